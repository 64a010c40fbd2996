"""Runs a case: inputs once, then each side in its own worker process, then the comparison."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from harness.case import Case
from harness.compare import CaseComparison, compare_dumps
from harness.dump import Dump
from harness.inputs import generate_inputs, write_inputs

SIDE_TIMEOUT_S = 1800


class SideFailed(Exception):
    """A worker crashed or timed out; the message carries the tail of its output."""


@dataclass
class CaseRun:
    case: Case
    dumps: dict[str, Dump]
    comparison: CaseComparison | None  # None when only one side ran

    @property
    def case_id(self) -> str:
        return self.case.name


def _run_worker(job: dict, workdir: Path) -> None:
    job_file = workdir / f"job-{job['side']}.json"
    job_file.write_text(json.dumps(job))
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    try:
        done = subprocess.run([sys.executable, "-m", "harness.worker", str(job_file)], capture_output=True,
                              text=True, timeout=SIDE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise SideFailed(f"side {job['side']!r} timed out after {SIDE_TIMEOUT_S}s") from None
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise SideFailed(f"side {job['side']!r} failed (exit {done.returncode}):\n{tail}")


def run_case(case: Case, dump_dirs: dict[str, Path] | None = None, repeat: int = 1) -> CaseRun:
    """Run the sides named in dump_dirs (each dumped there), or both sides into a temporary folder.
    With repeat > 1 each side runs the op that many times in its worker and records every digest."""
    with tempfile.TemporaryDirectory(prefix="xfalign-") as tmp:
        workdir = Path(tmp)
        dump_dirs = dump_dirs or {side: workdir / "dumps" / side for side in case.sides}
        inputs_file = workdir / "inputs.safetensors"
        write_inputs(generate_inputs(case), inputs_file)
        jobs = [{"case": case.to_json(), "source": case.source, "side": side,
                 "inputs": str(inputs_file), "dump": str(path), "repeat": repeat}
                for side, path in dump_dirs.items()]
        with ThreadPoolExecutor(len(jobs)) as pool:
            for future in [pool.submit(_run_worker, job, workdir) for job in jobs]:
                future.result()
        dumps = {side: Dump.read(path) for side, path in dump_dirs.items()}
    comparison = None
    if len(dumps) == 2:
        first, second = (dumps[s] for s in case.sides)
        comparison = compare_dumps(first, second, case.expect)
    return CaseRun(case, dumps, comparison)
