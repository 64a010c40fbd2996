"""The case schema: what a case file holds once validated (harness.load reads and validates the files)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from harness.compare.expectations import (
    Expectation,
    Report,
    expectation_type,
    spellings,
)
from harness.dtypes import INTEGER_DTYPES, NUMPY_DTYPES
from harness.errors import XfalignError
from harness.schema import NAME_RULE, Strict, is_safe_name

USER_IMPL = re.compile(r"^[\w./-]+(\.py)?:[A-Za-z_]\w*$")
# A sweep point's name: a safe name, then [label=value,...] (no path separators, no control characters).
POINT_NAME = re.compile(r"^(?P<base>[A-Za-z0-9][A-Za-z0-9_.-]*)(\[[^\x00-\x1f\x7f/\\]*\])?$")
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]


class CaseError(XfalignError):
    """Bad input: the message is one line naming file, line and field."""

    def __init__(self, message: str):
        # One line whatever the file holds: control characters (a newline in a key, say) are escaped.
        super().__init__(_CONTROL.sub(lambda m: repr(m.group())[1:-1], message))


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


REFERENCE_SIDE = "exact"  # the side name (and dump folder) of a case's float64 reference



class InputSpec(Strict):
    # items may be expressions over vars and options ("tokens * topk"); `true` is not a dimension
    shape: list[StrictInt] = Field(min_length=1)
    dtype: Literal[tuple(NUMPY_DTYPES)]  # type: ignore[valid-type]
    # normal, uniform: floats; randint: integers in [low, high); arange: 0..n-1 along the last axis
    dist: Literal["normal", "uniform", "randint", "arange"] = "normal"
    mean: float = Field(0.0, allow_inf_nan=False)
    std: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    low: float = Field(0.0, allow_inf_nan=False)
    high: float = Field(1.0, allow_inf_nan=False)
    seed: NonNegativeInt | None = None
    # Exact values planted at a fraction of positions (e.g. a clamp limit and its negative).
    special_values: list[float] = []
    special_fraction: float = Field(0.0, ge=0.0, le=1.0)
    grad: bool = True  # false: no gradient is taken for this input

    @field_validator("shape")
    @classmethod
    def _positive(cls, shape: list[int]) -> list[int]:
        if any(n <= 0 for n in shape):
            raise ValueError("every dimension must be positive")
        return shape

    @model_validator(mode="after")
    def _finite_range(self) -> InputSpec:
        if self.dist == "uniform" and not math.isfinite(self.high - self.low):
            raise ValueError(f"high - low must be a finite number, got {self.high} - {self.low}")
        if self.dist in ("randint", "arange") and self.dtype not in INTEGER_DTYPES:
            raise ValueError(f"dist {self.dist} makes integers: dtype is one of {', '.join(INTEGER_DTYPES)}")
        if self.dist == "randint" and not (self.low.is_integer() and self.high.is_integer() and self.low < self.high):
            raise ValueError(f"randint takes integers low < high (high excluded), got {self.low:g}, {self.high:g}")
        return self


class SideSpec(Strict):
    framework: str  # a registered framework adapter (harness.frameworks)
    impl: str | None = None  # a built-in variant, or module:function / path/to/file.py:function
    backward: str | None = None  # a user impl's hand-written backward, module:function / file.py:function
    mode: str | None = None  # an execution mode of the framework (its adapter's first when not given)
    device: Literal["cpu", "cuda"] | None = None  # this side's device; default: the case's

    @property
    def is_user_function(self) -> bool:
        return self.impl is not None and ":" in self.impl

    @property
    def implementation(self) -> str | None:
        """What this side runs: its impl, else its framework's default variant (None: neither; a validated
        case always has one)."""
        from harness.frameworks import adapter_for

        return self.impl or adapter_for(self.framework).default_impl

    @field_validator("framework")
    @classmethod
    def _known_framework(cls, framework: str) -> str:
        from harness.frameworks import known_frameworks

        if framework not in known_frameworks():
            raise ValueError(f"unknown framework {framework!r}; known: {', '.join(known_frameworks())}")
        return framework

    @field_validator("impl", "backward")
    @classmethod
    def _function_form(cls, target: str | None, info: ValidationInfo) -> str | None:
        if target is not None and (info.field_name == "backward" or ":" in target) and not USER_IMPL.match(target):
            raise ValueError("a user function is written module:function or path/to/file.py:function")
        if info.field_name == "backward" and target is not None and ":" not in (info.data.get("impl") or ""):
            raise ValueError("a backward goes with a user forward: set impl to module:function or file.py:function")
        return target

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, mode: str | None, info: ValidationInfo) -> str | None:
        from harness.frameworks import adapter_for

        if mode is None or "framework" not in info.data:
            return mode
        modes = adapter_for(info.data["framework"]).modes
        if mode not in modes:
            allowed = " or ".join(repr(m) for m in modes) if modes else "none (leave mode out)"
            raise ValueError(f"{info.data['framework']} execution modes: {allowed}, got {mode!r}")
        return mode


# An expectation: one of the kinds harness.compare.expectations registers, by its YAML key.
ExpectationField: Any = expectation_type(f"an expectation is {', '.join(spellings()[:-1])} or {spellings()[-1]}")


class ExpectSpec(Strict):
    all: ExpectationField = Report()
    tensors: dict[str, ExpectationField] = {}

    def for_tensor(self, name: str) -> Expectation:
        expectation: Expectation = self.tensors.get(name, self.all)
        return expectation


class Case(Strict):
    name: str
    description: str = ""
    sweep_of: str | None = None  # the sweep this case is a point of
    vars: dict[str, StrictInt] = {}  # names usable in shapes, and sweepable
    op: str
    options: dict[str, Any] = {}
    device: Literal["cpu", "cuda"] = "cpu"
    numerics: str | None = None  # a built-in profile (harness/profiles/; default portable-avx2) or a path to one
    timeout: float | None = Field(None, gt=0)  # seconds per side (default 600; --timeout overrides)
    seed: NonNegativeInt = 0
    inputs: dict[str, InputSpec]
    sides: dict[str, SideSpec]
    expect: ExpectSpec = ExpectSpec()
    source: str = Field("", exclude=True)  # the YAML file, for messages

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        match = POINT_NAME.match(name)
        if match is None or not is_safe_name(match["base"]):
            raise ValueError(f"{name!r} is not a safe case name: {NAME_RULE}")
        return name

    @field_validator("sides")
    @classmethod
    def _two_sides(cls, sides: dict[str, SideSpec]) -> dict[str, SideSpec]:
        if len(sides) != 2:
            raise ValueError(f"a case has exactly two sides, found {len(sides)}")
        for name in sides:
            if not is_safe_name(name):
                raise ValueError(f"{name!r} is not a safe side name: {NAME_RULE}")
            if name == REFERENCE_SIDE:
                raise ValueError(f"{REFERENCE_SIDE!r} names the float64 reference: name the side otherwise")
        return sides

    def to_json(self) -> dict:
        return self.model_dump(mode="json")

    def device_of(self, side: str) -> str:
        return self.sides[side].device or self.device


SEED_STRIDE = 1000  # reseeded(case, k) shifts every seed by k * SEED_STRIDE


def reseeded(case: Case, k: int) -> Case:
    """The case with every seed (the case's and each input's own) shifted by k * SEED_STRIDE, named as a
    sweep point of `seed` (for `xfalign run --seeds N`: the same case on other inputs)."""
    shift = k * SEED_STRIDE
    inputs = {name: spec.model_copy(update={"seed": spec.seed + shift}) if spec.seed is not None else spec
              for name, spec in case.inputs.items()}
    seed = case.seed + shift
    name = f"{case.name[:-1]},seed={seed}]" if case.name.endswith("]") else f"{case.name}[seed={seed}]"
    return case.model_copy(update={"seed": seed, "inputs": inputs, "name": name, "sweep_of": case.sweep_of or case.name})


def user_function_file(case_source: str, target: str) -> Path:
    """A user function's file: relative to the case file's folder (never the working directory)."""
    return Path(case_source).parent / target
