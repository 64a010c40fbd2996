"""The name and layout map between two captures: which B tensors make each A tensor, and how.

    format: xfalign-map/1
    sides: {a: megatron, b: paddle}            # optional: the sides (names or frameworks) it was written for
    roles:                                     # B's role words in A's (optimizer states), before anything else
      - {a: exp_avg, b: moment1}
      - {a: exp_avg_sq, b: moment2}
      - {a: step}                              # one side only: no counterpart, ignored (as under ignore)
      - {b: beta1_pow_acc}
    defaults:                                  # layouts of module pairs that do not give their own
      calls: {permute: [1, 0, 2]}              #   inputs/outputs/grad_outputs: A [s, b, h] = B [b, s, h]
      params: {transpose: true}                #   params/grads: torch [out, in] = paddle [in, out]
    modules:                                   # module pairs: B's tensors renamed, `#call:role.slot` kept
      - {a: "decoder.layers.{i}.mlp", b: "layers.{i}.mlp"}
      - {a: "decoder.layers.{i}.mlp.linear_fc2", b: "layers.{i}.mlp.down_proj"}
      - a: "decoder.layers.{i}.mlp.linear_fc1"            # several B modules: a pair for tables and
        b: ["layers.{i}.mlp.gate_proj", "layers.{i}.mlp.up_proj"]   # replay; tensors need entries below
    tensors:                                   # tensor entries: tried first, in order; first match wins
      - a: "decoder.layers.{i}.mlp.linear_fc1:{role:param|grad}.{p}"     # [2*ffn, h]: gate rows, up rows
        b: {gate: "layers.{i}.mlp.gate_proj:{role}.{p}", up: "layers.{i}.mlp.up_proj:{role}.{p}"}
        transpose: true                        # each B part [h, ffn] -> [ffn, h]
        split: {axis: 0}                       # A's fused tensor is the parts joined along its axis 0
      - a: "decoder.layers.{i}.mlp.experts:param.weight1"                 # experts: one capture ({e}) on
        b: "layers.{i}.mlp.experts.{e}.w1:param.weight"                  # one side only runs over parts
        split: {axis: 0, stack: true, count: 8}                           # stacked into a new axis 0
      - a: "decoder.layers.{i}.mlp.linear_fc1:{role:param|grad}.weight"   # A captured at TP > 1: each
        b: "decoder.layers.{i}.mlp.linear_fc1:{role}.weight"              # rank holds [gate_r; up_r]
        shard: {a: {axis: 0, group: tp, interleave: 2}}
    ignore:                                    # tensors with no counterpart, on purpose (not reported)
      b: ["layers.{i}.mlp.up_proj#{c}:input.0"]     # the same input as gate_proj's

Roles (`roles:`): a pair renames the role word of B's tensor names (`<module>:moment1.<p>`) to A's
(`<module>:exp_avg.<p>`) before anything else of the map is applied, so every other entry is written in A's
words (B's patterns and `ignore.b` included) and module pairs, `defaults.params` layouts and splits apply to
optimizer states as to `:param.` tensors; `to_b` renames back after them. A word of one side alone has no
counterpart: the tensors with that role are ignored on that side, as under `ignore`. Words are roles of
harness.store.tree_format (ROLES); each must occur in its side's tree. A tensor entry covers a parameter's
optimizer records when its role capture lists their (A's) words: `{role:param|grad|grad_clipped|updated|
exp_avg|exp_avg_sq}` (`map suggest` lists those the trees hold).

Patterns: `{name}` captures one dotted component (no `.`, `#`, `:`), `{name:x|y}` one of the listed words,
a capture named twice must match the same text; `*` (any text within a component) only in `ignore`.

Layouts go from B to A: `permute: [1, 0, 2]` means A's axis k is B's axis permute[k]; `transpose: true`
swaps the last two axes (tensors of fewer than two axes unchanged, so a bias passes through).

Split (one side lists several parts, or a capture on one side only runs over them): `axis` is an axis of
the FUSED tensor, in its own side's layout; the parts, in the order listed (or of their capture's value),
are converted to the fused side's layout and joined along it (`stack: true`: stacked into a new axis);
`sizes` (default equal parts) and `count` (parts of a capture; needed to split when sizes and stack do not
tell) are checked where known.

What `to_a` does with each B tensor: one whose role is B's alone is dropped; its role word is renamed (roles);
an `ignore.b` match is dropped; then a tensor entry, a module pair, or the identity (its own name: a tensor
the map does not mention keeps its name, so with no map at all the names pair as they are, and an unmapped
B tensor is reported by the comparison as present on one side only, through OneSidedPair; an A name made by
an entry wins over a B tensor kept under its own name).
A map must fit the trees it pairs (`check_trees`, before anything is compared): `sides`, where given, name
each tree's side or framework, in order; every `roles` word occurs in a tensor name of its side, and every
pattern of every entry (modules, tensors, ignore) matches a module or tensor of its side (B's names in A's
role words) in some step; an empty map is refused when loaded. A map covers only what it must (a tensor it
does not mention keeps its name), but an entry that pairs nothing is a typo or a map made for other trees.

Sharding (a side captured on several ranks: its tree has rank-NNNNN folders): `shard: {a: {...}, b: {...}}`
says, per side, how that side's tensors matched by the entry's patterns of that side (each part, where
several) are split across the ranks of a parallel group: `axis` (of the tensor each rank holds, in its own
side's layout), `group` (the parallel group: `tp` or `ep`, either one every rank of the capture, as a
capture records no other layout) and `interleave` (blocks per rank along the axis: Megatron's gated fc1
holds `[gate_r; up_r]` per rank, interleave 2, so the canonical `[gate; up]` is `[gate_0; gate_1; up_0;
up_1]`; harness.sharding). Expert parallelism: `ragged: true` (with `axis`) lets the pieces differ in length
(the tokens each rank's experts received); `reduce: sum` (no axis) says each rank holds a partial sum (a
replicated weight's gradient from the rank's own tokens), added up; `local: e, per_rank: n` (no axis) says
the entry's capture `{e}` is a rank's local expert index: rank r's tensor with e = l is the canonical tensor
with e = r * n + l (the pattern with that number), filed under that name. Before anything is paired or mapped, each step of a
tree of several ranks is put together in the canonical (one-rank) layout: a tensor a shard declares is
assembled from the ranks' pieces; every other tensor is a replica, checked bit-identical on every rank (a
replicas-differ finding otherwise). A split tensor that some rank holds digest-only cannot be assembled:
it is left out with the reason. Two trees of the same world size whose map declares no shard are compared
rank by rank instead (harness.compare.tree). A shard on a side of one rank has nothing to assemble.

Digest-only tensors: renamed with their digest when the layout keeps their bytes (a rename, or a permute
that moves only axes of size 1); otherwise they cannot be made without their bytes and are left out,
listed in `MappedDump.left_out` with the reason (re-capture them in full: digests-then-full).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator, model_validator

from harness.errors import XfalignError, describe_value, validation_problem
from harness.sharding import Sharding
from harness.store.digest import digests_of
from harness.store.dump import Dump
from harness.store.tree import Tree
from harness.store.tree_format import ROLES, TensorName
from harness.yamlio import line_and_field, read_yaml

MAP_FORMAT: Literal["xfalign-map/1"] = "xfalign-map/1"
MAX_MAP_BYTES = 1 << 20
Side = Literal["a", "b"]
SIDES: tuple[Side, Side] = ("a", "b")
PositiveInt = Annotated[StrictInt, Field(gt=0)]
PARALLEL_GROUPS = ("tp", "ep")  # a capture records no parallel layout: either group is its whole world


class MapError(XfalignError):
    """A map file that cannot be used: one line naming file, line and field (exit 2)."""


class MapApplyError(XfalignError):
    """A map entry that does not fit the tensors it is applied to: names the tensor and the entry (exit 2)."""


# --- patterns -----------------------------------------------------------------------------------------

_TOKEN = re.compile(r"\{(?P<name>[A-Za-z_]\w*)(?::(?P<alts>[^{}]*))?\}|\*")
_COMPONENT = r"[^.#:]+"


@dataclass(frozen=True)
class Pattern:
    """A tensor or module name with captures: `layers.{i}.mlp`, `{role:param|grad}`."""

    text: str
    regex: re.Pattern
    captures: tuple[str, ...]

    @classmethod
    def compile(cls, text: str, star: bool = False, words: dict[str, str] | None = None) -> Pattern:
        """`words`: a capture's `x|y` given elsewhere in the entry (it holds on every side)."""
        parts, captures, position = [], [], 0
        for token in _TOKEN.finditer(text):
            parts.append(_literal(text[position:token.start()]))
            position = token.end()
            name = token["name"]
            if name is None:
                if not star:
                    raise ValueError(f"{text!r}: '*' only in ignore lists; capture with {{name}} here")
                parts.append(r"[^.#:]*")
            elif name in captures:
                parts.append(f"(?P={name})")
            else:
                captures.append(name)
                alts = token["alts"] if token["alts"] is not None else (words or {}).get(name)
                if alts is not None and not all(alts.split("|")):
                    raise ValueError(f"{text!r}: {{{name}:...}} lists words separated by '|'")
                parts.append(f"(?P<{name}>{'|'.join(map(re.escape, alts.split('|'))) if alts is not None else _COMPONENT})")
        parts.append(_literal(text[position:]))
        return cls(text, re.compile("".join(parts)), tuple(captures))

    def match(self, name: str) -> dict[str, str] | None:
        found = self.regex.fullmatch(name)
        return None if found is None else found.groupdict()

    def format(self, values: dict[str, str]) -> str:
        return _TOKEN.sub(lambda token: values[token["name"]], self.text)

    @property
    def module(self) -> Pattern:
        """The module part of a tensor pattern (before `#call` or `:role`)."""
        cut = len(self.text)
        for found in re.finditer(r"[#:]", _TOKEN.sub(lambda t: "_" * len(t.group()), self.text)):
            cut = found.start()
            break
        return Pattern.compile(self.text[:cut])


