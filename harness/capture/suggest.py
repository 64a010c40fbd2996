"""`xfalign map suggest A B`: a map (harness.capture.mapping) proposed from two captures, as YAML to edit.

The forward records of one step are walked in execution order on both sides. A record of A pairs with
the next record of B when their output.0 shapes agree up to a permutation of axes (the permutation most
pairs agree on wins where several fit, e.g. when s == b), or with the next TWO records of B when A's
output.0 is theirs joined along one axis (a fused projection: Megatron linear_fc1 = gate_proj + up_proj);
a record that pairs with nothing within a few records is skipped and listed in a comment. Parameters of
paired modules are compared by shape: equal, transposed, or (fused pairs) joined along one axis. Layer
indices that agree on both sides become captures ({i}), so one entry covers every layer.

Optimizer records: where one tree names its optimizer states in torch's words (exp_avg, ...) and the other
in Paddle's (moment1, ...), a `roles:` section pairs them (STATE_PAIRS) and marks the words of one side
alone; tensor entries' role captures list every per-parameter role A holds with its parameter's shape.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import permutations
from typing import Any, Protocol

import numpy as np

from harness.capture.mapping import MapError
from harness.store.dump import Dump
from harness.store.tree_format import PARAM_ROLES, STATE_ROLES, STEP_ROLES, TensorName

LOOKAHEAD = 6  # records skipped, at most, to find the next pair
Shape = tuple[int, ...]

# optimizer states: (torch's word, Paddle's word), then each one's words without a counterpart (why, for the YAML)
STATE_PAIRS = (("exp_avg", "moment1"), ("exp_avg_sq", "moment2"), ("max_exp_avg_sq", "moment2_max"),
               ("main_param", "master_weight"))
STATES_ALONE = ({"step": "torch's step count t; no Paddle tensor holds it"},
                {"beta1_pow_acc": "Paddle's beta1^(t+1); no torch tensor holds it",
                 "beta2_pow_acc": "Paddle's beta2^(t+1); no torch tensor holds it"})


class TreeLike(Protocol):
    """What suggest_map reads of a capture tree (harness.store.tree.Tree)."""

    @property
    def steps(self) -> list[str]: ...

    def step(self, index: int) -> Dump: ...


@dataclass
class _Call:
    module: str
    call: int
    outputs: dict[str, Shape]  # slot -> shape
    inputs: dict[str, Shape]


@dataclass
class _Side:
    name: str
    side: str
    framework: str
    calls: list[_Call]
    params: dict[str, dict[str, Shape]]  # module -> param slot -> shape
    arrays: Any  # the dump's stored tensors (to check which part of a fused weight is which)
    roles: set[str]  # the roles of the step's tensor names
    param_roles: list[str]  # param, grad and the optimizer's per-parameter roles of the parameter's shape


@dataclass
class _Suggestion:
    modules: list[tuple[str, str]] = field(default_factory=list)  # (key, YAML text of the entry)
    tensors: list[tuple[str, str]] = field(default_factory=list)
    ignore_b: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def suggest_map(tree_a: TreeLike, tree_b: TreeLike, step: int = 0) -> str:
    """YAML text proposing a map from A's and B's records of `step` (see the module's docstring)."""
    a, b = _side(tree_a, step), _side(tree_b, step)
    pairs, skipped_a, skipped_b = _align(a.calls, b.calls)
    votes = Counter(p for call_a, calls_b in pairs for p in _call_perms(call_a, calls_b) if len(_call_perms(call_a, calls_b)) == 1)
    found = _Suggestion()
    for call_a, calls_b in pairs:
        if len(calls_b) == 1:
            _one_to_one(found, a, b, call_a, calls_b[0], votes)
        else:
            _fused(found, a, b, call_a, calls_b, votes)
    if not pairs:  # a map without entries would pair nothing (load_map refuses one)
        raise MapError(f"{a.name} and {b.name}: no forward record of step {step} pairs with one of the other tree by "
                       f"the shapes of its outputs ({len(a.calls)} and {len(b.calls)} records); write the map by hand")
    found.notes += [f"A {c.module}#{c.call}: no B record pairs with it" for c in skipped_a]
    found.notes += [f"B {c.module}#{c.call}: no A record pairs with it" for c in skipped_b]
    return _render(found, a, b, tree_a, tree_b, step, len(pairs))


def _side(tree: TreeLike, step: int) -> _Side:
    dump = tree.step(step)
    shapes = {name: tuple(d.shape) for name, d in dump.digests.items()}
    capture = dump.meta.get("capture") or {}
    calls: list[_Call] = []
    params: dict[str, dict[str, Shape]] = {}
    for record in capture.get("records", []):
        if record["phase"] == "forward":
            slots: dict[str, dict[str, Shape]] = {"input": {}, "output": {}}
            for name in record["tensors"]:
                parsed = TensorName.parse(name)
                if parsed is not None and parsed.role in slots:
                    slots[parsed.role][parsed.slot] = shapes[name]
            calls.append(_Call(record["module"], record["call"] or 0, slots["output"], slots["input"]))
    parsed_names = [(parsed, shape) for parsed, shape in ((TensorName.parse(n), s) for n, s in shapes.items()) if parsed]
    for parsed, shape in parsed_names:
        if parsed.role == "param":
            params.setdefault(parsed.module, {})[parsed.slot] = shape
    shaped: dict[str, bool] = {}  # a per-parameter role -> its tensors all have their parameter's shape
    for parsed, shape in parsed_names:
        param = params.get(parsed.module, {}).get(parsed.slot)
        if parsed.call is None and param is not None:
            shaped[parsed.role] = shaped.get(parsed.role, True) and shape == param
    param_roles = [*PARAM_ROLES, *(role for role in STEP_ROLES + STATE_ROLES if shaped.get(role))]
    return _Side(str(getattr(tree, "path", "?")), dump.side, dump.meta.get("framework", "?"), calls, params, dump.tensors,
                 {parsed.role for parsed, _ in parsed_names}, param_roles)


# --- shapes -------------------------------------------------------------------------------------------


def _perms(a: Shape, b: Shape) -> list[tuple[int, ...]]:
    """Permutations p with A = B permuted (A axis k = B axis p[k]); the identity first."""
    if len(a) != len(b) or sorted(a) != sorted(b):
        return []
    return [p for p in permutations(range(len(b))) if tuple(b[q] for q in p) == a]


def _joins(a: Shape, parts: list[Shape]) -> list[tuple[tuple[int, ...], int]]:
    """(p, axis): A = the parts, each permuted by p, joined along A's `axis`."""
    found: list[tuple[tuple[int, ...], int]] = []
    if not parts or any(len(s) != len(a) for s in parts):
        return found
    for p in permutations(range(len(a))):
        moved = [tuple(s[q] for q in p) for s in parts]
        for axis in range(len(a)):
            if all(m[:axis] + m[axis + 1:] == a[:axis] + a[axis + 1:] for m in moved) and sum(m[axis] for m in moved) == a[axis]:
                found.append((p, axis))
    return found


def _call_perms(call_a: _Call, calls_b: list[_Call]) -> list[tuple[int, ...]]:
    if "0" not in call_a.outputs or any("0" not in c.outputs for c in calls_b):
        return []
    if len(calls_b) == 1:
        return _perms(call_a.outputs["0"], calls_b[0].outputs["0"])
    return list(dict.fromkeys(p for p, _ in _joins(call_a.outputs["0"], [c.outputs["0"] for c in calls_b])))


def _pick(candidates: list, votes: Counter, key=lambda c: c) -> Any:
    """The candidate whose permutation most pairs agree on; ties: the first (identity first)."""
    return max(candidates, key=lambda c: votes[key(c)]) if candidates else None


def _align(calls_a: list[_Call], calls_b: list[_Call]) -> tuple[list[tuple[_Call, list[_Call]]], list[_Call], list[_Call]]:
    """Pair A's records with one B record, or with two B records that take the same input (records between
    them, an activation module say, are skipped), in order; skip what pairs with nothing."""

    def fits(i: int, j: int) -> list[int]:  # the B records A's i-th pairs with, from j on ([]: none)
        if _call_perms(calls_a[i], calls_b[j:j + 1]):
            return [j]
        for k in range(j + 1, min(j + 1 + LOOKAHEAD, len(calls_b))):
            if calls_b[j].inputs.get("0") == calls_b[k].inputs.get("0") and _call_perms(calls_a[i], [calls_b[j], calls_b[k]]):
                return [j, k]
        return []

    pairs, skipped_a, skipped_b = [], [], []
    i = j = 0
    while i < len(calls_a) and j < len(calls_b):
        taken = fits(i, j)
        if taken:
            pairs.append((calls_a[i], [calls_b[k] for k in taken]))
            skipped_b += calls_b[taken[0] + 1:taken[-1]]
            i, j = i + 1, taken[-1] + 1
            continue
        # the nearest resynchronization: skip d records of A, or of B
        for d in range(1, LOOKAHEAD + 1):
            if i + d < len(calls_a) and fits(i + d, j):
                skipped_a += calls_a[i:i + d]
                i += d
                break
            if j + d < len(calls_b) and fits(i, j + d):
                skipped_b += calls_b[j:j + d]
                j += d
                break
        else:
            skipped_a.append(calls_a[i])
            skipped_b.append(calls_b[j])
            i, j = i + 1, j + 1
    return pairs, skipped_a + calls_a[i:], skipped_b + calls_b[j:]


# --- entries ------------------------------------------------------------------------------------------

_INDEX = re.compile(r"(?<![^.])\d+(?![^.#:])")  # a dotted component that is a number: a layer, an expert


def _general(a: str, bs: list[str]) -> tuple[str, list[str]]:
    """Numbers that agree on both sides (a layer index) become captures {i}, {j}, ... in order."""
    numbers = _INDEX.findall(a)
    if not numbers or any(_INDEX.findall(b) != numbers for b in bs):
        return a, bs
    names = iter("ijklmn")
    captures = [next(names, f"n{k}") for k in range(len(numbers))]

    def fill(text: str) -> str:
        parts = iter(captures)
        return _INDEX.sub(lambda _: "{" + next(parts) + "}", text)

    return fill(a), [fill(b) for b in bs]


def _q(text: str) -> str:
    return json.dumps(text)  # a YAML double-quoted scalar: '#', ':', '{' and '(' need quoting


def _layout(p: tuple[int, ...] | None) -> str:
    if p is None or list(p) == sorted(p):
        return ""
    n = len(p)
    return "transpose: true" if n >= 2 and list(p) == [*range(n - 2), n - 1, n - 2] else f"permute: {list(p)}"


KINDS = ("", "transpose: true")  # the layouts one entry may give every parameter (a bias passes transpose)


def _kind_perm(kind: str, ndim: int) -> tuple[int, ...]:
    if kind and ndim >= 2:
        return (*range(ndim - 2), ndim - 1, ndim - 2)
    return tuple(range(ndim))


def _param_layout(a: dict[str, Shape], b: dict[str, Shape]) -> tuple[str | None, list[str]]:
    """One layout for every parameter of a module pair ("" none, "transpose: true"; None: none fits) and
    a note per parameter."""
    notes, fits = [], set(KINDS)
    for slot, shape in a.items():
        if slot not in b:
            notes.append(f"{slot}: not in B")
            continue
        perms = _perms(shape, b[slot])
        fits &= {kind for kind in KINDS if _kind_perm(kind, len(shape)) in perms}
        notes.append(f"{slot}: A {list(shape)}, B {list(b[slot])}")
    return (min(fits) if fits else None), notes


def _one_to_one(found: _Suggestion, a: _Side, b: _Side, call_a: _Call, call_b: _Call, votes: Counter) -> None:
    module_a, (module_b,) = _general(call_a.module, [call_b.module])
    perm = _pick(_call_perms(call_a, [call_b]), votes)
    lines = [f"  - a: {_q(module_a)}", f"    b: {_q(module_b)}"]
    calls = _layout(perm)
    comment = f"output.0: A {list(call_a.outputs['0'])}, B {list(call_b.outputs['0'])}"
    lines.append(f"    calls: {{{calls}}}  # {comment}" if calls else f"    # {comment}")
    params_a, params_b = a.params.get(call_a.module, {}), b.params.get(call_b.module, {})
    if params_a or params_b:
        kind, notes = _param_layout(params_a, params_b)
        if kind is None:
            found.notes.append(f"A {call_a.module}: no one layout fits all its parameters ({'; '.join(notes)})")
        lines.append(f"    params: {{{kind}}}  # {'; '.join(notes)}" if kind else f"    # params: {'; '.join(notes)}")
    found.modules.append((module_a, "\n".join(lines)))


def _fused(found: _Suggestion, a: _Side, b: _Side, call_a: _Call, calls_b: list[_Call], votes: Counter) -> None:
    """A's one module against several consecutive B modules: a module pair, and tensor entries that join."""
    names_b = [c.module for c in calls_b]
    params_a = a.params.get(call_a.module, {})
    order, checked = _part_order(a, b, call_a.module, names_b)
    names_b = [names_b[k] for k in order]
    calls_b = [calls_b[k] for k in order]
    module_a, modules_b = _general(call_a.module, names_b)
    found.modules.append((module_a, f"  - a: {_q(module_a)}\n    b: [{', '.join(map(_q, modules_b))}]"))
    parts = [re.sub(r"^.*\.", "", m) or f"part{k}" for k, m in enumerate(names_b)]
    which = "checked: the parameter bytes match in this order" if checked else \
        "in B's execution order: CHECK which part is which"
    same = call_a.call == calls_b[0].call and all(c.call == call_a.call for c in calls_b)
    call = "{c}" if same else str(call_a.call)
    calls_part = [("{c}" if same else str(c.call)) for c in calls_b]

    def parts_text(suffixes: list[str]) -> str:
        return "{" + ", ".join(f"{name}: {_q(m + s)}" for name, m, s in zip(parts, modules_b, suffixes)) + "}"

    # parameters and their gradients: one layout and one axis that fit every parameter
    fits = None
    for slot, shape in params_a.items():
        joins = _joins(shape, [b.params.get(m, {}).get(slot, ()) for m in names_b])
        options = {(kind, axis) for kind in KINDS for p, axis in joins if p == _kind_perm(kind, len(shape))}
        fits = options if fits is None else fits & options
    if params_a and fits:
        kind, axis = sorted(fits)[0]
        shapes = "; ".join(f"{slot}: A {list(s)}" for slot, s in params_a.items())
        found.tensors.append((f"{module_a}:param", "\n".join([
            f"  - a: {_q(module_a + ':{role:' + '|'.join(a.param_roles) + '}.{p}')}  # {shapes}; {which}",
            f"    b: {parts_text([':{role}.{p}'] * len(parts))}",
            *([f"    {kind}"] if kind else []),
            f"    split: {{axis: {axis}}}"])))
    elif params_a:
        found.notes.append(f"A {call_a.module}: its parameters are not B's {', '.join(names_b)} joined along one axis")
    # outputs and their gradients, then the input all parts share
    joins = _joins(call_a.outputs["0"], [c.outputs["0"] for c in calls_b])
    perm, axis = _pick(joins, votes, key=lambda j: j[0])
    sizes = [c.outputs["0"][perm[axis]] for c in calls_b]
    found.tensors.append((f"{module_a}#out", "\n".join([
        f"  - a: {_q(f'{module_a}#{call}:' + '{role:output|grad_output}.0')}  # A {list(call_a.outputs['0'])}",
        f"    b: {parts_text([f'#{c}:' + '{role}.0' for c in calls_part])}",
        *([f"    {_layout(perm)}"] if _layout(perm) else []),
        f"    split: {{axis: {axis}" + (f", sizes: {sizes}" if len(set(sizes)) > 1 else "") + "}"])))
    for slot, shape in call_a.inputs.items():
        perm_in = _pick(_perms(shape, calls_b[0].inputs.get(slot, ())), votes)
        if perm_in is None:
            found.notes.append(f"A {call_a.module}#{call_a.call}:input.{slot}: no B input of a fitting shape")
            continue
        found.tensors.append((f"{module_a}#in{slot}", "\n".join([
            f"  - a: {_q(f'{module_a}#{call}:input.{slot}')}",
            f"    b: {_q(f'{modules_b[0]}#{calls_part[0]}:input.{slot}')}",
            *([f"    {_layout(perm_in)}"] if _layout(perm_in) else [])])))
    for module, other, c in zip(modules_b[1:], calls_b[1:], calls_part[1:]):
        if other.inputs == calls_b[0].inputs:
            found.ignore_b.append(f"{module}#{c}:input.*")


def _part_order(a: _Side, b: _Side, module_a: str, modules_b: list[str]) -> tuple[list[int], bool]:
    """The order of B's parts in A's fused weight: checked on the bytes where both sides stored them (tried
    in execution order first, then reversed), else execution order."""
    name_a = f"{module_a}:param.weight"
    names_b = [f"{m}:param.weight" for m in modules_b]
    if name_a not in a.arrays or not all(n in b.arrays for n in names_b):
        return list(range(len(modules_b))), False
    target = np.asarray(a.arrays[name_a])
    for order in (list(range(len(modules_b))), list(range(len(modules_b)))[::-1]):
        parts = [np.asarray(b.arrays[names_b[k]]) for k in order]
        for p, axis in _joins(target.shape, [x.shape for x in parts]):
            joined = np.concatenate([np.transpose(x, p) for x in parts], axis)
            if joined.tobytes() == target.tobytes():
                return order, True
    return list(range(len(modules_b))), False


# --- optimizer states ---------------------------------------------------------------------------------


def _state_family(side: _Side) -> int | None:
    """0: the side names its optimizer states in torch's words, 1: in Paddle's, None: it has none (or both)."""
    found = {k for k, alone in enumerate(STATES_ALONE) for word in [*(p[k] for p in STATE_PAIRS), *alone]
             if word in side.roles}
    return found.pop() if len(found) == 1 else None


def _roles(a: _Side, b: _Side) -> list[str]:
    """The `roles:` entries (YAML lines) pairing A's optimizer-state words with B's, where their words differ."""
    family_a, family_b = _state_family(a), _state_family(b)
    if family_a is None or family_b is None or family_a == family_b:
        return []
    lines = []
    for pair in STATE_PAIRS:
        word_a, word_b = pair[family_a], pair[family_b]
        if word_a in a.roles and word_b in b.roles:
            lines.append(f"  - {{a: {word_a}, b: {word_b}}}")
        elif word_a in a.roles or word_b in b.roles:
            side, word, other, missing = ("a", word_a, "B", word_b) if word_a in a.roles else ("b", word_b, "A", word_a)
            lines.append(f"  - {{{side}: {word}}}  # {other} has no {missing}: no counterpart, ignored")
    for side, found, family in (("a", a, family_a), ("b", b, family_b)):
        lines += [f"  - {{{side}: {word}}}  # {why}: ignored" for word, why in STATES_ALONE[family].items()
                  if word in found.roles]
    return lines


# --- the YAML -----------------------------------------------------------------------------------------


def _unique(entries: list[tuple[str, str]], notes: list[str]) -> list[str]:
    """One entry per generalized key; where layers disagree, the first is kept and the others noted."""
    kept: dict[str, str] = {}
    for key, text in entries:
        if key not in kept:
            kept[key] = text
        elif kept[key] != text:
            notes.append(f"{key}: layers need different entries; the first layer's is kept (edit by hand)")
    return list(kept.values())


def _roles_text(a: _Side, b: _Side) -> list[str]:
    entries = _roles(a, b)
    if not entries:
        return []
    return ["# B's optimizer-state words renamed to A's before the entries below (written in A's words);",
            "# a word of one side alone has no counterpart: its tensors are ignored", "roles:", *entries]


def _render(found: _Suggestion, a: _Side, b: _Side, tree_a: Any, tree_b: Any, step: int, pairs: int) -> str:
    modules = _unique(found.modules, found.notes)
    tensors = _unique(found.tensors, found.notes)
    lines = [
        f"# xfalign map suggested from step {step} of two captures, by execution order and shapes:",
        f"#   A: {a.name} ({a.framework}, {len(a.calls)} forward records)",
        f"#   B: {b.name} ({b.framework}, {len(b.calls)} forward records); {pairs} pairs found",
        "# Check every entry (shapes alone cannot tell parts of equal size apart), then:",
        "#   xfalign compare A B --map THIS_FILE",
        "# Layouts go from B to A: permute [1, 0, 2] means A's axis k is B's axis permute[k].",
        "format: xfalign-map/1",
        f"sides: {{a: {_q(a.side)}, b: {_q(b.side)}}}",
        *_roles_text(a, b),
        "modules:" if modules else "modules: []",
        *modules,
        "tensors:" if tensors else "tensors: []",
        *tensors,
    ]
    ignore = list(dict.fromkeys(found.ignore_b))
    if ignore:
        lines += ["ignore:", "  b:  # the same input as the first part's", *[f"    - {_q(p)}" for p in ignore]]
    if found.notes:
        lines += ["# Not paired (present on one side only in the comparison unless you add entries):",
                  *[f"#   {note}" for note in dict.fromkeys(found.notes)]]
    return "\n".join(lines) + "\n"

