"""Case files -> Cases: the hardened YAML read, sweeps expanded, shape expressions evaluated, the schema, the op
family's rules, the numerics profile and user functions checked. Every problem is a CaseError of one line that
names the file, the line and the field."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.case import Case, CaseError, user_function_file
from harness.compare.expectations import tag_names
from harness.errors import describe_value, validation_problem
from harness.numerics import ProfileError, Profiles, load_profile
from harness.ops import family_for
from harness.schema import MAX_NAME_CHARS, NAME_RULE, FieldProblem, is_safe_name
from harness.sweep import expand_sweep, resolve_shapes
from harness.yamlio import line_and_field, read_yaml

MAX_CASE_BYTES = 1 << 20  # a case file is text a person writes
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
    lines = lines or {}
    if not isinstance(data, dict):
        raise CaseError(f"{source}:1: (top level): a case is a mapping of fields, got {describe_value(data)}")
    cases, point = [], None
    try:
        _check_names(data, source)
        data = {"name": Path(source).stem, **data}
        _check_structure(data)
        for point in expand_sweep(data, lambda: family_for(str(data.get("op")), source).working_inputs):
            _check_structure(point)
            if isinstance(point.get("op"), str):  # options first: shapes may be computed from them
                family_for(point["op"], source).parse_options(point.get("options") or {})
            resolve_shapes(point)
            case = Case(**point, source=source)
            family_for(case.op, source).validate(case)
            _check_numerics(case, profiles)
            _check_user_functions(case)
            cases.append(case)
    except ValidationError as error:
        location, message = validation_problem(error)
        line, field = _line_and_field(lines, location)
        raise CaseError(f"{source}:{line}: {field}: {message}{_in_point(point)}") from None
    except FieldProblem as problem:
        line, field = _line_and_field(lines, problem.path)
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
    if case.numerics is None:
        return
    try:
        (profiles.load if profiles is not None else load_profile)(case.numerics, case.source)
    except ProfileError as error:
        raise FieldProblem(("numerics",), str(error)) from None


def _in_point(point: dict | None) -> str:
    return f" (in sweep point {point['name']})" if point and point.get("sweep_of") else ""


def _line_and_field(lines: dict[tuple, int], loc: tuple) -> tuple[int, str]:
    """yamlio.line_and_field, without the names pydantic puts in a location for the expectation kind it validated."""
    return line_and_field(lines, tuple(p for p in loc if not (isinstance(p, str) and p in tag_names())))



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


def load_cases(path: str | Path, profiles: Profiles | None = None) -> list[Case]:
    """A case file: one case, or one per sweep point; `profiles`: the run's (each profile read once)."""
    path = Path(path)
    data, lines = read_yaml(path, "case file", CaseError, MAX_CASE_BYTES)
    return validate_cases(data, str(path), lines, profiles)


def load_case(path: str | Path) -> Case:
    """A case file that holds one case (no sweep)."""
    cases = load_cases(path)
    if len(cases) != 1:
        raise CaseError(f"{path}:1: sweep: this file is a sweep of {len(cases)} points; run it with xfalign run")
    return cases[0]
