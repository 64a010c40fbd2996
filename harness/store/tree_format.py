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
    <module>:param.<name>            the module's own parameter at the start of the step
    <module>:grad.<name>             its gradient at the end of the step (main_grad where the framework has one)

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
MODES = ("full", "digest", "digests-then-full")

Phase = Literal["params", "forward", "backward", "grads"]
Mode = Literal["full", "digest", "digests-then-full"]

_NAME = re.compile(r"^(?P<module>[^#:]+)(?:#(?P<call>\d+))?:(?P<role>input|output|grad_output|param|grad)\.(?P<slot>.+)$")


def step_folder(step: int) -> str:
    return f"step-{step:05d}"


def rank_folder(rank: int) -> str:
    return f"rank-{rank:05d}"


def call_tensor(module: str, call: int, role: str, slot: int | str) -> str:
    """The name of a tensor of one module call: role is input, output or grad_output."""
    return f"{module}#{call}:{role}.{slot}"


def param_tensor(module: str, role: str, param: str) -> str:
    """The name of a module's parameter (role "param") or its gradient (role "grad")."""
    return f"{module}:{role}.{param}"


class TensorName(BaseModel):
    """A captured tensor's name, taken apart."""

    model_config = ConfigDict(frozen=True)
    module: str
    call: int | None  # None for param and grad
    role: str  # input, output, grad_output, param, grad
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
    (inputs and outputs), the gradients arriving at one call's outputs, a module's parameter gradients."""

    model_config = ConfigDict(extra="forbid")
    module: str
    call: int | None = None  # None for params and grads
    phase: Phase
    tensors: list[str]


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