def _words(texts: list[str]) -> dict[str, str]:
    """The `{name:x|y}` words of the captures of an entry's patterns."""
    return {t["name"]: t["alts"] for text in texts for t in _TOKEN.finditer(text) if t["name"] and t["alts"] is not None}


def _literal(text: str) -> str:
    if "{" in text or "}" in text:
        raise ValueError(f"unbalanced or malformed capture in {text!r}: a capture is {{name}} or {{name:word|word}}")
    return re.escape(text)


# --- layouts ---

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Shard(_Strict):
    """How one side's tensor is split across the ranks of a parallel group (see the module's docstring)."""

    axis: StrictInt | None = None
    group: str = "tp"
    interleave: PositiveInt = 1
    ragged: StrictBool = False
    reduce: Literal["sum"] | None = None
    local: str | None = None  # the capture of the entry's pattern that holds a rank's local expert index
    per_rank: PositiveInt | None = None  # local experts per rank

    @field_validator("group")
    @classmethod
    def _known_group(cls, group: str) -> str:
        if group not in PARALLEL_GROUPS:
            raise ValueError(f"group {group!r}: only tensor- and expert-parallel groups are assembled now "
                             f"({', '.join(PARALLEL_GROUPS)}: every rank of the capture)")
        return group

    @model_validator(mode="after")
    def _one_kind(self) -> Shard:
        kinds = [k for k, given in (("axis", self.axis is not None), ("reduce", self.reduce is not None),
                                    ("local", self.local is not None)) if given]
        if len(kinds) != 1:
            raise ValueError("give one of axis (split), reduce: sum (partial sums) or local (local experts), "
                             f"not {' and '.join(kinds) or 'none'}")
        if (self.local is None) != (self.per_rank is None):
            raise ValueError("local and per_rank go together: the local expert capture and the experts per rank")
        if self.axis is None and (self.ragged or self.interleave != 1):
            raise ValueError("ragged and interleave describe a split on an axis: give axis")
        if self.ragged and self.interleave != 1:
            raise ValueError("ragged pieces are one block per rank (interleave 1)")
        return self

    def sharding(self, pattern: Pattern | None = None, values: dict[str, str] | None = None) -> Sharding:
        """The Sharding of one tensor; for local experts, of the tensor `pattern` matched with `values`."""
        if self.local is None:
            return Sharding(self.axis, self.interleave, self.ragged, self.reduce)
        assert pattern is not None and values is not None and self.per_rank is not None
        key, per_rank, filled = self.local, self.per_rank, dict(values)
        local = int(values[key])

        def rename(rank: int) -> str:
            return pattern.format({**filled, key: str(rank * per_rank + local)})
        return Sharding(rename=rename)


