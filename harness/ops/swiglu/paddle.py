"""Paddle side of the SwiGLU family. Paddle 3.3.1 has no CPU bf16 kernels for add, silu, sigmoid,
swiglu or clip, so every arithmetic op of fp32_island and per_op_rounding runs in fp32 and rounding to
the working dtype is an explicit cast; for one +, -, x of bf16 values that is bitwise the native bf16
result. Their autograd runs through the casts, so the backward follows the same order of roundings as
the forward. fleet_cpu_fallback is PaddleFleet's own code instead: its forward and its hand-written
backward (a PyLayer), op for op (native bf16 multiply, scalar ops, sum and casts where the real code has
them; fp32-then-round only for the bf16 swiglu and sigmoid that have no CPU kernel here)."""

from __future__ import annotations

import paddle
import paddle.nn.functional as F

from harness.ops.family import Implementations, variant
from harness.ops.swiglu import SwigluFamily

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


# ---------------------------------------------------------------------------------------------------
# PaddleFleet's fused_swiglu_scale XPU/CPU fallback
# ---------------------------------------------------------------------------------------------------

FLEET_SOURCE = (
    "PaddlePaddle/PaddleFleet src/paddlefleet/fusions/fused_swiglu_scale.py as of PR #1078 (merged 2026-05-30; "
    "its merge commit is not in the code index used here), the same code re-wrapped at "
    "PaddlePaddle/PaddleFormers@25ab366f005711732135624227bcc6f1f125207a "
    "paddleformers/fleet/fusions/fused_swiglu_scale.py"
)


def _fleet_clamp_on(clamp_value) -> bool:
    """PaddleFleet's switch: only L > 0 clamps (None, 0 and negatives take the non-clamped code)."""
    return clamp_value is not None and clamp_value > 0


def _fp32_then_round(op, t):
    """op(t) for an op with no Paddle 3.3.1 CPU kernel in t's dtype (swiglu, sigmoid on bf16): computed
    from the same bf16 values in fp32 and rounded once to bf16 (Paddle's GPU bf16 kernels for these ops
    also compute in fp32 and round once)."""
    return op(t.cast(FP32)).cast(t.dtype) if t.dtype == paddle.bfloat16 else op(t)


def _broadcast_scale(scale, target_dtype, target_ndim):
    """PaddleFleet's helper: cast scale to target dtype and unsqueeze to match target rank."""
    scale_exp = scale.cast(target_dtype)
    while scale_exp.ndim < target_ndim:
        scale_exp = scale_exp.unsqueeze(-1)
    return scale_exp


def fleet_swiglu_scale_forward(x, scale, clamp_value=None):
    """The XPU/CPU branch of PaddleFleet's fused_swiglu_scale_forward, op for op.

    clamped: (silu(clip(x32 gate, max=L)) * clip(x32 value, -L, L)).cast(x.dtype) * scale.cast(x.dtype)
    not clamped: F.swiglu(x) * scale.cast(x.dtype); F.swiglu has no CPU bf16 kernel, so it runs on the
    fp32 copy of x and is rounded once. The product with the probs rounded to x's dtype is a native
    bf16 multiply in both branches."""
    if _fleet_clamp_on(clamp_value):
        hidden = x.shape[-1] // 2
        x_fp32 = x.cast(FP32)
        gate = paddle.clip(x_fp32[..., :hidden], max=clamp_value)
        val = paddle.clip(x_fp32[..., hidden:], min=-clamp_value, max=clamp_value)
        out = (F.silu(gate) * val).cast(x.dtype)
    else:
        out = _fp32_then_round(F.swiglu, x)
    scale_exp = _broadcast_scale(scale, x.dtype, out.ndim)
    return out * scale_exp


