"""What a capture writes: a tree of xfalign dumps, one per step, and the names of the tensors in them.

    TREE/                      one capture (one process); with world size > 1: TREE/rank-00003/...
      capture.json             CaptureManifest: framework, mode, rank, world size, the steps written
      step-00000/              an ordinary xfalign dump (meta.json + tensors.safetensors) whose
      step-00001/              meta.json has a `capture` section (CaptureInfo)

A tensor's name says which module call and which role it comes from:

    <module>#<call>:input.<i>        positional tensor inputs, flattened, numbered from 0
    <module>#<call>:input.<key>      keyword tensor inputs
    <module>#<call>:output.<i>       tensor leaves of the output (tuples, lists, dicts flattened)
    <module>#<call>:grad_output.<i>  gradient arriving at output <i> in the backward pass
    <module>:param.<name>            the module's own parameter as the step's forward pass read it
    <module>:grad.<name>             its gradient at the end of the step (main_grad where the framework has one)

With an optimizer captured (`capture(..., optimizer=opt)`), the optimizer step adds, per parameter and under
the same module as its `:param.` record (so a map's module pairs apply to them too):

    <module>:grad_clipped.<name>     the gradient the optimizer consumed (after the framework's clipping)
    <module>:<state>.<name>          the optimizer's state after the step, under the framework's own name:
                                     torch exp_avg, exp_avg_sq, max_exp_avg_sq, step; Megatron main_param;
                                     Paddle moment1, moment2, moment2_max, beta1_pow_acc, beta2_pow_acc,
                                     master_weight (a map's `roles:` pairs them across frameworks)
    <module>:updated.<name>          the parameter after the step (the bf16 copy-back included)

and the step's scalars, under the pseudo-module `(train)`:

    (train):loss.0                   the loss the step reported (`cap.loss(value)`)
    (train):lr.<group>               the learning rate of each parameter group, as the optimizer used it
    (train):grad_norm.pre_clip       the global L2 norm of the :grad. tensors, float64, computed by xfalign
    (train):grad_norm.post_clip      the same of the :grad_clipped. tensors
    (train):grad_norm.reported       the framework's own norm, where it returns one (Megatron's step)

The loss record (phase "loss") comes before the step's first backward record; the optimizer's records (phase
"optimizer") come last, the `(train)` one (learning rates, norms) before the modules' (execution order).

<module> is the module's dotted path in the model (`decoder.layers.0.mlp.linear_fc1`), `(root)` for the
model itself; <call> counts that module's calls within the step, from 0.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict

CAPTURE_FORMAT = "xfalign-capture/1"
MANIFEST_FILE = "capture.json"
ROOT = "(root)"
TRAIN = "(train)"  # the pseudo-module of a step's scalars: loss, learning rates, grad norms
MODES = ("full", "digest", "digests-then-full")

Phase = Literal["params", "forward", "backward", "grads", "loss", "optimizer"]
# the execution order of a step's phases: a trajectory's first divergence is the first in this order
PHASE_ORDER: dict[str, int] = {"params": 0, "forward": 1, "loss": 2, "backward": 3, "grads": 4, "optimizer": 5}

CALL_ROLES = ("input", "output", "grad_output")
PARAM_ROLES = ("param", "grad")
STEP_ROLES = ("grad_clipped", "updated")  # per parameter, recorded by the optimizer step
# optimizer states, by the frameworks' own names
STATE_ROLES = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step", "main_param",
               "moment1", "moment2", "moment2_max", "beta1_pow_acc", "beta2_pow_acc", "master_weight")
TRAIN_ROLES = ("loss", "lr", "grad_norm")
Mode = Literal["full", "digest", "digests-then-full"]

ROLES = CALL_ROLES + PARAM_ROLES + STEP_ROLES + STATE_ROLES + TRAIN_ROLES
_NAME = re.compile(r"^(?P<module>[^#:]+)(?:#(?P<call>\d+))?:(?P<role>" + "|".join(ROLES) + r")\.(?P<slot>.+)$")


def step_folder(step: int) -> str:
    return f"step-{step:05d}"


def rank_folder(rank: int) -> str:
    return f"rank-{rank:05d}"


def call_tensor(module: str, call: int, role: str, slot: int | str) -> str:
    """The name of a tensor of one module call: role is input, output or grad_output."""
    return f"{module}#{call}:{role}.{slot}"


def param_tensor(module: str, role: str, param: str) -> str:
    """The name of a module's parameter (role "param"), its gradient ("grad") or of what the optimizer step
    records of it (a STEP_ROLES or STATE_ROLES role)."""
    return f"{module}:{role}.{param}"


def train_tensor(role: str, slot: int | str) -> str:
    """The name of one of a step's scalars (TRAIN_ROLES): `(train):loss.0`, `(train):lr.0`, ..."""
    return f"{TRAIN}:{role}.{slot}"


