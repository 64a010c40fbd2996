"""Paddle side of vocab-parallel cross entropy. Every variant takes the logits to fp32 first, as Megatron and
PaddleFleet do (Paddle 3.3.1 has no CPU bf16 kernel of cross_entropy_with_softmax either); the cast's backward
rounds the fp32 gradient to the logits' dtype, as torch's autograd does with the gradient Megatron returns."""

from __future__ import annotations

import paddle

from harness.ops.cross_entropy import CrossEntropyFamily
from harness.ops.family import Implementations, NotAvailable, variant

FP32 = paddle.float32

LANGUAGE_LOSS = ("PaddlePaddle/PaddleFleet@00c72d67cc08c97ac2fb9f806120c71d14018216 "
                 "src/paddlefleet/models/common/language_loss/language_loss.py (LanguageLoss)")


def paddle_smoothing(alpha: float, vocab: int) -> float:
    """Paddle's label_smoothing spreads epsilon over all vocab tokens, Megatron's alpha over the vocab - 1 others:
    the same loss needs epsilon = alpha * vocab / (vocab - 1) (Megatron's own `smoothing`)."""
    return alpha * vocab / (vocab - 1) if alpha > 0 else 0.0


def cross_entropy(logits, target, options):
    """paddle.nn.CrossEntropyLoss(reduction="none") on logits.cast("float32"): PaddleFleet's loss where tensor
    parallelism is off. The vocabulary is whole whatever options.tensor_parallel says. With label smoothing Paddle
    takes its soft-label path, which keeps a trailing axis of 1: the loss is given the target's shape."""
    smoothing = paddle_smoothing(options["label_smoothing"], logits.shape[-1])
    loss = paddle.nn.CrossEntropyLoss(reduction="none", label_smoothing=smoothing)(logits.cast(FP32), target)
    return loss.reshape(target.shape)


def _scalar(value: float):
    """A Python float as a 0-d fp32 tensor: torch rounds a scalar operand to fp32 and multiplies in fp32."""
    return paddle.full([], value, dtype=FP32)


def in_rank_order(combine, values: list):
    """values[0] combined with values[1], the result with values[2], ...: an all-reduce's sum in rank order."""
    total = values[0]
    for value in values[1:]:
        total = combine(total, value)
    return total


class MegatronFormula(paddle.autograd.PyLayer):
    """megatron.core.tensor_parallel.cross_entropy._VocabParallelCrossEntropy, step for step in Paddle ops on fp32
    logits, its vocabulary split into `ranks` consecutive slices in one process: the max of each slice, then the max
    of those (the MAX all-reduce: exact in any order); each slice's logits minus it, exp, sum; the slices' sums and
    predicted logits (0 on the slices that do not hold the target) added in rank order (the SUM all-reduces); loss =
    log(sum) - predicted; softmax = exp / sum. Label smoothing as Megatron at TP > 1: each rank with its own slice's
    size and mean log-probability; the loss returned is rank 0's. Backward per slice: softmax, minus (1 - smoothing)
    at the target, minus smoothing / slice size everywhere when smoothing, times grad_out. PaddleFleet's port of
    Megatron's function (PaddlePaddle/PaddleFleet@1acbd02e45ba95fcddaa7763da509112d6697f14
    src/paddlefleet/tensor_parallel/cross_entropy.py) takes the same Paddle ops on one rank's slice."""

    @staticmethod
    def forward(ctx, logits, target, ranks, label_smoothing):
        slices = paddle.split(logits, ranks, axis=-1)
        width = slices[0].shape[-1]
        logits_max = in_rank_order(paddle.maximum, [piece.max(axis=-1) for piece in slices])
        exps, masks, local_targets, picks = [], [], [], []
        for rank, piece in enumerate(slices):
            shifted = piece - logits_max.unsqueeze(-1)
            outside = (target < rank * width) | (target >= (rank + 1) * width)
            local = paddle.where(outside, paddle.zeros_like(target), target - rank * width)
            picked = paddle.take_along_axis(shifted, local.unsqueeze(-1), axis=-1).squeeze(-1)
            picks.append(paddle.where(outside, paddle.zeros_like(picked), picked))
            exps.append(paddle.exp(shifted))
            masks.append(outside)
            local_targets.append(local)
        predicted = in_rank_order(paddle.add, picks)
        sum_exp = in_rank_order(paddle.add, [exp.sum(axis=-1) for exp in exps])
        loss = paddle.log(sum_exp) - predicted
        softmaxes = [exp / sum_exp.unsqueeze(-1) for exp in exps]
        smoothing = label_smoothing * width / (width - 1) if label_smoothing > 0 else 0.0
        if smoothing:
            mean_log_probs = paddle.log(softmaxes[0]).sum(axis=-1) / _scalar(width)  # torch's CPU mean: sum / n
            loss = _scalar(1.0 - smoothing) * loss - _scalar(smoothing) * mean_log_probs
        ctx.smoothing, ctx.width = smoothing, width
        ctx.save_for_backward(*softmaxes, *masks, *local_targets)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        saved = ctx.saved_tensor()
        ranks = len(saved) // 3
        softmaxes, masks, local_targets = saved[:ranks], saved[ranks:2 * ranks], saved[2 * ranks:]
        grads = []
        for softmax, outside, local in zip(softmaxes, masks, local_targets):
            update = 1.0 - outside.cast(FP32)
            if ctx.smoothing:
                update = _scalar(1.0 - ctx.smoothing) * update
            index = local.unsqueeze(-1)
            at_target = paddle.take_along_axis(softmax, index, axis=-1) - update.unsqueeze(-1)
            grad = paddle.put_along_axis(softmax, index, at_target, axis=-1)
            if ctx.smoothing:
                grad = grad - _scalar(ctx.smoothing * (1 / ctx.width))
            grads.append(grad * grad_output.unsqueeze(-1))
        return paddle.concat(grads, axis=-1), None