def fleet_swiglu_scale_backward(x, scale, out_grad, clamp_value=None):
    """The XPU/CPU branch of PaddleFleet's hand-written fused_swiglu_scale_backward: (d_x, d_scale).

    clamped (L > 0): everything in fp32 from x; masks cast to out_grad's dtype; d_u = out_grad * fp32
    scale (type promotion to fp32); d_gate = d_u * sig * (1 + g * (1 - sig)) * v * g_mask in that
    order; d_x rounded once; d_scale = sum(swiglu.cast(x.dtype) * out_grad.cast(scale.dtype), -1,
    keepdim=True).cast(scale.dtype): the bf16-rounded SwiGLU, shape [N, 1].
    not clamped: every op in x's dtype, each rounding: sig = sigmoid(g).cast(x.dtype) (sigmoid on the
    fp32 copy: no CPU bf16 kernel), silu = g * sig, swiglu = silu * v, d_u = out_grad * scale.cast(x.dtype),
    d_val = d_u * silu, d_gate = d_u * v * sig * (1.0 + g * (1.0 - sig)) (native bf16 multiply and
    scalar ops); d_scale = sum(out_grad32 * swiglu32, -1).cast(scale.dtype): NO keepdim, shape [N]
    for a [N, 1] scale."""
    hidden = x.shape[-1] // 2
    if _fleet_clamp_on(clamp_value):
        x_fp32 = x.cast(FP32)
        gate_raw = x_fp32[..., :hidden]
        val_raw = x_fp32[..., hidden:]
        gate_fp32 = paddle.clip(gate_raw, max=clamp_value)
        val_fp32 = paddle.clip(val_raw, min=-clamp_value, max=clamp_value)
        g_mask = (gate_raw <= clamp_value).cast(out_grad.dtype)
        v_mask = ((val_raw <= clamp_value) & (val_raw >= -clamp_value)).cast(out_grad.dtype)

        sig = F.sigmoid(gate_fp32)
        silu = gate_fp32 * sig
        swiglu_val = silu * val_fp32

        scale_fp32 = scale.cast(FP32)
        scale_exp = _broadcast_scale(scale_fp32, FP32, out_grad.ndim)
        d_u = out_grad * scale_exp

        d_val = d_u * silu * v_mask
        d_gate = d_u * sig * (1.0 + gate_fp32 * (1.0 - sig)) * val_fp32 * g_mask
        d_x = paddle.concat([d_gate, d_val], axis=-1).cast(x.dtype)

        scale_dtype = scale.dtype
        d_scale = paddle.sum(swiglu_val.cast(x.dtype) * out_grad.cast(scale_dtype), axis=-1, keepdim=True).cast(scale_dtype)
        return d_x, d_scale

    gate = x[..., :hidden]
    val = x[..., hidden:]

    sig = _fp32_then_round(F.sigmoid, gate).cast(x.dtype)
    silu = gate * sig
    swiglu_val = silu * val

    scale_exp = _broadcast_scale(scale, x.dtype, out_grad.ndim)
    d_u = out_grad * scale_exp

    d_val = d_u * silu
    d_gate = d_u * val * sig * (1.0 + gate * (1.0 - sig))
    d_x = paddle.concat([d_gate, d_val], axis=-1).cast(x.dtype)

    d_scale = paddle.sum(out_grad.cast(FP32) * swiglu_val.cast(FP32), axis=-1).cast(scale.dtype)
    return d_x, d_scale


class FleetSwigluScale(paddle.autograd.PyLayer):
    """fused_swiglu_scale as PaddleFleet's MoE layers use it: the fallback forward, and its hand-written
    backward in place of autograd. The backward's d_scale goes back unchanged: Paddle 3.3.1 accepts a
    PyLayer gradient of shape [N] for the [N, 1] probs and leaves probs.grad with shape [N]."""

    @staticmethod
    def forward(ctx, x, scale, clamp_value):
        ctx.save_for_backward(x, scale)
        ctx.clamp_value = clamp_value
        return fleet_swiglu_scale_forward(x, scale, clamp_value)

    @staticmethod
    def backward(ctx, out_grad):
        x, scale = ctx.saved_tensor()
        return fleet_swiglu_scale_backward(x, scale, out_grad, ctx.clamp_value)


@tokens_2d
def fleet_cpu_fallback(x, bias, probs, options):
    """PaddleFleet's XPU/CPU fallback of fused_swiglu_scale (PR #1078), forward and hand-written
    backward, reproduced op for op (see fleet_swiglu_scale_forward/backward). Clamped iff clamp > 0.

    Where the real code runs a bf16 op that Paddle 3.3.1 has no CPU kernel for (swiglu in the
    non-clamped forward, sigmoid in the non-clamped backward), that op runs on the fp32 copy of the
    same values and is rounded to bf16 at the point where the real op's bf16 result appears. Every
    other op is the real one on this CPU: bf16 multiply, scalar 1.0 - t and 1.0 + t, sum, concat,
    casts, and bf16 x fp32 type promotion. (So with bf16 inputs the real non-clamped code cannot run
    on a CPU-only Paddle 3.3.1 build at all; its clamped code can.)

    grad.probs is the real d_scale: dtype of the probs; shape [N] from the non-clamped code (it sums
    without keepdim), [N, 1] from the clamped code."""
    if options["activation"] != "swiglu":
        raise ValueError("fleet_cpu_fallback is PaddleFleet's fused_swiglu_scale: SwiGLU only")
    if bias is not None or probs is None:
        raise ValueError("fleet_cpu_fallback is PaddleFleet's fused_swiglu_scale: it takes probs "
                         "(options.weighted: true) and no bias")
    return FleetSwigluScale.apply(x, probs, options["clamp"])


def _fleet_provenance(options: dict) -> str:
    if _fleet_clamp_on(options.get("clamp")):
        branch = (f"clamped branch (clamp_value={options['clamp']} > 0): fp32 forward rounded once, then x "
                  "probs rounded to bf16; fp32 backward, d_scale [N, 1] from the bf16-rounded SwiGLU")
    else:
        branch = ("non-clamped branch: F.swiglu rounded once, then x probs rounded to bf16; backward in bf16 "
                  "op by op, d_scale an fp32 sum of shape [N]")
    return (f"PaddleFleet fused_swiglu_scale XPU/CPU fallback, forward and hand-written backward (a PyLayer), "
            f"reproduced from {FLEET_SOURCE}; {branch}; swiglu/sigmoid of bf16 values run in fp32 and round once "
            "(no CPU bf16 kernels in Paddle 3.3.1) (xfalign harness/ops/swiglu/paddle.py)")


class SwigluPaddle(Implementations, family=SwigluFamily, framework="paddle"):
    fp32_island = variant("xfalign Paddle variant: fp32 island, one rounding (harness/ops/swiglu/paddle.py)")(fp32_island)
    per_op_rounding = variant("xfalign Paddle variant: rounds after each op (harness/ops/swiglu/paddle.py)")(per_op_rounding)
    fleet_cpu_fallback = variant(_fleet_provenance)(fleet_cpu_fallback)