class TensorName(BaseModel):
    """A captured tensor's name, taken apart."""

    model_config = ConfigDict(frozen=True)
    module: str
    call: int | None  # None but for a module call's tensors
    role: str  # one of ROLES
    slot: str  # the index, keyword or parameter name

    @classmethod
    def parse(cls, name: str) -> TensorName | None:
        match = _NAME.match(name)
        if match is None:
            return None
        call = match["call"]
        return cls(module=match["module"], call=None if call is None else int(call), role=match["role"], slot=match["slot"])


class TensorStats(BaseModel):
    """Statistics of a float tensor (computed in float64; over finite values; None when there are none)."""

    model_config = ConfigDict(extra="forbid")
    min: float | None
    max: float | None
    mean: float | None
    norm: float | None  # L2 norm
    nan: int
    inf: int


class ModuleInfo(BaseModel):
    """A selected module: its path, its class name, the selected module it sits in (None: none)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    type: str
    parent: str | None = None


class Record(BaseModel):
    """One event of the step, in execution order: a module's parameters at the start, one call's forward
    (inputs and outputs), the loss, the gradients arriving at one call's outputs, a module's parameter
    gradients, what the optimizer step did to a module's parameters (or the step's scalars: module TRAIN)."""

    model_config = ConfigDict(extra="forbid")
    module: str
    call: int | None = None  # None but for forward and backward
    phase: Phase
    tensors: list[str]


class LiveCheck(BaseModel):
    """A step checked while it ran against a reference tree's step (`capture(..., reference=TREE)`)."""

    model_config = ConfigDict(extra="forbid")
    reference: str  # the reference tree's step folder
    checked: int  # tensors whose digest was compared with the reference's
    differing: list[str]  # those that differed, in record order
    not_checkable: list[str]  # tensors the reference has no digest for under this side's names
    full: bool  # this step's tensors were kept in full (it diverged, or came after the divergence)


class Divergence(BaseModel):
    """Where a live-checked capture first differed from its reference."""

    model_config = ConfigDict(extra="forbid")
    step: int
    tensor: str


class CaptureInfo(BaseModel):
    """The `capture` section of a step dump's meta.json."""

    model_config = ConfigDict(extra="forbid")
    step: int
    mode: Mode
    rank: int | None = None  # None when no distributed group was initialized
    world_size: int | None = None
    root: str  # the model's class name
    modules: list[ModuleInfo]  # the selected modules, in the model's order
    records: list[Record]  # in execution order
    live: LiveCheck | None = None  # None: not checked against a reference while it ran


class CaptureManifest(BaseModel):
    """capture.json at the top of a tree (or of a rank's folder)."""

    model_config = ConfigDict(extra="forbid")
    format: Literal["xfalign-capture/1"]
    xfalign: str
    side: str
    framework: str
    mode: Mode
    rank: int | None = None
    world_size: int | None = None
    root: str
    steps: list[str]  # step folders written, in order
    optimizer: str | None = None  # the class of the optimizer whose steps were captured
    reference: str | None = None  # the tree each step was checked against while it ran
    diverged: Divergence | None = None  # the first step (and tensor) that differed from the reference
