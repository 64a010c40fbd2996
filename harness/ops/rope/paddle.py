"""Paddle side of the RoPE family. t arrives as Paddle's [b, s, h, d], freqs as [1, s, 1, rot_dim].

Paddle 3.3.1's CPU build has no bf16 kernel for add, cos, sin, or for the backward of concat (concat_grad),
so fp32_island and per_op_rounding carry every value in fp32 and make each rounding an explicit cast:

- fp32_island: cos/sin of the fp32 angles (times mscale), t * cos + rotate_half(t) * sin, all fp32, ONE
  rounding to t's dtype at the end; the backward likewise in fp32 with one rounding of grad.t. This is the
  arithmetic of Transformer Engine's fused RoPE (Megatron's apply_rope_fusion: fp32 sincos and math, one
  cast), not Megatron's eager path.
- per_op_rounding: megatron-core's eager `_apply_rotary_pos_emb_bshd`, op for op: cos and sin rounded to
  freqs' dtype, times mscale rounded to freqs' dtype, cast to t's dtype; t * cos_, rotate_half(t) * sin_
  and their sum each rounded to t's dtype. In the backward, every op's input gradient is rounded where
  torch's autograd computes it in t's dtype (g * cos_, g * sin_, and the sum of the two gradients
  reaching t): the `rounded` casts below are identities in the forward on values that already fit the
  dtype, and round the gradient flowing back through them. For +, x of two bf16 values, fp32-then-round
  is bitwise the native bf16 result.
- fused_rope: paddle.incubate.nn.functional.fused_rotary_position_embedding with cos/sin made as Megatron
  makes them (rounded to t's dtype); use_neox_rotary_style=True is Paddle's name for rotating adjacent
  pairs (Megatron's rotary_interleaved), False rotates halves. The kernel is registered for GPU (and XPU)
  only: on a CPU build it is reported as not available.
"""

from __future__ import annotations

import paddle

from harness.ops.family import Implementations, NotAvailable, variant
from harness.ops.rope import RopeFamily

FP32 = paddle.float32


def rotate_half(x, interleaved: bool):
    """Megatron's _rotate_half: halves [x1, x2] -> [-x2, x1]; interleaved pairs (a, b) -> (-b, a)."""
    if not interleaved:
        x1, x2 = paddle.chunk(x, 2, axis=-1)
        return paddle.concat([-x2, x1], axis=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return paddle.stack([-x2, x1], axis=-1).reshape(x.shape)


def rounded(x, dtype):
    """fp32 carrier -> dtype -> fp32: rounds the value in the forward, the gradient in the backward."""
    return x if dtype == FP32 else x.cast(dtype).cast(FP32)


def _split(t, freqs):
    rot_dim = freqs.shape[-1]
    x = t.cast(FP32)
    return x[..., :rot_dim], x[..., rot_dim:]


def _megatron_cos_sin(freqs, options, dtype):
    """cos_ and sin_ as Megatron makes them: (cos(freqs) * mscale).to(dtype), each op in freqs' dtype."""
    angles = freqs.cast(FP32)
    made = []
    for fn in (paddle.cos, paddle.sin):
        value = rounded(fn(angles), freqs.dtype)
        value = rounded(value * options["mscale"], freqs.dtype)
        made.append(rounded(value, dtype))
    return made


class RopePaddle(Implementations, family=RopeFamily, framework="paddle"):
    @variant(provenance="xfalign Paddle variant: fp32_island, RoPE in fp32 from the inputs, one rounding "
                        "(Transformer Engine's fused-RoPE arithmetic) (harness/ops/rope/paddle.py)")
    @staticmethod
    def fp32_island(t, freqs, options):
        x_rot, x_pass = _split(t, freqs)
        angles = freqs.cast(FP32)
        cos, sin = paddle.cos(angles) * options["mscale"], paddle.sin(angles) * options["mscale"]
        out = x_rot * cos + rotate_half(x_rot, options["rotary_interleaved"]) * sin
        return paddle.concat([out, x_pass], axis=-1).cast(t.dtype)

    @variant(provenance="xfalign Paddle variant: per_op_rounding, megatron-core's eager "
                        "_apply_rotary_pos_emb_bshd op for op, each op rounded (harness/ops/rope/paddle.py)")
    @staticmethod
    def per_op_rounding(t, freqs, options):
        dtype = t.dtype
        x_rot, x_pass = _split(t, freqs)
        cos_, sin_ = _megatron_cos_sin(freqs, options, dtype)
        # each use of t_rot rounds its own gradient (torch: g * cos_ in bf16; rotate_half^T(g * sin_) in bf16)
        first = rounded(rounded(x_rot, dtype) * cos_, dtype)
        second = rounded(rotate_half(rounded(x_rot, dtype), options["rotary_interleaved"]) * sin_, dtype)
        out = rounded(first + second, dtype)
        return paddle.concat([out, x_pass], axis=-1).cast(dtype)

    @variant(provenance="Paddle kernel: paddle.incubate.nn.functional.fused_rotary_position_embedding "
                        "(use_neox_rotary_style = rotary_interleaved, time_major=False), cos/sin rounded to "
                        "t's dtype as Megatron makes them (harness/ops/rope/paddle.py)")
    @staticmethod
    def fused_rope(t, freqs, options):
        from paddle.incubate.nn.functional import fused_rotary_position_embedding

        rot_dim = freqs.shape[-1]
        cos_, sin_ = (c.cast(t.dtype) for c in _megatron_cos_sin(freqs, options, t.dtype))
        try:
            out, _, _ = fused_rotary_position_embedding(
                t[..., :rot_dim], sin=sin_, cos=cos_, use_neox_rotary_style=options["rotary_interleaved"],
                time_major=False)
        except RuntimeError as error:
            if "not registered" not in str(error):
                raise
            first = str(error).strip().splitlines()[0]
            raise NotAvailable(f"paddle.incubate.nn.functional.fused_rotary_position_embedding has no kernel on "
                               f"{paddle.device.get_device()} in this Paddle build ({first})") from None
        return out if rot_dim == t.shape[-1] else paddle.concat([out, t[..., rot_dim:]], axis=-1)
