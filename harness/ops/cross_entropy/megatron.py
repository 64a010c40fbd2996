"""Megatron side of vocab-parallel cross entropy: the real megatron.core.tensor_parallel.vocab_parallel_cross_entropy,
and the float64 reference made of its own steps."""

from __future__ import annotations

import torch
from megatron.core import tensor_parallel
from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy

from harness.frameworks.megatron_group import model_parallel_group
from harness.ops.cross_entropy import CrossEntropyFamily
from harness.ops.family import Implementations, NotAvailable, reference, variant


def require_ranks(ranks: int) -> None:
    """At TP > 1 this process must be one of `ranks` rank workers sharing a torch.distributed world."""
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    if ranks > 1 and world != ranks:
        raise NotAvailable(f"Megatron at tensor_parallel={ranks} runs on {ranks} rank workers, and this side runs in "
                           f"a world of {world} (the Paddle variant megatron_formula emulates the vocabulary split in "
                           "one process)")


def _provenance(options: dict) -> str:
    return (f"megatron-core: megatron.core.tensor_parallel.vocab_parallel_cross_entropy (TP={options['tensor_parallel']}, "
            f"label_smoothing={options['label_smoothing']})")


class CrossEntropyMegatron(Implementations, family=CrossEntropyFamily, framework="megatron"):
    @variant(provenance=_provenance)
    @staticmethod
    def megatron(logits, target, options):
        require_ranks(options["tensor_parallel"])
        with model_parallel_group(logits.device.type, options["tensor_parallel"]):
            # fp32 logits: `.float()` inside is a no-op and Megatron subtracts the max from them in place; the copy
            # keeps the case's input intact (in training they are the output layer's activations)
            return tensor_parallel.vocab_parallel_cross_entropy(logits.clone(), target, options["label_smoothing"])


class Float64CrossEntropy(torch.autograd.Function):
    """_VocabParallelCrossEntropy's forward and backward at TP=1 (no all-reduce: one rank holds the whole vocabulary),
    through VocabParallelCrossEntropy's own steps, in the logits' dtype: the max is taken here instead of in
    calculate_logits_max, whose `.float()` would narrow float64 logits to fp32, and the one-hot update is in float64
    (Megatron's `.float()` of the target mask, and (1 - smoothing) times it, would round in fp32)."""

    @staticmethod
    def forward(ctx, logits, target, label_smoothing):
        logits = logits.clone()  # calculate_predicted_logits works in place
        vocab = logits.size(-1)
        logits_max = torch.max(logits, dim=-1)[0]
        target_mask, masked_target_1d, predicted_logits, sum_exp_logits, exp_logits = \
            VocabParallelCrossEntropy.calculate_predicted_logits(logits, target, logits_max, 0, vocab)
        softmax, loss = VocabParallelCrossEntropy.calculate_cross_entropy_loss(exp_logits, predicted_logits,
                                                                               sum_exp_logits)
        smoothing = label_smoothing * vocab / (vocab - 1) if label_smoothing > 0 else 0.0
        if smoothing:
            loss = (1.0 - smoothing) * loss - smoothing * torch.log(softmax).mean(dim=-1)
        ctx.smoothing, ctx.vocab = smoothing, vocab
        ctx.save_for_backward(softmax, target_mask, masked_target_1d)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target_mask, masked_target_1d = ctx.saved_tensors
        grad_2d = softmax.view(-1, ctx.vocab)
        rows = torch.arange(grad_2d.size(0), device=grad_2d.device)
        update = 1.0 - target_mask.view(-1).to(softmax.dtype)
        grad_2d[rows, masked_target_1d] -= (1.0 - ctx.smoothing) * update
        if ctx.smoothing:
            grad_2d -= ctx.smoothing / ctx.vocab
        return softmax.mul_(grad_output.unsqueeze(dim=-1)), None, None


REFERENCE_PROVENANCE = (
    "float64 reference: megatron-core's vocab_parallel_cross_entropy at TP=1 written with its own steps "
    "(megatron.core.tensor_parallel.cross_entropy.VocabParallelCrossEntropy.calculate_predicted_logits and "
    "calculate_cross_entropy_loss; its backward's softmax - one-hot, times grad_output) in float64, run eagerly; "
    "the max is taken in float64 (calculate_logits_max would take the logits to fp32); label smoothing as Megatron "
    "at TP=1, over the whole vocabulary at any tensor_parallel (xfalign harness/ops/cross_entropy/megatron.py)")


@reference(provenance=REFERENCE_PROVENANCE)
def cross_entropy_reference(logits, target, options):
    """The loss the case describes, exactly: the vocabulary split changes only roundings (label smoothing aside,
    which Megatron gets wrong at TP > 1), so the reference is TP=1."""
    return Float64CrossEntropy.apply(logits, target, options["label_smoothing"])
