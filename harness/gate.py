"""The CI gate: goldens per case, drift against them, nondeterminism, cross-framework expectations.

A golden is `<case>.golden.yaml` (per-tensor digests of both sides, input digests, an environment
fingerprint per side; no timestamps, no paths), readable in a review diff, plus
`<case>.golden.safetensors` with the tensors themselves, which lets drift be measured in ULP. The
tensor file is optional (`--digests-only`): without it drift is reported by digest alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from safetensors.numpy import load_file, save_file

from harness.compare import difference_text, failure_text, pair_tensors
from harness.digest import Digest
from harness.fingerprint import differences
from harness.files import write_text_atomic
from harness.runner import CaseRun

_DIGEST_LINE = re.compile(r"^(\w+) \[([\d, ]*)\] ([0-9a-f]{32})$")


def _digest_text(d: Digest) -> str:
    return f"{d.dtype} [{', '.join(map(str, d.shape))}] {d.md5}"


def _parse_digest(text: str) -> Digest:
    match = _DIGEST_LINE.match(text)
    if not match:
        raise ValueError(f"not a digest line: {text!r}")
    shape = tuple(int(n) for n in match[2].split(",") if n.strip())
    return Digest(match[1], shape, match[3])


@dataclass
class Golden:
    case: str
    inputs: dict[str, Digest]
    environment: dict[str, dict]  # side -> fingerprint (every field that decides the side's bits)
    tensors: dict[str, dict[str, Digest]]  # side -> tensor -> digest
    arrays: dict[str, np.ndarray] | None = None  # "side/tensor" -> values, when stored

    @classmethod
    def from_run(cls, run: CaseRun) -> Golden:
        env = {side: dict(dump.meta["environment"]) for side, dump in run.dumps.items()}
        # every side's consumed inputs: one side that could not run must not switch the input check off
        inputs = {name: digest for dump in run.dumps.values() for name, digest in dump.input_digests.items()}
        return cls(
            run.case_id, inputs, env,
            {side: dump.digests for side, dump in run.dumps.items()},
            {f"{side}/{name}": array for side, dump in run.dumps.items() for name, array in dump.tensors.items()},
        )

    def to_yaml(self) -> str:
        data = {
            "case": self.case,
            "inputs": {name: _digest_text(d) for name, d in self.inputs.items()},
            "sides": {side: {"environment": self.environment[side],
                             "tensors": {name: _digest_text(d) for name, d in tensors.items()}}
                      for side, tensors in self.tensors.items()},
        }
        header = "# xfalign golden. Update: xfalign gate CASE --baseline DIR --update\n"
        return header + yaml.safe_dump(data, sort_keys=False, width=120)

    @staticmethod
    def paths(directory: Path, case_id: str) -> tuple[Path, Path]:
        return directory / f"{case_id}.golden.yaml", directory / f"{case_id}.golden.safetensors"

    def write(self, directory: Path, with_arrays: bool = True) -> None:
        text_path, array_path = self.paths(directory, self.case)
        directory.mkdir(parents=True, exist_ok=True)
        if with_arrays and self.arrays is not None:
            staging = array_path.with_name(f".{array_path.name}.tmp")
            save_file(self.arrays, staging)
            staging.replace(array_path)
        else:
            array_path.unlink(missing_ok=True)
        write_text_atomic(text_path, self.to_yaml())

    @classmethod
    def read(cls, directory: Path, case_id: str) -> Golden | None:
        text_path, array_path = cls.paths(directory, case_id)
        if not text_path.exists():
            return None
        data = yaml.safe_load(text_path.read_text())
        golden = cls(
            data["case"],
            {name: _parse_digest(text) for name, text in data["inputs"].items()},
            {side: entry["environment"] for side, entry in data["sides"].items()},
            {side: {name: _parse_digest(t) for name, t in entry["tensors"].items()} for side, entry in data["sides"].items()},
            None,
        )
        if array_path.exists():  # the values must be those the digests (MD5, as in the YAML) describe
            from safetensors import SafetensorError

            from harness.digest import verify
            from harness.dump import IntegrityError
            try:
                golden.arrays = load_file(array_path)
            except (OSError, ValueError, SafetensorError) as error:
                raise IntegrityError(f"{array_path}: not a readable safetensors file ({error})") from None
            digests = {f"{side}/{name}": d for side, tensors in golden.tensors.items() for name, d in tensors.items()}
            unknown = [key for key in golden.arrays if key not in digests]
            if unknown:
                raise IntegrityError(f"{array_path}: tensor {unknown[0]}: not in {text_path.name} (corrupt or edited golden)")
            corrupt = verify(golden.arrays, digests)
            if corrupt:
                raise IntegrityError(f"{array_path}: tensor {corrupt[0]}: bytes do not match the golden's digest "
                                     "(corrupt or edited golden)")
        return golden


def baseline_dir(root: Path, environment_class: str) -> Path:
    """Goldens of one environment class: `root` itself when it holds goldens, else root/<class>."""
    return root if any(root.glob("*.golden.yaml")) else root / environment_class


def missing_class_message(root: Path, environment_class: str, case_files: list[str]) -> str:
    """One line for a machine whose class has no goldens: which class it is, how to create them."""
    present = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    there = f" (classes there: {', '.join(present)})" if present else ""
    return (f"this run's environment class is {environment_class}; {root} has no goldens for it{there}. "
            f"Create them with: xfalign gate {' '.join(case_files)} --baseline {root} --update")


@dataclass
class Problem:
    kind: str  # expectation | drift | input | nondeterministic | no-golden
    text: str


@dataclass
class GateResult:
    case_id: str
    problems: list[Problem] = field(default_factory=list)
    environment_changes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def golden_problems(self) -> bool:
        return any(p.kind in ("drift", "input", "no-golden") for p in self.problems)

    @property
    def drifted(self) -> bool:
        return any(p.kind in ("drift", "input") for p in self.problems)


def _environment_changes(golden: Golden, current: Golden) -> list[str]:
    return [f"{side}: {change}" for side, fingerprint in current.environment.items()
            for change in differences(golden.environment.get(side, {}), fingerprint)]


def _drift(side: str, name: str, old: Digest | None, new: Digest | None, golden: Golden, run: CaseRun) -> str | None:
    if old == new:
        return None
    where = f"{side}/{name}"
    if old is None or new is None:
        return f"{where}: {'new tensor, not in the golden' if old is None else 'in the golden, not produced now'}"
    if golden.arrays is None or where not in golden.arrays:
        return f"{where}: digest {old.md5[:8]} → {new.md5[:8]} (the golden holds no values to measure ULP)"
    pair = pair_tensors(where, golden.arrays[where], run.dumps[side].tensors[name], "bitwise", (old, new))
    return f"{where}: drifted from the golden: {difference_text(pair)}"


def check(run: CaseRun, golden: Golden | None) -> GateResult:
    result = GateResult(run.case_id)
    for side, dump in run.dumps.items():
        for name, distinct in dump.nondeterministic.items():
            result.problems.append(Problem("nondeterministic", f"{side}/{name}: {distinct} different digests in "
                                           f"{len(dump.meta['repeats'][name])} repeats on side {side} "
                                           "(nondeterministic there; not a cross-framework difference)"))
    unstable = {name for dump in run.dumps.values() for name in dump.nondeterministic}
    for pair in run.comparison.failing:
        if pair.name not in unstable:
            result.problems.append(Problem("expectation", failure_text(pair)))
    if golden is None:
        result.problems.append(Problem("no-golden", "no golden yet: run with --update to record one"))
        return result
    current = Golden.from_run(run)
    for name in golden.inputs.keys() | current.inputs.keys():
        if golden.inputs.get(name) != current.inputs.get(name):
            result.problems.append(Problem("input", f"input {name}: {golden.inputs.get(name)} → {current.inputs.get(name)}"))
    for side in current.tensors:
        old, new = golden.tensors.get(side, {}), current.tensors[side]
        for name in list(new) + [n for n in old if n not in new]:
            text = _drift(side, name, old.get(name), new.get(name), golden, run)
            if text:
                result.problems.append(Problem("drift", text))
    if result.drifted:
        result.environment_changes = _environment_changes(golden, current)
    return result


def describe_update(old: Golden | None, new: Golden) -> str:
    """What an update changed, for the terminal."""
    if old is None:
        return "created"
    changed = [f"{side}/{name}" for side, tensors in new.tensors.items() for name, digest in tensors.items()
               if old.tensors.get(side, {}).get(name) != digest]
    changed += [f"input {name}" for name, digest in new.inputs.items() if old.inputs.get(name) != digest]
    changed += _environment_changes(old, new)
    return "updated: " + ", ".join(changed) if changed else "unchanged"
