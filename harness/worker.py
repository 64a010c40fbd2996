"""Worker process: runs sides of cases and writes their dumps.

    python -m harness.worker --serve IN OUT    one job per line on fd IN, one result per line on fd OUT
                                               (harness.protocol), until IN is closed

A long-lived worker serves one (framework, device, numerics profile): the profile's variables are set
before the framework is imported (on the first job), and everything a case may change is put back after
it (`_CaseState`): environment variables, working directory, the framework's deterministic flags, RNG,
torch.distributed groups and Megatron's parallel state, dynamo's compile caches, default dtype, grad
mode, warnings filters, user modules. Torch's compile/eager mode is switched per case at runtime.

A job (harness.protocol.SideJob, ReferenceJob) holds the case, the side, the inputs file, the dump
directory, the parent's working directory and the case's environment, and a log file (the case's output:
fds 1 and 2 point there while it runs). The result: Dumped once the dump is in place, Failed when the side
raised (the traceback goes to the case's log), OutputFailed when the dump could not be written (exit 2). A
worker that dies during a job (user code calling sys.exit or os._exit, a signal) exited before writing its
dump; the parent reports it so and starts a new worker for the next case.
"""

from __future__ import annotations

import os
import random
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, cast

import numpy as np
from safetensors import SafetensorError

from harness import __version__, fingerprint
from harness.case import REFERENCE_SIDE, Case, SideSpec
from harness.dtypes import FLOAT_DTYPES, dtype_name
from harness.execute import SideOutput, execute
from harness.frameworks import FrameworkAdapter, adapter_for
from harness.frameworks.base import names_matching
from harness.ops import NotAvailable, family_for, reference_impl
from harness.protocol import (
    CaseJob,
    Dumped,
    Failed,
    Job,
    OutputFailed,
    Prepare,
    Prepared,
    ProtocolError,
    ReferenceJob,
    Result,
    SideJob,
    decode_job,
    encode,
)
from harness.reaper import kill_descendants, reap
from harness.store.atomic import unsynced
from harness.store.digest import Digest
from harness.store.dump import GENERATOR, Dump, read_inputs

_WARNINGS = ".*(Transformer Engine|Apex|ccache).*"


def run_side(job: SideJob, arrays: dict, adapter: FrameworkAdapter, timings: dict | None = None) -> SideOutput:
    """One run of the side's op, with the environment recorded."""
    case, side_name, profile = job.case, job.side, job.numerics
    device = case.device_of(side_name)
    reason = adapter.unavailable(device)
    if reason:
        raise NotAvailable(reason)  # a result (N/A), not a crash
    adapter.use_device(device)
    adapter.apply_profile(profile)
    if job.world > 1:
        assert job.rendezvous is not None  # the runner gives every rank of a world its meeting place
        adapter.join_world(job.rank, job.world, job.rendezvous, device)
    # The family's settings hold for forward and backward, as in a training run, and are read there.
    with adapter.deterministic(family_for(case.op, case.source).deterministic(case)):
        compiled = adapter.compile_stats()
        started = time.perf_counter()
        output = execute(case, case.sides[side_name], arrays, adapter, device, rank=job.rank, world=job.world)
        if timings is not None:
            timings.setdefault("op_s", []).append(time.perf_counter() - started)
            for name, value in adapter.compile_stats().items():  # compilation inside the op (torch.compile)
                timings[name] = timings.get(name, 0) + value - compiled.get(name, 0)
        runtime = adapter.runtime_fingerprint(device)
    output.environment = fingerprint.assemble(adapter, device, profile, runtime, job.environment_class)
    return output


def run_reference(job: ReferenceJob, arrays: dict, adapter: FrameworkAdapter) -> SideOutput:
    """The family's float64 reference: every float input widened exactly to float64, run eagerly on the CPU
    (bits that depend on neither a GPU nor a compiler), forward and backward."""
    case, framework, profile = job.case, job.framework, job.numerics
    adapter.use_device("cpu")
    adapter.apply_profile(profile)
    widened = {name: array.astype(np.float64) if dtype_name(array.dtype) in FLOAT_DTYPES else array
               for name, array in arrays.items()}
    with adapter.deterministic(False):
        output = execute(case, SideSpec(framework=framework, impl="float64"), widened, adapter, "cpu",
                         impl=reference_impl(case.op, framework, case.source))
    output.environment = fingerprint.assemble(adapter, "cpu", profile, device_class=job.environment_class)
    return output


