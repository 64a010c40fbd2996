"""Paddle side of the SwiGLU family. Paddle 3.3.1 has no CPU bf16 kernels for add, silu, sigmoid or
clip, so every arithmetic op here runs in fp32 and rounding to the working dtype is an explicit cast;
for one +, -, x of bf16 values that is bitwise the native bf16 result. Autograd runs through the
casts, so the backward follows the same order of roundings as the forward."""

from __future__ import annotations

import paddle
import paddle.nn.functional as F

from harness.ops import Impl

FP32 = paddle.float32


def _clamp_halves(y, limit):
    """Megatron clamps the input (before any bias): gate max=L, linear to [-L, L]."""
    if limit is None:
        return y
    gate, linear = paddle.chunk(y, 2, axis=-1)
    return paddle.concat([paddle.clip(gate, max=limit), paddle.clip(linear, -limit, limit)], axis=-1)


def tokens_2d(impl):
    """Run on [N, 2H] like Megatron's *_impl entry points (probs are [N, 1]), restore 3-D after."""

    def wrapped(x, bias, probs, options):
        out = impl(x.reshape([-1, x.shape[-1]]), bias, probs, options)
        return out.reshape(x.shape[:-1] + [out.shape[-1]])

    wrapped.__doc__ = impl.__doc__
    return wrapped


@tokens_2d
def fp32_island(x, bias, probs, options):
    """Megatron's order in fp32 from the working-dtype inputs, one rounding at the end (what
    torch.compile makes of Megatron's fused functions)."""
    y = _clamp_halves(x.cast(FP32), options["clamp"])
    if bias is not None:
        y = y + bias.cast(FP32)
    gate, linear = paddle.chunk(y, 2, axis=-1)
    if options["activation"] == "quick_geglu":
        out = gate * F.sigmoid(1.702 * gate) * (linear + options["linear_offset"])
    else:
        out = F.silu(gate) * linear
    if probs is not None:
        out = out * probs.cast(FP32)
    return out.cast(x.dtype)


@tokens_2d
def per_op_rounding(x, bias, probs, options):
    """Megatron's eager order: every op rounds to the working dtype (fp32 probs promote the last
    product to fp32 before the final cast, as in torch)."""
    dtype = x.dtype

    def op(fn, *tensors):
        return fn(*(t.cast(FP32) for t in tensors)).cast(dtype)

    y = x
    if options["clamp"] is not None:
        y = op(lambda t: _clamp_halves(t, options["clamp"]), y)
    if bias is not None:
        y = op(paddle.add, y, bias)
    gate, linear = paddle.chunk(y, 2, axis=-1)
    if options["activation"] == "quick_geglu":
        scaled = op(lambda t: 1.702 * t, gate)
        activated = op(paddle.multiply, gate, op(F.sigmoid, scaled))
        linear = op(lambda t: t + options["linear_offset"], linear)
    else:
        activated = op(F.silu, gate)
    out = op(paddle.multiply, activated, linear)
    if probs is not None:
        out = paddle.multiply(out.cast(FP32), probs.cast(FP32)).cast(dtype)
    return out


@tokens_2d
def fleet_cpu_fallback(x, bias, probs, options):
    """PaddleFleet's CPU fallback of fused_swiglu_scale: SwiGLU in fp32 rounded once, then times
    the probs rounded to the working dtype (Megatron multiplies by the unrounded probs)."""
    y = _clamp_halves(x.cast(FP32), options["clamp"])
    if bias is not None:
        y = y + bias.cast(FP32)
    gate, linear = paddle.chunk(y, 2, axis=-1)
    out = (F.silu(gate) * linear).cast(x.dtype)
    if probs is not None:
        out = (out.cast(FP32) * probs.cast(x.dtype).cast(FP32)).cast(x.dtype)
    return out


IMPLS = {
    "fp32_island": Impl(fp32_island, "xfalign Paddle variant: fp32 island, one rounding (harness/ops/swiglu/paddle.py)"),
    "per_op_rounding": Impl(per_op_rounding, "xfalign Paddle variant: rounds after each op (harness/ops/swiglu/paddle.py)"),
    "fleet_cpu_fallback": Impl(fleet_cpu_fallback, "xfalign Paddle variant: PaddleFleet fused_swiglu_scale CPU fallback (harness/ops/swiglu/paddle.py)"),
}
