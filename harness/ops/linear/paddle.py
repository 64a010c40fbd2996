"""Paddle side of the linear family. Weight arrives as [in, out] (Paddle's layout). Paddle 3.3.1 has no
CPU bf16 matmul or add: the GEMM runs in fp32 from the bf16 values and rounds once."""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle.autograd import PyLayer

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


def _mm(a, b, dtype):
    """One GEMM as this file does them: fp32 from the working-dtype values, rounded once to `dtype`."""
    return paddle.matmul(a.cast(FP32), b.cast(FP32)).cast(dtype)


def _rank_order_sum(parts, dtype):
    """The all-reduce's sum: the ranks' pieces added in rank order, each addition rounded to `dtype` (gloo's
    and NCCL's sum of two bf16/fp16 values: in fp32, then rounded). Exact at two ranks, whatever the order."""
    total = parts[0]
    for part in parts[1:]:
        total = (total.cast(FP32) + part.cast(FP32)).cast(dtype)
    return total


class _ShardedLinear(PyLayer):
    """Megatron's tensor-parallel linear, every rank's GEMMs in one process. weight is Paddle's [in, out].
    column: out_r = x @ W[:, r] (then + b_r); grad.x = all-reduce of g_r @ W[:, r]^T.
    row: out = all-reduce of x[..., r] @ W[r, :], then + b; grad.x[..., r] = g @ W[r, :]^T."""

    @staticmethod
    def forward(ctx, x, weight, bias, parallel, tp):
        ctx.parallel, ctx.tp, ctx.has_bias = parallel, tp, bias is not None
        ctx.save_for_backward(x, weight)
        dtype = x.dtype
        if parallel == "column":
            pieces = [_mm(x, w, dtype) for w in paddle.split(weight, tp, axis=1)]
            out = paddle.concat(pieces, axis=-1)
        else:
            out = _rank_order_sum([_mm(xr, w, dtype) for xr, w in
                                   zip(paddle.split(x, tp, axis=-1), paddle.split(weight, tp, axis=0))], dtype)
        if bias is not None:
            out = (out.cast(FP32) + bias.cast(FP32)).cast(dtype)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensor()
        dtype = x.dtype
        rows_x, rows_g = x.reshape([-1, x.shape[-1]]), grad.reshape([-1, grad.shape[-1]])
        if ctx.parallel == "column":
            grad_x = _rank_order_sum([_mm(g, w.T, dtype) for g, w in
                                      zip(paddle.split(grad, ctx.tp, axis=-1), paddle.split(weight, ctx.tp, axis=1))],
                                     dtype)
        else:
            grad_x = paddle.concat([_mm(grad, w.T, dtype) for w in paddle.split(weight, ctx.tp, axis=0)], axis=-1)
        grad_weight = _mm(rows_x.T, rows_g, dtype)  # each rank's rows of it are the same dot products
        if not ctx.has_bias:
            return grad_x, grad_weight
        return grad_x, grad_weight, rows_g.cast(FP32).sum(0).cast(dtype)


def tp_sharded(x, weight, bias, options):
    """Megatron's tensor-parallel reduction in one process: per-rank partial GEMMs summed in rank order."""
    return _ShardedLinear.apply(x, weight, bias, options["parallel"], options["tensor_parallel"])


def _provenance(name: str) -> str:
    return f"xfalign Paddle variant: {name} (harness/ops/linear/paddle.py)"


class LinearPaddle(Implementations, family=LinearFamily, framework="paddle"):
    matmul_add = variant(_provenance("matmul_add"))(matmul_add)
    functional_linear = variant(_provenance("functional_linear"))(functional_linear)
    fused_linear = variant(_provenance("fused_linear"))(fused_linear)
    tp_sharded = variant(_provenance("tp_sharded"))(tp_sharded)
