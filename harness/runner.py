"""Runs a case: inputs once, then each side in its own worker process, then the comparison.

Each worker runs in its own session and process group (so does everything it starts: torch's compile
workers, helpers left by user code). Its stdout and stderr go to a file in the run's temporary folder,
never to a pipe, so a helper that inherits them cannot hold the run open: the parent waits for the
worker's pid only, then SIGKILLs the whole group. On a timeout, on a failing side (the other side is
stopped too), and on SIGINT/SIGTERM (`interrupt_handler`, installed by the CLI, raises `Interrupted`)
every group still alive is SIGKILLed and the temporary folder is removed before the exception leaves.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import harness
from harness.case import Case
from harness.compare.case import CaseComparison, compare_dumps
from harness.dump import Dump, DumpError
from harness.errors import Interrupted, OutputError, SideCrashed, safe_name
from harness.inputs import generate_inputs, write_inputs
from harness.numerics import NumericsProfile, environment_class, load_profile

# Per side, from the worker's start (framework import and compilation included); `--timeout` on the
# command line, else a case's `timeout`, else this.
DEFAULT_SIDE_TIMEOUT_S = 600
OUTPUT_TAIL_LINES = 15
_POLL_S = 0.05

# A worker runs the harness package this process imported, never one that happens to sit in the working
# directory: -P keeps the cwd off sys.path while PYTHONPATH still applies; the package is loaded from the parent's folder and every harness module is checked to come
# from there.
HARNESS_DIR = Path(harness.__file__).resolve().parent
_WORKER_BOOT = """\
import importlib.util, os, sys
package, job = sys.argv[1], sys.argv[2]
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


@dataclass
class CaseRun:
    case: Case
    dumps: dict[str, Dump]
    comparison: CaseComparison | None  # None when only one side ran
    environment_class: str  # goldens of this run live in baselines/<environment_class>/

    @property
    def case_name(self) -> str:
        return self.case.name


class _Critical:
    """Signals that arrive while a worker is being registered or the run is being torn down are
    deferred to the end of that section (a flag, not a signal mask: Python runs handlers in the main
    thread whichever thread the kernel picked)."""

    depth = 0
    pending: int | None = None


def interrupt_handler(signum: int, frame) -> None:
    """SIGINT/SIGTERM handler (installed by the CLI): raises Interrupted, which tears the run down."""
    if _Critical.depth:
        _Critical.pending = signum
        return
    raise Interrupted(signum)


@contextmanager
def _critical():
    _Critical.depth += 1
    try:
        yield
    finally:
        _Critical.depth -= 1
        if not _Critical.depth and _Critical.pending is not None:
            signum, _Critical.pending = _Critical.pending, None
            raise Interrupted(signum)


