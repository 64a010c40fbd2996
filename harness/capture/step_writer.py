"""A captured step made into its dump (`step_dump`), and the process that can write the dumps (`WriterProcess`).

A capture hands each step to a writer. The writer thread waits for the step's digests, then either makes and
writes the dump itself, or hands the step (a `StepPayload`: records, digest entries, the few arrays kept) to a
writer process, which makes the meta, writes the step and the manifest, and answers. In the process, building
and writing a step never holds the training process's GIL. A step of digests alone skips the thread: the training's
thread sends its payload as the step ends and its digests' values once the device has them (the capture checks
at each step's end, and waits for them only to keep at most WRITES_AHEAD steps unwritten), and reads the answers
that are there; a thread woken per step took the training's GIL between its kernel launches (harness.capture.api).

The process is a fresh interpreter (`python -P -m harness.capture.step_writer`), not a fork of the training (CUDA,
threads) nor a spawn that would re-run the training script. It reads pickled messages on its stdin: ("open",
folder, manifest, staging, context) once per capture, then ("step", payload) (a payload listing `digests` is
written once ("values", its index, rows or None: the step dropped) comes), ("list",) (the manifest rewritten) and
("close",) (the steps made durable). It answers each step, list and close in order on its stdout, in framed pickles
(`read_answer`): None or the failure; once a step fails, the capture's later steps are answered None, not written.
Then it waits for the training process's next capture. It ends at the end of its stdin (the training's process
gone). The folder stays claimed (flocked) by the training's process.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn, cast

import numpy as np

from harness.store.dump import Dump
from harness.store.fast_hash import PendingDigest
from harness.store.stats import tensor_stats
from harness.store.tree import TreeWriter
from harness.store.tree_format import CaptureInfo, CaptureManifest, Record


@dataclass(frozen=True)
class StepContext:
    """What every step's meta says alike: set when the capture is entered."""

    side: str
    framework: str
    root: str
    mode: str
    rank: int | None
    world_size: int | None
    modules: list[dict]  # ModuleInfo, as JSON data
    provenance: str | None
    environment: dict
    # the capture section (CaptureInfo as JSON data, but its step) per distinct record structure: a training's steps
    # repeat one, and validating ~100 records per step cost ~1 ms on the writer's thread (CI machine)
    sections: dict[tuple, dict] = field(default_factory=dict, compare=False, repr=False)


@dataclass
class StepPayload:
    """One step, its digests settled: what its dump is made of."""

    index: int
    records: list[tuple[str, int | None, str, list[str]]]
    order: list[str]  # every tensor, in record order
    tensors: dict[str, np.ndarray]  # kept in full
    stats: dict[str, dict]  # of the tensors kept in full
    unstored: dict[str, dict | int]  # digest-only tensors' entries; an int: its row of the values (`settle`)
    norms: dict[str, list[str]]  # a grad norm to compute: its name -> the gradients it is over
    note: str | None  # notes.capture: what was not recorded
    digests: list[tuple[str, tuple[int, ...], int]] = field(default_factory=list)  # per row: dtype, shape, bytes

    def settle(self, values: np.ndarray) -> None:
        """The entries of the digests whose values came apart (rows of fast_hash.SLOTS, in `digests` order)."""
        for name, entry in self.unstored.items():
            if type(entry) is int:
                work = PendingDigest(*self.digests[entry], None)
                work.settle(values[entry])
                self.unstored[name] = work.result()


def step_dump(context: StepContext, payload: StepPayload) -> Dump:
    """The step's dump: its meta, and its grad norms computed (float64 sqrt of the sum of the gradients' squared
    L2 norms, from their statistics)."""
    assert not any(type(entry) is int for entry in payload.unstored.values()), "StepPayload.settle has not run"
    tensors, stats, unstored = dict(payload.tensors), dict(payload.stats), cast(dict[str, dict], dict(payload.unstored))
    for name, over in payload.norms.items():
        found = [stats[g] if g in stats else unstored[g]["stats"] for g in over]
        norms = [entry["norm"] for entry in found if entry["norm"] is not None]
        tensors[name] = np.asarray(np.sqrt(np.sum(np.square(norms, dtype=np.float64))), dtype=np.float64)
        stats[name] = tensor_stats(tensors[name])
    meta = {"case": {}, "case_name": "capture", "side": context.side, "framework": context.framework,
            "impl": context.root, "provenance": context.provenance, "environment": context.environment, "inputs": {},
            "capture": _capture_section(context, payload)}
    if payload.note is not None:
        meta["notes"] = {"capture": payload.note}
    return Dump(meta, tensors, unstored=unstored, stats=stats, order=payload.order)


