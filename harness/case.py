"""The case: a YAML file, validated on load, with errors that name file, line and field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.dtypes import NUMPY_DTYPES

USER_IMPL = re.compile(r"^[\w./-]+(\.py)?:[A-Za-z_]\w*$")


class CaseError(Exception):
    """Bad input: the message is one line naming file, line and field."""


class FieldProblem(Exception):
    """Raised by op families during validation; `path` locates the field in the case."""

    def __init__(self, path: tuple, message: str):
        super().__init__(message)
        self.path = path
        self.message = message


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(Strict):
    shape: list[int] = Field(min_length=1)
    dtype: Literal[tuple(NUMPY_DTYPES)]  # type: ignore[valid-type]
    dist: Literal["normal", "uniform"] = "normal"
    mean: float = 0.0
    std: float = 1.0
    low: float = 0.0
    high: float = 1.0
    seed: int | None = None
    # Exact values planted at a fraction of positions (e.g. a clamp limit and its negative).
    special_values: list[float] = []
    special_fraction: float = Field(0.0, ge=0.0, le=1.0)

    @field_validator("shape")
    @classmethod
    def _positive(cls, shape: list[int]) -> list[int]:
        if any(n <= 0 for n in shape):
            raise ValueError("every dimension must be positive")
        return shape


class SideSpec(Strict):
    framework: Literal["megatron", "paddle"]
    impl: str | None = None  # a built-in variant, or module:function / path/to/file.py:function
    mode: Literal["compile", "eager"] = "compile"  # Megatron execution mode (torch.compile or eager)

    @property
    def is_user_function(self) -> bool:
        return self.impl is not None and ":" in self.impl

    @field_validator("impl")
    @classmethod
    def _impl_form(cls, impl: str | None) -> str | None:
        if impl is not None and ":" in impl and not USER_IMPL.match(impl):
            raise ValueError("a user function is written module:function or path/to/file.py:function")
        return impl


class MaxUlp(Strict):
    max_ulp: int = Field(ge=0)


Expectation = Union[Literal["bitwise", "report"], MaxUlp]


class ExpectSpec(Strict):
    all: Expectation = "report"
    tensors: dict[str, Expectation] = {}

    def for_tensor(self, name: str) -> Expectation:
        return self.tensors.get(name, self.all)


def describe_expectation(expectation: Expectation) -> str:
    return expectation if isinstance(expectation, str) else f"max_ulp {expectation.max_ulp}"


class Case(Strict):
    name: str
    description: str = ""
    op: str
    options: dict[str, Any] = {}
    device: Literal["cpu", "cuda"] = "cpu"
    seed: int = 0
    inputs: dict[str, InputSpec]
    sides: dict[str, SideSpec]
    expect: ExpectSpec = ExpectSpec()
    source: str = Field("", exclude=True)  # the YAML file, for messages

    @field_validator("sides")
    @classmethod
    def _two_sides(cls, sides: dict[str, SideSpec]) -> dict[str, SideSpec]:
        if len(sides) != 2:
            raise ValueError(f"a case has exactly two sides, found {len(sides)}")
        return sides

    def to_json(self) -> dict:
        return self.model_dump(mode="json")


def _line_map(node: yaml.Node, path: tuple = (), lines: dict | None = None) -> dict[tuple, int]:
    """Map each field path (keys and list indices) to its 1-based line in the YAML text."""
    lines = {} if lines is None else lines
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            lines[path + (key.value,)] = key.start_mark.line + 1
            _line_map(value, path + (key.value,), lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _line_map(item, path + (index,), lines)
    return lines


def _locate(lines: dict[tuple, int], loc: tuple) -> tuple[int, str]:
    """Longest prefix of a pydantic/family location that exists in the file, and its dotted name."""
    data_loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p == "MaxUlp")))
    for n in range(len(data_loc), -1, -1):
        if data_loc[:n] in lines:
            return lines[data_loc[:n]], ".".join(str(p) for p in data_loc) or "(top level)"
    return 1, ".".join(str(p) for p in data_loc)


def validate_case(data: Any, source: str, lines: dict[tuple, int] | None = None) -> Case:
    """Validate parsed YAML (schema, then the op family's own rules)."""
    from harness.ops import family_for

    lines = lines or {}
    if not isinstance(data, dict):
        raise CaseError(f"{source}:1: (top level): a case is a mapping of fields")
    data = {"name": Path(source).stem, **data}
    try:
        case = Case(**data, source=source)
        family_for(case.op).validate(case)
    except ValidationError as error:
        # In a union, the member that got deepest into the value explains the problem best.
        first = max(error.errors(), key=lambda e: len(e["loc"]))
        line, field = _locate(lines, first["loc"])
        message = first["msg"]
        if first["type"] == "literal_error":
            message = f"{message}, got {first['input']!r}"
        raise CaseError(f"{source}:{line}: {field}: {message}") from None
    except FieldProblem as problem:
        line, field = _locate(lines, problem.path)
        raise CaseError(f"{source}:{line}: {field}: {problem.message}") from None
    return case


def load_case(path: str | Path) -> Case:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise CaseError(f"{path}: cannot read case file: {error.strerror}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise CaseError(f"{path}:{line}: (yaml): {problem}") from None
    lines = _line_map(node) if node is not None else {}
    return validate_case(data, str(path), lines)
