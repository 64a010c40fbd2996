"""Goldens: one per case (or capture-tree step), read and written only here.

A golden is `<case>.golden.yaml` (per-tensor digests of both sides, input digests, an environment
fingerprint per side; no timestamps, no paths), readable in a review diff, plus
`<case>.golden.<hash>.safetensors` with the tensors themselves, which lets drift be measured in ULP;
`<hash>` is the first 12 hex digits of the SHA-256 of the file's bytes and the YAML names the file
(`values:`). The tensor file is optional (`--digests-only`, `values: null`): without it drift is
reported by digest alone. `<case>` is the case name made a safe file name (`file_stem`: sweep point names'
`[ ] , =` become `_`; a name longer than MAX_STEM characters is shortened as HTML report names are, its start
and a hash of the whole name).

A golden is written as a unit: the values file under its new name, then the YAML replaced in one step,
then the case's other values files removed; readers follow the YAML's reference, so the YAML and the
values it names always agree. Writers of one folder take turns (an flock on the folder).

The YAML is a GoldenFile (a pydantic model, as Megatron-LM's functional tests' GoldenValues), read and written
through it. It names its format (`format: xfalign-golden/1`), its version: a golden of another format is refused
in one line naming both. It names the version of the input generator that made the inputs (`generator:`,
harness.store.dump.GENERATOR; unrecorded: 1): a golden of another generator is reported as such, not as drift
of every tensor.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
from collections.abc import Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import numpy as np
import yaml
from pydantic import BaseModel, BeforeValidator, Field, PlainSerializer, PlainValidator, ValidationError, model_validator
from pydantic_core import PydanticCustomError
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from harness.errors import OutputError, XfalignError, describe_value, field_text, safe_name, shortened
from harness.store.atomic import fsync_dir, pause, stage_file, write_atomic
from harness.store.digest import Digest, verify
from harness.store.dump import GENERATOR, Dump, DumpError, IntegrityError, recorded_generator

# The comment line on top of each file: how to update it.
GOLDEN_HEADER = "# xfalign golden. Update: xfalign gate CASE --baseline DIR --update\n"
TREE_GOLDEN_HEADER = "# xfalign golden of a capture step. Update: xfalign gate --tree TREE --baseline DIR --update\n"
OBTAINED_HEADER = ("# xfalign obtained: what the last run produced, where it drifted from the golden beside it (not a "
                   "golden; removed when the golden passes or is rewritten). Accept it: --golden force-regen\n")


class Run(Protocol):
    """What a golden is made of: a case run's dumps per side (harness.runner.CaseRun)."""
    @property
    def case_name(self) -> str: ...

    @property
    def dumps(self) -> Mapping[str, Dump]: ...


FORMAT = "xfalign-golden/1"
# A file name is at most 255 bytes: the stem, then `.golden.<12 hex digits>.safetensors` (32 characters), or a
# staging file's `.` + `.golden.safetensors.<8 characters>.tmp` (33).
MAX_STEM = 200
_DIGEST_LINE = re.compile(r"^(\w+) \[([\d, ]*)\] (?:([0-9a-f]{32})|fast64:([0-9a-f]{16}))$")


def _digest_text(d: Digest) -> str:
    """`dtype [shape] md5`, or `... fast64:<hex>` for a tensor captured with the fast hash only."""
    return f"{d.dtype} [{', '.join(map(str, d.shape))}] " + (d.md5 if d.md5 is not None else f"fast64:{d.fast64}")


def _digest_of_line(value: Any) -> Digest:
    if isinstance(value, Digest):
        return value
    match = _DIGEST_LINE.match(value) if isinstance(value, str) else None
    if match is None:
        raise PydanticCustomError("digest_line", "not a digest line (dtype [shape] md5), got {got}",
                                  {"got": describe_value(value)})
    shape = tuple(int(n) for n in match[2].split(",") if n.strip())
    return Digest(match[1], shape, match[3], fast64=match[4])


