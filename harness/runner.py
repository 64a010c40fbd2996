"""Runs cases: inputs once per case, each side in a long-lived worker process, then the comparison.

A `WorkerPool` keeps one worker per (framework, device, numerics profile) for the whole run, so each
framework is imported once; every case's side is a job sent to the worker of its key (harness.worker
puts the process back as it was after each case). `run_cases` runs up to `jobs` cases at once and
yields them in case order.

Each worker runs in its own session, under a keeper process (harness.reaper): every process the worker
starts stays a descendant of the keeper, even one that leaves the worker's session or group (a daemon),
and the worker ends those a case started when the case ends. Its stdout and stderr go to files (the
worker's own log, and per job the case's log), never to a pipe, so a helper that inherits them cannot
hold the run open; jobs and results travel on a private pipe, and the parent watches the keeper's pid
(which exits as the worker did), not the pipe. A worker that dies during a job (a signal, os._exit,
sys.exit) or passes the job's timeout has everything under its keeper SIGKILLed; that case fails
(SideCrashed: the signal named, the exit code, the last lines of the case's output) and the next case
of that key gets a new worker. On SIGINT/SIGTERM (`interrupt_handler`, installed by the CLI, raises
`Interrupted`) or when the pool is closed every worker's tree is SIGKILLed and the temporary folder
removed before the exception leaves. When this process dies without that (SIGKILL), each keeper sees
it and ends its worker's tree, and the next run removes the temporary folder it left.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import SafetensorError

import harness
from harness.case import REFERENCE_SIDE, Case
from harness.compare.case import CaseComparison, compare_dumps
from harness.errors import Interrupted, OutputError, SideCrashed, safe_name
from harness.inputs import generate_inputs
from harness.numerics import NumericsProfile
from harness.ops import family_for, reference_framework
from harness.protocol import Dumped, Failed, Job, OutputFailed, Prepare, ProtocolError, ReferenceJob, Result, SideJob, decode_result, encode
from harness.reaper import claim, kill_descendants, sweep
from harness.run_options import DEFAULT_SIDE_TIMEOUT_S, RunOptions
from harness.store.atomic import unsynced
from harness.store.dump import INPUTS_FILE, Dump, DumpError, write_inputs
from harness.store.ranks import assemble_dumps, rank_dump_dir

OUTPUT_TAIL_LINES = 15
_POLL_S = 0.05

# A worker runs the harness package this process imported, never one that happens to sit in the working
# directory: -P keeps the cwd off sys.path while PYTHONPATH still applies; the package is loaded from the
# parent's folder and every harness module is checked to come from there.
HARNESS_DIR = Path(harness.__file__).resolve().parent
_WORKER_BOOT = """\
import importlib.util, os, sys
package = sys.argv[1]
spec = importlib.util.spec_from_file_location("harness", os.path.join(package, "__init__.py"),
                                              submodule_search_locations=[package])
module = importlib.util.module_from_spec(spec)
sys.modules["harness"] = module
spec.loader.exec_module(module)
import harness.reaper
harness.reaper.keep(int(sys.argv[2]))  # this process stays as the keeper; the worker is its child
import harness.worker
for name, loaded in list(sys.modules.items()):
    where = getattr(loaded, "__file__", None)
    if (name == "harness" or name.startswith("harness.")) and where and \\
            not os.path.realpath(where).startswith(os.path.realpath(package) + os.sep):
        sys.exit(f"xfalign worker: {name} was imported from {where}, not from the parent's {package}")
