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

from dataclasses import dataclass
from typing import Literal

from harness.compare.step_loss import StepLoss
from harness.compare.tree import Divergence, StepComparison, step_folder_of
from harness.store.tree_format import ROOT, STATE_ROLES, TensorName

Kind = Literal["equal", "input-differs", "diverges", "inherits"]
KINDS: tuple[Kind, ...] = ("equal", "input-differs", "diverges", "inherits")
CARRIED_ROLES = (*STATE_ROLES, "updated")  # what an optimizer step hands to the next step


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
        groups.setdefault(step_folder_of(step.label), []).append(step)
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
