"""Sweeps and shape expressions, on a case file's data before the schema sees it: `sweep: {label: [values]}`
becomes one case per combination, and `shape: [tokens * topk, hidden]` is evaluated over vars and options."""

from __future__ import annotations

import ast
import copy
import itertools
import math
import operator
import re
from collections.abc import Callable, Collection
from typing import Any

from harness.errors import describe_value
from harness.schema import FieldProblem

MAX_SWEEP_POINTS = 1000
POINT_PART = re.compile(r"^[^\x00-\x1f\x7f/\\]+$")  # one label=value of a point id: no path separators

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


def resolve_shapes(data: dict) -> None:
    """Every shape expression of the inputs, evaluated over the options and vars (FieldProblem naming the dimension)."""
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


def _apply(point: dict, label: str, value: Any, working_inputs: Collection[str]) -> None:
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


def expand_sweep(data: dict, working_inputs: Callable[[], Collection[str]]) -> list[dict]:
    """A case with `sweep: {label: [values]}` becomes one case per combination, named base[label=value,...].
    `working_inputs`: the inputs a `dtype` sweep sets (the op family's), asked once the sweep itself is sound."""
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
    working = working_inputs()
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