def run_job(job: CaseJob, timings: dict | None = None) -> Path:
    """One side of one case (or its float64 reference), its dump written, in a worker whose framework
    `_prepare` imported (the profile's variables set before); here only the case's mode is set."""
    timings = {} if timings is None else timings
    if isinstance(job, ReferenceJob):
        return _reference_job(job, adapter_for(job.framework), timings)
    case = job.case
    side = case.sides[job.side]
    adapter = adapter_for(side.framework)
    mode = side.mode or adapter.default_mode
    timings["framework"] = side.framework
    meta = _start(case, adapter, mode, side=job.side, framework=side.framework, impl=side.implementation)
    started = time.perf_counter()
    arrays = read_inputs(Path(job.inputs))
    timings["read_inputs_s"] = time.perf_counter() - started
    if job.world > 1:
        meta |= {"rank": job.rank, "world": job.world}
    try:
        runs = [run_side(job, arrays, adapter, timings) for _ in range(job.repeat)]
    except NotAvailable as reason:
        meta |= {"provenance": "-", "environment": {}, "inputs": {}, "unavailable": str(reason)}
        return _write_dump(Dump(meta, {}), job, timings)
    output = runs[0]
    meta |= {
        "provenance": output.provenance,
        "environment": output.environment,
        "inputs": {name: digest.to_json() for name, digest in output.input_digests.items()},
        # MD5 of each tensor in every repeat: more than one distinct value means nondeterminism.
        "repeats": {name: [Digest.of(run.tensors[name], xxh3=False).md5 if name in run.tensors else None for run in runs]
                    for name in output.tensors} if len(runs) > 1 else {},
    }
    return _write_dump(Dump(meta, output.tensors), job, timings)


def _start(case: Case, adapter: FrameworkAdapter, mode: str | None, **names: str | None) -> dict:
    """The framework in the job's mode, and the dump's meta so far: `names` are its side, framework and impl."""
    adapter.set_mode(mode)
    warnings.filterwarnings("ignore", message=_WARNINGS)
    family = family_for(case.op, case.source)
    return {"xfalign": __version__, "case": case.to_json(), "case_name": case.name, "generator": GENERATOR,
            **names, "mode": mode, "axes": family.tensor_axes(case), "notes": family.tensor_notes(case)}


def _reference_job(job: ReferenceJob, adapter: FrameworkAdapter, timings: dict) -> Path:
    meta = _start(job.case, adapter, "eager", side=REFERENCE_SIDE, framework=job.framework, impl="float64 reference")
    arrays = read_inputs(Path(job.inputs))
    started = time.perf_counter()
    output = run_reference(job, arrays, adapter)
    timings["reference_s"] = time.perf_counter() - started
    # the inputs as given (before widening): the same digests as the sides', which compare checks
    meta |= {"provenance": output.provenance, "environment": output.environment, "repeats": {},
             "inputs": {name: Digest.of(array, xxh3=False).to_json() for name, array in arrays.items()}}
    return _write_dump(Dump(meta, output.tensors), job, timings)


class DumpWriteFailed(Exception):
    """The dump could not be written (unwritable folder, full disk): an output error, not a crash."""


def _write_dump(dump: Dump, job: CaseJob, timings: dict) -> Path:
    """The job's dump at job.dump; fsynced unless the job says it is a temporary one (`durable` False: a run
    without --dump, whose folder is removed when the run ends)."""
    started = time.perf_counter()
    try:
        with nullcontext() if job.durable else unsynced():
            return dump.write(job.dump)
    except (OSError, SafetensorError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise DumpWriteFailed(f"cannot write the dump {job.dump}: {reason}") from error
    finally:
        timings["dump_s"] = time.perf_counter() - started


class _Prepared:
    """Whether this process has set its profile's variables and may import its framework."""

    done = False
    framework: str | None = None


def _prepare(job: Job) -> dict:
    """First job of a long-lived worker: the profile's variables, then the framework import (timed)."""
    framework = job.framework
    adapter = adapter_for(framework)
    adapter.before_import(job.numerics, None)
    started = time.perf_counter()
    adapter.import_framework()
    _Prepared.done, _Prepared.framework = True, framework
    return {"import_s": time.perf_counter() - started}


class _CaseState:
    """What a case may change in this process, recorded before it and put back after it."""

    def __init__(self, job: CaseJob):
        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.filters = list(warnings.filters)
        self.python_random = random.getstate()
        self.numpy_random = _numpy_state()
        self.modules = set(sys.modules)
        self.path = list(sys.path)
        self.adapter = adapter_for(_Prepared.framework) if _Prepared.framework else None
        self.framework_state = self.adapter.save_state() if self.adapter else None
        # the case runs in the parent's folder, with the parent's variables, the profile's on top
        os.environ.clear()
        os.environ.update(job.env)
        kept = names_matching(self.adapter.worker_env, list(self.environ)) if self.adapter else []
        for name in kept:  # what the worker set before its import stays (cache dirs)
            os.environ.setdefault(name, self.environ[name])
        os.chdir(job.cwd)

    def restore(self) -> None:
        _end_case_processes()
        if self.adapter is not None:
            self.adapter.restore_state(self.framework_state)
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.environ)
        # typeshed declares `filters` a read-only Sequence; it is the module's list, replaced in place as
        # warnings.catch_warnings does
        cast("list[Any]", warnings.filters)[:] = self.filters
        warnings._filters_mutated()  # type: ignore[attr-defined]  # private, not in typeshed: invalidates the filters' caches
        random.setstate(self.python_random)
        _set_numpy_state(self.numpy_random)
        sys.path[:] = self.path
        for name in set(sys.modules) - self.modules:  # user code loaded for this case only
            if name.startswith("xfalign_user_"):
                del sys.modules[name]
        from harness import ops

        ops._file_module.cache_clear()
        ops._family.cache_clear()


