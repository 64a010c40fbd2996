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

import harness
from harness.case import Case
from harness.compare import CaseComparison, compare_dumps
from harness.dump import Dump
from harness.inputs import generate_inputs, write_inputs
from harness.numerics import NumericsProfile, environment_class, load_profile

SIDE_TIMEOUT_S = 1800

# A worker runs the harness package this process imported, never one that happens to sit in the working
# directory: -P (and, before 3.11, dropping sys.path[0]) keeps the cwd off sys.path while PYTHONPATH still
# applies; the package is loaded from the parent's folder and every harness module is checked to come
# from there.
HARNESS_DIR = Path(harness.__file__).resolve().parent
_WORKER_BOOT = """\
import importlib.util, os, sys
package, job = sys.argv[1], sys.argv[2]
if not getattr(sys.flags, "safe_path", False) and sys.path and sys.path[0] == "":
    del sys.path[0]
spec = importlib.util.spec_from_file_location("harness", os.path.join(package, "__init__.py"),
                                              submodule_search_locations=[package])
module = importlib.util.module_from_spec(spec)
sys.modules["harness"] = module
spec.loader.exec_module(module)
import harness.worker
for name, loaded in list(sys.modules.items()):
    where = getattr(loaded, "__file__", None)
    if (name == "harness" or name.startswith("harness.")) and where and \
            not os.path.realpath(where).startswith(os.path.realpath(package) + os.sep):
        sys.exit(f"xfalign worker: {name} was imported from {where}, not from the parent's {package}")
sys.exit(harness.worker.main([job]))
"""


class SideFailed(Exception):
    """A worker crashed or timed out; the message carries the tail of its output."""


@dataclass
class CaseRun:
    case: Case
    dumps: dict[str, Dump]
    comparison: CaseComparison | None  # None when only one side ran
    environment_class: str  # goldens of this run live in baselines/<environment_class>/

    @property
    def case_id(self) -> str:
        return self.case.name


def _run_worker(job: dict, workdir: Path) -> None:
    job_file = workdir / f"job-{job['side']}.json"
    job_file.write_text(json.dumps(job))
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    try:
        safe_path = ["-P"] if sys.version_info >= (3, 11) else []
        done = subprocess.run([sys.executable, *safe_path, "-c", _WORKER_BOOT, str(HARNESS_DIR), str(job_file)],
                              capture_output=True, text=True, timeout=SIDE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise SideFailed(f"side {job['side']!r} timed out after {SIDE_TIMEOUT_S}s") from None
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise SideFailed(f"side {job['side']!r} failed (exit {done.returncode}):\n{tail}")


def profile_of(case: Case, numerics: str | None = None) -> NumericsProfile:
    """The run's numerics profile: --numerics, else the case's, else the default."""
    return load_profile(numerics or case.numerics, case.source if not numerics else None)


def class_of(case: Case, numerics: str | None = None) -> str:
    return environment_class(profile_of(case, numerics), [case.device_of(side) for side in case.sides])


def run_case(case: Case, dump_dirs: dict[str, Path] | None = None, repeat: int = 1,
             numerics: str | None = None) -> CaseRun:
    """Run the sides named in dump_dirs (each dumped there), or both sides into a temporary folder.
    With repeat > 1 each side runs the op that many times in its worker and records every digest.
    `numerics` names a profile that replaces the case's."""
    profile = profile_of(case, numerics)
    with tempfile.TemporaryDirectory(prefix="xfalign-") as tmp:
        workdir = Path(tmp)
        dump_dirs = dump_dirs or {side: workdir / "dumps" / side for side in case.sides}
        inputs_file = workdir / "inputs.safetensors"
        write_inputs(generate_inputs(case), inputs_file)
        jobs = [{"case": case.to_json(), "source": case.source, "side": side,
                 "inputs": str(inputs_file), "dump": str(path), "repeat": repeat,
                 "numerics": profile.model_dump(mode="json")}
                for side, path in dump_dirs.items()]
        with ThreadPoolExecutor(len(jobs)) as pool:
            for future in [pool.submit(_run_worker, job, workdir) for job in jobs]:
                future.result()
        dumps = {side: Dump.read(path) for side, path in dump_dirs.items()}
    comparison = None
    if len(dumps) == 2:
        first, second = (dumps[s] for s in case.sides)
        comparison = compare_dumps(first, second, case.expect)
    return CaseRun(case, dumps, comparison, environment_class(profile, [case.device_of(s) for s in case.sides]))
