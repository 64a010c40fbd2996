"""The case: a YAML file, validated on load, with errors that name file, line and field."""

from __future__ import annotations

import ast
import copy
import importlib.machinery
import importlib.util
import itertools
import math
import operator
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    Field,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from harness.compare.expectations import (
    Expectation,
    Report,
    expectation_type,
    spellings,
    tag_names,
)
from harness.dtypes import INTEGER_DTYPES, NUMPY_DTYPES
from harness.errors import XfalignError, describe_value, validation_problem
from harness.schema import MAX_NAME_CHARS, NAME_RULE, FieldProblem, Strict, is_safe_name

if TYPE_CHECKING:
    from harness.numerics import Profiles

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


MAX_CASE_BYTES = 1 << 20  # a case file is text a person writes
MAX_YAML_DEPTH = 32  # nesting levels of mappings and lists
MAX_READABLE_DEPTH = 100  # beyond this a file is refused before its nodes are built
MAX_YAML_NODES = 100_000  # nodes visited, aliases followed (a "billion laughs" file stops here)


class DuplicateKey(yaml.constructor.ConstructorError):
    """A key given twice in one mapping (plain YAML silently keeps the last)."""

    def __init__(self, mapping: yaml.MappingNode, key: Any, key_node: yaml.Node, first_line: int):
        super().__init__("while constructing a mapping", mapping.start_mark,
                         f"duplicate key {key!r} (first at line {first_line})", key_node.start_mark)
        self.mapping, self.key = mapping, key


class CaseLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults` may be overridden: not a duplicate
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = key in first_line
                except TypeError:  # an unhashable key: the base class refuses it
                    continue
                if seen:
                    raise DuplicateKey(node, key, key_node, first_line[key])
                first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


class _YamlShape(Exception):
    def __init__(self, node: yaml.Node, path: tuple, message: str):
        super().__init__(message)
        self.line, self.path, self.message = node.start_mark.line + 1, path, message


def _key_name(key: yaml.Node) -> Any:
    return key.value if isinstance(key, yaml.ScalarNode) else f"<{getattr(key, 'id', '?')} key>"


def _line_map(root: yaml.Node) -> tuple[dict[tuple, int], dict[int, tuple]]:
    """Map each field path (keys and list indices) to its 1-based line in the YAML text, and each
    mapping node to its path. Refuses recursive aliases, deep nesting and files that expand (through
    aliases) to more than MAX_YAML_NODES nodes, so nothing after this can recurse or blow up."""
    lines: dict[tuple, int] = {}
    paths: dict[int, tuple] = {}
    stack: list[tuple[yaml.Node, tuple, frozenset[int]]] = [(root, (), frozenset())]
    visited = 0
    while stack:
        node, path, ancestors = stack.pop()
        visited += 1
        if visited > MAX_YAML_NODES:
            raise _YamlShape(node, path, f"the file expands to more than {MAX_YAML_NODES:,} values (anchors and aliases followed)")
        if id(node) in ancestors:
            raise _YamlShape(node, path, "an alias refers to a value that contains it (a recursive structure)")
        if len(path) > MAX_YAML_DEPTH:
            raise _YamlShape(node, path, f"nested more than {MAX_YAML_DEPTH} levels deep")
        lines.setdefault(path, node.start_mark.line + 1)
        paths.setdefault(id(node), path)
        inner = ancestors | {id(node)}
        if isinstance(node, yaml.MappingNode):
            for key, _ in reversed(node.value):
                lines[path + (_key_name(key),)] = key.start_mark.line + 1
            for key, value in reversed(node.value):
                stack.append((value, path + (_key_name(key),), inner))
        elif isinstance(node, yaml.SequenceNode):
            for index in range(len(node.value) - 1, -1, -1):
                stack.append((node.value[index], path + (index,), inner))
    return lines, paths


def line_and_field(lines: dict[tuple, int], loc: tuple) -> tuple[int, str]:
    """Longest prefix of a pydantic/family location that exists in the file, and its dotted name."""
    data_loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in tag_names())))
    for n in range(len(data_loc), -1, -1):
        if data_loc[:n] in lines:
            return lines[data_loc[:n]], ".".join(str(p) for p in data_loc) or "(top level)"
    return 1, ".".join(str(p) for p in data_loc)


MAX_EXPRESSION_CHARS = 200
MAX_EXPRESSION_DEPTH = 32  # operators nested in one another
MAX_DIMENSION = 1 << 40  # any value in a shape expression, and its result


def _eval_dim(text: str, names: dict[str, Any]) -> int:
    """An int expression over names: + - * // and parentheses, nothing else; short, shallow, and every
    value in it (and the result) at most MAX_DIMENSION in size."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"a shape expression is at most {MAX_EXPRESSION_CHARS} characters, this one has {len(text):,}")

    def checked(number: int, node: ast.AST) -> int:
        if abs(number) > MAX_DIMENSION:
            raise ValueError(f"{ast.unparse(node)!r} is {'more' if number > 0 else 'less'} than "
                             f"{'' if number > 0 else '-'}2**40: too large for a dimension")
        return number

    def value(node: ast.AST, depth: int) -> int:
        if depth > MAX_EXPRESSION_DEPTH:
            raise ValueError(f"a shape expression nests at most {MAX_EXPRESSION_DEPTH} operations")
        if isinstance(node, ast.Expression):
            return value(node.body, depth)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return checked(node.value, node)
        if isinstance(node, ast.Name) and type(names.get(node.id)) is int:
            return checked(names[node.id], node)
        if isinstance(node, ast.Name) and node.id in names:
            raise ValueError(f"{node.id} is {describe_value(names[node.id])}, not an integer")
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left, depth + 1), value(node.right, depth + 1)
            if isinstance(node.op, ast.FloorDiv) and right == 0:
                raise ValueError(f"division by zero in {ast.unparse(node)!r}")
            return checked(_OPS[type(node.op)](left, right), node)
        raise ValueError(f"cannot evaluate {ast.unparse(node)!r} (known: {', '.join(sorted(names)) or 'none'})")

    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise ValueError(f"{text!r} is not an expression ({getattr(error, 'msg', None) or error})") from None
    return value(tree, 0)


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def _resolve_shapes(data: dict) -> None:
    names = {**(data.get("options") or {}), **(data.get("vars") or {})}
    for name, spec in (data.get("inputs") or {}).items():
        if isinstance(spec, dict) and isinstance(spec.get("shape"), list):
            for i, dim in enumerate(spec["shape"]):
                if isinstance(dim, str):
                    try:
                        spec["shape"][i] = _eval_dim(dim, names)
                    except (ValueError, SyntaxError, ZeroDivisionError, RecursionError, OverflowError) as error:
                        raise FieldProblem(("inputs", name, "shape", i), str(error) or type(error).__name__) from None


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


def expand_sweep(data: dict, source: str = "") -> list[dict]:
    """A case with `sweep: {label: [values]}` becomes one case per combination, named base[label=value,...]."""
    from harness.ops import family_for

    sweep = data.pop("sweep", None)
    if sweep is None:
        return [data]
    if not isinstance(sweep, dict) or not sweep:
        raise FieldProblem(("sweep",), "sweep is a mapping of label: [values]")
    for label, values in sweep.items():
        if not isinstance(label, str) or not label:
            raise FieldProblem(("sweep", label), f"a sweep label is a name, got {describe_value(label)}")
        if not isinstance(values, list) or not values:
            raise FieldProblem(("sweep", label), "a sweep label takes a non-empty list of values")
        for value in values:  # the point id names the value: no path separators, no control characters
            if not POINT_PART.match(f"{label}={_short(value)}"):
                raise FieldProblem(("sweep", label), f"sweep value {_short(value)!r} cannot be part of a point id "
                                   "(no '/', '\\' or control characters)")
    count = math.prod(len(values) for values in sweep.values())
    if count > MAX_SWEEP_POINTS:
        raise FieldProblem(("sweep",), f"this sweep has {count:,} points; at most {MAX_SWEEP_POINTS:,}")
    working = family_for(str(data.get("op")), source).working_inputs
    expect: dict = data["expect"] if isinstance(data.get("expect"), dict) else {}
    per_point = expect.pop("points", None) or {}
    if not isinstance(per_point, dict) or not all(isinstance(k, str) for k in per_point):
        raise FieldProblem(("expect", "points"), "points is a mapping of point id (e.g. topk=4): {all, tensors}")
    points = []
    for values in itertools.product(*sweep.values()):
        point = copy.deepcopy(data)
        for label, value in zip(sweep, values):
            try:
                _apply(point, label, value, working)
            except (TypeError, AttributeError, KeyError, IndexError):
                raise FieldProblem(("sweep", label), f"cannot set {label} to {_short(value)!r} in this case") from None
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
    for where, expect in ((("expect",), base), (("expect", "points", point_id), override)):
        if not isinstance(expect.get("tensors") or {}, dict):
            raise FieldProblem(where + ("tensors",),
                               f"tensors is a mapping of tensor: expectation, got {describe_value(expect['tensors'])}")
    merged = {**base, **{k: v for k, v in override.items() if k != "tensors"}}
    merged["tensors"] = {**(base.get("tensors") or {}), **(override.get("tensors") or {})}
    return merged


MAX_SWEEP_POINTS = 1000
POINT_PART = re.compile(r"^[^\x00-\x1f\x7f/\\]+$")
_MAPPINGS = {"options": "option: value", "vars": "name: integer", "inputs": "name: {shape, dtype, ...}",
             "sides": "name: {framework, impl, ...}", "expect": "all, tensors, points", "sweep": "label: [values]"}


def _check_names(data: dict, source: str) -> None:
    """The case name (explicit, or the file's stem) and the side names become file names: safe ones only."""
    explicit = "name" in data
    name = data["name"] if explicit else Path(source).stem
    if not isinstance(name, str):
        raise FieldProblem(("name",), f"a case name is text, got {describe_value(name)}")
    if not is_safe_name(name):
        origin = "" if explicit else f" (the name comes from the file name {Path(source).name!r}: rename it or set name:)"
        raise FieldProblem(("name",), f"{name[:80]!r} is not a safe case name: {NAME_RULE}, "
                                      f"at most {MAX_NAME_CHARS} characters{origin}")
    if isinstance(data.get("sides"), dict):
        for side in data["sides"]:
            if not is_safe_name(side):
                raise FieldProblem(("sides", side), f"{str(side)[:80]!r} is not a safe side name: {NAME_RULE}")


def _check_structure(data: dict) -> None:
    """Mappings where mappings belong, before anything indexes into them (the schema says the rest)."""
    for key in data:
        if not isinstance(key, str):
            raise FieldProblem((key,), f"a field name is text, got {describe_value(key)}")
    for key, form in _MAPPINGS.items():
        if key in data and not isinstance(data[key], dict):
            raise FieldProblem((key,), f"{key} is a mapping ({form}), got {describe_value(data[key])}")
        for name in data.get(key, {}):
            if not isinstance(name, str):
                raise FieldProblem((key, name), f"a name in {key} is text, got {describe_value(name)}")
    for name, spec in data.get("inputs", {}).items():
        if not isinstance(spec, dict):
            raise FieldProblem(("inputs", name), f"an input is a mapping (shape, dtype, dist, ...), got {describe_value(spec)}")
    for name, spec in data.get("sides", {}).items():
        if not isinstance(spec, dict):
            raise FieldProblem(("sides", name), f"a side is a mapping (framework, impl, mode, device), got {describe_value(spec)}")


def validate_cases(data: Any, source: str, lines: dict[tuple, int] | None = None,
                   profiles: Profiles | None = None) -> list[Case]:
    """Validate parsed YAML: names, structure, sweep expansion, shape expressions, schema, the op family's
    rules, the numerics profile and user functions. Every problem is a CaseError of one line."""
    from harness.ops import family_for

    lines = lines or {}
    if not isinstance(data, dict):
        raise CaseError(f"{source}:1: (top level): a case is a mapping of fields, got {describe_value(data)}")
    cases, point = [], None
    try:
        _check_names(data, source)
        data = {"name": Path(source).stem, **data}
        _check_structure(data)
        for point in expand_sweep(data, source):
            _check_structure(point)
            if isinstance(point.get("op"), str):  # options first: shapes may be computed from them
                family_for(point["op"], source).parse_options(point.get("options") or {})
            _resolve_shapes(point)
            case = Case(**point, source=source)
            family_for(case.op, source).validate(case)
            _check_numerics(case, profiles)
            _check_user_functions(case)
            cases.append(case)
    except ValidationError as error:
        location, message = validation_problem(error)
        line, field = line_and_field(lines, location)
        raise CaseError(f"{source}:{line}: {field}: {message}{_in_point(point)}") from None
    except FieldProblem as problem:
        line, field = line_and_field(lines, problem.path)
        raise CaseError(f"{source}:{line}: {field}: {problem.message}{_in_point(point)}") from None
    except (TypeError, AttributeError, KeyError, IndexError, ValueError, ArithmeticError, RecursionError) as error:
        # A shape of input no check above foresaw: still one line, never a traceback.
        detail = (str(error).splitlines() or [""])[0][:200]
        raise CaseError(f"{source}:1: (case): this case cannot be validated ({type(error).__name__}: {detail})"
                        f"{_in_point(point)}") from None
    return cases


def _check_numerics(case: Case, profiles: Profiles | None) -> None:
    """The profile the case names must load (read once per run where the run's `profiles` are given); the
    default one is the run's to load (--numerics may replace it)."""
    from harness.numerics import ProfileError, load_profile

    if case.numerics is None:
        return
    try:
        (profiles.load if profiles is not None else load_profile)(case.numerics, case.source)
    except ProfileError as error:
        raise FieldProblem(("numerics",), str(error)) from None


def _in_point(point: dict | None) -> str:
    return f" (in sweep point {point['name']})" if point and point.get("sweep_of") else ""


def user_function_file(case_source: str, target: str) -> Path:
    """A user function's file: relative to the case file's folder (never the working directory)."""
    return Path(case_source).parent / target


def _defined_names(path: Path) -> set[str] | None:
    """Names a Python file defines at module level (def, class, assignment, import), read without running
    it; None where that cannot be known (`from x import *`, a module __getattr__)."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    names: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.partition(".")[0])
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):  # conditional definitions count
            for field in ("body", "orelse", "finalbody", "handlers"):
                body.extend(getattr(node, field, []))
        elif isinstance(node, ast.ExceptHandler):
            body.extend(node.body)
    return None if "__getattr__" in names else names


def _module_origin(name: str) -> str | None:
    """Where module `name` would be loaded from, found without importing it or its parent packages (a
    parent's __init__ may import a framework): "" when it exists without a file of source, None when
    there is no such module."""
    parts = name.split(".")
    try:
        if name in sys.modules:
            return getattr(sys.modules[name], "__file__", None) or ""
        spec = importlib.util.find_spec(parts[0])  # a top-level name: nothing is imported to find it
        for part in parts[1:]:
            locations = spec.submodule_search_locations if spec is not None else None
            if not locations:
                return None
            spec = importlib.machinery.PathFinder.find_spec(part, list(locations))
    except (ImportError, ValueError):
        return None
    return None if spec is None else (spec.origin if spec.has_location and spec.origin else "")


def _check_user_functions(case: Case) -> None:
    """`impl: file.py:function` (beside the case) and `impl: pkg.mod:function`, and a `backward:` beside it,
    must exist at load time."""
    for side_name, side in case.sides.items():
        for key in ("impl", "backward"):
            if side.is_user_function and getattr(side, key) is not None:
                _check_user_function(case, ("sides", side_name, key), getattr(side, key))


def _check_user_function(case: Case, where: tuple, spec: str) -> None:
    target, function = spec.rsplit(":", 1)
    if target.endswith(".py"):
        path = user_function_file(case.source, target)
        if not path.is_file():
            folder = Path(case.source).parent
            raise FieldProblem(where, f"no file {target} beside the case (looked for {path}; a user function file "
                                      f"is found relative to the case file's folder {str(folder) or '.'})")
        source = str(path)
    else:
        origin = _module_origin(target)
        if origin is None:
            raise FieldProblem(where, f"no module {target!r} on the Python path")
        source = origin
    if not source.endswith(".py"):
        return  # compiled or namespace module: its names cannot be read without importing it
    try:
        names = _defined_names(Path(source))
    except (SyntaxError, ValueError, UnicodeDecodeError) as error:
        line = getattr(error, "lineno", None)
        raise FieldProblem(where, f"{target} cannot be read as Python"
                                  f"{f' (line {line})' if line else ''}: {getattr(error, 'msg', None) or error}") from None
    except (OSError, RecursionError, MemoryError) as error:
        raise FieldProblem(where, f"{target} cannot be read: {error}") from None
    if names is not None and function not in names:
        defined = sorted(n for n in names if not n.startswith("_"))
        raise FieldProblem(where, f"{target} defines no {function!r}"
                                  + (f" (it defines {', '.join(defined[:8])})" if defined else ""))


def _check_readable_depth(text: str) -> None:
    """PyYAML builds nodes recursively: refuse a file nested beyond what can be read from the parser's
    event stream first (iterative, so a 2000-level file is refused in milliseconds, not by a slow
    RecursionError). Files nested less deeply but beyond MAX_YAML_DEPTH get the field-naming error later."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_READABLE_DEPTH:
                raise RecursionError
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def load_cases(path: str | Path, profiles: Profiles | None = None) -> list[Case]:
    """A case file: one case, or one per sweep point; `profiles`: the run's (each profile read once)."""
    path = Path(path)
    data, lines = read_yaml(path, "case file", CaseError, MAX_CASE_BYTES)
    return validate_cases(data, str(path), lines, profiles)


def read_yaml(path: Path, what: str, error_type: type[XfalignError], max_bytes: int) -> tuple[Any, dict[tuple, int]]:
    """A YAML file of xfalign's (`what`: "case file", "map file") parsed with the guards every such file
    gets (size, UTF-8, depth, duplicate keys, aliases), and the line of each field: (data, lines). Any
    problem is an `error_type` of one line naming the file, the line and the field."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise error_type(f"{path}: cannot read {what}: {error.strerror or error}") from None
    if len(raw) > max_bytes:
        raise error_type(f"{path}:1: (file): the {what} has {len(raw):,} bytes; a {what} is at most {max_bytes:,}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw[:error.start].count(b"\n") + 1
        raise error_type(f"{path}:{line}: (file): not UTF-8 text (byte 0x{raw[error.start]:02x} at offset "
                         f"{error.start}); save the {what} as UTF-8") from None
    paths: dict[int, tuple] = {}
    try:
        _check_readable_depth(text)
        loader = CaseLoader(text)  # checks for unprintable characters first
        try:
            node = loader.get_single_node()
            lines, paths = _line_map(node) if node is not None else ({}, {})
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except DuplicateKey as error:
        field = ".".join(str(p) for p in (*paths.get(id(error.mapping), ()), error.key))
        where = error.problem_mark.line + 1 if error.problem_mark else "?"
        raise error_type(f"{path}:{where}: {field}: {error.problem}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = mark.line + 1 if mark else text[:getattr(error, "position", 0)].count("\n") + 1
        problem = getattr(error, "problem", None) or (str(error).splitlines() or ["cannot parse"])[0]
        raise error_type(f"{path}:{line}: (yaml): {problem}") from None
    except _YamlShape as error:
        raise error_type(f"{path}:{error.line}: {'.'.join(map(str, error.path)) or '(top level)'}: {error.message}") from None
    except RecursionError:
        raise error_type(f"{path}:1: (yaml): nested too deeply to read (at most {MAX_YAML_DEPTH} levels)") from None
    return data, lines


def load_case(path: str | Path) -> Case:
    """A case file that holds one case (no sweep)."""
    cases = load_cases(path)
    if len(cases) != 1:
        raise CaseError(f"{path}:1: sweep: this file is a sweep of {len(cases)} points; run it with xfalign run")
    return cases[0]
