"""A dump: every tensor one side produced (safetensors) plus JSON metadata, written atomically."""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections.abc import ItemsView, Iterator, Mapping, ValuesView
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from harness import __version__
from harness.errors import OutputError, XfalignError, field_text, safe_name, validation_problem
from harness.store.atomic import file_mode, fsync, fsync_dir, fsync_file, pause, remove_tree, replace_dir, staging_dir
from harness.store.digest import Digest, StreamCheck, digests_of, mismatches
from harness.store.tree_format import CaptureInfo, TensorStats

FORMAT = "xfalign-dump/1"
TENSORS_FILE = "tensors.safetensors"
META_FILE = "meta.json"
DUMP_FILES = (TENSORS_FILE, META_FILE)  # all a dump folder holds: anything else is the user's
# The version of the input generator (harness.inputs): bump it whenever the bits of any input change. Version 1 cast the
# float64 draws with ml_dtypes' astype (whose float64 -> bfloat16 rounding changed between 0.6.0 and 0.7.0);
# version 2 rounds them with harness.rounding, which depends on nothing installed.
GENERATOR = 2
INPUTS_FILE = "inputs.safetensors"  # a case's generated inputs, as the runner hands them to its sides' workers
_FAST64 = re.compile(r"^[0-9a-f]{16}$")


class TensorEntry(BaseModel):
    """One stored tensor: its name and the digests recorded when it was written."""

    model_config = ConfigDict(extra="forbid")
    name: str
    dtype: str
    shape: list[int]
    md5: str | None = None  # always set for a stored tensor; None only with fast64 (hash="fast")
    xxh3: str | None = None
    fast64: str | None = None  # harness.store.fast_hash: a digest-only tensor captured with hash="fast"
    stored: bool = True  # False: only the digests (and stats) were kept (a capture in digest mode)
    stats: TensorStats | None = None

    @model_validator(mode="after")
    def _has_a_digest(self) -> TensorEntry:
        if self.md5 is None and (self.stored or self.fast64 is None):
            raise ValueError("needs an md5" + ("" if self.stored else " or a fast64"))
        if self.fast64 is not None and not _FAST64.match(self.fast64):
            raise ValueError(f"fast64 {self.fast64!r} is not 16 hex digits")
        return self


class DumpMeta(BaseModel):
    """meta.json of a dump: what ran, where, on which inputs, and the digest of every stored tensor.
    Validated when a dump is written and when it is read; `format` names this schema's version."""

    model_config = ConfigDict(extra="forbid")
    format: Literal["xfalign-dump/1"]
    xfalign: str  # the version that wrote it
    case: dict[str, Any]  # the validated case, as JSON
    case_name: str
    side: str
    framework: str
    impl: str
    mode: str | None = None
    axes: dict[str, list[str]] = {}  # names of a tensor's last two axes, where the op knows them
    notes: dict[str, str] = {}  # what a reader must know to read a tensor's comparison
    provenance: str
    environment: dict[str, Any]  # the fingerprint (harness.fingerprint)
    inputs: dict[str, dict[str, Any]]  # input name -> digest of the input as the side consumed it
    generator: int | None = None  # the input generator that made them (GENERATOR); None: a capture
    unavailable: str | None = None  # why the side could not run here (then nothing else was captured)
    repeats: dict[str, list[str | None]] = {}  # tensor -> MD5 per repeat, when run more than once
    tensors: list[TensorEntry] = []
    capture: CaptureInfo | None = None  # a step of a model capture (harness.capture)
    # a side on several ranks: a rank's own dump says which rank of how many; the canonical dump made from
    # them (harness.store.ranks) says how many, how each tensor was split, and which replicas differed
    rank: int | None = None
    world: int | None = None
    shardings: dict[str, str] = {}
    replicas_differ: dict[str, list[int]] = {}


