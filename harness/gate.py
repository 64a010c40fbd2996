"""The CI gate: goldens per case, drift against them, nondeterminism, cross-framework expectations.

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
values it names always agree. Writers of one folder take turns (an flock on the folder). The YAML names
its format (`format: xfalign-golden/1`) and the version of the input generator that made the inputs
(`generator:`, harness.inputs.GENERATOR; unrecorded: 1): a golden of another generator is reported as
such, not as drift of every tensor.

The gate's results are Findings (harness.compare.findings): the failing expectations, drift against the
golden, changed inputs, nondeterminism, a missing golden; changed fingerprint fields ride along, passing.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import yaml
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from harness.atomic import fsync_dir, pause, stage_file, write_atomic
from harness.capture.compare import StepComparison, TreeComparison, TreeSide, compare_steps
from harness.capture.format import TensorName
from harness.capture.tree import Tree
from harness.case import FieldProblem
from harness.compare.findings import GOLDEN, Finding, judged
from harness.compare.pairs import DigestPair, originate
from harness.digest import Digest, verify
from harness.dump import Dump, DumpError, IntegrityError, recorded_generator
from harness.errors import OutputError, XfalignError, describe_value, field_text, safe_name
from harness.fingerprint import changed_fields
from harness.golden_policy import GoldenPolicy
from harness.inputs import GENERATOR
from harness.reports.html import shortened
from harness.reports.text import (
    GOLDEN_HEADER,
    OBTAINED_HEADER,
    TREE_GOLDEN_HEADER,
    environment_change_text,
    missing_class_text,
)
from harness.runner import CaseRun, critical

FORMAT = "xfalign-golden/1"
# A file name is at most 255 bytes: the stem, then `.golden.<12 hex digits>.safetensors` (32 characters), or a
# staging file's `.` + `.golden.safetensors.<8 characters>.tmp` (33).
MAX_STEM = 200
_DIGEST_LINE = re.compile(r"^(\w+) \[([\d, ]*)\] (?:([0-9a-f]{32})|fast64:([0-9a-f]{16}))$")


def _digest_text(d: Digest) -> str:
    """`dtype [shape] md5`, or `... fast64:<hex>` for a tensor captured with the fast hash only."""
    return f"{d.dtype} [{', '.join(map(str, d.shape))}] " + (d.md5 if d.md5 is not None else f"fast64:{d.fast64}")


def _parse_digest(text: str) -> Digest:
    match = _DIGEST_LINE.match(text)
    if not match:
        raise ValueError(f"not a digest line: {text!r}")
    shape = tuple(int(n) for n in match[2].split(",") if n.strip())
    return Digest(match[1], shape, match[3], fast64=match[4])


def _field(data: Any, path: tuple, kind: type) -> Any:
    """The value at `path` in a golden's YAML, of type `kind` (an empty mapping may be written as nothing)."""
    value = data
    for depth, key in enumerate(path):
        if not isinstance(value, dict):
            raise FieldProblem(path[:depth], f"a mapping expected, got {describe_value(value)}")
        if key not in value:
            raise FieldProblem(path[:depth + 1], "missing")
        value = value[key]
    if value is None and kind is dict:
        return {}
    if not isinstance(value, kind):
        raise FieldProblem(path, f"{'a mapping' if kind is dict else 'text'} expected, got {describe_value(value)}")
    return value