class _LayoutChecks(_Strict):
    """The checks of a `permute` / `transpose` pair, for the models that declare them (Layout, a tensor entry)."""

    if TYPE_CHECKING:  # declared by each subclass, where its fields are in the order errors are reported
        permute: list[int] | None
        transpose: bool

    @field_validator("permute", check_fields=False)
    @classmethod
    def _permutation(cls, axes: list[int] | None) -> list[int] | None:
        if axes is not None and sorted(axes) != list(range(len(axes))):
            raise ValueError(f"permute lists each axis 0..n-1 once, got {axes}")
        return axes

    @model_validator(mode="after")
    def _one_kind(self) -> Any:
        if self.permute is not None and self.transpose:
            raise ValueError("give permute or transpose, not both")
        return self


class Layout(_LayoutChecks):
    """How a B tensor's axes become A's: `permute` (A axis k = B axis permute[k]) or `transpose` (last two)."""

    permute: list[StrictInt] | None = None
    transpose: StrictBool = False

    @property
    def identity(self) -> bool:
        return not self.transpose and (self.permute is None or self.permute == sorted(self.permute))

    def axes(self, ndim: int, to_a: bool = True) -> list[int]:
        if self.transpose:
            return list(range(ndim - 2)) + [ndim - 1, ndim - 2] if ndim >= 2 else list(range(ndim))
        if self.permute is None:
            return list(range(ndim))
        if len(self.permute) != ndim:
            raise ValueError(f"permute {self.permute} has {len(self.permute)} axes, the tensor {ndim}")
        return self.permute if to_a else [int(i) for i in np.argsort(self.permute)]

    def apply(self, array: np.ndarray, to_a: bool = True) -> np.ndarray:
        axes = self.axes(array.ndim, to_a)
        return array if axes == sorted(axes) else np.ascontiguousarray(np.transpose(array, axes))

    def same_bytes_shape(self, shape: list[int], to_a: bool = True) -> list[int] | None:
        """The new shape if the layout keeps the C-order bytes (only axes of size 1 move), else None."""
        axes = self.axes(len(shape), to_a)
        moved = [axis for axis in axes if shape[axis] != 1]
        return [shape[axis] for axis in axes] if moved == sorted(moved) else None

    def describe(self) -> str:
        return "transpose" if self.transpose else f"permute {self.permute}" if not self.identity else ""


IDENTITY = Layout()


# --- the map file's schema ----------------------------------------------------------------------------


class Split(_Strict):
    axis: StrictInt  # of the fused tensor, in its own side's layout
    sizes: list[PositiveInt] | None = None  # default: equal parts
    count: PositiveInt | None = None  # parts of a capture that runs over them
    stack: StrictBool = False

    @model_validator(mode="after")
    def _consistent(self) -> Split:
        if self.stack and self.sizes is not None:
            raise ValueError("stacked parts have no sizes (each is one slice of the new axis)")
        if self.sizes is not None and self.count is not None and self.count != len(self.sizes):
            raise ValueError(f"count {self.count} but {len(self.sizes)} sizes")
        return self


def _parts(value: Any) -> list[tuple[str, str]]:
    """A side of a tensor entry: one name, a list of parts, or a mapping part-name: pattern."""
    if isinstance(value, str):
        return [("", value)]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return [(str(i), v) for i, v in enumerate(value)]
    if isinstance(value, dict) and value and all(isinstance(v, str) for v in value.values()):
        return [(str(k), v) for k, v in value.items()]
    raise ValueError(f"a tensor name pattern, a list of them, or a mapping part: pattern, got {describe_value(value)}")


class TensorEntrySpec(_LayoutChecks):
    a: Any
    b: Any
    permute: list[StrictInt] | None = None
    transpose: StrictBool = False
    split: Split | None = None
    shard: dict[Side, Shard] = {}
    note: str = ""

    @field_validator("a", "b")
    @classmethod
    def _patterns(cls, value: Any) -> list[tuple[str, str]]:
        parts = _parts(value)
        for _, text in parts:
            Pattern.compile(text)
        return parts


class ModuleEntrySpec(_Strict):
    a: str
    b: str | list[str]
    calls: Layout | None = None
    params: Layout | None = None

    @field_validator("a", "b")
    @classmethod
    def _patterns(cls, value: str | list[str]) -> str | list[str]:
        for text in [value] if isinstance(value, str) else value:
            if re.search(r"[#:]", _TOKEN.sub("", text)):
                raise ValueError(f"{text!r}: a module path has no '#' or ':' (tensor names go under tensors:)")
            Pattern.compile(text)
        return value


class Defaults(_Strict):
    calls: Layout = IDENTITY
    params: Layout = IDENTITY


class Ignore(_Strict):
    a: list[str] = []
    b: list[str] = []

    @field_validator("a", "b")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for text in value:
            Pattern.compile(text, star=True)
        return value


class RoleEntrySpec(_Strict):
    """Two sides' words for one role (`{a: exp_avg, b: moment1}`), or one side's alone: no counterpart."""

    a: str | None = None
    b: str | None = None

    @field_validator("a", "b")
    @classmethod
    def _known(cls, word: str | None) -> str | None:
        if word is not None and word not in ROLES:
            raise ValueError(f"{word!r} is not a role of a captured tensor's name ({', '.join(ROLES)})")
        return word

    @model_validator(mode="after")
    def _given(self) -> RoleEntrySpec:
        if self.a is None and self.b is None:
            raise ValueError("give a, b or both (a word of one side alone: its tensors have no counterpart)")
        return self


