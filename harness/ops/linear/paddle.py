"""Paddle side of the linear family. Weight arrives as [in, out] (Paddle's layout). Paddle 3.3.1 has no
CPU bf16 matmul or add: the GEMM runs in fp32 from the bf16 values and rounds once."""

from __future__ import annotations

import paddle
import paddle.nn.functional as F

from harness.ops.family import Implementations, NotAvailable, variant
from harness.ops.linear import LinearFamily

FP32 = paddle.float32


def matmul_add(x, weight, bias, options):
    """paddle.matmul(x, W) then a separate bias add: two roundings, Megatron's order."""
    dtype = x.dtype
    out = paddle.matmul(x.cast(FP32), weight.cast(FP32)).cast(dtype)
    if bias is not None:
        out = (out.cast(FP32) + bias.cast(FP32)).cast(dtype)
    return out


def functional_linear(x, weight, bias, options):
    """paddle.nn.functional.linear: GEMM and bias in one fp32 computation, one rounding."""
    return F.linear(x.cast(FP32), weight.cast(FP32), None if bias is None else bias.cast(FP32)).cast(x.dtype)


def fused_linear(x, weight, bias, options):
    """paddle.incubate.nn.functional.fused_linear (cuBLASLt epilogue): GPU only."""
    if not paddle.device.is_compiled_with_cuda() or paddle.device.get_device() == "cpu":
        raise NotAvailable("paddle.incubate.nn.functional.fused_linear is not available on cpu")
    from paddle.incubate.nn.functional import fused_linear as fused

    return fused(x, weight, bias)


def _provenance(name: str) -> str:
    return f"xfalign Paddle variant: {name} (harness/ops/linear/paddle.py)"


class LinearPaddle(Implementations, family=LinearFamily, framework="paddle"):
    matmul_add = variant(_provenance("matmul_add"))(matmul_add)
    functional_linear = variant(_provenance("functional_linear"))(functional_linear)
    fused_linear = variant(_provenance("fused_linear"))(fused_linear)
