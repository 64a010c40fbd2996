"""Megatron side of the RoPE family: the real megatron.core.models.common.embeddings.rope_utils.apply_rotary_pos_emb.

With `apply_rope_fusion: false` (the only setting a CPU machine can have) it runs megatron-core's unfused
`_apply_rotary_pos_emb_bshd`, eager torch (no jit_fuser on this path), which rounds after every op:

    cos_ = (cos(freqs) * mscale).to(t.dtype)      # cos/sin in freqs' dtype, the product too, then a cast
    sin_ = (sin(freqs) * mscale).to(t.dtype)
    out  = cat((t_rot * cos_) + (rotate_half(t_rot) * sin_), t_pass)    # three roundings in t's dtype

`apply_rope_fusion: true` asks for Transformer Engine's fused kernel (fused_apply_rotary_pos_emb, fp32
math, one rounding). Without TE, megatron-core's own TransformerConfig refuses it ("apply_rope_fusion is
not available. Please install TE >= 1.4."): reported as not available. flash-attn's apply_rotary_emb is
used only by apply_rotary_pos_emb_with_cos_sin (inference), not here.

apply_rotary_pos_emb reads the context-parallel group from parallel_state when none is passed, as in a
training step: the call runs inside a one-process torch.distributed group (gloo on CPU, nccl on GPU;
in-process HashStore rendezvous)
with CP=1, torn down after the forward (the backward needs no group).

The float64 reference (`rope_reference`) is that same call on float64 t and freqs (the input bits widened
exactly): `_apply_rotary_pos_emb_bshd` computes in the inputs' dtype (cos/sin in freqs' dtype, `.to(t.dtype)`),
so in float64 nothing rounds below float64, and the backward is torch's autograd of it, as Megatron's.
"""

from __future__ import annotations

import warnings

import torch
from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
from megatron.core.transformer.transformer_config import TransformerConfig

from harness.frameworks.megatron_group import one_process_group
from harness.ops.family import Implementations, NotAvailable, reference, variant
from harness.ops.rope import RopeFamily


def rope_config(t: torch.Tensor, options: dict) -> TransformerConfig:
    """The TransformerConfig apply_rotary_pos_emb reads (rotary_interleaved, apply_rope_fusion,
    multi_latent_attention=False); the sizes only have to be consistent with t's heads and head dim."""
    heads, head_dim = t.shape[2], t.shape[3]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecation notes about unrelated defaults
            return TransformerConfig(num_layers=1, hidden_size=heads * head_dim, num_attention_heads=heads,
                                     kv_channels=head_dim, rotary_interleaved=options["rotary_interleaved"],
                                     apply_rope_fusion=options["apply_rope_fusion"])
    except ValueError as error:
        if options["apply_rope_fusion"] and "apply_rope_fusion" in str(error):
            raise NotAvailable(f"apply_rope_fusion needs Transformer Engine's fused RoPE; megatron-core says: {error}") from None
        raise


def _provenance(options: dict) -> str:
    path = ("Transformer Engine fused_apply_rotary_pos_emb (apply_rope_fusion: true)" if options["apply_rope_fusion"]
            else "unfused eager path megatron.core.models.common.embeddings.rope_utils._apply_rotary_pos_emb_bshd")
    return (f"megatron-core: megatron.core.models.common.embeddings.rope_utils.apply_rotary_pos_emb, {path}, "
            f"TransformerConfig(rotary_interleaved={options['rotary_interleaved']}, "
            f"apply_rope_fusion={options['apply_rope_fusion']}), mscale={options['mscale']}, CP=1")


class RopeMegatron(Implementations, family=RopeFamily, framework="megatron"):
    @variant(provenance=_provenance, source=lambda options: apply_rotary_pos_emb)
    @staticmethod
    def megatron(t, freqs, options):
        config = rope_config(t, options)
        with one_process_group(t.device.type):
            return apply_rotary_pos_emb(t, freqs, config, mscale=options["mscale"])


def _reference_provenance(options: dict) -> str:
    text = f"float64 reference: {_provenance(options | {'apply_rope_fusion': False})}, run eagerly on float64 t and freqs"
    if options["apply_rope_fusion"]:
        text += ("; apply_rope_fusion: Transformer Engine's fused kernel computes the same rotation (fp32 cos/sin and "
                 "arithmetic, one rounding), so its float64 reference is the unfused formula")
    return text


@reference(provenance=_reference_provenance, source=lambda options: apply_rotary_pos_emb)
def rope_reference(t, freqs, options):
    return RopeMegatron.megatron(t, freqs, options | {"apply_rope_fusion": False})