class MapSpec(_Strict):
    format: Literal["xfalign-map/1"] = MAP_FORMAT
    sides: dict[Side, str] = {}
    roles: list[RoleEntrySpec] = []
    defaults: Defaults = Defaults()
    modules: list[ModuleEntrySpec] = []
    tensors: list[TensorEntrySpec] = []
    ignore: Ignore = Ignore()


# --- compiled entries ---------------------------------------------------------------------------------


@dataclass
class _TensorEntry:
    where: str  # "map.yaml:14 (tensors[2])", for messages
    parts: dict[str, list[tuple[str, Pattern]]]  # side -> [(part name, pattern)]
    layout: Layout
    split: Split | None
    shard: dict[Side, Shard] = field(default_factory=dict)
    fused: Side | None = None  # the side holding one fused tensor, when the entry splits
    gathered: str | None = None  # the capture (on the parts side only) that runs over the parts
    a_captures: tuple[str, ...] = ()


@dataclass
class _ModuleEntry:
    where: str
    a: Pattern
    b: list[Pattern]
    calls: Layout
    params: Layout


def _compile_tensor_entry(spec: TensorEntrySpec, where: str) -> _TensorEntry:
    """Raises FieldError (a field of the entry, a message) when the entry cannot be applied."""
    words = _words([text for side in ("a", "b") for _, text in getattr(spec, side)])
    parts = {side: [(name, Pattern.compile(text, words=words)) for name, text in getattr(spec, side)] for side in ("a", "b")}
    if spec.permute is not None or spec.transpose:
        layout = Layout(permute=spec.permute, transpose=spec.transpose)
    else:
        layout = IDENTITY
    captures = {side: {frozenset(p.captures) for _, p in parts[side]} for side in ("a", "b")}
    for side in ("a", "b"):
        if len(captures[side]) > 1:
            raise _FieldError((side,), "every part must use the same captures")
    ca, cb = next(iter(captures["a"])), next(iter(captures["b"]))
    entry = _TensorEntry(where, parts, layout, spec.split, dict(spec.shard), a_captures=parts["a"][0][1].captures)
    if ca != cb:
        one_sided = ca ^ cb
        parts_side: Side = "b" if cb > ca else "a"
        if len(one_sided) != 1 or not (ca < cb or cb < ca) or len(parts["a"]) + len(parts["b"]) != 2:
            raise _FieldError(("b",), f"captures differ (a: {sorted(ca) or 'none'}, b: {sorted(cb) or 'none'}); a capture "
                                      "on one side only must be the one that runs over the parts, each side one pattern")
        entry.gathered = next(iter(one_sided))
        entry.fused = "a" if parts_side == "b" else "b"
    elif len(parts["a"]) > 1 and len(parts["b"]) > 1:
        raise _FieldError(("b",), "only one side lists several parts (the other side's one tensor is split into them)")
    elif len(parts["a"]) > 1 or len(parts["b"]) > 1:
        entry.fused = "a" if len(parts["b"]) > 1 else "b"
    if entry.fused is None and spec.split is not None:
        raise _FieldError(("split",), "split needs several parts on one side (a list, or a capture on one side only)")
    if entry.fused is not None and spec.split is None:
        raise _FieldError(("split",), "several parts need split: {axis: ...} (the axis of the fused tensor they make)")
    if entry.fused is not None and spec.split is not None:
        listed = len(parts["b" if entry.fused == "a" else "a"])
        if entry.gathered is None and spec.split.sizes is not None and len(spec.split.sizes) != listed:
            raise _FieldError(("split", "sizes"), f"{len(spec.split.sizes)} sizes for {listed} parts")
        if entry.gathered is None and spec.split.count is not None and spec.split.count != listed:
            raise _FieldError(("split", "count"), f"count {spec.split.count} for {listed} parts")
    return entry


class _FieldError(Exception):
    def __init__(self, path: tuple, message: str):
        super().__init__(message)
        self.path, self.message = path, message


# --- the result of to_a -------------------------------------------------------------------------------


@dataclass
class MappedDump(Dump):
    """B's step dump in A's names and layouts (see the module's docstring for the rules)."""

    left_out: dict[str, str] = field(default_factory=dict)  # A name -> why it could not be made
    sources: dict[str, list[str]] = field(default_factory=dict)  # A name -> the B tensors it is made of
    how: dict[str, str] = field(default_factory=dict)  # A name -> the transform, where not a plain rename
    unmapped: list[str] = field(default_factory=list)  # B tensors the map does not mention (kept by name)
    ignored: list[str] = field(default_factory=list)  # B tensors dropped by ignore.b


@dataclass
class _Source:
    """What one side holds for a name: an array, or (digest only) its digest entry."""

    array: np.ndarray | None
    entry: dict | None
    why: str | None = None  # not there to translate: why (a split tensor a rank held digest-only)


# --- the map ------------------------------------------------------------------------------------------