def _digests(data: Any, path: tuple) -> dict[str, Digest]:
    """The digest lines at `path` (name: `dtype [shape] md5`)."""
    digests = {}
    for name, line in _field(data, path, dict).items():
        try:
            digests[name] = _parse_digest(line)
        except (ValueError, TypeError):
            raise FieldProblem((*path, name), f"not a digest line (dtype [shape] md5), got {describe_value(line)}") from None
    return digests


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
    def from_run(cls, run: CaseRun) -> Golden:
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

    def to_yaml(self, values: str | None = None) -> str:
        """The YAML; `values` is the name of the values file it goes with (None: digests only)."""
        data = {
            "format": FORMAT,
            "case": self.case,
            **({"generator": self.generator} if self.generator is not None else {}),
            "values": values,
            "inputs": {name: _digest_text(d) for name, d in self.inputs.items()},
            "sides": {side: {"environment": self.environment[side],
                             "tensors": {name: _digest_text(d) for name, d in tensors.items()}}
                      for side, tensors in self.tensors.items()},
        }
        return self.header + yaml.safe_dump(data, sort_keys=False, width=120)

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
        """The golden in `text`, and the values file to read with it (None: none). A malformed one is a
        GoldenError naming the field: `x.golden.yaml: not a readable golden (sides.paddle.tensors: missing)`."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            problem = getattr(error, "problem", None) or _one_line(error)
            raise GoldenError(f"{text_path}: not a readable golden (not YAML"
                              f"{f' at line {mark.line + 1}' if mark else ''}: {problem})") from None
        try:
            version = _field(data, ("format",), str)
            sides = _field(data, ("sides",), dict)
            golden = cls(
                _field(data, ("case",), str),
                _digests(data, ("inputs",)),
                {side: _field(data, ("sides", side, "environment"), dict) for side in sides},
                {side: _digests(data, ("sides", side, "tensors")) for side in sides},
                None,
                generator=recorded_generator(data),
            )
            reference = _field(data, ("values",), object)
        except FieldProblem as problem:
            raise GoldenError(f"{text_path}: not a readable golden ({field_text(problem.path)}: {problem.message})") from None
        if version != FORMAT:
            raise GoldenError(f"{text_path}: golden format {version!r}; this xfalign reads {FORMAT!r}")
        if golden.case != case_name:
            raise GoldenMismatch(f"{text_path}: holds the golden of case {golden.case!r}, not {case_name!r} "
                                 "(two case names that make one file name: rename one)")
        if golden.generator is not None and not isinstance(golden.generator, int):
            raise GoldenError(f"{text_path}: generator: {golden.generator!r} is not a version number")
        if reference is None:
            return golden, None
        if not isinstance(reference, str) or Path(reference).name != reference or not reference.endswith(".safetensors"):
            raise GoldenError(f"{text_path}: values: {reference!r} is not a values file name")
        return golden, text_path.parent / reference

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


def unused_goldens(directory: Path, names: list[str]) -> list[Path]:
    """The goldens in `directory` that none of `names` (cases, or tree steps) has: `--warn-unused`."""
    produced = {Golden.text_path(Path(directory), name).name for name in names}
    return sorted(path for path in Path(directory).glob("*.golden.yaml") if path.name not in produced)


def baseline_dir(root: Path, environment_class: str) -> Path:
    """Goldens of one environment class: `root` itself when it holds goldens, else root/<class>."""
    return root if any(root.glob("*.golden.yaml")) else root / environment_class


def missing_class_message(root: Path, environment_class: str, case_files: list[str]) -> str:
    """One line for a machine whose class has no goldens: which class it is, how to create them."""
    present = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    return missing_class_text(root, environment_class, present, case_files)


@dataclass
class GateResult:
    case_name: str
    findings: list[Finding] = field(default_factory=list)  # failing ones fail the gate; environment ones explain drift
    unreadable: XfalignError | None = None  # why its golden could not be read (then it was not checked)
    written: Path | None = None  # the golden written now (missing, or rewritten by the policy)
    update: GoldenUpdate | None = None  # what writing it changed
    obtained: Path | None = None  # what the run produced, written beside a golden it drifted from

    @classmethod
    def of_unreadable(cls, case_name: str, error: XfalignError):
        """The verdict of a case (or step) whose golden cannot be read: it fails, the others go on."""
        return cls(case_name, [Finding("no-golden", "", False, {"unreadable": str(error)})], unreadable=error)

    @property
    def failures(self) -> list[Finding]:
        return [finding for finding in self.findings if not finding.passed]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def drifted(self) -> bool:
        """Whether the run's tensors or inputs differ from the golden."""
        return any(f.expected == GOLDEN or f.kind in ("input", "generator") for f in self.failures)

    @property
    def golden_problems(self) -> bool:
        """Whether rewriting the golden would change what it says (`--update --only-failing`)."""
        return self.drifted or any(f.kind == "no-golden" for f in self.failures)

    @property
    def inputs_changed(self) -> bool:
        """Whether the run's inputs differ from the golden's: the golden belongs to another case (or this case's
        inputs changed), which explains its drift better than the code or the environment can."""
        return any(f.kind == "input" for f in self.failures)

    @property
    def environment_changes(self) -> list[str]:
        return [environment_change_text(f) for f in self.findings if f.kind == "environment"]