def _version_number(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PydanticCustomError("version_number", "{got} is not a version number", {"got": repr(value)})
    return value


def _values_file(value: Any) -> str | None:
    """A values file beside the golden: a plain file name (no path), `*.safetensors`; None: digests only."""
    if value is None or (isinstance(value, str) and Path(value).name == value and value.endswith(".safetensors")):
        return value
    raise PydanticCustomError("values_file", "{got} is not a values file name", {"got": repr(value)})


def _none_is_empty(value: Any) -> Any:
    return {} if value is None else value  # `inputs:` with nothing under it: an empty mapping


DigestLine = Annotated[Digest, PlainValidator(_digest_of_line), PlainSerializer(_digest_text)]
Digests = Annotated[dict[str, DigestLine], BeforeValidator(_none_is_empty)]
# A side's fingerprint (harness.fingerprint): field -> value, open (the fields are the framework adapters' to name)
Environment = Annotated[dict[str, Any], BeforeValidator(_none_is_empty)]


class GoldenSide(BaseModel):
    """One side of a golden: its fingerprint and its tensors' digests."""

    environment: Environment
    tensors: Digests  # in the side's order


class GoldenFile(BaseModel):
    """A `*.golden.yaml` file, field by field in the order written (unknown fields are dropped). Its `format`
    is its version: a reader checks it before anything else (GoldenFile.parse)."""

    format: Literal["xfalign-golden/1"]  # FORMAT (every write validates it)
    case: str
    # the input generator (harness.store.dump.GENERATOR) that made the inputs; not written when there are none
    generator: Annotated[int, PlainValidator(_version_number)] | None = Field(None, exclude_if=lambda value: value is None)
    values: Annotated[str | None, PlainValidator(_values_file)]
    inputs: Digests
    sides: Annotated[dict[str, GoldenSide], BeforeValidator(_none_is_empty)]

    @model_validator(mode="before")
    @classmethod
    def _unrecorded_generator(cls, data: Any) -> Any:
        """A golden written before the generator was recorded: 1 when it has inputs (recorded_generator)."""
        if isinstance(data, dict) and "generator" not in data:
            return {**data, "generator": recorded_generator(data)}
        return data

    @classmethod
    def parse(cls, text: str, where: Path) -> GoldenFile:
        """The golden in `text` (the file `where`). Not one is a GoldenError of one line naming the file and the
        field: `x.golden.yaml: not a readable golden (sides.paddle.tensors: missing)`; a golden of another format
        names the format found and the one this xfalign reads."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            problem = getattr(error, "problem", None) or _one_line(error)
            raise GoldenError(f"{where}: not a readable golden (not YAML"
                              f"{f' at line {mark.line + 1}' if mark else ''}: {problem})") from None
        version = data.get("format") if isinstance(data, dict) else None
        if isinstance(version, str) and version != FORMAT:  # a later format may differ in any other field
            raise GoldenError(f"{where}: golden format {version!r}; this xfalign reads {FORMAT!r}")
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise GoldenError(f"{where}: not a readable golden ({_problem(error)})") from None

    def text(self, header: str) -> str:
        """The file's text: `header` (the comment line on top), then the YAML."""
        return header + yaml.safe_dump(self.model_dump(), sort_keys=False, width=120)


# what a golden's field holds when it holds something else, by pydantic's error type
_EXPECTED = {"model_type": "a mapping", "dict_type": "a mapping", "string_type": "text",
             "literal_error": "text"}  # `format` not text (text of another format is told apart before)


def _problem(error: ValidationError) -> str:
    """The first problem of a golden that does not validate, as `field: what is wrong`."""
    first = error.errors()[0]
    if first["type"] == "missing":
        message = "missing"
    elif first["type"] in _EXPECTED:
        message = f"{_EXPECTED[first['type']]} expected, got {describe_value(first['input'])}"
    else:
        message = first["msg"]
    return f"{field_text(first['loc'])}: {message}"


class GoldenError(DumpError):
    """A golden that cannot be read: an unreadable or malformed YAML, a values file it names that is
    missing (exit 2; `gate --update` rewrites it)."""


class GoldenMismatch(XfalignError):
    """A golden file that holds another case's golden (two case names that make one file name)."""


_VALUES_FILE = re.compile(r"^(?P<stem>.+)\.golden\.[0-9a-f]{12}\.safetensors$")


def file_stem(name: str) -> str:
    """A case's (or a tree step's) name as the stem of its goldens' file names (and its dump folder's name)."""
    return shortened(safe_name(name), name, MAX_STEM)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def _locked(directory: Path):
    """Writers of goldens in one folder take turns (readers need no lock)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _remove_stale(directory: Path, stem: str, keep: str | None) -> None:
    """The case's values files other than `keep` and staging files left by a killed writer (every writer
    stages while it holds the lock, so none is in use). Best effort."""
    staging = re.compile(rf"^\.{re.escape(stem)}\.golden\.(yaml|safetensors)\.[^./]+\.tmp$")
    try:
        for path in directory.iterdir():
            match = _VALUES_FILE.match(path.name)
            if (match and match["stem"] == stem and path.name != keep) or staging.match(path.name):
                path.unlink(missing_ok=True)
    except OSError:
        pass


def _changed(path: Path, text: str) -> bool:
    try:
        return path.read_text() != text
    except OSError:
        return True


@dataclass
class Golden:
    case: str
    inputs: dict[str, Digest]
    environment: dict[str, dict]  # side -> fingerprint (every field that decides the side's bits)
    tensors: dict[str, dict[str, Digest]]  # side -> tensor -> digest
    arrays: dict[str, np.ndarray] | None = None  # "side/tensor" -> values, when stored
    header: str = GOLDEN_HEADER  # the comment line on top: how to update it
    generator: int | None = GENERATOR  # the input generator that made the inputs (None: no generated inputs)

    @classmethod
    def from_run(cls, run: Run) -> Golden:
        env = {side: dict(dump.meta["environment"]) for side, dump in run.dumps.items()}
        # every side's consumed inputs: one side that could not run must not switch the input check off
        inputs = {name: digest for dump in run.dumps.values() for name, digest in dump.input_digests.items()}
        generators = {dump.generator for dump in run.dumps.values() if dump.generator is not None}
        return cls(
            run.case_name, inputs, env,
            {side: dump.digests for side, dump in run.dumps.items()},
            {f"{side}/{name}": array for side, dump in run.dumps.items() for name, array in dump.tensors.items()},
            generator=max(generators, default=GENERATOR),
        )

    @classmethod
    def of_file(cls, file: GoldenFile) -> Golden:
        """The golden a file holds (its values not read)."""
        return cls(file.case, dict(file.inputs), {side: dict(s.environment) for side, s in file.sides.items()},
                   {side: dict(s.tensors) for side, s in file.sides.items()}, None, generator=file.generator)

    def to_file(self, values: str | None) -> GoldenFile:
        """The file of this golden; `values` is the name of the values file it goes with (None: digests only)."""
        return GoldenFile.model_validate({
            "format": FORMAT, "case": self.case, "generator": self.generator, "values": values, "inputs": self.inputs,
            "sides": {side: {"environment": self.environment[side], "tensors": tensors}
                      for side, tensors in self.tensors.items()}})

    def to_yaml(self, values: str | None = None) -> str:
        """The YAML; `values` is the name of the values file it goes with (None: digests only)."""
        return self.to_file(values).text(self.header)

    @staticmethod
    def text_path(directory: Path, case_name: str) -> Path:
        return directory / f"{file_stem(case_name)}.golden.yaml"

    def write_obtained(self, directory: Path) -> Path | None:
        """What a run produced, beside the golden it drifted from, in the golden's format (digests only):
        `diff x.golden.yaml x.golden.obtained.yaml` reads as a review diff. Best effort (a read-only baseline
        in CI): None when it cannot be written."""
        path = obtained_path(Path(directory), self.case)
        try:
            write_atomic(path, replace(self, header=OBTAINED_HEADER).to_yaml(None))
        except OSError:
            return None
        return path

    @classmethod
    def paths(cls, directory: Path, case_name: str) -> tuple[Path, Path | None]:
        """The golden's YAML file and the values file it names now (None: none); for a case with no golden,
        the YAML file a new one gets."""
        text_path = cls.text_path(Path(directory), case_name)
        try:
            reference = yaml.safe_load(text_path.read_text()).get("values")
        except (OSError, ValueError, yaml.YAMLError, AttributeError):
            return text_path, None
        return text_path, text_path.parent / reference if isinstance(reference, str) else None

    def write(self, directory: Path, with_arrays: bool = True) -> Path:
        """Write the golden as a unit (see the module's note); returns the YAML file. An OSError (no
        permission, disk full) is an OutputError naming the file; what was there before stays intact."""
        directory = Path(directory)
        stem = file_stem(self.case)
        text_path = directory / f"{stem}.golden.yaml"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with _locked(directory):
                values = None
                if with_arrays and self.arrays is not None:
                    values = self._write_values(directory, stem)
                    pause("golden-values-written")
                write_atomic(text_path, self.to_yaml(values))
                pause("golden-yaml-replaced")
                _remove_stale(directory, stem, keep=values)
                obtained_path(directory, self.case).unlink(missing_ok=True)  # the golden says it now
        except (OSError, SafetensorError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else _one_line(error)
            raise OutputError(f"cannot write the golden {text_path}: {reason}") from None
        return text_path

    def _write_values(self, directory: Path, stem: str) -> str:
        """The values file, complete under a unique staging name, then renamed to its content's name."""
        arrays = self.arrays or {}
        staging = stage_file(directory, f"{stem}.golden.safetensors", lambda path: save_file(arrays, path))
        try:
            name = f"{stem}.golden.{_sha256(staging)[:12]}.safetensors"
            os.replace(staging, directory / name)
        except BaseException:
            staging.unlink(missing_ok=True)
            raise
        fsync_dir(directory)
        return name

    @classmethod
    def _parse(cls, text: str, text_path: Path, case_name: str) -> tuple[Golden, Path | None]:
        """The golden in `text`, and the values file to read with it (None: none); GoldenFile.parse's errors."""
        file = GoldenFile.parse(text, text_path)
        if file.case != case_name:
            raise GoldenMismatch(f"{text_path}: holds the golden of case {file.case!r}, not {case_name!r} "
                                 "(two case names that make one file name: rename one)")
        return cls.of_file(file), None if file.values is None else text_path.parent / file.values

    @classmethod
    def read(cls, directory: Path, case_name: str) -> Golden | None:
        """The golden of `case_name`, its values checked against its digests; None if there is none. A
        GoldenError or IntegrityError (both DumpErrors, exit 2) names the file that cannot be read. A
        writer replacing the golden meanwhile makes it read again."""
        directory = Path(directory)
        for _ in range(10):
            text_path = cls.text_path(directory, case_name)
            try:
                text = text_path.read_text()
            except FileNotFoundError:
                return None
            except (OSError, UnicodeDecodeError) as error:
                reason = error.strerror if isinstance(error, OSError) and error.strerror else _one_line(error)
                raise GoldenError(f"{text_path}: cannot read it: {reason}") from None
            golden, array_path = cls._parse(text, text_path, case_name)
            if array_path is None:
                return golden
            try:
                golden.arrays = load_file(array_path)
            except FileNotFoundError:
                if _changed(text_path, text):
                    continue  # replaced by a writer after it was read: read the new one
                raise GoldenError(f"{array_path}: missing (named by {text_path.name})") from None
            except (OSError, ValueError, SafetensorError) as error:
                raise IntegrityError(f"{array_path}: not a readable safetensors file ({error})") from None
            # the values must be those the digests (MD5, as in the YAML) describe
            digests = {f"{side}/{name}": d for side, tensors in golden.tensors.items() for name, d in tensors.items()}
            unknown = [key for key in golden.arrays if key not in digests]
            if unknown:
                raise IntegrityError(f"{array_path}: tensor {unknown[0]}: not in {text_path.name} (corrupt or edited golden)")
            corrupt = verify(golden.arrays, digests)
            if corrupt:
                raise IntegrityError(f"{array_path}: tensor {corrupt[0]}: bytes do not match the golden's digest "
                                     "(corrupt or edited golden)")
            return golden
        raise GoldenError(f"{cls.text_path(directory, case_name)}: replaced while being read, again and again")