@dataclass
class _Worker:
    side: str
    process: subprocess.Popen
    log: Path
    status: Path
    started: float
    reaped: bool = False

    def exited(self) -> bool:
        """Whether the worker has exited, leaving it unreaped (its pid stays the group's id until
        `stop` SIGKILLs the group)."""
        if hasattr(os, "waitid"):
            return os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        return self.process.poll() is not None

    def stop(self) -> None:
        """SIGKILL the worker's process group (helpers and compile workers included) and reap the worker."""
        if self.reaped:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:  # stuck in the kernel; it dies when that returns
            pass
        self.reaped = True

    def tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").rstrip().splitlines()[-OUTPUT_TAIL_LINES:]
        except OSError:
            lines = []
        if not lines:
            return "; it printed nothing"
        return f"; last {len(lines)} lines of its output:\n" + "\n".join(f"  {line}" for line in lines)

    def check(self) -> None:
        """Raise SideCrashed (or OutputError) unless the worker exited 0 with its dump written."""
        code = self.process.returncode
        try:
            status = json.loads(self.status.read_text())
        except (OSError, ValueError):
            status = {}
        if code < 0:
            name = _signal_name(-code)
            hint = " (likely out of memory)" if -code == signal.SIGKILL else ""
            raise SideCrashed(f"side {self.side!r} was killed by {name}{hint} (signal {-code}){self.tail()}")
        if "output_error" in status:
            raise OutputError(status["output_error"])
        if "error" in status:
            headline = (str(status["error"]).strip().splitlines() or ["?"])[0]
            raise SideCrashed(f"side {self.side!r} failed (exit {code}): {headline}{self.tail()}")
        if "dump" not in status:
            raise SideCrashed(f"side {self.side!r} exited before writing its dump (exit {code}){self.tail()}")
        if code != 0:
            raise SideCrashed(f"side {self.side!r} failed after writing its dump (exit {code}){self.tail()}")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _start_worker(job: dict, workdir: Path, index: int, workers: list[_Worker]) -> None:
    """Start one side's worker and register it in `workers` (a signal cannot fall in between)."""
    stem = f"{index}-{safe_name(job['side'])}"
    job_file, status, log = (workdir / f"{kind}-{stem}.{ext}" for kind, ext in
                             (("job", "json"), ("status", "json"), ("output", "log")))
    job_file.write_text(json.dumps(dict(job, status=str(status))))
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    with open(log, "wb") as output, _critical():
        process = subprocess.Popen([sys.executable, "-P", "-c", _WORKER_BOOT, str(HARNESS_DIR), str(job_file)],
                                   stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
        workers.append(_Worker(job["side"], process, log, status, time.monotonic()))


def _wait(workers: list[_Worker], timeout: float) -> None:
    """Wait for every worker (its pid only); stop each group as its worker ends. The first failure or
    timeout raises at once (the caller stops the others)."""
    pending = list(workers)
    while pending:
        for worker in list(pending):
            if worker.exited():
                worker.stop()  # whatever it left running dies with it
                pending.remove(worker)
                worker.check()
            elif time.monotonic() - worker.started > timeout:
                worker.stop()
                raise SideCrashed(f"side {worker.side!r} timed out after {timeout:g} s{worker.tail()}")
        if pending:
            time.sleep(_POLL_S)


def side_timeout(case: Case, timeout: float | None = None) -> float:
    """Seconds each side may run: the command line's, else the case's `timeout`, else the default."""
    if timeout is None:
        timeout = case.timeout
    return float(timeout) if timeout is not None else float(DEFAULT_SIDE_TIMEOUT_S)


def profile_of(case: Case, numerics: str | None = None) -> NumericsProfile:
    """The run's numerics profile: --numerics, else the case's, else the default."""
    return load_profile(numerics or case.numerics, case.source if not numerics else None)


def class_of(case: Case, numerics: str | None = None) -> str:
    return environment_class(profile_of(case, numerics), [case.device_of(side) for side in case.sides])


def run_case(case: Case, dump_dirs: dict[str, Path] | None = None, repeat: int = 1,
             numerics: str | None = None, timeout: float | None = None,
             max_input_gib: float | None = None) -> CaseRun:
    """Run the sides named in dump_dirs (each dumped there), or both sides into a temporary folder.
    With repeat > 1 each side runs the op that many times in its worker and records every digest.
    `numerics` names a profile that replaces the case's; `timeout` (seconds per side) the case's."""
    profile = profile_of(case, numerics)
    limit = side_timeout(case, timeout)
    try:
        workdir = Path(tempfile.mkdtemp(prefix="xfalign-"))
    except OSError as error:
        raise OutputError(f"cannot create a temporary folder in {tempfile.gettempdir()}: {error.strerror}") from None
    workers: list[_Worker] = []
    try:
        dump_dirs = dump_dirs or {side: workdir / "dumps" / f"{i}-{safe_name(side)}" for i, side in enumerate(case.sides)}
        inputs_file = workdir / "inputs.safetensors"
        try:
            write_inputs(generate_inputs(case, max_input_gib), inputs_file)
        except OSError as error:
            raise OutputError(f"cannot write the inputs in {workdir}: {error.strerror}") from None
        jobs = [{"case": case.to_json(), "source": case.source, "side": side,
                 "inputs": str(inputs_file), "dump": str(path), "repeat": repeat,
                 "numerics": profile.model_dump(mode="json")}
                for side, path in dump_dirs.items()]
        for index, job in enumerate(jobs):
            _start_worker(job, workdir, index, workers)
        _wait(workers, limit)
        dumps = {}
        for side, path in dump_dirs.items():
            try:
                dumps[side] = Dump.read(path)
            except DumpError as error:
                raise SideCrashed(f"side {side!r} wrote a dump that cannot be read back: {error}") from None
    finally:
        with _critical():
            for worker in workers:
                worker.stop()
            shutil.rmtree(workdir, ignore_errors=True)
    comparison = None
    if len(dumps) == 2:
        first, second = (dumps[s] for s in case.sides)
        comparison = compare_dumps(first, second, case.expect)
    return CaseRun(case, dumps, comparison, environment_class(profile, [case.device_of(s) for s in case.sides]))
