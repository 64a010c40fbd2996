"""Rotary position embedding (RoPE): megatron-core's `apply_rotary_pos_emb` on `[s, b, h, d]`.

Signature of every implementation, built-in or user:

    fn(t, freqs, options) -> out

In the case (and in every comparison) t is Megatron's `[s, b, h, d]` (sequence, batch, heads, head dim)
and freqs its `[s, 1, 1, rot_dim]` rotary angles; rot_dim < d rotates only the first rot_dim channels
and passes the rest through. The Paddle side gets both through the layout adapter as Paddle's
`[b, s, h, d]` and `[1, s, 1, rot_dim]` (axis permutation (1, 0, 2, 3)); its out and grad.t come back
through the inverse permutation. freqs takes no gradient. The harness captures out and grad.t.

freqs is made by the family, not drawn at random: the angles megatron-core's RotaryEmbedding makes
(`inv_freq = 1 / base ** (arange(0, rot_dim, 2) / rot_dim)`, `outer(arange(s) + offset, inv_freq)`,
all fp32; halves concatenated, or each angle repeated twice when interleaved), rounded once to the freqs
input's dtype. On this CPU they are bit for bit RotaryEmbedding's (tests/test_rope.py checks it).

options: rotary_interleaved (TransformerConfig.rotary_interleaved), mscale (apply_rotary_pos_emb's
mscale, YaRN's attention factor), rotary_base and position_offset (the angles), apply_rope_fusion
(Megatron's Transformer Engine fused kernel: not available without TE; the Paddle side ignores it).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from pydantic import Field

from harness.case import Case
from harness.ops.family import OpFamily
from harness.rounding import round_float64
from harness.schema import FieldProblem, Strict

BSHD_TO_PADDLE = (1, 0, 2, 3)  # [s, b, h, d] -> [b, s, h, d]; its own inverse


class RopeOptions(Strict):
    rotary_interleaved: bool = False  # rotate pairs (2i, 2i+1) instead of halves (i, i + rot_dim/2)
    mscale: float = Field(1.0, gt=0.0, allow_inf_nan=False)  # cos and sin are multiplied by it before the cast
    rotary_base: int = Field(10000, ge=2)  # RotaryEmbedding's rotary_base
    position_offset: int = Field(0, ge=0)  # RotaryEmbedding(offset=...): angles of positions offset..offset+s-1
    apply_rope_fusion: bool = False  # TransformerConfig.apply_rope_fusion: TE's fused kernel (Megatron side only)


def rotary_freqs(seq_len: int, rot_dim: int, interleaved: bool, base: int = 10000, offset: int = 0) -> np.ndarray:
    """[seq_len, 1, 1, rot_dim] fp32 angles, computed as megatron-core's RotaryEmbedding does (fp32 throughout)."""
    exponents = np.arange(0, rot_dim, 2, dtype=np.float32) / np.float32(rot_dim)
    # base ** exponent through libm's double pow, rounded once to fp32: numpy's fp32 power is dispatched by CPU
    # (SVML on AVX-512) and gave other angle bits on the GPU machine's host; inputs must not depend on the machine.
    powers = round_float64(np.array([math.pow(base, float(e)) for e in exponents], dtype=np.float64), "float32")
    inv_freq = (np.float32(1.0) / powers).astype(np.float32)
    positions = np.arange(seq_len, dtype=np.float32) + np.float32(offset)
    angles = np.outer(positions, inv_freq).astype(np.float32)
    emb = np.repeat(angles, 2, axis=-1) if interleaved else np.concatenate([angles, angles], axis=-1)
    return np.ascontiguousarray(emb[:, None, None, :])


class RopeFamily(OpFamily):
    name = "rope"
    options_model = RopeOptions
    signature = ("t", "freqs")
    working_inputs = ("t", "grad_out")
    no_grad = ("freqs",)
    variants: ClassVar[dict[str, tuple[str, ...]]] = {
        "megatron": ("megatron",), "paddle": ("fp32_island", "per_op_rounding", "fused_rope")}
    implementations: ClassVar[dict[str, str]] = {
        "megatron": "harness.ops.rope.megatron:RopeMegatron", "paddle": "harness.ops.rope.paddle:RopePaddle"}
    reference: ClassVar[dict[str, str]] = {"megatron": "harness.ops.rope.megatron:rope_reference"}
    layouts: ClassVar[dict[str, dict[str, tuple[int, ...]]]] = {
        "paddle": {name: BSHD_TO_PADDLE for name in ("t", "freqs", "grad_out", "out")}}

    def tensor_axes(self, case: Case) -> dict[str, list[str]]:
        return {"out": ["head", "channel"], "grad.t": ["head", "channel"]}

    def tensor_notes(self, case: Case) -> dict[str, str]:
        note = "compared in Megatron's [s, b, h, d] layout: the Paddle side ran on [b, s, h, d] and is permuted back"
        return {"out": note, "grad.t": note}

    def validate_inputs(self, case: Case) -> None:
        t, freqs = case.inputs["t"], case.inputs["freqs"]
        if len(t.shape) != 4:
            raise FieldProblem(("inputs", "t", "shape"), "t is [s, b, h, d] (Megatron's layout)")
        seq_len, _, _, head_dim = t.shape
        if len(freqs.shape) != 4 or freqs.shape[:3] != [seq_len, 1, 1]:
            raise FieldProblem(("inputs", "freqs", "shape"), f"freqs is [s={seq_len}, 1, 1, rot_dim], got {freqs.shape}")
        rot_dim = freqs.shape[3]
        if rot_dim % 2 or rot_dim > head_dim:
            raise FieldProblem(("inputs", "freqs", "shape"),
                               f"rot_dim (freqs' last dim) must be even and at most d={head_dim}, got {rot_dim}")
        for name, spec in (("t", t), ("freqs", freqs)):
            if spec.dtype not in ("bfloat16", "float16", "float32", "float64"):
                raise FieldProblem(("inputs", name, "dtype"), f"{name} is a floating-point tensor, got {spec.dtype}")
        self.require(case, {"grad_out": t.shape}, dtype_of="t", same_dtype=("grad_out",))

    def generate_input(self, name: str, case: Case, rng) -> np.ndarray | None:
        if name != "freqs":
            return None
        options = self.options(case)
        spec = case.inputs["freqs"]
        seq_len, rot_dim = spec.shape[0], spec.shape[3]
        angles = rotary_freqs(seq_len, rot_dim, options.rotary_interleaved, options.rotary_base, options.position_offset)
        # One round-to-nearest-even, as torch's .to(dtype); xfalign's own (fp32 -> float64 is exact), as every
        # input's: ml_dtypes' casts are not to be relied on for input bits.
        return round_float64(angles, spec.dtype)