def megatron_formula(logits, target, options):
    """Megatron's arithmetic (MegatronFormula) on logits.cast("float32"), with the vocabulary split into
    options.tensor_parallel slices as Megatron's ranks hold it."""
    return MegatronFormula.apply(logits.cast(FP32), target, options["tensor_parallel"], options["label_smoothing"])


def fleet_parallel(logits, target, options):
    """What paddle.distributed.fleet.meta_parallel.ParallelCrossEntropy (PaddleFleet's LanguageLoss under tensor
    parallelism) runs: mp_ops._c_softmax_with_cross_entropy on logits.cast("float32"), here with no group (one
    rank). Paddle's CPU builds have no kernel for it, in one process or several."""
    from paddle.distributed.fleet.layers.mpu import mp_ops

    if options["label_smoothing"] > 0:
        raise NotAvailable("ParallelCrossEntropy has no label smoothing")
    try:
        loss = mp_ops._c_softmax_with_cross_entropy(logits.cast(FP32), target, group=None)
    except RuntimeError as error:
        if "(Unavailable)" not in str(error):
            raise
        raise NotAvailable(f"mp_ops._c_softmax_with_cross_entropy (ParallelCrossEntropy): "
                           f"{str(error).strip().splitlines()[0]}") from None
    if options["tensor_parallel"] > 1:
        raise NotAvailable(f"ParallelCrossEntropy at tensor_parallel={options['tensor_parallel']} runs in that many "
                           "processes, which the Paddle side does not start")
    return loss.squeeze(-1)


def _provenance(text: str):
    return lambda options: f"{text} (xfalign harness/ops/cross_entropy/paddle.py)"


class CrossEntropyPaddle(Implementations, family=CrossEntropyFamily, framework="paddle"):
    cross_entropy = variant(_provenance(
        f"paddle.nn.CrossEntropyLoss(reduction='none') on logits.cast('float32'), as {LANGUAGE_LOSS} computes the "
        "loss without tensor parallelism; label_smoothing alpha passed as alpha * vocab / (vocab - 1)"))(cross_entropy)
    megatron_formula = variant(lambda options: (
        "xfalign Paddle variant: megatron.core.tensor_parallel.vocab_parallel_cross_entropy's arithmetic in Paddle ops "
        f"(fp32; max, exp, sum, log, softmax - one-hot), vocabulary split into {options['tensor_parallel']} slice(s) "
        "combined in rank order (harness/ops/cross_entropy/paddle.py)"))(megatron_formula)
    fleet_parallel = variant(_provenance(
        "paddle.distributed.fleet.layers.mpu.mp_ops._c_softmax_with_cross_entropy, the op of "
        f"paddle.distributed.fleet.meta_parallel.ParallelCrossEntropy, which {LANGUAGE_LOSS} uses under tensor "
        "parallelism, on logits.cast('float32')"))(fleet_parallel)
