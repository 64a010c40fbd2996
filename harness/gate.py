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
from harness.files import write_text_atomic
from harness.runner import CaseRun

# Fingerprint fields: what changes numerics besides the code under test.
FINGERPRINT = ("torch", "megatron_core", "paddle", "paddle_commit", "python", "device_name", "cuda", "flags")
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
    environment: dict[str, dict]  # side -> fingerprint
    tensors: dict[str, dict[str, Digest]]  # side -> tensor -> digest
    arrays: dict[str, np.ndarray] | None = None  # "side/tensor" -> values, when stored

    @classmethod
    def from_run(cls, run: CaseRun) -> Golden:
        env = {side: {k: dump.meta["environment"][k] for k in FINGERPRINT if dump.meta["environment"].get(k) is not None}
               for side, dump in run.dumps.items()}
        first = next(iter(run.dumps.values()))
        return cls(
            run.case_id, first.input_digests, env,
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
        return cls(
            data["case"],
            {name: _parse_digest(text) for name, text in data["inputs"].items()},
            {side: entry["environment"] for side, entry in data["sides"].items()},
            {side: {name: _parse_digest(t) for name, t in entry["tensors"].items()} for side, entry in data["sides"].items()},
            load_file(array_path) if array_path.exists() else None,
        )


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
    changes = []
    for side, fingerprint in current.environment.items():
        old = golden.environment.get(side, {})
        for key in FINGERPRINT:
            if old.get(key) != fingerprint.get(key):
                changes.append(f"{side}: {key} {old.get(key)} → {fingerprint.get(key)}")
    return changes


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