def _capture_section(context: StepContext, payload: StepPayload) -> dict:
    """The meta's `capture` section, validated (CaptureInfo) once per distinct record structure."""
    key = tuple((module, call, phase, tuple(names)) for module, call, phase, names in payload.records)
    section = context.sections.get(key)
    if section is None:
        info = CaptureInfo.model_validate({
            "step": 0, "mode": context.mode, "rank": context.rank, "world_size": context.world_size,
            "root": context.root, "modules": context.modules,
            "records": [Record.model_validate({"module": m, "call": c, "phase": p, "tensors": n})
                        for m, c, p, n in payload.records]})
        if len(context.sections) >= 16:  # structures that keep changing: keep a few
            context.sections.clear()
        section = context.sections[key] = info.model_dump(mode="json")
    return dict(section, step=payload.index)  # its lists shared between steps' metas: read, never changed


class WriterProcessError(RuntimeError):
    """The writer process failed other than by an OSError (which is raised as one), or ended: the capture
    raises it as a CaptureWriteError naming the step."""


def _send(stream: IO[bytes], message: Any) -> None:
    pickle.dump(message, stream, protocol=pickle.HIGHEST_PROTOCOL)
    stream.flush()


_FRAME = struct.Struct("<Q")  # an answer's length, before it: read whole from the pipe's descriptor, no buffer


def _answer(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_FRAME.pack(len(data)) + data)
    stream.flush()


def _read_exactly(fd: int, count: int) -> bytes:
    parts = []
    while count:
        part = os.read(fd, count)
        if not part:
            raise EOFError
        parts.append(part)
        count -= len(part)
    return b"".join(parts)


def read_answer(fd: int) -> Any:
    """The next answer on the descriptor `fd` (EOFError at its end)."""
    (count,) = _FRAME.unpack(_read_exactly(fd, _FRAME.size))
    return pickle.loads(_read_exactly(fd, count))


# Processes whose capture ended well, kept for this process's next capture: a process starts in 1-4 s (its imports:
# ml_dtypes alone took 1.0-1.5 s on this project's CI machine), which a capture of a few steps would wait for at its end
_IDLE: list[WriterProcess] = []
_IDLE_LOCK = threading.Lock()


