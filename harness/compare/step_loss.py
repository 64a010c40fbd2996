"""A step's loss, as one side's dump recorded it: `(train):loss.0` (capture's `cap.loss`), else a 0-d
`(root)#0:output.0` (a model that returns its loss); its value and its digest, for the per-step summary."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.store.digest import Digest
from harness.store.dump import Dump
from harness.store.tree_format import ROOT, call_tensor, train_tensor

LOSS = train_tensor("loss", 0)
ROOT_OUTPUT = call_tensor(ROOT, 0, "output", 0)  # the loss where no `(train):loss.0` was recorded: if 0-d


@dataclass(frozen=True)
class StepLoss:
    """A step's loss as one side recorded it."""

    tensor: str  # LOSS, or ROOT_OUTPUT
    value: float | None  # None: not known (a golden's digest, or a digest-only infinity: its stats keep no sign)
    digest: Digest


def step_loss(dump: Dump) -> StepLoss | None:
    """The loss a step's dump recorded: `(train):loss.0`, else a 0-d `(root)#0:output.0`; None: neither."""
    for name in (LOSS, ROOT_OUTPUT):
        digest = _digest(dump, name)
        if digest is not None and (digest.shape == () or (name == LOSS and math.prod(digest.shape) == 1)):
            return StepLoss(name, _value(dump, name), digest)
    return None


def _digest(dump: Dump, name: str) -> Digest | None:
    if name in dump.tensors:
        return Digest.of(np.asarray(dump.tensors[name]), xxh3=False)  # one scalar: its MD5, as the table shows it
    entry = dump.unstored.get(name)
    return Digest.from_json(entry) if entry is not None else None


def _value(dump: Dump, name: str) -> float | None:
    if name in dump.tensors:
        return float(np.asarray(dump.tensors[name]).astype(np.float64).reshape(()))
    stats = dump.unstored[name].get("stats")
    if stats is None:  # a golden's record: digests only
        return None
    if stats["mean"] is not None:  # over one finite element: the value, exactly (float64 holds every float dtype)
        return float(stats["mean"])
    return math.nan if stats["nan"] else None