def meta_text(meta: dict) -> str:
    """meta.json's text: a line per top-level field, and a line per item of a list of objects (each tensor,
    each capture record), keys sorted. Each line is made by orjson (json's encoder took ~2 ms per step of
    145 tensors, on the capture's writer thread)."""
    lines = []
    for key in sorted(meta):
        value = meta[key]
        if isinstance(value, list) and value and all(map(isinstance, value, repeat(dict))):
            items = _items_text(value).decode()
            lines.append(f" {_json(key)}: [\n  {items}\n ]")
        elif isinstance(value, dict) and any(isinstance(v, list) and v and isinstance(v[0], dict) for v in value.values()):
            lines.append(f" {_json(key)}: " + meta_text(value).rstrip("\n").replace("\n", "\n "))
        else:
            lines.append(f" {_json(key)}: {_json(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


_ORJSON_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def _json_bytes(value: Any) -> bytes:
    """`value` as compact JSON (UTF-8), keys sorted. orjson writes NaN and Inf as null, and refuses an integer past
    64 bits: those values are written by json instead, which keeps them."""
    try:
        text = orjson.dumps(value, option=_ORJSON_OPTIONS)
    except TypeError:
        text = None
    if text is None or (b"null" in text and _has_nonfinite(value)):
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return text


def _items_text(items: list[dict]) -> bytes:
    """The objects of `items` as `_json_bytes` writes each, a line each (joined by `,` and a newline), from one orjson
    call over the list where that is exact: its objects meet at `},{` and nowhere else (no such text within one,
    counted), and a line that says null is kept only where no NaN or Inf stood there (a step's meta: one call instead
    of ~300 on the writer's thread)."""
    try:
        text = orjson.dumps(items, option=_ORJSON_OPTIONS)
    except TypeError:
        text = b""
    inner = text[1:-1]  # without `[` and `]`
    if not text or inner.count(b"},{") != len(items) - 1:
        return _LINE.join([_json_bytes(item) for item in items])
    if b"null" not in inner:
        return inner.replace(b"},{", b"}" + _LINE + b"{")
    lines = [b"{" + line + b"}" for line in inner[1:-1].split(b"},{")]
    return _LINE.join([_json_bytes(item) if b"null" in line and _has_nonfinite(item) else line
                       for line, item in zip(lines, items, strict=True)])


_LINE = b",\n  "  # between a list's objects in meta.json


def _json(value: Any) -> str:
    return _json_bytes(value).decode()


def _has_nonfinite(value: Any) -> bool:
    """Whether a NaN or an infinity is anywhere in `value` (its dicts' values, lists and tuples). Strings, None and
    integers, most of what a meta holds, are passed by their type alone."""
    pending = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is str or item is None or kind is int or kind is bool:
            continue
        if isinstance(item, float):  # numpy's float64 too
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return False


def validated_meta(meta: dict, where: str) -> dict:
    """`meta` checked against DumpMeta (DumpError naming the first bad field), as plain JSON data. The case
    is kept as data: what reads it checks it (a comparison, the expectations it recorded)."""
    try:
        return DumpMeta.model_validate(meta).model_dump(mode="json", exclude_unset=True)
    except ValidationError as error:
        location, message = validation_problem(error)
        raise DumpError(f"{where}: {META_FILE}: {field_text(location)}: {message}") from None


class DumpError(XfalignError):
    """A dump directory that cannot be read."""

    @classmethod
    def in_meta(cls, directory: Path | None, field: str, message: str) -> DumpError:
        """A field of a dump's meta.json that is not what it must be, named with the file it is in."""
        return cls(f"{directory or 'dump'}: {META_FILE}: {field}: {message}")


class IntegrityError(DumpError):
    """Stored tensors whose bytes, dtype or shape do not match the digests recorded with them: a
    corrupt or edited dump (or golden)."""


class DumpTargetError(OutputError, FileExistsError):
    """A folder a dump may not be written to, because writing would replace what xfalign did not write
    or another side's dump (exit 2). Also an OSError, so that a worker reports it as an output error."""


def _dump_meta(folder: Path) -> dict | None:
    """The metadata of the xfalign dump at `folder`, or None if it holds none."""
    try:
        meta = json.loads((folder / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and str(meta.get("format", "")).startswith("xfalign-dump/") else None


def check_dump_target(path: str | Path, side: str | None = None, label: str = "dump") -> None:
    """Raise DumpTargetError (naming the path) unless a dump of `side` may be written at `path`: the path
    does not exist, is an empty folder, or holds an xfalign dump (of `side`, when given) and nothing else. A
    folder that holds other sides' dumps (DIR/<side>), a dump beside other files, anything else, a symbolic
    link and a folder inside a dump are refused. Touches nothing."""
    path = Path(path)
    where = f"{label} {path}".strip()
    if path.parent != path and _dump_meta(path.parent) is not None:
        raise DumpTargetError(f"{where}: is inside the xfalign dump {path.parent}; refusing to write there")
    if not os.path.lexists(path):
        return
    if path.is_symlink():
        raise DumpTargetError(f"{where}: is a symbolic link; refusing to replace it (give the folder it points to)")
    if not path.is_dir():
        raise DumpTargetError(f"{where}: exists and is not a directory")
    try:
        entries = sorted(path.iterdir())
    except OSError as error:
        raise DumpTargetError(f"{where}: cannot read it: {error.strerror or error}") from None
    if not entries:
        return
    meta = _dump_meta(path)
    if meta is not None:
        if side is not None and meta.get("side") != side:
            raise DumpTargetError(f"{where}: holds the dump of side {meta.get('side')!r}, not {side!r}; refusing to "
                                  f"replace another side's dump (give another folder, e.g. "
                                  f"{path.parent / safe_name(side)})")
        foreign = [entry.name for entry in entries if entry.name not in DUMP_FILES]
        if foreign:  # replacing the dump would delete them with it
            listed = ", ".join(repr(name) for name in foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise DumpTargetError(f"{where}: holds {listed} besides an xfalign dump; refusing to replace it (move "
                                  f"{'them' if len(foreign) > 1 else 'it'} out, or give another folder)")
        return
    inner = [entry for entry in entries if entry.is_dir() and _dump_meta(entry) is not None]
    if inner:
        hint = f" (give --dump {path / safe_name(side)} to write this side beside them)" if side else ""
        raise DumpTargetError(f"{where}: holds the xfalign dumps {', '.join(e.name for e in inner)}; refusing "
                              f"to replace them{hint}")
    raise DumpTargetError(f"{where}: exists and is not an xfalign dump (no {META_FILE}); refusing to replace it")


def read_meta(directory: Path) -> dict:
    """The validated meta.json of the dump at `directory`, without its tensors; DumpError naming the dump."""
    try:
        meta = json.loads((directory / META_FILE).read_text())
    except (OSError, ValueError) as error:
        raise DumpError(f"{directory}: not a readable xfalign dump ({error})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise DumpError(f"{directory}: unknown dump format {found!r}")
    return validated_meta(meta, str(directory))


def write_inputs(arrays: dict[str, np.ndarray], path: Path) -> None:
    """A case's generated inputs (harness.inputs), for its sides' workers to read (read_inputs)."""
    save_file(arrays, path)


def read_inputs(path: Path) -> dict[str, np.ndarray]:
    return load_file(path)


def recorded_generator(record: Mapping[str, Any]) -> int | None:
    """The input generator (GENERATOR) that a dump's meta or a golden says made its inputs:
    generated inputs recorded before the version was are version 1; None: no generated inputs (a capture)."""
    return record.get("generator", 1 if record.get("inputs") else None)


def _corrupt(directory: Path, name: str, problem: str) -> IntegrityError:
    """`problem`: what disagrees, as harness.store.digest.mismatches says it ("bytes do not match the recorded MD5")."""
    return IntegrityError(f"{directory}: tensor {name}: {problem} (corrupt or edited dump)")


class CheckedTensors(Mapping):
    """A read dump's tensors (name -> array, in the dump's order), each checked against its recorded
    digest before it is handed out: all at once (`check`, in threads), one on first access, or by a pass
    that reads the bytes anyway (`unchecked` hands out an array with its StreamCheck, `settle` takes
    the verdicts). Every check hashes the bytes with MD5, the digest shown and kept, and with XXH3-128
    where recorded (harness.store.digest.mismatches): a tensor whose recorded dtype, shape, MD5 or XXH3 disagrees
    with its bytes raises IntegrityError naming the dump, the tensor and what disagrees. Digest-only
    tensors (stored: false) are not here: they have no bytes to check."""

    def __init__(self, directory: Path, arrays: dict[str, np.ndarray], digests: dict[str, Digest]):
        self._directory, self._arrays, self._digests = directory, arrays, digests
        self._pending = set(arrays)  # not checked yet
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> np.ndarray:
        array = self._arrays[name]
        if name in self._pending:
            self.check([name])
        return array

    def __contains__(self, name: object) -> bool:
        return name in self._arrays

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def items(self):
        self.check()  # all at once, in threads
        return ItemsView(self)

    def values(self):
        self.check()
        return ValuesView(self)

    def check(self, names: list[str] | None = None) -> None:
        """Check `names` (default: every tensor not yet checked), in threads; IntegrityError names the
        first (in the dump's order) whose bytes, dtype or shape disagree with its digest."""
        with self._lock:
            todo = [name for name in (self._arrays if names is None else names) if name in self._pending]
            corrupt = mismatches({name: self._arrays[name] for name in todo}, self._digests)
            if corrupt:
                name, problem = next(iter(corrupt.items()))
                raise _corrupt(self._directory, name, problem)
            self._pending.difference_update(todo)

    def unchecked(self, name: str) -> tuple[np.ndarray, StreamCheck | None]:
        """The array, and the check its bytes still need (None when already checked): the caller feeds
        it while reading the bytes, then hands it to `settle` before using anything it found."""
        array = self._arrays[name]
        return array, StreamCheck(array, self._digests[name]) if name in self._pending else None

    def settle(self, checks: dict[str, StreamCheck]) -> None:
        """Take the verdicts of checks made by `unchecked` (hashing what their pass did not feed);
        IntegrityError names the first tensor, in the dump's order, that fails."""
        for name in self._arrays:
            if name in checks:
                problem = checks[name].mismatch()
                if problem is not None:
                    raise _corrupt(self._directory, name, problem)
                with self._lock:
                    self._pending.discard(name)


@dataclass
class Dump:
    meta: dict  # case, side, framework, impl, provenance, environment, input digests
    # forward -> backward order; a read dump's are CheckedTensors (bytes checked before use)
    tensors: Mapping[str, np.ndarray] = field(default_factory=dict)
    # tensors recorded without their bytes: name -> {"dtype", "shape", "md5", "xxh3", "stats"} (a capture in
    # digest mode; with hash="fast": "fast64" instead of "md5" and "xxh3"); `digests` covers them, `tensors` does not
    unstored: dict[str, dict] = field(default_factory=dict)
    stats: dict[str, dict] = field(default_factory=dict)  # name -> TensorStats fields, for stored tensors
    order: list[str] | None = None  # every tensor's name, stored or not, in the order to record them
    directory: Path | None = None  # where it was read from, for messages (None: made in memory)

    @property
    def side(self) -> str:
        return self.meta["side"]

    @property
    def input_digests(self) -> dict[str, Digest]:
        return {name: Digest.from_json(d) for name, d in self.meta["inputs"].items()}

    @property
    def generator(self) -> int | None:
        return recorded_generator(self.meta)

    @property
    def names(self) -> list[str]:
        """Every tensor recorded, stored or digest-only, in the dump's order (forward -> backward)."""
        if self.order is not None:
            return list(self.order)
        return list(self.tensors) + [name for name in self.unstored if name not in self.tensors]

    @property
    def digests(self) -> dict[str, Digest]:
        """As recorded when the dump was written; a dump never written (e.g. one a map translated) has its
        stored tensors hashed now, its digest-only ones as recorded."""
        if "tensors" not in self.meta:
            return {**{name: Digest.from_json(entry) for name, entry in self.unstored.items()}, **digests_of(self.tensors)}
        return {entry["name"]: Digest.from_json(entry) for entry in self.meta["tensors"]}

    @property
    def nondeterministic(self) -> dict[str, int]:
        """Tensors whose digest varied between repeats, with the number of distinct digests."""
        return {name: len(set(md5s)) for name, md5s in self.meta.get("repeats", {}).items() if len(set(md5s)) > 1}

    def write(self, directory: str | Path, validate: bool = True, fresh: bool = False) -> Path:
        """Write the dump at `directory` (see `check_dump_target` for what may be there already). It is
        made complete in a staging folder beside it, then swapped in (harness.store.atomic.replace_dir): at
        every instant the old complete dump or the new one is at the path. validate=False: the meta is
        JSON data built from validated parts (a capture's step), not checked against DumpMeta again.
        fresh=True: the caller holds the parent folder (a capture's tree, harness.store.tree.TreeWriter) and
        `directory` is not there (DumpTargetError if it is): the target's checks are skipped."""
        directory = Path(directory)
        if fresh:
            if os.path.lexists(directory):
                raise DumpTargetError(f"dump {directory}: exists already; refusing to replace it")
        else:
            check_dump_target(directory, self.meta.get("side"))
            directory.parent.mkdir(parents=True, exist_ok=True)
        digests = digests_of(self.tensors)  # MD5 and XXH3, hashed in parallel threads
        by_name = {name: {"name": name, **digests[name].to_json(xxh3=True)} for name in self.tensors}
        for name, stats in self.stats.items():
            if name in by_name:
                by_name[name]["stats"] = stats
        by_name.update({name: {"name": name, **entry, "stored": False} for name, entry in self.unstored.items()})
        if self.order is not None and sorted(self.order) != sorted(by_name):
            raise ValueError("Dump.order must name every tensor, stored or not, once")
        entries = [by_name[name] for name in self.order or by_name]
        meta = dict(self.meta, format=FORMAT, xfalign=__version__, tensors=entries)
        if validate:
            meta = validated_meta(meta, str(directory))
        staging = staging_dir(directory)
        try:
            # np.ascontiguousarray makes a 0-d array 1-d: only arrays that need it are copied, in their shape
            arrays = {name: a if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(a.shape)
                      for name, a in self.tensors.items()}
            save_file(arrays, staging / TENSORS_FILE)
            with open(staging / META_FILE, "w") as handle:
                handle.write(meta_text(meta))
                handle.flush()
                fsync(handle.fileno())
            mode = file_mode()  # the umask, read once (from /proc: ~20 us)
            for name in (TENSORS_FILE, META_FILE):
                os.chmod(staging / name, mode)  # safetensors makes 0600
            fsync_file(staging / TENSORS_FILE)
            fsync_dir(staging)
            pause("dump-staged")
            if not fresh:
                check_dump_target(directory, self.meta.get("side"))  # again: a file may have appeared while writing
            replace_dir(staging, directory)
        except BaseException:
            remove_tree(staging)  # the new dump not swapped in, or the old one swapped out
            raise
        self.meta = meta
        return directory

    @classmethod
    def read(cls, directory: str | Path, check_bytes: bool = True) -> Dump:
        """The dump at `directory`, every tensor's bytes checked against the digest recorded with it: MD5 and,
        where recorded, XXH3-128 (IntegrityError). With `check_bytes=False` the check is left to the first use of a tensor, or
        to the comparison, which checks the bytes in its one pass over them
        (harness.compare.case.compare_dumps): nothing uses bytes that were not checked."""
        directory = Path(directory)
        meta = read_meta(directory)
        try:
            arrays = load_file(directory / TENSORS_FILE)
        except (OSError, SafetensorError) as error:
            raise DumpError(f"{directory}: not a readable xfalign dump ({error})") from None
        try:
            digests = {entry["name"]: Digest.from_json(entry) for entry in meta["tensors"] if entry.get("stored", True)}
        except (KeyError, TypeError, ValueError) as error:
            raise DumpError(f"{directory}: not a readable xfalign dump (bad tensor entry in {META_FILE}: {error!r})") from None
        for name in digests:
            if name not in arrays:
                raise DumpError(f"{directory}: tensor {name}: listed in {META_FILE} but not in {TENSORS_FILE}")
        for name in arrays:
            if name not in digests:
                raise DumpError(f"{directory}: tensor {name}: in {TENSORS_FILE} but not listed in {META_FILE}")
        # The digests shown and kept (MD5) must be digests of these bytes: each tensor is checked (by MD5, and
        # XXH3 where recorded) now, or on first use, or by the comparison's one pass over the bytes
        tensors = CheckedTensors(directory, {name: arrays[name] for name in digests}, digests)
        if check_bytes:
            tensors.check()
        unstored = {entry["name"]: {k: v for k, v in entry.items() if k not in ("name", "stored")}
                    for entry in meta["tensors"] if not entry.get("stored", True)}
        stats = {entry["name"]: entry["stats"] for entry in meta["tensors"] if entry.get("stats") is not None}
        return cls(meta, tensors, unstored=unstored, stats=stats, order=[entry["name"] for entry in meta["tensors"]],
                   directory=directory)
