"""Paddle side of MoE combine: PaddleFleet's variants. Paddle 3.3.1 has no CPU bf16 scatter or add, so
arithmetic runs in fp32 and rounding to the token dtype is an explicit cast at the point where the
bf16 kernel would round; accumulation follows scatter-add's order (permuted rows in order)."""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F

from harness.ops.family import Implementations, variant
from harness.ops.moe_combine import MoeCombineFamily

FP32 = paddle.float32


def route(logits, topk):
    """Top-k on the logits, softmax over the chosen ones (Megatron's order without pre-softmax)."""
    values, indices = paddle.topk(logits.cast(FP32), k=topk, axis=1)
    probs = F.softmax(values, axis=-1).cast(logits.dtype).cast(FP32)
    dense = paddle.put_along_axis(paddle.zeros(logits.shape, FP32), indices, probs, axis=1).cast(logits.dtype)
    routing_map = paddle.put_along_axis(paddle.zeros(logits.shape, FP32), indices, paddle.ones(indices.shape, FP32),
                                        axis=1).cast(paddle.bool)
    return dense, routing_map


def rows_by_token(routing_map, topk):
    """[tokens, topk] indices of each token's rows in permute's expert-major order (experts ascending)."""
    token_of_row = np.nonzero(routing_map.numpy().T)[1]  # integer bookkeeping: numpy is exact here
    return paddle.to_tensor(np.argsort(token_of_row, kind="stable").reshape(-1, topk))


def permuted_probs(probs, routing_map):
    return paddle.masked_select(probs.cast(FP32).T, routing_map.T)


def combine(variant):
    def impl(expert_out, probs, routing_map, logits, options):
        outputs = {}
        if options["routing"] == "router":
            probs, routing_map = route(logits, options["topk"])
            outputs = {"routing.probs": probs, "routing.map": routing_map}
        rows = rows_by_token(routing_map, options["topk"])
        scale = permuted_probs(probs, routing_map) if options["apply_probs"] else None
        return outputs | {"out": variant(expert_out, scale, rows)}

    impl.__doc__ = variant.__doc__
    return impl


@combine
def default(expert_out, scale, rows):
    """PaddleFleet default: tokens x probs in the token dtype (probs rounded to it first), then
    scatter_(overwrite=False) into zeros of the token dtype: every add rounds."""
    dtype = expert_out.dtype
    weighted = expert_out.cast(FP32)
    if scale is not None:
        weighted = (weighted * scale.cast(dtype).cast(FP32).unsqueeze(-1)).cast(dtype).cast(FP32)
    out = weighted[rows[:, 0]]
    for k in range(1, rows.shape[1]):
        out = (out.cast(dtype).cast(FP32) + weighted[rows[:, k]])
    return out.cast(dtype)


@combine
def fp32_accumulate(expert_out, scale, rows):
    """Products and accumulation in fp32, one rounding at the end."""
    weighted = expert_out.cast(FP32)
    if scale is not None:
        weighted = weighted * scale.unsqueeze(-1)
    out = weighted[rows[:, 0]]
    for k in range(1, rows.shape[1]):
        out = out + weighted[rows[:, k]]
    return out.cast(expert_out.dtype)


@combine
def gather_sum(expert_out, scale, rows):
    """Products in the token dtype, gathered to [tokens, topk, hidden], then paddle.sum over topk
    (Paddle's bf16 sum kernel on CPU)."""
    dtype = expert_out.dtype
    weighted = expert_out.cast(FP32)
    if scale is not None:
        weighted = weighted * scale.cast(dtype).cast(FP32).unsqueeze(-1)
    gathered = paddle.stack([weighted[rows[:, k]] for k in range(rows.shape[1])], axis=1)
    return paddle.sum(gathered.cast(dtype), axis=1)


def _provenance(name: str) -> str:
    return f"xfalign Paddle variant: {name} (harness/ops/moe_combine/paddle.py)"


class MoeCombinePaddle(Implementations, family=MoeCombineFamily, framework="paddle"):
    default = variant(_provenance("default"))(default)
    fp32_accumulate = variant(_provenance("fp32_accumulate"))(fp32_accumulate)
    gather_sum = variant(_provenance("gather_sum"))(gather_sum)