sys.exit(harness.worker.main(sys.argv[3:]))
"""


@dataclass
class CaseRun:
    case: Case
    dumps: dict[str, Dump]
    comparison: CaseComparison | None  # None when only one side ran
    environment_class: str  # goldens of this run live in baselines/<environment_class>/
    # seconds: "inputs", "compare", "total" in the parent; per side what its worker measured
    # ("import_s" on a worker's first job, "op_s" per repeat, "read_inputs_s", "dump_s", "reset_s", "total_s")
    timings: dict = field(default_factory=dict)

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
def critical():
    """A SIGINT/SIGTERM (on the main thread) inside the block is held until it ends: what the block writes
    and records happens whole, and a wait on futures or a call into an executor leaves no lock taken (the
    handler raises between any two bytecodes: raised where concurrent.futures had just taken a future's lock,
    it left that lock held, so the thread finishing the future, and this process's exit, which joins that
    thread, waited for ever). Keep such blocks short: the signal waits for them."""
    main = threading.current_thread() is threading.main_thread()
    if main:
        _Critical.depth += 1
    try:
        yield
    finally:
        if main:
            _Critical.depth -= 1
            if not _Critical.depth and _Critical.pending is not None:
                signum, _Critical.pending = _Critical.pending, None
                raise Interrupted(signum)


def _wait_done(futures: list[Future]) -> None:
    """Return once every one of `futures` is done: short waits, so a signal is handled promptly, each under
    critical()."""
    while True:
        with critical():
            if not wait(futures, timeout=0.2).not_done:
                return


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _tail(*logs: Path) -> str:
    """The last lines of the first of `logs` that has any (the case's log, then the worker's own)."""
    lines: list[str] = []
    for log in logs:
        try:
            lines = log.read_text(errors="replace").rstrip().splitlines()[-OUTPUT_TAIL_LINES:]
        except OSError:
            lines = []
        if lines:
            break
    if not lines:
        return "; it printed nothing"
    return f"; last {len(lines)} lines of its output:\n" + "\n".join(f"  {line}" for line in lines)


TEMP_PREFIX = "xfalign-"
_ROOM_HINT = "free some space there or set TMPDIR to a folder with room"


def _write_failure(error: OSError | SafetensorError) -> str:
    """The operating system's words for a failed write; safetensors wraps them ("Error while serializing:
    I/O error: No space left on device (os error 28)")."""
    if isinstance(error, OSError):
        return error.strerror or str(error)
    wrapped = re.search(r"I/O error: (.+?) \(os error \d+\)", str(error))
    return wrapped.group(1) if wrapped else str(error)


def _claimed_temp_folder() -> Path:
    """A new temporary folder, marked as this process's; first the folders of killed runs are removed."""
    parent = Path(tempfile.gettempdir())
    sweep(parent, TEMP_PREFIX)
    try:
        folder = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=parent))
    except OSError as error:
        raise OutputError(f"cannot create a temporary folder in {parent}: {error.strerror} ({_ROOM_HINT})") from None
    try:
        claim(folder)
    except OSError as error:
        shutil.rmtree(folder, ignore_errors=True)
        raise OutputError(f"cannot write in the temporary folder {folder}: {error.strerror} ({_ROOM_HINT})") from None
    return folder


class PoolClosed(Exception):
    """The pool was closed (interrupted run) while a job waited or ran."""