def _environment_findings(golden: Golden, current: Golden) -> list[Finding]:
    """Every fingerprint field that differs from the golden's (a field only one recorded counts)."""
    findings = []
    for side, now in current.environment.items():
        before = golden.environment.get(side, {})
        findings += [Finding("environment", side, True, {"field": name, "golden": before.get(name), "now": now.get(name)})
                     for name in changed_fields(before, now)]
    return findings


def _drift(side: str, name: str, old: Digest | None, new: Digest | None, golden: Golden,
           now: Mapping[str, np.ndarray]) -> list[Finding]:
    """How tensor `name` of `side` drifted from the golden; `now`: the side's tensors (values, where kept)."""
    if old == new:
        return []
    where = f"{side}/{name}"
    if old is not None and new is not None and (golden.arrays is None or where not in golden.arrays):
        return judged(DigestPair(where, old, new, digests_only=()).compare(), False, GOLDEN)
    pair = originate(where, golden.arrays.get(where) if golden.arrays else None, now.get(name), (old, new))
    return judged(pair.compare(), False, GOLDEN)


def check(run: CaseRun, golden: Golden | None) -> GateResult:
    result = GateResult(run.case_name)
    for side, dump in run.dumps.items():
        for name, distinct in dump.nondeterministic.items():
            result.findings.append(Finding("nondeterministic", f"{side}/{name}", False, {
                "side": side, "distinct": distinct, "repeats": len(dump.meta["repeats"][name])}))
    unstable = {name for dump in run.dumps.values() for name in dump.nondeterministic}
    for tensor in run.comparison.failing if run.comparison else []:  # a gate runs both sides
        if tensor.name not in unstable:  # nondeterministic on one side: not blamed on the other
            result.findings += tensor.failures
    if golden is None:
        result.findings.append(Finding("no-golden", "", False))
        return result
    current = Golden.from_run(run)
    if golden.generator != current.generator:  # every input differs by design: one finding, not one per tensor
        result.findings.append(Finding("generator", "", False, {"golden": golden.generator, "now": current.generator}))
        return result
    for name in golden.inputs.keys() | current.inputs.keys():
        if golden.inputs.get(name) != current.inputs.get(name):
            result.findings.append(Finding("input", name, False, {
                "golden": golden.inputs[name].to_json() if name in golden.inputs else None,
                "now": current.inputs[name].to_json() if name in current.inputs else None}))
    for side in current.tensors:
        old, new = golden.tensors.get(side, {}), current.tensors[side]
        for name in list(new) + [n for n in old if n not in new]:
            result.findings += _drift(side, name, old.get(name), new.get(name), golden, run.dumps[side].tensors)
    if result.drifted:
        result.findings += _environment_findings(golden, current)
    return result


def write_golden(golden: Golden, directory: Path, written: list[str], with_arrays: bool = True) -> Path:
    """Write the golden and add its case to `written`, as one: SIGINT or SIGTERM meanwhile takes effect after
    both, so an interrupted update says exactly which goldens it wrote, and leaves no staging file."""
    with critical():
        path = golden.write(directory, with_arrays)
        written.append(golden.case)
    return path


def golden_problem(directory: Path, case_name: str) -> XfalignError | None:
    """Why the case's golden cannot be read (None: it reads, or there is none yet): asked before any side runs."""
    try:
        Golden.read(directory, case_name)
    except (DumpError, GoldenMismatch) as error:
        return error
    return None


