"""The case: a YAML file, validated on load, with errors that name file, line and field."""

from __future__ import annotations

import ast
import copy
import itertools
import operator
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
    shape: list[int] = Field(min_length=1)  # items may be expressions over vars and options: "tokens * topk"
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
    device: Literal["cpu", "cuda"] | None = None  # this side's device; default: the case's

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
    sweep_of: str | None = None  # the sweep this case is a point of
    vars: dict[str, int] = {}  # names usable in shapes, and sweepable
    op: str
    options: dict[str, Any] = {}
    device: Literal["cpu", "cuda"] = "cpu"
    numerics: str | None = None  # a profile in configs/numerics/ (default portable-avx2) or a path to one
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

    def device_of(self, side: str) -> str:
        return self.sides[side].device or self.device


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


def _eval_dim(text: str, names: dict[str, Any]) -> int:
    """An int expression over names: + - * // and parentheses, nothing else."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name) and type(names.get(node.id)) is int:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"cannot evaluate {ast.unparse(node)!r} (known: {', '.join(sorted(names)) or 'none'})")

    return value(ast.parse(text, mode="eval"))


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def _resolve_shapes(data: dict) -> None:
    names = {**(data.get("options") or {}), **(data.get("vars") or {})}
    for name, spec in (data.get("inputs") or {}).items():
        if isinstance(spec, dict) and isinstance(spec.get("shape"), list):
            for i, dim in enumerate(spec["shape"]):
                if isinstance(dim, str):
                    try:
                        spec["shape"][i] = _eval_dim(dim, names)
                    except (ValueError, SyntaxError) as error:
                        raise FieldProblem(("inputs", name, "shape", i), str(error)) from None


def _short(value: Any) -> str:
    if isinstance(value, list):
        return "x".join(map(str, value))
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}.get(str(value), str(value))


def _apply(point: dict, label: str, value: Any, working_inputs: tuple[str, ...]) -> None:
    """Set one sweep value: a var, seed, dtype (the family's working-dtype inputs), a dotted path, or an option."""
    if label in (point.get("vars") or {}):
        point["vars"][label] = value
    elif label == "seed":
        point["seed"] = value
    elif label == "dtype":
        for name in working_inputs:
            if name in point.get("inputs", {}):
                point["inputs"][name]["dtype"] = value
    elif "." in label:
        *parents, leaf = label.split(".")
        target = point
        for key in parents:
            if not isinstance(target.get(key), dict):
                raise FieldProblem(("sweep", label), f"no field {key!r} on the way to {label!r}")
            target = target[key]
        target[leaf] = value
    else:
        point.setdefault("options", {})[label] = value


def expand_sweep(data: dict) -> list[dict]:
    """A case with `sweep: {label: [values]}` becomes one case per combination, named base[label=value,...]."""
    from harness.ops import family_for

    sweep = data.pop("sweep", None)
    if sweep is None:
        return [data]
    if not isinstance(sweep, dict) or not sweep:
        raise FieldProblem(("sweep",), "sweep is a mapping of label: [values]")
    for label, values in sweep.items():
        if not isinstance(values, list) or not values:
            raise FieldProblem(("sweep", label), "a sweep label takes a non-empty list of values")
    working = family_for(str(data.get("op"))).working_inputs
    expect = data.get("expect") if isinstance(data.get("expect"), dict) else {}
    per_point = expect.pop("points", None) or {}
    points = []
    for values in itertools.product(*sweep.values()):
        point = copy.deepcopy(data)
        for label, value in zip(sweep, values):
            _apply(point, label, value, working)
        point_id = ",".join(f"{label}={_short(value)}" for label, value in zip(sweep, values))
        point["name"] = f"{data['name']}[{point_id}]"
        point["sweep_of"] = data["name"]
        if point_id in per_point:
            point["expect"] = _merge_expect(expect, per_point[point_id], point_id)
        points.append(point)
    unknown = sorted(set(per_point) - {p["name"][len(data["name"]) + 1:-1] for p in points})
    if unknown:
        raise FieldProblem(("expect", "points", unknown[0]), f"no sweep point {unknown[0]!r} in this sweep")
    return points


def _merge_expect(base: dict, override: Any, point_id: str) -> dict:
    """A point's expectations: its own `all` and `tensors` over the sweep's."""
    if not isinstance(override, dict):
        raise FieldProblem(("expect", "points", point_id), "a point's expectations are a mapping (all, tensors)")
    merged = {**base, **{k: v for k, v in override.items() if k != "tensors"}}
    merged["tensors"] = {**(base.get("tensors") or {}), **(override.get("tensors") or {})}
    return merged


def validate_cases(data: Any, source: str, lines: dict[tuple, int] | None = None) -> list[Case]:
    """Validate parsed YAML: sweep expansion, shape expressions, schema, then the op family's rules."""
    from harness.ops import family_for

    lines = lines or {}
    if not isinstance(data, dict):
        raise CaseError(f"{source}:1: (top level): a case is a mapping of fields")
    data = {"name": Path(source).stem, **data}
    cases, point = [], None
    try:
        for point in expand_sweep(data):
            if isinstance(point.get("op"), str):  # options first: shapes may be computed from them
                family_for(point["op"]).parse_options(point.get("options") or {})
            _resolve_shapes(point)
            case = Case(**point, source=source)
            family_for(case.op).validate(case)
            _check_numerics(case)
            cases.append(case)
    except ValidationError as error:
        # In a union, the member that got deepest into the value explains the problem best.
        first = max(error.errors(), key=lambda e: len(e["loc"]))
        line, field = _locate(lines, first["loc"])
        message = first["msg"]
        if first["type"] == "literal_error":
            message = f"{message}, got {first['input']!r}"
        raise CaseError(f"{source}:{line}: {field}: {message}{_in_point(point)}") from None
    except FieldProblem as problem:
        line, field = _locate(lines, problem.path)
        raise CaseError(f"{source}:{line}: {field}: {problem.message}{_in_point(point)}") from None
    return cases


def _check_numerics(case: Case) -> None:
    from harness.numerics import ProfileError, load_profile

    try:
        load_profile(case.numerics, case.source)
    except ProfileError as error:
        raise FieldProblem(("numerics",), str(error)) from None


def _in_point(point: dict | None) -> str:
    return f" (in sweep point {point['name']})" if point and point.get("sweep_of") else ""


def load_cases(path: str | Path) -> list[Case]:
    """A case file: one case, or one per sweep point."""
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
    return validate_cases(data, str(path), lines)


def load_case(path: str | Path) -> Case:
    """A case file that holds one case (no sweep)."""
    cases = load_cases(path)
    if len(cases) != 1:
        raise CaseError(f"{path}:1: sweep: this file is a sweep of {len(cases)} points; run it with xfalign run")
    return cases[0]
