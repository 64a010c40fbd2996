"""What both sides of the training demo share, with no framework imported: sizes, the optimizer's schedule,
the batches, and Megatron's learning-rate formula (megatron/core/optimizer_param_scheduler.py get_lr), which the
Paddle side's scheduler returns (the Megatron side runs megatron-core's own OptimizerParamScheduler)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sizes:
    """The model and data sizes. The float32 GEMMs' inner dimensions (hidden, 2 * ffn, vocab) stay <= 192, where
    torch's MKL sgemm runs one FMA chain (torch_exact.k_blocks knows the larger cases too)."""

    vocab: int = 128
    hidden: int = 64
    ffn: int = 64
    layers: int = 2
    seq: int = 128
    batch: int = 8  # seq * batch = 1024 tokens per step
    steps: int = 10
    init_std: float = 0.05  # megatron-core's init_method_std (Megatron-LM --init-method-std): the grad norm starts
    # above the clip (1.0) and falls below it from step 3 on, so both regimes of the clip are exercised

    @property
    def tokens(self) -> int:
        return self.seq * self.batch


@dataclass(frozen=True)
class Schedule:
    """Megatron-LM's defaults where it has them (betas 0.9/0.999, eps 1e-8, clip 1.0, lr warmup from 0), a short
    cosine decay, weight decay 0.1 (none on 1-D parameters: megatron-core's param groups)."""

    max_lr: float = 1e-2
    min_lr: float = 1e-3
    warmup: int = 2
    decay: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    clip: float = 1.0


SIZES, SCHEDULE = Sizes(), Schedule()
EOD = 0  # the loss mask is 0 where the label is EOD (Megatron-LM's --eod-mask-loss)
RMS_EPS = 1e-5  # megatron-core's layernorm_epsilon default, PaddleFormers' rms_norm_eps here


def megatron_lr(schedule: Schedule, step: int) -> float:
    """OptimizerParamScheduler.get_lr at num_steps=`step` (init_lr 0, linear warmup, cosine), the same float
    operations in the same order."""
    init_lr = 0.0
    if schedule.warmup > 0 and step <= schedule.warmup:
        return init_lr + ((schedule.max_lr - init_lr) * float(step) / float(schedule.warmup))
    if step > schedule.decay:
        return schedule.min_lr
    decay_ratio = float(step - schedule.warmup) / float(schedule.decay - schedule.warmup)
    coeff = 0.5 * (math.cos(math.pi * decay_ratio) + 1.0)
    return schedule.min_lr + coeff * (schedule.max_lr - schedule.min_lr)


def batches(sizes: Sizes = SIZES, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """Fixed token ids, one batch per step: tokens [b, s] (int64), labels (the next token), loss_mask (float32,
    0 where the label is EOD). The text follows a fixed successor table with 20% random tokens: a bigram model
    (which a language model without attention is) can learn it."""
    rng = np.random.default_rng(seed)
    successor = rng.permutation(sizes.vocab)
    out = []
    for _ in range(sizes.steps):
        text = np.empty((sizes.batch, sizes.seq + 1), dtype=np.int64)
        text[:, 0] = rng.integers(0, sizes.vocab, sizes.batch)
        for t in range(sizes.seq):
            noise = rng.random(sizes.batch) < 0.2
            text[:, t + 1] = np.where(noise, rng.integers(0, sizes.vocab, sizes.batch), successor[text[:, t]])
        labels = text[:, 1:].copy()
        out.append({"tokens": text[:, :-1].copy(), "labels": labels, "loss_mask": (labels != EOD).astype(np.float32)})
    return out