@dataclass
class GoldenUpdate:
    """What writing a golden changed (harness.reports.text.update_text says it)."""
    created: bool  # there was none (or none readable)
    tensors: list[str] = field(default_factory=list)  # side/tensor whose digest changed
    inputs: list[str] = field(default_factory=list)  # inputs whose digest changed
    environment: list[Finding] = field(default_factory=list)  # fingerprint fields that changed


def describe_update(old: Golden | None, new: Golden) -> GoldenUpdate:
    """What an update changed."""
    if old is None:
        return GoldenUpdate(True)
    return GoldenUpdate(
        False,
        [f"{side}/{name}" for side, tensors in new.tensors.items()
         for name, digest in tensors.items() if old.tensors.get(side, {}).get(name) != digest],
        [name for name, digest in new.inputs.items() if old.inputs.get(name) != digest],
        _environment_findings(old, new))


R = TypeVar("R", bound=GateResult)


def settle(policy: GoldenPolicy, folder: Path, name: str, golden: Golden | None, current: Golden,
           judge: Callable[[Golden | None], R], written: list[str], with_arrays: bool = True) -> R:
    """A case (or tree step) against its golden under `policy`: `judge` checks the run against a golden (None:
    there is none); `current` is the golden the run makes. The one rule of the CLI, trees and pytest: a golden is
    written when the policy says so (GoldenPolicy.writes); a missing one written by write-missing fails once,
    saying so; one rewritten by force-regen or regen-all is checked again. A drift left in place leaves
    `<stem>.golden.obtained.yaml` beside the golden; a pass (or a rewrite) removes it."""
    result = judge(golden)
    if policy.writes(golden is None, result.golden_problems):
        path = write_golden(current, folder, written, with_arrays)
        update = describe_update(golden, current)
        if policy.passes_written:
            result = judge(Golden.read(folder, name) or current)
        else:  # a missing golden, written: it fails once, saying where it was written
            result.findings = [replace(f, data={**f.data, "written": str(path)}) if f.kind == "no-golden" else f
                               for f in result.findings]
        result.written, result.update = path, update
    elif result.drifted:
        result.obtained = current.write_obtained(folder)
    elif golden is not None:
        with suppress(OSError):  # best effort, as writing it
            obtained_path(folder, name).unlink(missing_ok=True)
    return result


# -- capture trees -------------------------------------------------------------------------------------
# A tree's golden is one golden per step (this module's format, digests only, `values: null`), named
# `<side>.<step>` (`<side>.rank-00001_step-00000` with ranks) in the baseline folder itself: the tensors'
# digests, in execution order, and the fingerprint recorded by the capture. A missing golden is written and
# the step fails once; `update` rewrites them all. For the reports, each step is also compared with its
# golden as two capture steps are (A: the golden, B: the step now).

GOLDEN_SIDE = "golden"  # side A's name in a tree gate's reports


@dataclass
class TreeGateResult(GateResult):
    step: StepComparison | None = None  # the step against its golden, for the reports (None: no golden read)

    @property
    def first_drift(self) -> tuple[str, str | None] | None:
        """The first tensor (in execution order) that drifted from the golden, and its module."""
        finding = next((f for f in self.failures if f.expected == GOLDEN), None)
        if finding is None:
            return None
        parsed = TensorName.parse(finding.tensor.split("/", 1)[-1])
        return finding.tensor, parsed.module if parsed else None


def _step_golden(name: str, dump: Dump) -> Golden:
    side = dump.side
    return Golden(name, {}, {side: dict(dump.meta["environment"])}, {side: dump.digests}, None, TREE_GOLDEN_HEADER,
                  generator=None)


