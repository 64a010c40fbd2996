"""Paddle side of the bias GeLU family (cases/user/bias_gelu.py). Paddle 3.3.1 has no CPU bf16 kernels for
add, tanh or multiply, so both variants compute in fp32 from the working-dtype inputs and round once."""

import paddle

from harness.ops import load_object
from harness.ops.family import Implementations, variant

BiasGeluFamily = load_object("bias_gelu.py:BiasGeluFamily", __file__)  # the family file beside this one, loaded once
FP32 = paddle.float32


def _gelu(x):
    """Megatron's bias_gelu formula (tanh approximation) on the biased fp32 input."""
    return x * 0.5 * (1.0 + paddle.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def _gelu_back(g, x):
    """Megatron's bias_gelu_back formula, op for op."""
    tanh_out = paddle.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
    ff = 0.5 * x * ((1 - tanh_out * tanh_out) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + tanh_out)
    return ff * g


class _MegatronBackward(paddle.autograd.PyLayer):
    """Forward as fp32_island; backward is Megatron's hand-written derivative in fp32, rounded once, and
    the bias gradient is its sum over tokens (what torch's autograd makes of GeLUFunction's [N, H] bias grad)."""

    @staticmethod
    def forward(ctx, x, bias):
        ctx.save_for_backward(x, bias)
        return _gelu(x.cast(FP32) + bias.cast(FP32)).cast(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, bias = ctx.saved_tensor()
        d = _gelu_back(grad.cast(FP32), x.cast(FP32) + bias.cast(FP32))
        return d.cast(x.dtype), d.cast(x.dtype).cast(FP32).sum(axis=0).cast(bias.dtype)


class BiasGeluPaddle(Implementations, family=BiasGeluFamily, framework="paddle"):
    @variant(provenance="user variant (cases/user/bias_gelu_paddle.py): Megatron's bias_gelu formula in fp32, one "
                        "rounding; backward by Paddle's autograd")
    def fp32_island(x, bias, options):
        return _gelu(x.cast(FP32) + bias.cast(FP32)).cast(x.dtype)

    @variant(provenance="user variant (cases/user/bias_gelu_paddle.py): forward as fp32_island, backward "
                        "Megatron's bias_gelu_back formula in fp32 (a PyLayer)")
    def megatron_backward(x, bias, options):
        return _MegatronBackward.apply(x, bias)
