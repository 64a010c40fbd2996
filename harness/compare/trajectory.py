"""Two capture trees as a trajectory: each step summed up (its loss on both sides, how many tensors differ,
its first divergent tensor) and said of one kind:

    equal          every tensor compared is bitwise equal
    input-differs  the step starts from equal parameters and optimizer state, but the model's inputs
                   (`(root)#<call>:input.*`) differ: another batch, not numerics
    diverges       the step starts from equal state and differs anyway: the first divergent step, or a later
                   one whose starting state was equal again
    inherits       the step follows a step that differs and starts from different state: parameters at its
                   start (a `params` tensor) or optimizer state (or updated parameters) the step before left
                   different; `inherits_from` is the step where that run of differing steps began

The first divergent step is the first that differs (diverges, or input-differs: its kind says which).
The steps of a tree of several ranks compared rank by rank are summed up per step folder, their ranks together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from harness.store.digest import Digest
from harness.store.dump import Dump
from harness.store.tree_format import ROOT, STATE_ROLES, TensorName, call_tensor, train_tensor

if TYPE_CHECKING:
    from harness.compare.tree import Divergence, StepComparison

Kind = Literal["equal", "input-differs", "diverges", "inherits"]
KINDS: tuple[Kind, ...] = ("equal", "input-differs", "diverges", "inherits")
CARRIED_ROLES = (*STATE_ROLES, "updated")  # what an optimizer step hands to the next step
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


@dataclass
class StepSummary:
    index: int  # its position in the trajectory, from 0
    label: str  # the step folder
    steps: list[StepComparison]  # the step compared: one, or one per rank
    loss_a: StepLoss | None
    loss_b: StepLoss | None
    differing: int  # tensors not bitwise equal (or on one side only), of
    compared: int  # the tensors compared (not those the map could not make from digests)
    divergence: Divergence | None  # its first divergent tensor, in execution order (of its first rank that has one)
    kind: Kind
    inherits_from: int | None = None  # for "inherits": the index of the step where its divergence began


@dataclass
class Trajectory:
    steps: list[StepSummary]

    @property
    def first_divergent(self) -> StepSummary | None:
        return next((step for step in self.steps if step.kind != "equal"), None)


def trajectory_of(steps: list[StepComparison]) -> Trajectory:
    """The steps compared (in order; a tree of several ranks: each rank's, rank by rank) summed up per step."""
    groups: dict[str, list[StepComparison]] = {}
    for step in steps:
        groups.setdefault(step.label.rpartition("/")[2], []).append(step)
    summaries: list[StepSummary] = []
    carried = False  # the step before left optimizer state or updated parameters that differ
    for index, (label, members) in enumerate(groups.items()):
        differing = [(view.phase, result.name) for step in members for view in step.records for result in view.tensors
                     if not result.pair.bitwise and result.name not in step.left_out]
        compared = sum(result.name not in step.left_out for step in members for result in step.comparison.tensors)
        summary = StepSummary(
            index, label, members, next((s.loss_a for s in members if s.loss_a), None),
            next((s.loss_b for s in members if s.loss_b), None), len(differing), compared,
            next((s.divergence for s in members if s.divergence), None), "equal")
        if differing:
            summary.kind, summary.inherits_from = _kind(differing, carried, summaries[-1] if summaries else None)
        carried = any(phase == "optimizer" and _role(name) in CARRIED_ROLES for phase, name in differing)
        summaries.append(summary)
    return Trajectory(summaries)


def _kind(differing: list[tuple[str, str]], carried: bool, previous: StepSummary | None) -> tuple[Kind, int | None]:
    """The kind of a step with differing tensors (phase, name), and the step it inherits from."""
    start_differs = carried or any(phase == "params" for phase, _ in differing)
    if start_differs and previous is not None and previous.kind != "equal":
        return "inherits", previous.index if previous.inherits_from is None else previous.inherits_from
    if not start_differs and any(_is_model_input(name) for _, name in differing):
        return "input-differs", None
    return "diverges", None


def _role(name: str) -> str | None:
    parsed = TensorName.parse(name)
    return parsed.role if parsed else None


def _is_model_input(name: str) -> bool:
    parsed = TensorName.parse(name)
    return parsed is not None and parsed.module == ROOT and parsed.role == "input"