def check_step(name: str, dump: Dump, golden: Golden) -> TreeGateResult:
    """Drift of one step's digests from its golden (every tensor, in execution order)."""
    result = TreeGateResult(name)
    current = _step_golden(name, dump)
    for side, new in current.tensors.items():
        old = golden.tensors.get(side, {})
        for tensor in list(new) + [n for n in old if n not in new]:
            result.findings += _drift(side, tensor, old.get(tensor), new.get(tensor), golden, dump.tensors)
    if result.drifted:
        result.findings += _environment_findings(golden, current)
    return result


def _golden_dump(golden: Golden, dump: Dump) -> Dump:
    """The golden of a step as a digest-only dump of it, with the step's own record of what ran (its order)."""
    meta = {key: value for key, value in dump.meta.items() if key != "tensors"}
    digests = golden.tensors.get(dump.side, {})
    return Dump(dict(meta, environment=golden.environment.get(dump.side, {})), {},
                unstored={name: digest.to_json() for name, digest in digests.items()}, order=list(digests))


@dataclass
class _Step:
    name: str  # its golden's name: <side>.<step>, <side>.rank-00001/<step>
    label: str  # as tree comparisons name it: <step>, rank-00001/<step>
    tree: Tree  # the tree (of its rank) that holds it
    step: str


def _steps(tree: Tree) -> list[_Step]:
    units = [(f"{rank_tree.path.name}/", rank_tree) for _, rank_tree in sorted(tree.ranks.items())] or [("", tree)]
    return [_Step(f"{unit.manifest.side}.{prefix}{step}", prefix + step, unit, step)
            for prefix, unit in units for step in unit.steps]


def gate_tree(tree: Tree, baseline: str | Path, policy: GoldenPolicy | bool = GoldenPolicy.WRITE_MISSING,
              written: list[str] | None = None) -> Iterator[TreeGateResult]:
    """Every step of the capture tree (every rank's) against its golden in `baseline`, each as it is done, under
    `policy` (settle; True: regen-all, as `update=True` was). Each golden written is added to `written` as it is
    written: an interrupted update knows which it wrote. A golden that cannot be read fails its step (force-regen
    and regen-all rewrite it); the other steps go on."""
    if isinstance(policy, bool):
        policy = GoldenPolicy.REGEN_ALL if policy else GoldenPolicy.WRITE_MISSING
    baseline, written = Path(baseline), [] if written is None else written
    for unit in _steps(tree):
        dump = unit.tree.step(unit.step)
        try:
            golden = Golden.read(baseline, unit.name)
        except (DumpError, GoldenMismatch) as error:
            if not policy.rewrites_unreadable or isinstance(error, GoldenMismatch):  # another's: never overwritten
                yield TreeGateResult.of_unreadable(unit.name, error)
                continue
            golden = None  # unreadable: rewritten

        def judge(against: Golden | None, unit: _Step = unit, dump: Dump = dump) -> TreeGateResult:
            if against is None:
                return TreeGateResult(unit.name, [Finding("no-golden", "", False)])
            return check_step(unit.name, dump, against)

        new = _step_golden(unit.name, dump)
        result = settle(policy, baseline, unit.name, golden, new, judge, written, with_arrays=False)
        shown = new if result.written is not None else golden
        if shown is not None:
            result.step = compare_steps(unit.label, _golden_dump(shown, dump), dump)
        yield result


def tree_gate_steps(tree: Tree) -> list[str]:
    """The goldens' names of a tree's steps, in the order gate_tree goes through them."""
    return [unit.name for unit in _steps(tree)]


def tree_gate_comparison(tree: Tree, baseline: Path, results: list[TreeGateResult]) -> TreeComparison:
    """The tree against its goldens as a comparison of two trees (A: the goldens, B: the tree now), for the
    JSON and HTML reports; a step whose golden was missing or unreadable is a finding."""
    now = TreeSide.of(tree)
    goldens = replace(now, path=str(baseline), side=GOLDEN_SIDE, mode="digest")
    findings = [replace(finding, tensor=result.case_name) for result in results
                for finding in result.failures if finding.kind == "no-golden"]
    return TreeComparison(goldens, now, None, [result.step for result in results if result.step is not None], findings)