class _Process:
    """One started worker process (`popen`: its keeper, harness.reaper): its channel, its own log."""

    def __init__(self, popen: subprocess.Popen, to_worker: int, from_worker: int, log: Path):
        self.popen, self.to_worker, self.from_worker, self.log = popen, to_worker, from_worker, log
        self.started = time.monotonic()
        self.reaped = False
        self.buffer = b""
        # the pool's close and the slot's thread may both stop it; held while killing: the keeper's pid
        # is not reaped (and reused) meanwhile
        self._stopping = threading.RLock()

    def exited(self) -> bool:
        """Whether the worker has exited (its keeper, once it ended what the worker left), leaving the
        keeper unreaped (its pid is not reused before `stop`)."""
        if self.reaped:
            return True
        if hasattr(os, "waitid"):
            return os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        return self.popen.poll() is not None

    def kill(self) -> None:
        """SIGKILL every process under the keeper (the worker, whatever it started); the keeper reaps them
        and exits, and `stop` reaps the keeper."""
        with self._stopping:
            if not self.reaped:
                kill_descendants(self.popen.pid)

    def stop(self) -> None:
        """SIGKILL the worker's tree (helpers and compile workers included) and reap its keeper.
        Its pipe ends are closed exactly once: a second close could hit a descriptor reused meanwhile."""
        with self._stopping:
            if self.reaped:
                return
            self.kill()
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:  # stuck in the kernel; it dies when that returns
                pass
            self.reaped = True
            for fd in (self.to_worker, self.from_worker):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def send(self, job: Job) -> bool:
        data = encode(job)
        try:
            while data:
                data = data[os.write(self.to_worker, data):]
        except (BrokenPipeError, OSError):
            return False
        return True

    def receive(self, wait: float) -> Result | None:
        """A result if one arrives within `wait` seconds; ProtocolError if the line is not one."""
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([self.from_worker], [], [], wait)
            if not ready:
                return None
            chunk = os.read(self.from_worker, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
            wait = 0
        line, self.buffer = self.buffer.split(b"\n", 1)
        return decode_result(line)


@dataclass
class _Job:
    side: str  # for messages: the side's name, REFERENCE_SIDE, "(start)"
    message: Job
    timeout: float
    future: Future
    then: _Job | None = None  # the follow-up (message.then): sent with this job, answered by the worker right after it

    @property
    def log(self) -> Path:
        return Path(self.message.log)


class _Slot:
    """One worker of a key, (re)started as needed, and the thread that feeds it jobs."""

    def __init__(self, pool: WorkerPool, key: tuple, queue: deque, index: int):
        self.pool, self.key, self.queue, self.index = pool, key, queue, index
        self.process: _Process | None = None
        self.thread = threading.Thread(target=self._loop, name=f"xfalign-worker-{key[0]}-{index}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        pool = self.pool
        while True:
            with pool._lock:
                while not self.queue and not pool._closed:
                    pool._wake.wait()
                if pool._closed:
                    return
                job = self.queue.popleft()
            if not job.future.set_running_or_notify_cancel():
                if job.then is not None:
                    job.then.future.cancel()
                continue
            try:
                job.future.set_result(self._run(job))
            except BaseException as error:  # noqa: BLE001  (handed to the waiting case)
                job.future.set_exception(error)
                if job.then is not None and job.then.future.set_running_or_notify_cancel():
                    job.then.future.set_exception(error)
                continue
            if job.then is not None:
                self._follow(job.then)

    def _follow(self, job: _Job) -> None:
        """The follow-up's record, which the worker sends after the first one's (read even when the
        follow-up's future was cancelled meanwhile: the channel stays in step)."""
        wanted = job.future.set_running_or_notify_cancel()
        try:
            assert self.process is not None  # the first job's record came from it
            result = self._await(job, self.process, time.monotonic())
        except BaseException as error:  # noqa: BLE001  (handed to the waiting case)
            if wanted:
                job.future.set_exception(error)
            return
        if wanted:
            job.future.set_result(result)

    def _spawn(self) -> _Process:
        pool = self.pool
        number = next(pool._counter)
        log = pool.workdir / f"worker-{number}-{safe_name(self.key[0])}.log"
        child_in, to_worker = os.pipe()
        from_worker, child_out = os.pipe()
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        try:
            with open(log, "wb") as output, pool._lock:
                if pool._closed:
                    raise PoolClosed("the worker pool was closed")
                popen = subprocess.Popen(
                    [sys.executable, "-P", "-c", _WORKER_BOOT, str(HARNESS_DIR), str(os.getpid()), "--serve", str(child_in),
                     str(child_out)],
                    stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True, pass_fds=(child_in, child_out))
                process = _Process(popen, to_worker, from_worker, log)
                pool._processes.append(process)
                pool._spawned[self.key[0]] = pool._spawned.get(self.key[0], 0) + 1
        except BaseException:
            for fd in (to_worker, from_worker):
                os.close(fd)
            raise
        finally:
            os.close(child_in)
            os.close(child_out)
        return process

    def _run(self, job: _Job) -> Result:
        if self.process is not None and self.process.exited():  # died while idle: not this case's fault
            self.process.stop()
            self.process = None
        process = self.process
        fresh = process is None
        if process is None:
            process = self.process = self._spawn()
        started = process.started if fresh else time.monotonic()
        return self._await(job, process, started, process.send(job.message))

    def _await(self, job: _Job, process: _Process, started: float, sent: bool = True) -> Result:
        """The worker's record for `job`; SideCrashed if it dies, or runs past the job's timeout from `started`."""
        pool = self.pool
        while True:
            if pool._closed:
                process.stop()
                raise PoolClosed("the worker pool was closed")
            try:
                result = process.receive(_POLL_S) if sent else None
            except ProtocolError as error:  # the channel is out of step: the worker is not trusted further
                process.stop()
                self.process = None
                raise SideCrashed(f"side {job.side!r}: {error}{_tail(job.log, process.log)}") from None
            if result is not None:
                return result
            if not sent or process.exited():
                process.stop()  # whatever it left running dies with it
                self.process = None
                raise self._crash(job, process)
            if time.monotonic() - started > job.timeout:
                process.stop()
                self.process = None
                raise SideCrashed(f"side {job.side!r} timed out after {job.timeout:g} s"
                                  f"{_tail(job.log, process.log)}")

    @staticmethod
    def _crash(job: _Job, process: _Process) -> SideCrashed:
        code = process.popen.returncode
        if code is not None and code < 0:
            name = _signal_name(-code)
            hint = " (likely out of memory)" if -code == signal.SIGKILL else ""
            return SideCrashed(f"side {job.side!r} was killed by {name}{hint} (signal {-code}){_tail(job.log, process.log)}")
        return SideCrashed(f"side {job.side!r} exited before writing its dump (exit {code}){_tail(job.log, process.log)}")


class _RankSlot(_Slot):
    """The `world` rank workers of a side that runs on several ranks (tensor parallel): one torch.distributed
    world, started together, each sent the job with its rank and its own dump folder, and stopped together. A
    rank that crashes, hangs, fails or answers out of step ends them all (its peers would wait in a
    collective for ever): the case fails, and the next one starts a fresh world."""

    def __init__(self, pool: WorkerPool, key: tuple, queue: deque, index: int, world: int):
        self.world = world
        self.processes: list[_Process] = []
        self.rendezvous = ""
        super().__init__(pool, key, queue, index)

    def _stop_all(self) -> None:
        for process in self.processes:
            process.stop()
        self.processes, self.process = [], None

    def _run(self, job: _Job) -> Result:
        if any(process.exited() for process in self.processes):  # one died while idle: the world is gone
            self._stop_all()
        fresh = not self.processes
        if fresh:
            self.rendezvous = str(self.pool.workdir / f"world-{next(self.pool._counter)}.store")
            self.processes = [self._spawn() for _ in range(self.world)]
            self.process = self.processes[0]
        started = min(p.started for p in self.processes) if fresh else time.monotonic()
        messages = [self._message(job.message, rank) for rank in range(self.world)]
        sent = [process.send(message) for process, message in zip(self.processes, messages)]
        return self._await_ranks(job, started, sent)

    def _message(self, message: Job, rank: int) -> Job:
        if not isinstance(message, SideJob):
            return message  # Prepare: every rank imports its framework
        return message.model_copy(update={"rank": rank, "world": self.world, "rendezvous": self.rendezvous,
                                          "dump": str(rank_dump_dir(message.dump, rank)),
                                          "log": message.log if rank == 0 else str(_rank_log(message.log, rank))})

    def _await_ranks(self, job: _Job, started: float, sent: list[bool]) -> Result:
        """Every rank's record (rank 0's returned, with the others' checked); the first rank that fails,
        dies or times out ends the world."""
        results: dict[int, Result] = {}
        while len(results) < self.world:
            if self.pool._closed:
                self._stop_all()
                raise PoolClosed("the worker pool was closed")
            for rank, process in enumerate(self.processes):
                if rank in results:
                    continue
                log = job.log if rank == 0 else _rank_log(job.log, rank)
                try:
                    result = process.receive(_POLL_S / self.world) if sent[rank] else None
                except ProtocolError as error:
                    self._stop_all()
                    raise SideCrashed(f"side {job.side!r} rank {rank}: {error}{_tail(log, process.log)}") from None
                if result is not None:
                    if isinstance(result, (Failed, OutputFailed)):  # its peers may wait on it in a collective
                        self._crashed_peer(job)  # a peer that died makes the others fail: it is the cause
                        self._stop_all()
                        return result.model_copy(update={"error": f"rank {rank}: {result.error}"})
                    results[rank] = result
                elif not sent[rank] or process.exited():
                    self._raise_crash(job, rank)
            if time.monotonic() - started > job.timeout:
                waiting = [rank for rank in range(self.world) if rank not in results]
                tails = "".join(_tail(_rank_log(job.log, r) if r else job.log, self.processes[r].log) for r in waiting[:1])
                self._stop_all()
                raise SideCrashed(f"side {job.side!r} timed out after {job.timeout:g} s (ranks "
                                  f"{', '.join(map(str, waiting))} of {self.world} had not finished){tails}")
        return results[0]


    def _crashed_peer(self, job: _Job) -> None:
        """A rank that failed may only have lost its peer: a rank that exits within _PEER_GRACE_S is the crash."""
        deadline = time.monotonic() + _PEER_GRACE_S
        while True:
            for rank, process in enumerate(self.processes):
                if process.exited():
                    self._raise_crash(job, rank)
            if time.monotonic() > deadline:
                return
            time.sleep(_POLL_S)

    def _raise_crash(self, job: _Job, rank: int) -> None:
        process = self.processes[rank]
        self._stop_all()
        crash = self._crash(job, process)
        raise SideCrashed(str(crash).replace(f"side {job.side!r}", f"side {job.side!r} rank {rank}", 1))


_PEER_GRACE_S = 1.0


def _rank_log(log: str | Path, rank: int) -> Path:
    log = Path(log)
    return log.with_name(f"{log.stem}.rank{rank}{log.suffix}")


class WorkerPool:
    """Long-lived workers, one per (framework, device, numerics profile) (more per key where `jobs`
    allows: jobs // 2 each), started when a case first needs one, reused by every case, restarted after
    a crash or a timeout. A context manager: closing it SIGKILLs every worker's tree and removes
    the pool's temporary folder (logs, inputs, the dumps of runs without --dump).

        with WorkerPool() as pool:
            run = run_case(case, pool=pool)
            with pool.as_default():       # run_case() and the CLI called inside use this pool
                ...
    """

    def __init__(self, jobs: int | None = None):
        self.jobs = max(1, jobs or os.cpu_count() or 1)
        self.workers_per_key = max(1, self.jobs // 2)
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._queues: dict[tuple, deque] = {}
        self._slots: dict[tuple, list[_Slot]] = {}
        self._processes: list[_Process] = []
        self._spawned: dict[str, int] = {}
        self._counter = itertools.count()
        self._workdir: Path | None = None
        self.timings: list[tuple[str, dict]] = []  # (case name, CaseRun.timings) of every case run here

    # -- lifetime -------------------------------------------------------------------------------------

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def workdir(self) -> Path:
        with self._lock:
            if self._workdir is None:
                self._workdir = _claimed_temp_folder()
            return self._workdir

    def close(self) -> None:
        """SIGKILL every worker's tree, fail what is still queued, remove the temporary folder."""
        with critical():
            with self._lock:
                self._closed = True
                self._wake.notify_all()
                processes = list(self._processes)
                pending = [job for queue in self._queues.values() for job in queue]
                for queue in self._queues.values():
                    queue.clear()
            for process in processes:
                process.kill()  # a slot's thread sees its pipe close and stops (reaps) its own worker
            for job in pending + [job.then for job in pending if job.then is not None]:
                if job.future.set_running_or_notify_cancel():
                    job.future.set_exception(PoolClosed("the worker pool was closed"))
            for slots in self._slots.values():
                for slot in slots:
                    slot.thread.join(timeout=5)
            for process in processes:
                process.stop()
            if _DefaultPool.pool is self:
                _DefaultPool.pool = None
            self._write_timings()
            if self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)

    def _write_timings(self) -> None:
        """With XFALIGN_TIMINGS=FILE (scripts/bench_suite.py sets it), every case's timings and the
        workers started, as JSON."""
        target = os.environ.get("XFALIGN_TIMINGS")
        if target and self.timings:
            try:
                Path(target).write_text(json.dumps({"cases": self.timings, "spawned": self._spawned}))
            except OSError:
                pass

    @contextmanager
    def as_default(self):
        """Inside, run_case() without `pool=` and the CLI's run and gate use this pool."""
        previous, _DefaultPool.pool = _DefaultPool.pool, self
        try:
            yield self
        finally:
            _DefaultPool.pool = previous

    def stats(self) -> dict:
        """{"spawned": {framework: worker processes started}, "alive": n}: 1 per framework when nothing crashed."""
        with self._lock:
            return {"spawned": dict(self._spawned), "alive": sum(not p.exited() for p in self._processes)}

    # -- jobs -----------------------------------------------------------------------------------------

    def prestart(self, key: tuple, numerics: NumericsProfile) -> None:
        """Start the worker of `key` now and have it import its framework (while the parent makes the
        first inputs). Nothing if that key has a worker already."""
        with self._lock:
            if self._closed or self._slots.get(key):
                return
        job = Prepare(framework=key[0], numerics=numerics, log=str(self.workdir / f"start-{next(self._counter)}.log"))
        future = self.submit(key, "(start)", job, float(DEFAULT_SIDE_TIMEOUT_S))

        def record(done: Future) -> None:
            if not done.cancelled() and done.exception() is None:
                with self._lock:
                    self.timings.append((f"(start {key[0]})", {key[0]: done.result().timings}))

        future.add_done_callback(record)

    def submit(self, key: tuple, side: str, job: Job, timeout: float) -> Future:
        """Queue one job for the worker of `key` (`side` names it in messages); the future's result is the
        worker's Result."""
        queued = _Job(side, job, timeout, Future())
        self._queue(key, queued)
        return queued.future

    def submit_followed(self, key: tuple, side: str, job: SideJob, timeout: float) -> tuple[Future, Future]:
        """Like `submit` for `job`, whose follow-up `job.then` the same worker runs right after it, in one
        message (the case's float64 reference after its Megatron side: the inputs, the job's round trip and
        Megatron's group serve both). The two futures, each with its own Result; each job's `timeout` counts
        from its own start."""
        assert job.then is not None
        then = _Job(REFERENCE_SIDE, job.then, timeout, Future())
        first = _Job(side, job, timeout, Future(), then=then)
        self._queue(key, first)
        return first.future, then.future

    def _queue(self, key: tuple, job: _Job) -> None:
        with self._lock:
            if self._closed:
                raise PoolClosed("the worker pool was closed")
            queue = self._queues.setdefault(key, deque())
            queue.append(job)
            slots = self._slots.setdefault(key, [])
            busy = len(queue) + sum(slot.process is not None for slot in slots)
            world = _world_of(key)
            if world > 1:  # one world per key: another would start `world` more processes
                if not slots:
                    slots.append(_RankSlot(self, key, queue, 0, world))
            elif len(slots) < self.workers_per_key and (not slots or busy > len(slots)):
                slots.append(_Slot(self, key, queue, len(slots)))
            self._wake.notify_all()


class _DefaultPool:
    pool: WorkerPool | None = None


def current_pool() -> WorkerPool | None:
    """The pool made the default by `WorkerPool.as_default()`, if any."""
    return _DefaultPool.pool


def _key(case: Case, side: str, profile: NumericsProfile) -> tuple:
    """Which worker runs a side: what must be set before its framework is imported, and the number of ranks
    it runs on (a side of several ranks has a world of rank workers of its own)."""
    framework = case.sides[side].framework
    key = _worker_key(framework, case.device_of(side), profile)
    world = family_for(case.op, case.source).ranks(case, framework)
    return key + (("ranks", world),) if world > 1 else key


def _worker_key(framework: str, device: str, profile: NumericsProfile) -> tuple:
    return (framework, device, json.dumps(profile.model_dump(mode="json"), sort_keys=True))


def _world_of(key: tuple) -> int:
    return key[3][1] if len(key) > 3 else 1


def _reference_key(case: Case, profile: NumericsProfile) -> tuple:
    """The worker that computes the case's float64 reference (on its CPU): the worker of a side of the
    reference's framework where the case has one (the reference follows that side in its job), so no
    process is started for it."""
    framework = reference_framework(case)
    assert framework is not None  # asked only for a case whose family has a reference
    host = next((side for side, spec in case.sides.items() if spec.framework == framework), None)
    if host is None or _world_of(_key(case, host, profile)) > 1:  # the reference runs on one rank
        return _worker_key(framework, "cpu", profile)
    return _key(case, host, profile)


NO_REFERENCE_RUN = "the float64 reference was not run (--no-reference)"


def _reference_result(job: Future, folder: Path) -> tuple[Dump | None, str, dict]:
    """(the reference's dump, or None and why not, its timings). A reference that fails leaves the case's
    comparison without an arbiter; it does not fail the case."""
    _wait_done([job])
    try:
        result = job.result()
    except SideCrashed as error:
        return None, f"the float64 reference crashed: {str(error).splitlines()[0]}", {}
    if not isinstance(result, Dumped):
        return None, f"the float64 reference failed: {(result.error.strip().splitlines() or ['?'])[0]}", result.timings
    try:
        return Dump.read(folder, check_bytes=False), "", result.timings
    except DumpError as error:
        return None, f"the float64 reference wrote a dump that cannot be read back: {error}", result.timings


def _assembled(case: Case, side: str, folder: Path, world: int, durable: bool) -> Dump:
    """The canonical dump of a side that ran on `world` ranks, made from its ranks' dumps (each checked
    against its digests as it is read) and written at `folder`."""
    ranks = [Dump.read(rank_dump_dir(folder, rank)) for rank in range(world)]
    shardings = family_for(case.op, case.source).shardings(case, case.sides[side].framework)
    dump = assemble_dumps(ranks, shardings)
    try:
        with nullcontext() if durable else unsynced():
            dump.write(folder)
    except (OSError, SafetensorError) as error:
        raise OutputError(f"cannot write the dump {folder}: {_write_failure(error)} ({_ROOM_HINT})") from None
    return dump


def _wait_all(futures: dict[str, Future], logs: dict[str, Path]) -> dict[str, Dumped]:
    """Each side's result. A side that failed (crashed, timed out, raised, could not write its dump)
    raises as soon as it is known, the first in side order among those known; a job of the case not yet
    started is cancelled (one that runs finishes in its worker and is discarded)."""
    while True:
        with critical():  # a signal is raised between these checks and waits, not inside them
            finished = all(future.done() for future in futures.values())  # before the checks: no race
            for side, future in futures.items():
                if not future.done():
                    continue
                try:
                    result = future.result()
                except BaseException:
                    _cancel(futures)
                    raise
                if isinstance(result, OutputFailed):
                    _cancel(futures)
                    raise OutputError(result.error)
                if isinstance(result, Failed):
                    _cancel(futures)
                    headline = (result.error.strip().splitlines() or ["?"])[0]
                    raise SideCrashed(f"side {side!r} failed (exit {result.exit}): {headline}{_tail(logs[side])}")
            if finished:
                return {side: future.result() for side, future in futures.items()}
            wait(list(futures.values()), timeout=0.2, return_when=FIRST_COMPLETED)  # short: a signal is handled promptly


def _cancel(futures: dict[str, Future]) -> None:
    for future in futures.values():
        future.cancel()


def run_case(case: Case, dump_dirs: dict[str, Path] | None = None, options: RunOptions | None = None,
             pool: WorkerPool | None = None) -> CaseRun:
    """Run the sides named in dump_dirs (each dumped there), or both sides into a temporary folder, with the
    run's `options` (default: RunOptions()). With repeat > 1 each side runs the op that many times in its
    worker and records every digest. `pool`: the workers to use (default: the pool made default by
    `as_default`, else a pool of its own, closed when the case is done). When both sides run, the family's
    float64 reference runs too (unless options.reference is False), into dump_dirs["exact"] where given; it
    arbitrates the comparison."""
    options = options or RunOptions()
    pool = pool or current_pool()
    if pool is None:
        with WorkerPool(jobs=2) as own:
            return run_case(case, dump_dirs, options, own)
    started = time.perf_counter()
    settings = options.settings(case)
    profile, limit = settings.profile, settings.timeout
    try:
        workdir = Path(tempfile.mkdtemp(prefix=f"case-{safe_name(case.name)[:40]}-", dir=pool.workdir))
    except OSError as error:
        raise OutputError(f"cannot create a temporary folder in {pool.workdir}: {error.strerror} ({_ROOM_HINT})") from None
    reference_job = None
    try:
        # absolute before any user code runs: a side that changes its working directory cannot move its dump
        dump_dirs = {side: Path(path).absolute() for side, path in (dump_dirs or {
            side: workdir / "dumps" / f"{i}-{safe_name(side)}" for i, side in enumerate(case.sides)}).items()}
        inputs_file = workdir / INPUTS_FILE
        try:
            write_inputs(generate_inputs(case, options.max_input_gib), inputs_file)
        except (OSError, SafetensorError) as error:
            raise OutputError(f"cannot write the case's inputs {inputs_file}: {_write_failure(error)} ({_ROOM_HINT})") from None
        timings: dict = {"inputs": time.perf_counter() - started}
        env = dict(os.environ, PYTHONWARNINGS="ignore") | profile.env  # the case's: the profile's variables on top
        cwd = os.getcwd()

        def durable(folder: Path) -> bool:  # a dump in the case's temporary folder (removed after) is not fsynced
            return not folder.is_relative_to(workdir)

        futures, logs = {}, {}
        sides = [side for side in dump_dirs if side != REFERENCE_SIDE]
        alone = REFERENCE_SIDE in dump_dirs and not sides  # `run --side exact`: the reference only
        follow = None  # the float64 reference's job
        if options.reference and (len(sides) == 2 or alone) and reference_framework(case) is not None:
            dump_dirs.setdefault(REFERENCE_SIDE, workdir / "dumps" / REFERENCE_SIDE)
            reference_key = _reference_key(case, profile)
            logs[REFERENCE_SIDE] = workdir / "output-reference.log"
            follow = ReferenceJob(case=case, framework=reference_key[0], numerics=profile,
                                  environment_class=settings.reference_class, inputs=str(inputs_file),
                                  dump=str(dump_dirs[REFERENCE_SIDE]), durable=durable(dump_dirs[REFERENCE_SIDE]),
                                  log=str(logs[REFERENCE_SIDE]), cwd=cwd, env=env)
        for index, side in enumerate(sides):
            logs[side] = workdir / f"output-{index}-{safe_name(side)}.log"
            key = _key(case, side, profile)
            job = SideJob(case=case, side=side, repeat=options.repeat, numerics=profile,
                          environment_class=settings.side_classes[side], inputs=str(inputs_file), dump=str(dump_dirs[side]),
                          durable=durable(dump_dirs[side]), log=str(logs[side]), cwd=cwd, env=env)
            if follow is not None and reference_job is None and key == reference_key:  # after the side, in its job
                futures[side], reference_job = pool.submit_followed(key, side, job.model_copy(update={"then": follow}), limit)
            else:
                futures[side] = pool.submit(key, side, job, limit)
        if follow is not None and reference_job is None:
            reference_job = pool.submit(reference_key, REFERENCE_SIDE, follow, limit)
        results = _wait_all(futures, logs)
        dumps = {}
        for side in sides:
            path = dump_dirs[side]
            timings[side] = results[side].timings
            world = _world_of(_key(case, side, profile))
            try:
                dumps[side] = (_assembled(case, side, path, world, durable(path)) if world > 1
                               else Dump.read(path, check_bytes=False))  # verified inside the comparison pass
            except DumpError as error:
                raise SideCrashed(f"side {side!r} wrote a dump that cannot be read back: {error}") from None
        exact, exact_missing = None, NO_REFERENCE_RUN
        if reference_job is not None:
            exact, exact_missing, timings[REFERENCE_SIDE] = _reference_result(reference_job, dump_dirs[REFERENCE_SIDE])
            if alone and exact is None:
                raise SideCrashed(exact_missing)
        elif reference_framework(case) is None:
            exact_missing = family_for(case.op, case.source).no_reference
    finally:
        if reference_job is not None:
            reference_job.cancel()  # a side failed: the reference is not waited for
        shutil.rmtree(workdir, ignore_errors=True)
    if exact is not None and not sides:
        dumps[REFERENCE_SIDE] = exact
    comparison = None
    if len(sides) == 2:
        compared = time.perf_counter()
        first, second = (dumps[s] for s in case.sides)
        comparison = compare_dumps(first, second, case.expect, exact, exact_missing)
        timings["compare"] = time.perf_counter() - compared
    timings["total"] = time.perf_counter() - started
    with pool._lock:
        pool.timings.append((case.name, timings))
    return CaseRun(case, dumps, comparison, settings.environment_class, timings)


def run_cases(cases: list[Case], dump_dirs=lambda case: None, options: RunOptions | None = None,
              pool: WorkerPool | None = None, jobs: int | None = None) -> Iterator[tuple[Case, CaseRun | SideCrashed]]:
    """Run the cases with the run's `options` (default: RunOptions()), up to `jobs` at once (default: the
    pool's), yielding (case, run) in case order as each becomes available; a crashed side is yielded as its
    SideCrashed, not raised. Any other error (bad output path, interrupted run) raises when its case's turn comes."""
    options = options or RunOptions()
    pool = pool or current_pool()
    if pool is None:
        with WorkerPool(jobs=jobs) as own:
            yield from run_cases(cases, dump_dirs, options, own, jobs)
        return
    parallel = max(1, jobs or pool.jobs)
    for case in cases:  # every framework starts importing at once, before the first inputs are made
        profile = options.settings(case).profile
        for side in case.sides if dump_dirs(case) is None else [s for s in dump_dirs(case) if s != REFERENCE_SIDE]:
            pool.prestart(_key(case, side, profile), profile)

    def one(case: Case):
        try:
            return run_case(case, dump_dirs(case), options, pool)
        except SideCrashed as error:
            return error

    executor = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="xfalign-case")
    remaining = iter(cases)
    with critical():  # submit takes the executor's locks
        pending = deque((case, executor.submit(one, case)) for case in itertools.islice(remaining, parallel))
    try:
        while pending:
            case, future = pending[0]
            _wait_done([future])
            pending.popleft()
            following = next(remaining, None)
            if following is not None:
                with critical():
                    pending.append((following, executor.submit(one, following)))
            yield case, future.result()
    finally:
        # an error or an interrupted run: cases not started are dropped; those running end with their
        # jobs (or at once, when the pool is closed)
        with critical():
            for _, future in pending:
                future.cancel()
            executor.shutdown(wait=False, cancel_futures=True)
