"""A fused kernel written the way PaddleFleet writes them: a forward and a hand-written backward
(src/paddlefleet/fusions/fused_swiglu_scale.py, XPU/CPU fallback, non-clamped branch), here as a user
forward/backward pair that the harness wraps as one paddle.autograd.PyLayer:

    impl: user/fleet_swiglu_scale.py:forward       forward(x, bias, probs, options) -> out
    backward: user/fleet_swiglu_scale.py:backward  backward(grad_out, x, bias, probs, options) -> (d_x, d_bias, d_probs)

Paddle 3.3.1 has no CPU bf16 kernel for swiglu or sigmoid: those run on the fp32 copy and round once
to bf16, where the real bf16 op's result appears."""

import paddle
import paddle.nn.functional as F


def _bf16_op(op, t):
    return op(t.cast("float32")).cast(t.dtype) if t.dtype == paddle.bfloat16 else op(t)


def _scale_like(scale, dtype, ndim):
    scale = scale.cast(dtype)
    while scale.ndim < ndim:
        scale = scale.unsqueeze(-1)
    return scale


def forward(x, bias, probs, options):
    """swiglu(x) rounded to x's dtype, times the probs rounded to x's dtype."""
    out = _bf16_op(F.swiglu, x)
    return out * _scale_like(probs, x.dtype, out.ndim)


def backward(out_grad, x, bias, probs, options):
    """Every op in x's dtype, as PaddleFleet's backward: d_x, no bias gradient, d_probs an fp32 sum of
    shape [N] (no keepdim)."""
    hidden = x.shape[-1] // 2
    gate, val = x[..., :hidden], x[..., hidden:]
    sig = _bf16_op(F.sigmoid, gate).cast(x.dtype)
    silu = gate * sig
    swiglu = silu * val
    d_u = out_grad * _scale_like(probs, x.dtype, out_grad.ndim)
    d_val = d_u * silu
    d_gate = d_u * val * sig * (1.0 + gate * (1.0 - sig))
    d_x = paddle.concat([d_gate, d_val], axis=-1).cast(x.dtype)
    d_probs = paddle.sum(out_grad.cast("float32") * swiglu.cast("float32"), axis=-1).cast(probs.dtype)
    return d_x, None, d_probs