class TensorMap:
    """A loaded map (`load_map`), or the identity (`TensorMap()`: every name pairs with itself)."""

    def __init__(self, spec: MapSpec | None = None, source: str = "(identity map)", lines: dict[tuple, int] | None = None):
        self.spec = spec or MapSpec()
        self.source = source
        self.lines = lines = lines or {}

        def where(path: tuple) -> str:
            return f"{source}:{line_and_field(lines, path)[0]} ({path[0]}[{path[1]}])"

        self.tensor_entries: list[_TensorEntry] = []
        for index, entry_spec in enumerate(self.spec.tensors):
            try:
                self.tensor_entries.append(_compile_tensor_entry(entry_spec, where(("tensors", index))))
            except _FieldError as problem:
                line, name = line_and_field(lines, ("tensors", index, *problem.path))
                raise MapError(f"{source}:{line}: {name}: {problem.message}") from None
        self.module_entries: list[_ModuleEntry] = []
        for index, module_spec in enumerate(self.spec.modules):
            b = [module_spec.b] if isinstance(module_spec.b, str) else module_spec.b
            words = _words([module_spec.a, *b])
            a_pattern, b_patterns = Pattern.compile(module_spec.a, words=words), [Pattern.compile(t, words=words) for t in b]
            for position, pattern in enumerate(b_patterns):
                if set(pattern.captures) != set(a_pattern.captures):
                    line, name = line_and_field(lines, ("modules", index, "b", *([position] if len(b) > 1 else [])))
                    raise MapError(f"{source}:{line}: {name}: captures differ (a: {sorted(a_pattern.captures) or 'none'}, "
                                   f"b: {sorted(pattern.captures) or 'none'})")
            if len(b) > 1 and (module_spec.calls or module_spec.params):
                line, name = line_and_field(lines, ("modules", index, "calls" if module_spec.calls else "params"))
                raise MapError(f"{source}:{line}: {name}: a layout needs a one-to-one module pair; with several B "
                               "modules give tensor entries")
            self.module_entries.append(_ModuleEntry(where(("modules", index)), a_pattern, b_patterns,
                                                    _given(module_spec.calls, self.spec.defaults.calls),
                                                    _given(module_spec.params, self.spec.defaults.params)))
        self.ignore = {side: [Pattern.compile(t, star=True) for t in getattr(self.spec.ignore, side)] for side in ("a", "b")}
        self.role_words: dict[Side, dict[str, str]] = {"a": {}, "b": {}}  # a side's word -> the other side's
        self.alone: dict[Side, set[str]] = {"a": set(), "b": set()}  # words of one side: no counterpart
        for index, role in enumerate(self.spec.roles):
            for side in SIDES:
                word = getattr(role, side)
                if word in self.role_words[side] or word in self.alone[side]:
                    raise self._error(("roles", index, side), f"{word!r} is listed twice for side {side}")
            if role.a is not None and role.b is not None:
                self.role_words["a"][role.a], self.role_words["b"][role.b] = role.b, role.a
            else:
                side = "a" if role.a is not None else "b"
                self.alone[side].add(getattr(role, side))

    @property
    def sides(self) -> dict[Side, str]:
        return dict(self.spec.sides)

    @property
    def is_identity(self) -> bool:
        return not (self.spec.tensors or self.spec.modules or self.spec.ignore.a or self.spec.ignore.b or self.spec.roles)

    def check_trees(self, tree_a: Tree, tree_b: Tree) -> None:
        """MapError (file:line: field) where the map does not fit the two trees it is to pair: its `sides`
        are not theirs (the side's name or its framework), or an entry matches nothing in any step (a typo,
        or a map written for other captures: an entry that pairs nothing would go unnoticed)."""
        trees: dict[Side, Tree] = {"a": tree_a, "b": tree_b}
        for side, tree in trees.items():
            wanted, manifest = self.spec.sides.get(side), tree.manifest
            if wanted is not None and wanted not in (manifest.side, manifest.framework):
                raise self._error(("sides", side), f"the map is for side {wanted!r}, but tree {side.upper()} ({tree.path}) is "
                                                   f"side {manifest.side!r} (framework {manifest.framework}): give the trees "
                                                   "in the map's order, or correct sides")
        names = {side: tree.tensor_names() for side, tree in trees.items()}
        parsed_names = {side: [parsed for parsed in map(TensorName.parse, found) if parsed is not None]
                        for side, found in names.items()}
        modules = {side: {parsed.module for parsed in found} for side, found in parsed_names.items()}
        for index, role in enumerate(self.spec.roles):
            for side in SIDES:
                word = getattr(role, side)
                if word is not None and not any(parsed.role == word for parsed in parsed_names[side]):
                    raise self._error(("roles", index, side), f"no tensor of tree {side.upper()} ({trees[side].path}) has "
                                                              f"the role {word!r}: correct it, or remove the entry")
        raw_b, names["b"] = names["b"], {self._in_a_words("b", name) for name in names["b"]}
        for location, side, pattern in self._patterns():
            is_module = location[0] == "modules"
            if not any(pattern.match(name) is not None for name in (modules if is_module else names)[side]):
                hint = ""
                if side == "b" and not is_module and any(pattern.match(name) is not None for name in raw_b):
                    hint = f" in A's role words (roles: renames {', '.join(sorted(self.role_words['b']))} first)"
                raise self._error(location, f"{pattern.text!r} matches no {'module' if is_module else 'tensor'} of tree "
                                            f"{side.upper()} ({trees[side].path}){hint}: correct it, or remove the entry")

    def _patterns(self) -> Iterator[tuple[tuple, Side, Pattern]]:
        """Every pattern of the map's entries, with its place in the file and the side whose names it matches."""
        for index, entry in enumerate(self.tensor_entries):
            for side in SIDES:
                parts = entry.parts[side]
                several = len(parts) > 1 or parts[0][0] != ""
                for part, pattern in parts:
                    yield ("tensors", index, side, *([int(part) if part.isdigit() else part] if several else [])), side, pattern
        for index, module_entry in enumerate(self.module_entries):
            yield ("modules", index, "a"), "a", module_entry.a
            several = not isinstance(self.spec.modules[index].b, str)
            for position, pattern in enumerate(module_entry.b):
                yield ("modules", index, "b", *([position] if several else [])), "b", pattern
        for side in SIDES:
            for position, pattern in enumerate(self.ignore[side]):
                yield ("ignore", side, position), side, pattern

    def _error(self, location: tuple, message: str) -> MapError:
        line, name = line_and_field(self.lines, location)
        return MapError(_one_line(f"{self.source}:{line}: {name}: {message}"))

    @property
    def declares_sharding(self) -> bool:
        return any(entry.shard for entry in self.tensor_entries)

    def sharding(self, side: Side, name: str) -> Sharding | None:
        """How tensor `name` of `side` is split across that side's ranks: the shard of the first tensor entry
        whose `side` patterns match it (first match wins, as in translation); None: a replica."""
        hit = self._entry_hit(self._in_a_words(side, name), side)
        if hit is None:
            return None
        entry = self.tensor_entries[hit[0]]
        shard = entry.shard.get(side)
        if shard is None:
            return None
        if shard.local is not None and not hit[2].get(shard.local, "").isdigit():
            raise MapApplyError(f"{entry.where}: tensor {name}: shard.local names the capture {shard.local!r}, which "
                                "does not hold a local expert index (a number) in it")
        pattern = dict(entry.parts[side]).get(hit[1]) or entry.parts[side][0][1]
        return shard.sharding(pattern, hit[2])

    def ignored(self, side: Side, name: str) -> bool:
        """Whether `name` of `side` has no counterpart on purpose: its role is that side's alone (roles), or it
        is in the map's ignore list."""
        return self._ignores(side, name, self._in_a_words(side, name))

    def _ignores(self, side: Side, name: str, read: str) -> bool:
        """`ignored`, given `read`: the name in A's role words."""
        parsed = TensorName.parse(name) if self.alone[side] else None
        if parsed is not None and parsed.role in self.alone[side]:
            return True
        return any(pattern.match(read) is not None for pattern in self.ignore[side])

    def _in_a_words(self, side: Side, name: str) -> str:
        """A tensor name of `side` with its role word in A's words (the words every pattern is written in)."""
        return name if side == "a" else _with_role(name, self.role_words["b"])

    # --- translation, one engine for both directions ---

    def to_a(self, dump_b: Dump) -> MappedDump:
        """B's dump in A's names and layouts. Stored tensors transformed; digest-only ones renamed when the
        layout keeps their bytes, else left out (`left_out`). meta.capture stays B's (B's module names)."""
        names = dump_b.names
        stored = [name for name in names if name in dump_b.tensors]
        check = getattr(dump_b.tensors, "check", None)
        if check is not None:
            check(stored)  # every byte used below is checked against its digest, in threads
        entries = {entry["name"]: entry for entry in dump_b.meta.get("tensors", [])}
        for name, array in dump_b.tensors.items():
            entries.setdefault(name, {"name": name, **digests_of({name: array})[name].to_json(xxh3=True)})
        for name, entry in dump_b.unstored.items():
            entries.setdefault(name, {"name": name, **entry, "stored": False})

        absent: dict[str, str] = dict(getattr(dump_b, "left_out", {}))  # B's, assembling its ranks

        def fetch(name: str) -> _Source:
            if name in absent:
                return _Source(None, None, absent[name])
            return _Source(dump_b.tensors[name] if name in dump_b.tensors else None, entries[name])

        made = self._translate(names + [name for name in absent if name not in names], "b", fetch)
        tensors: dict[str, np.ndarray] = {}
        result = MappedDump(copy.deepcopy(dump_b.meta), tensors, order=[], directory=dump_b.directory)
        fresh = {name: out.array for name, out in made.outputs.items() if out.array is not None and out.entry is None}
        fresh_digests = digests_of(fresh)
        meta_entries = []
        for name, out in made.outputs.items():
            if out.array is not None:
                tensors[name] = out.array
                if out.entry is not None:  # bytes unchanged: B's digest, under A's name
                    meta_entries.append({**out.entry, "name": name})
                    if "stats" in out.entry:
                        result.stats[name] = out.entry["stats"]
                else:
                    meta_entries.append({"name": name, **fresh_digests[name].to_json(xxh3=True)})
            else:
                assert out.entry is not None
                entry = {k: v for k, v in out.entry.items() if k not in ("name", "stored")}
                result.unstored[name] = entry
                meta_entries.append({**out.entry, "name": name, "stored": False})
            result.order.append(name)  # type: ignore[union-attr]
        result.meta["tensors"] = meta_entries
        differ = dump_b.meta.get("replicas_differ") or {}
        if differ:  # B's replicas whose ranks differ (harness.store.ranks), under the A names made of them
            result.meta["replicas_differ"] = {
                name: sorted({rank for source in sources for rank in differ.get(source, [])})
                for name, sources in made.sources.items() if any(source in differ for source in sources)}
        result.left_out, result.sources, result.how = made.left_out, made.sources, made.how
        result.unmapped, result.ignored = made.unmapped, made.ignored
        return result

    def to_b(self, arrays_a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A's arrays in B's names and layouts (the inverse of to_a): weights and optimizer states to load into
        B, replay inputs. Names the map does not mention keep their names (role words renamed: roles); ignore.a
        names and roles of A alone are dropped."""
        made = self._translate(list(arrays_a), "a", lambda name: _Source(np.asarray(arrays_a[name]), None))
        if made.left_out:
            name, why = next(iter(made.left_out.items()))
            raise MapApplyError(f"{self.source}: cannot make B tensor {name}: {why}")
        return {name: out.array for name, out in made.outputs.items() if out.array is not None}

    def module_pairs(self, modules_a: list[str], modules_b: list[str] | None = None) -> dict[str, list[str]]:
        """For each A module (in the given order), the B modules that make it up: from module pairs, then
        from tensor entries' module parts, else the module of the same name; filtered by `modules_b`."""
        known_b = None if modules_b is None else set(modules_b)
        pairs: dict[str, list[str]] = {}
        for module in modules_a:
            found: list[str] = []
            for entry in self.module_entries:
                values = entry.a.match(module)
                if values is not None:
                    found = [pattern.format(values) for pattern in entry.b]
                    break
            else:
                found = self._modules_from_entries(module, modules_b)
            if not found and not self._module_named(module):
                found = [module]
            pairs[module] = [name for name in dict.fromkeys(found) if known_b is None or name in known_b]
        return pairs

    def _module_named(self, module: str) -> bool:
        return any(pattern.module.match(module) is not None for entry in self.tensor_entries for _, pattern in entry.parts["a"])

    def _modules_from_entries(self, module: str, modules_b: list[str] | None) -> list[str]:
        found: list[str] = []
        for entry in self.tensor_entries:
            for _, a_pattern in entry.parts["a"]:
                values = a_pattern.module.match(module)
                if values is None:
                    continue
                for _, b_pattern in entry.parts["b"]:
                    b_module = b_pattern.module
                    if all(c in values for c in b_module.captures):
                        found.append(b_module.format(values))
                    elif modules_b is not None:  # a capture runs over B modules (experts): the ones present
                        partial = Pattern.compile(_fill(b_module.text, values))
                        found += [name for name in modules_b if partial.match(name) is not None]
        return found

    # --- the engine ---

    def _translate(self, names: list[str], source: Side, fetch) -> _Made:
        target: Side = "a" if source == "b" else "b"
        to_a = source == "b"
        made = _Made()
        groups: dict[tuple, dict[str, str]] = {}  # (entry index, target captures) -> part key -> source name
        jobs: list[tuple] = []  # in the order of first appearance
        kept: list[tuple[str, str]] = []
        for name in names:
            read = self._in_a_words(source, name)  # what the patterns match; jobs fetch `name`
            if self._ignores(source, name, read):
                made.ignored.append(name)
                continue
            hit = self._entry_hit(read, source)
            if hit is not None:
                index, part, values = hit
                entry = self.tensor_entries[index]
                if entry.fused == source or entry.fused is None:  # one source tensor: its own job
                    jobs.append(("entry", index, values, {part: name}))
                    continue
                key_values = {k: v for k, v in values.items() if k != entry.gathered}
                key = (index, tuple(sorted(key_values.items())))
                if key not in groups:
                    groups[key] = {}
                    jobs.append(("entry", index, key_values, groups[key]))
                groups[key][part] = name
                continue
            renamed = self._module_hit(read, source)
            if renamed is not None:
                jobs.append(("rename", name, *renamed))
            else:
                kept.append((name, read))
        for job in jobs:
            if job[0] == "rename":
                _, name, new_name, layout, where = job
                self._one(made, new_name, [name], fetch(name), layout, to_a, where)
            else:
                self._entry_job(made, self.tensor_entries[job[1]], job[2], job[3], source, target, fetch)
        for name, new_name in kept:
            made.unmapped.append(name)
            if new_name in made.outputs or new_name in made.left_out:
                continue  # an A name made by an entry wins over a B tensor kept under its own name
            self._one(made, new_name, [name], fetch(name), IDENTITY, to_a, "")
        if target == "b" and self.role_words["a"]:
            made.in_b_words(lambda name: _with_role(name, self.role_words["a"]), self.source)
        return made

    def _entry_hit(self, name: str, side: Side) -> tuple[int, str, dict[str, str]] | None:
        for index, entry in enumerate(self.tensor_entries):
            for part, pattern in entry.parts[side]:
                values = pattern.match(name)
                if values is not None:
                    return index, values[entry.gathered] if entry.gathered in values else part, values
        return None

    def _module_hit(self, name: str, side: Side) -> tuple[str, Layout, str] | None:
        parsed = TensorName.parse(name)
        if parsed is None:
            return None
        for entry in self.module_entries:
            if len(entry.b) != 1:
                continue
            source, target = (entry.b[0], entry.a) if side == "b" else (entry.a, entry.b[0])
            values = source.match(parsed.module)
            if values is not None:
                layout = entry.params if parsed.call is None else entry.calls
                return target.format(values) + name[len(parsed.module):], layout, entry.where
        return None

    def _one(self, made: _Made, new_name: str, sources: list[str], got: _Source, layout: Layout, to_a: bool,
             where: str) -> None:
        """A one-to-one translation: the array through the layout, or a digest under the new name."""
        if new_name in made.outputs:
            raise MapApplyError(f"{where or self.source}: tensor {new_name}: made twice (from "
                                f"{', '.join(made.sources[new_name])} and {', '.join(sources)})")
        made.sources[new_name] = sources
        if layout.describe():
            made.how[new_name] = f"{layout.describe()} of {sources[0]}"
        if got.why is not None:
            made.left_out[new_name] = got.why
            return
        try:
            if got.array is not None:
                array = layout.apply(got.array, to_a)
                made.outputs[new_name] = _Source(array, got.entry if array is got.array else None)
                return
            assert got.entry is not None
            shape = layout.same_bytes_shape(list(got.entry["shape"]), to_a)
        except ValueError as error:
            raise MapApplyError(f"{where}: tensor {sources[0]}: {error}") from None
        if shape is None:
            made.left_out[new_name] = (f"{sources[0]} is digest-only and the map's {layout.describe()} changes its bytes: "
                                       "capture it in full to compare")
        else:
            made.outputs[new_name] = _Source(None, {**got.entry, "shape": shape})

    def _entry_job(self, made: _Made, entry: _TensorEntry, values: dict[str, str], parts: dict[str, str],
                   source: Side, target: Side, fetch) -> None:
        to_a = source == "b"
        if entry.fused is None:
            (_, pattern), = entry.parts[target]
            name = next(iter(parts.values()))
            self._one(made, pattern.format(values), [name], fetch(name), entry.layout, to_a, entry.where)
        elif entry.fused == target:
            self._join(made, entry, values, parts, source, target, fetch)
        else:
            self._split(made, entry, values, next(iter(parts.values())), source, target, fetch)

    def _join(self, made: _Made, entry: _TensorEntry, values: dict[str, str], parts: dict[str, str],
              source: Side, target: Side, fetch) -> None:
        """Several source tensors -> the target's one fused tensor."""
        assert entry.split is not None
        name = entry.parts[target][0][1].format(values)
        if entry.gathered is not None:
            order = sorted(parts, key=lambda v: (0, int(v), "") if v.isdigit() else (1, 0, v))
        else:
            order = [part for part, _ in entry.parts[source]]
        names = [parts[part] for part in order if part in parts]
        made.sources[name] = names
        made.how[name] = f"{'stack' if entry.split.stack else 'concat'} along axis {entry.split.axis} of " + ", ".join(names)
        missing = [part for part in order if part not in parts]
        if missing:
            pattern = dict(entry.parts[source])[missing[0]]
            made.left_out[name] = f"part {missing[0]!r} ({pattern.format(values)}) is not in {source.upper()}'s dump"
            return
        count = entry.split.count if entry.split.sizes is None else len(entry.split.sizes)
        if entry.gathered is not None and count is not None and count != len(names):
            made.left_out[name] = f"{len(names)} parts found ({entry.gathered} = {', '.join(order)}), the map says {count}"
            return
        got = [fetch(part) for part in names]
        why = next((g.why for g in got if g.why is not None), None)
        if why is not None:
            made.left_out[name] = why
            return
        if any(g.array is None for g in got):
            digest_only = next(n for n, g in zip(names, got) if g.array is None)
            made.left_out[name] = f"{digest_only} is digest-only: joining parts needs full tensors (capture them in full)"
            return
        try:
            arrays = [entry.layout.apply(g.array, source == "b") for g in got if g.array is not None]
            axis = _axis(entry.split.axis, arrays[0].ndim + entry.split.stack)
            if entry.split.sizes is not None:
                sizes = [a.shape[axis] for a in arrays]
                if sizes != entry.split.sizes:
                    raise ValueError(f"parts have sizes {sizes} along axis {axis}, the map says {entry.split.sizes}")
            joined = np.stack(arrays, axis) if entry.split.stack else np.concatenate(arrays, axis)
        except ValueError as error:
            raise MapApplyError(f"{entry.where}: tensor {name} (from {', '.join(names)}): {error}") from None
        made.outputs[name] = _Source(joined, None)

    def _split(self, made: _Made, entry: _TensorEntry, values: dict[str, str], name: str, source: Side,
               target: Side, fetch) -> None:
        """The source's one fused tensor -> several target tensors."""
        assert entry.split is not None
        got = fetch(name)
        if got.why is not None:
            for _, pattern in entry.parts[target]:
                if entry.gathered is None:
                    made.left_out[pattern.format(values)] = got.why
            return
        split = entry.split
        shape = got.array.shape if got.array is not None else tuple(got.entry["shape"]) if got.entry else ()
        try:
            axis = _axis(split.axis, len(shape))
            if entry.gathered is None:
                count = len(entry.parts[target])
            elif split.stack:
                count = shape[axis]
            elif split.sizes is not None or split.count is not None:
                count = len(split.sizes) if split.sizes is not None else split.count  # type: ignore[assignment]
            else:
                raise ValueError(f"split into how many parts? give split.count (or sizes) for {entry.gathered}")
            if split.stack and count != shape[axis]:
                raise ValueError(f"{count} parts stacked, but axis {axis} has {shape[axis]}")
            sizes = split.sizes or [shape[axis] // count] * count
            if split.stack:
                sizes = [1] * count
            if sum(sizes) != shape[axis] or (split.sizes is None and shape[axis] % count):
                raise ValueError(f"axis {axis} has {shape[axis]}, not {'+'.join(map(str, sizes))} "
                                 f"({'the sizes' if split.sizes else f'{count} equal parts'})")
        except ValueError as error:
            raise MapApplyError(f"{entry.where}: tensor {name}: {error}") from None
        if entry.gathered is None:
            targets = [pattern.format(values) for _, pattern in entry.parts[target]]
        else:
            pattern = entry.parts[target][0][1]
            targets = [pattern.format({**values, entry.gathered: str(i)}) for i in range(count)]
        for new_name in targets:
            made.sources[new_name] = [name]
            made.how[new_name] = f"part of {name}, split along axis {axis}"
        if got.array is None:
            for new_name in targets:
                made.left_out[new_name] = f"{name} is digest-only: splitting it needs the full tensor (capture it in full)"
            return
        bounds = np.cumsum(sizes)[:-1]
        for new_name, piece in zip(targets, np.split(got.array, bounds, axis)):
            if split.stack:
                piece = piece.squeeze(axis)
            try:
                made.outputs[new_name] = _Source(np.ascontiguousarray(entry.layout.apply(piece, source == "b")), None)
            except ValueError as error:
                raise MapApplyError(f"{entry.where}: tensor {name} (part {new_name}): {error}") from None


def _with_role(name: str, words: dict[str, str]) -> str:
    """`name` with its role word replaced by words[role], where listed."""
    parsed = TensorName.parse(name) if words else None
    if parsed is None or parsed.role not in words:
        return name
    prefix = name[:len(name) - len(parsed.slot) - len(parsed.role) - 1]  # `<module>#<call>:`
    return f"{prefix}{words[parsed.role]}.{parsed.slot}"


def _fill(text: str, values: dict[str, str]) -> str:
    """A pattern with the captures in `values` filled in, the others left as captures."""
    return _TOKEN.sub(lambda t: values.get(t["name"], t.group()), text)


def _given(layout: Layout | None, default: Layout) -> Layout:
    return default if layout is None else layout


def _axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for {ndim} axes")
    return axis % ndim


@dataclass
class _Made:
    outputs: dict[str, _Source] = field(default_factory=dict)  # entry None: new bytes, digest to compute
    left_out: dict[str, str] = field(default_factory=dict)
    sources: dict[str, list[str]] = field(default_factory=dict)
    how: dict[str, str] = field(default_factory=dict)
    unmapped: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def in_b_words(self, rename, source: str) -> None:
        """The names made (A's role words, where a map's entries left them) renamed by `rename` (to B's)."""
        for attribute in ("outputs", "left_out", "sources", "how"):
            made: dict = getattr(self, attribute)
            renamed = {rename(name): value for name, value in made.items()}
            if len(renamed) != len(made):
                twice = next(name for name in made if rename(name) != name and rename(name) in made)
                raise MapApplyError(f"{source}: tensor {rename(twice)}: made twice (as itself, and from {twice} "
                                    "renamed by roles)")
            setattr(self, attribute, renamed)


# --- loading ------------------------------------------------------------------------------------------


def load_map(path: str | Path | None) -> TensorMap:
    """The map at `path` (None: the identity map); MapError (file:line: field: message) if it is bad."""
    if path is None:
        return TensorMap()
    path = Path(path)
    data, lines = read_yaml(path, "map file", MapError, MAX_MAP_BYTES)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise MapError(f"{path}:1: (top level): a map is a mapping (format, modules, tensors, ...), got {describe_value(data)}")
    try:
        spec = MapSpec.model_validate(data)
    except ValidationError as error:
        location, message = validation_problem(error)
        line, name = line_and_field(lines, location)
        raise MapError(_one_line(f"{path}:{line}: {name}: {message.removeprefix('Value error, ')}")) from None
    tensor_map = TensorMap(spec, str(path), lines)
    if tensor_map.is_identity:
        raise MapError(f"{path}:1: (top level): the map has no modules, tensors or ignore entries, so it would pair "
                       "names as they are: give entries (xfalign map suggest A B proposes them), or no map")
    return tensor_map


def _one_line(text: str) -> str:
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: repr(m.group())[1:-1], text)
