"""Paddle SwiGLU variants changed on purpose, to show that the built-in expectations and the gate catch such
changes (tests/test_gate_catches.py, scripts/prove_expectations.py). Signature of a swiglu implementation."""

import math

import numpy as np
import paddle
import paddle.nn.functional as F

FP32 = paddle.float32


def _island(x, bias, probs, round_activation: bool):
    y = x.cast(FP32) + (bias.cast(FP32) if bias is not None else 0)
    gate, linear = paddle.chunk(y, 2, axis=-1)
    activated = F.silu(gate)
    if round_activation:  # the one change: silu(gate) rounded to the working dtype before the product
        activated = activated.cast(x.dtype).cast(FP32)
    out = activated * linear
    return out * probs.cast(FP32) if probs is not None else out


def early_rounding(x, bias, probs, options):
    """The fp32 island with silu(gate) rounded to bf16 before it multiplies the linear half."""
    flat = x.reshape([-1, x.shape[-1]])
    out = _island(flat, bias, probs, round_activation=True).cast(x.dtype)
    return out.reshape(x.shape[:-1] + [out.shape[-1]])


def one_ulp_off(x, bias, probs, options):
    """The fp32 island with the first output element moved one ULP away from zero (every other bit equal)."""
    flat = x.reshape([-1, x.shape[-1]])
    rounded = _island(flat, bias, probs, round_activation=False).cast(x.dtype)
    first = float(rounded.cast(FP32).flatten()[0])
    mantissa_bits = 7 if x.dtype == paddle.bfloat16 else 23
    exponent = math.frexp(abs(first))[1] - 1 if first else -126
    step = np.zeros(rounded.shape, np.float32)
    step.flat[0] = math.copysign(2.0 ** (exponent - mantissa_bits), first or 1.0)
    out = (rounded.cast(FP32) + paddle.to_tensor(step)).cast(x.dtype)
    return out.reshape(x.shape[:-1] + [out.shape[-1]])