class WriterProcess:
    """The training's end of a writer process. `take` gives an idle one or starts one (without waiting for its
    imports); `write`, `list_steps` and `close` wait for its answer: OSError (rebuilt from its errno and words) or
    WriterProcessError on failure. Called by one thread at a time."""

    @classmethod
    def take(cls) -> WriterProcess:
        with _IDLE_LOCK:
            while _IDLE:
                idle = _IDLE.pop()
                if idle._process.poll() is None:
                    return idle
        return cls()

    def __init__(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])  # where `harness` is, however it was imported
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
        # -P: not the working directory first on its path (`-m` puts it there), which may hold another `harness`
        self._process = subprocess.Popen([sys.executable, "-P", "-m", "harness.capture.step_writer"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def open(self, tree: TreeWriter, context: StepContext) -> None:
        """Hand it the tree, opened (claimed) by this process, and what every step's meta says."""
        self.send(("open", tree.folder, tree.manifest.model_dump(mode="json"), tree.staging, context))

    def write(self, payload: StepPayload, values: Callable[[], np.ndarray] | None = None) -> None:
        """Write a step; with `values` (the payload lists `digests`), send the payload, then what values() gives
        (it may wait for the device), then wait for the answer."""
        self.send(("step", payload))
        if values is not None:
            try:
                found = values()
            except BaseException:
                self.send(("values", payload.index, None))  # the process drops the step
                self.answer()
                raise
            self.send(("values", payload.index, found))
        self.answer()

    def list_steps(self) -> None:
        """The manifest made to list every step written (TreeWriter.list_steps)."""
        self.send(("list",))
        self.answer()

    def close(self) -> None:
        """The steps made durable; the process kept for this process's next capture, or ended if it failed (a
        process that ended already: its failure)."""
        try:
            self.send(("close",))
            self.answer()
        except BaseException:
            self.end()
            raise
        with _IDLE_LOCK:
            _IDLE.append(self)

    def end(self) -> None:
        """Close its stdin (it ends there) and wait for it."""
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                stream.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a write stuck in the kernel
            self._process.kill()
            self._process.wait()

    def send(self, message: tuple) -> None:
        """Send a message, not waiting for its answer (`answer`)."""
        assert self._process.stdin is not None
        try:
            _send(self._process.stdin, message)
        except BrokenPipeError:
            self._ended()

    def answered(self) -> bool:
        """Whether an answer is there to read (`answer` would not wait)."""
        assert self._process.stdout is not None
        return bool(select.select([self._process.stdout.fileno()], [], [], 0)[0])

    def answer(self) -> None:
        """Wait for the next answer; raise the failure it tells."""
        assert self._process.stdout is not None
        try:
            failure = read_answer(self._process.stdout.fileno())
        except (EOFError, pickle.UnpicklingError):
            self._ended()
        if failure is None:
            return
        kind, words = failure
        if kind == "os":
            raise OSError(*words)
        raise WriterProcessError(f"the writer process failed: {words}")

    def _ended(self) -> NoReturn:
        code = self._process.wait()
        raise WriterProcessError(f"the writer process ended (exit code {code}; its error output is above)") from None


@atexit.register
def _end_idle() -> None:
    with _IDLE_LOCK:
        idle, _IDLE[:] = list(_IDLE), []
    for process in idle:
        process.end()


def _failure(error: BaseException) -> tuple[str, Any]:
    if isinstance(error, OSError) and error.errno is not None:
        return "os", (error.errno, error.strerror, *([str(error.filename)] if error.filename else []))
    return "other", f"{type(error).__name__}: {error}"


def serve(inbox: IO[bytes], outbox: IO[bytes]) -> None:
    """The writer process's loop (see the module's note)."""
    tree: TreeWriter | None = None
    context: StepContext | None = None
    broken: tuple | None = None  # an open that failed: every later call is answered with it
    stopped = False  # a step's write failed: the capture's later steps are answered None, not written
    waiting: list[StepPayload] = []  # steps not written yet, in order: the first waits for its digests' values
    # each step written is made durable by a thread of its own meanwhile, not all at the capture's end
    syncer = ThreadPoolExecutor(1, thread_name_prefix="xfalign-sync")
    syncing: list[Future] = []

    def write_waiting() -> None:
        """Write the steps at the head of `waiting` whose values are there, answering each."""
        nonlocal stopped, syncing
        while waiting and not waiting[0].digests:
            payload = waiting.pop(0)
            if stopped or payload.index < 0:  # a failed step's capture, or a step dropped (its values not fetched)
                _answer(outbox, None)
                continue
            try:
                assert tree is not None and context is not None
                # the meta is made of validated parts: the schema check on writing is skipped (Dump.read checks it)
                written = tree.write_step(payload.index, step_dump(context, payload), validate=False)
            except Exception as error:  # noqa: BLE001 - answered to the training's process, which raises it
                stopped = True
                _answer(outbox, _failure(error))
                continue
            _answer(outbox, None)
            # those done keep only their failure, for the close: a long capture holds no future per step
            syncing = [sync for sync in syncing if not sync.done() or sync.exception() is not None]
            syncing.append(syncer.submit(tree.sync_step, written.name))

    while True:
        try:
            kind, *rest = pickle.load(inbox)
        except EOFError:  # the training's process is gone
            return
        try:
            if kind == "open":
                folder, manifest, staging, context = rest
                tree = TreeWriter.adopt(folder, CaptureManifest.model_validate(manifest), staging)
                stopped, waiting = False, []
                continue
            if broken is not None:
                if kind != "values":  # a step's values come with its step, answered already
                    _answer(outbox, broken)
                if kind == "close":
                    return
            elif kind == "step":
                waiting.append(rest[0])
                write_waiting()
            elif kind == "values":
                index, values = rest
                payload = next((step for step in waiting if step.index == index), None)
                if payload is None:  # not waiting for them: the training's process sends each step's once
                    continue
                if values is None:
                    payload.index = -1
                else:
                    payload.settle(values)
                payload.digests = []
                write_waiting()
            elif kind == "list":
                assert tree is not None
                tree.list_steps()
                _answer(outbox, None)
            elif kind == "close":  # the capture's end: this process waits for the next capture
                done, syncing = syncing, []
                for sync in done:  # an fsync that failed fails the close, as finish's own would
                    sync.result()
                if tree is not None:
                    tree.finish()
                tree = context = None
                waiting = []  # steps whose values never came: the training's process has answered for them
                _answer(outbox, None)
        except Exception as error:  # noqa: BLE001 - answered to the training's process, which raises it
            if kind == "open":
                broken = _failure(error)
            else:
                _answer(outbox, _failure(error))


if __name__ == "__main__":
    # Ctrl-C in a terminal reaches the whole process group: the training's process decides what to do, and its
    # capture's end still needs this process to finish the steps
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _inbox, _outbox = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not corrupt the answers
    serve(_inbox, _outbox)