OBTAINED_SUFFIX = ".golden.obtained.yaml"


def obtained_path(directory: Path, case_name: str) -> Path:
    """Where a run that drifted from the golden of `case_name` leaves what it produced."""
    return Path(directory) / f"{file_stem(case_name)}{OBTAINED_SUFFIX}"


def remove_obtained(directory: Path, case_name: str) -> None:
    """Remove what a run that drifted from the golden of `case_name` left beside it (a run passes it now). Best
    effort, as writing it."""
    with suppress(OSError):
        obtained_path(directory, case_name).unlink(missing_ok=True)


def unused_goldens(directory: Path, names: list[str]) -> list[Path]:
    """The goldens in `directory` that none of `names` (cases, or tree steps) has: `--warn-unused`."""
    produced = {Golden.text_path(Path(directory), name).name for name in names}
    return sorted(path for path in Path(directory).glob("*.golden.yaml") if path.name not in produced)


def environment_classes(root: Path) -> list[str]:
    """The environment classes whose goldens a baseline folder holds (its folders)."""
    return sorted(path.name for path in root.iterdir() if path.is_dir()) if root.is_dir() else []


def baseline_dir(root: Path, environment_class: str) -> Path:
    """Goldens of one environment class: `root` itself when it holds goldens, else root/<class>."""
    return root if any(root.glob("*.golden.yaml")) else root / environment_class