def _end_case_processes() -> None:
    """SIGKILL and reap what the case started and left running: helpers, daemons that left this worker's
    session (re-parented here: the worker is their subreaper, harness.reaper). A framework's pool kept
    for the next cases stays."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # no child at all: nothing to walk /proc for
        return
    kept = adapter_for(_Prepared.framework).kept_processes() if _Prepared.framework else frozenset()
    reap(kill_descendants(os.getpid(), spare=kept))


def _numpy_state():
    import numpy as np

    return np.random.get_state()


def _set_numpy_state(state) -> None:
    import numpy as np

    np.random.set_state(state)


def _redirect(log: str | None, fallback: int) -> None:
    """Point fds 1 and 2 at the case's log (or back at the worker's own)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.dup2(fd, 1)
            os.dup2(fd, 2)
        finally:
            os.close(fd)
    else:
        os.dup2(fallback, 1)
        os.dup2(fallback, 2)


def serve_one(job: Job, send: Callable[[Result], None], own_log: int) -> None:
    """Run one job in this long-lived worker, send its result, and put the process back as it was. A side's
    job with a follow-up (`then`: the case's float64 reference, in the same worker) sends two results: the
    side's as soon as its dump is written, then the follow-up's, which runs on the process put back as it
    was before the side except for what the adapter holds for it (FrameworkAdapter.held_for_follow_up)."""
    timings: dict = {}
    started = time.perf_counter()
    follow = job.then if isinstance(job, SideJob) else None
    try:
        if not _Prepared.done:
            timings |= _prepare(job)
        if isinstance(job, Prepare):  # started ahead of its first case: the import only
            return send(Prepared(timings=timings | {"framework": _Prepared.framework}))
        state = _CaseState(job)
    except Exception as error:
        traceback.print_exc()
        send(Failed(error=f"{type(error).__name__}: {error}", timings=timings))
        return send(_not_run()) if follow else None
    if follow is None:
        result = _attempt(job, timings)
        _restore(state, timings)
        timings["total_s"] = time.perf_counter() - started
        return send(_timed(result, timings))
    with _held_groups():
        result = _attempt(job, timings)
        timings["total_s"] = time.perf_counter() - started
        send(_timed(result, timings))
        started, timings = time.perf_counter(), {}
        _restore(state, timings)  # the held group stays
        if not isinstance(result, Dumped):
            return send(_not_run())
        _redirect(follow.log, own_log)
        state = _CaseState(follow)
        result = _attempt(follow, timings)
    _restore(state, timings)
    timings["total_s"] = time.perf_counter() - started
    send(_timed(result, timings))


def _attempt(job: CaseJob, timings: dict) -> Dumped | Failed | OutputFailed:
    """run_job's result: its dump, or why it has none (its timings are added when it is sent)."""
    try:
        return Dumped(dump=str(run_job(job, timings)))
    except DumpWriteFailed as error:
        return OutputFailed(error=str(error))
    except Exception as error:
        traceback.print_exc()  # to the case's log, whose tail the parent shows
        return Failed(error=f"{type(error).__name__}: {error}")


def _timed(result: Result, timings: dict) -> Result:
    return result.model_copy(update={"timings": timings})


def _restore(state: _CaseState, timings: dict) -> None:
    started = time.perf_counter()
    state.restore()
    timings["reset_s"] = timings.get("reset_s", 0) + time.perf_counter() - started


def _not_run() -> Failed:
    return Failed(error="not run: the side it follows failed")


def _held_groups():
    """What the side sets up that its follow-up reuses (Megatron's one-process group), kept between them."""
    return adapter_for(_Prepared.framework).held_for_follow_up() if _Prepared.framework else nullcontext()


def serve(fd_in: int, fd_out: int) -> int:
    """The long-lived worker's loop: a job per line in, a result per line out (two for a job with a
    follow-up), until fd_in closes."""
    for fd in (fd_in, fd_out):
        os.set_inheritable(fd, False)  # helpers started by user code do not get the parent's channel
    own_log = os.dup(1)
    buffer = b""

    def send(result: Result) -> None:
        data = encode(result)
        while data:
            data = data[os.write(fd_out, data):]

    while True:
        while b"\n" not in buffer:
            chunk = os.read(fd_in, 1 << 16)
            if not chunk:
                return 0
            buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        try:
            job = decode_job(line)
        except ProtocolError as error:  # the channel is out of step: nothing further on it can be trusted
            print(f"xfalign worker: {error}", file=sys.stderr)
            return 2
        _redirect(job.log, own_log)
        try:
            serve_one(job, send, own_log)  # SystemExit / KeyboardInterrupt from user code end the worker
        finally:
            _redirect(None, own_log)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "--serve":
        print("usage: python -m harness.worker --serve IN OUT (started by harness.runner)", file=sys.stderr)
        return 2
    return serve(int(argv[1]), int(argv[2]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
