"""`capture(model, path, ...)`: hooks on a model's modules that record, per training step, every selected
module's inputs, outputs, output gradients, parameters (as the step's forward pass read them) and parameter gradients
(when `step()` is called), and write each step as an xfalign dump (the tree in harness.store.tree_format).

    with capture(model, "dumps/side-a", mode="digest") as cap:
        for batch in batches:
            loss = model(batch).sum(); loss.backward()
            cap.step()                      # before the gradients are zeroed
            optimizer.step(); optimizer.zero_grad()

Forward records are in the order calls return (a module's after those of the modules it calls), so the
first divergent output in record order is the earliest computed one; backward records in the order the
gradients arrive. The framework is found by the adapters (harness.frameworks), which own the hook code.
Tensors are copied to the host in the hooks and hashed (digest modes) on a thread pool while the step
goes on. With hash="fast" (digest modes) a tensor is not copied: the adapter computes its fast64
(harness.store.fast_hash) and statistics where it lives (on the GPU for a CUDA tensor), and `step()`
starts moving those few scalars of every tensor to the host at once; no MD5 is recorded for such a tensor
(tensors kept in full still get one). `step()` hands the step to a writer thread, which waits for that work
and writes the step's dump while training goes on, the steps in order: a later `step()` waits for it once
WRITES_AHEAD steps are not written yet (once one is, for steps holding tensors in full, MD5 digests or a live
check's copies), and so do `flush()` and the end of the `with` block, which raise a write's error
(CaptureWriteError, naming the step and the folder); no step handed over after a failed one is written. With
writer="process" a writer process (harness.capture.step_writer) makes and writes the dump: the writer thread hands
it the step, or, for a step of fast digests alone, the training's thread itself, at the step's end (a thread woken
per step took the GIL between the training's kernel launches), the digests' values at a later step's end, once
the device has them.

The path is made absolute when the capture is made (training code may change its working directory). The
tree is written by harness.store.tree.TreeWriter: an earlier tree of the same side at the path is kept until
the new capture's first step is complete (the new tree is written in a staging folder beside it and swapped
in then), and a folder is written by one capture at a time (in this process, and across processes through
an flock on the folder). A capture object is entered once at a time. Tensors of a dtype or layout no dump
holds (fp8, sparse, ...) are left out, listed in the step's meta (notes.capture): a capture never breaks the
training step.
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
import sys
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import yaml
from safetensors import SafetensorError

from harness import __version__, fingerprint
from harness.capture.live import ON_DIVERGENCE, LiveReference
from harness.capture.step_writer import StepContext, StepPayload, WriterProcess, WriterProcessError, step_dump
from harness.dtypes import NUMPY_DTYPES
from harness.errors import OutputError, XfalignError
from harness.frameworks import FrameworkAdapter, adapter_for, known_frameworks
from harness.schema import MAX_NAME_CHARS, NAME_RULE, is_safe_name
from harness.store.digest import digest_entry, digests_of
from harness.store.dump import Dump
from harness.store.fast_hash import HASHES, PendingDigest, fast_entry
from harness.store.stats import tensor_stats
from harness.store.tree import TreeBusyError, TreeWriter
from harness.store.tree_format import (
    CAPTURE_FORMAT,
    MODES,
    ROOT,
    STATE_ROLES,
    TRAIN,
    CaptureManifest,
    Divergence,
    ModuleInfo,
    call_tensor,
    param_tensor,
    rank_folder,
    step_folder,
    train_tensor,
)

WRITERS = ("thread", "process")  # where a step's dump is made and written: harness.capture.step_writer
# arrays kept in full of at most this many elements get their statistics at once, on the hook's thread: ~7 us for a
# scalar (a step's loss, learning rates, grad norms), against a pool thread woken to take the interpreter's lock
INLINE_STATS = 1024
# Steps handed to the writer and not written yet before step() waits for the oldest: digest-only steps are small, and
# a step that waited for the one before it to be written waited for the writer to get the interpreter's lock between
# the training's hooks (H200, the 1.2 ms MLP: a third of its captured step, py-spy, 2026-12-04); steps holding full
# tensors are written one at a time (their arrays stay in memory until written). Below torch's PINNED_BLOCKS.
WRITES_AHEAD = 3


# While a capture of a GPU model is entered, the interpreter's switch interval (Python's default: 5 ms) is at most
# this: the training thread, whose hooks launch the digests while the device waits for them, then waits less for
# its turn under the interpreter's lock when the writer thread holds it (H200, a TransformerLayer: 29.1-29.5 ms per
# captured step against 30.1-30.6 ms, the last 4 steps of one run each, 2026-12-02). Restored when the last such capture ends.
SWITCH_INTERVAL = 0.0005


class _SwitchInterval:
    """The interpreter's switch interval lowered to SWITCH_INTERVAL while any GPU capture is entered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._before = 0.0

    def lower(self) -> None:
        with self._lock:
            if not self._users:
                self._before = sys.getswitchinterval()
                sys.setswitchinterval(min(SWITCH_INTERVAL, self._before))
            self._users += 1

    def restore(self) -> None:
        with self._lock:
            self._users -= 1
            if not self._users:
                sys.setswitchinterval(self._before)


_SWITCHING = _SwitchInterval()


class _Done:
    """Work done at once: as a finished Future (`result()`), without a Future's lock and condition."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def result(self) -> Any:
        return self.value


class _SentStep:
    """A step of fast digests alone sent to the writer process by the training's thread: its digests' values follow
    (`rows`, None once sent: Capture._send_values), then the process's answer, read in order (`result`)."""

    __slots__ = ("capture", "index", "pending", "rows")

    def __init__(self, capture: Capture, index: int, pending: list[PendingDigest], rows: Any):
        self.capture, self.index, self.pending, self.rows = capture, index, pending, rows

    def ready(self) -> bool:
        """Whether its values can be sent without waiting for the device."""
        ready = getattr(self.rows, "ready", None)
        return ready is None or ready()

    def result(self) -> None:
        self.capture._settle_sent(self)


class CaptureError(XfalignError):
    """A capture that cannot start: a model no framework adapter knows, a bad mode, side name, selection or
    refetch list, a capture entered twice, a folder another capture is writing."""


class CaptureDiverged(CaptureError):
    """A capture checked against a reference (on_divergence="stop") whose step differed from it: raised once
    that step is written (in full), from the end of the step (the optimizer's step, or `step()`)."""


class CaptureWriteError(OutputError, OSError):
    """A step or the manifest that cannot be written (a full disk, no permission): names the step and the
    folder. An OSError too, as the write's own error was before. Its __cause__ is the write's own error."""


def adapter_of(model: Any) -> FrameworkAdapter:
    """The framework adapter whose framework `model` is a module of."""
    for name in known_frameworks():
        adapter = adapter_for(name)
        if adapter.owns_model(model):
            return adapter
    raise CaptureError(f"capture: a {type(model).__module__}.{type(model).__name__} is not a module of any known "
                       f"framework ({', '.join(known_frameworks())})")


def load_refetch(refetch: str | Path | Sequence[str] | None, side: str) -> list[str]:
    """The module globs whose tensors a "digests-then-full" capture keeps in full: a list, or a YAML file
    holding a list or a mapping side name -> list (what `xfalign compare --refetch` writes)."""
    if refetch is None:
        return []
    if not isinstance(refetch, (str, Path)):
        globs, where = list(refetch), "refetch"
    else:
        where = str(refetch)
        try:
            globs = yaml.safe_load(Path(refetch).read_text(encoding="utf-8"))
        except OSError as error:
            raise CaptureError(f"{where}: cannot read the refetch list: {error.strerror or error}") from None
        except yaml.YAMLError as error:
            raise CaptureError(f"{where}: not valid YAML: {str(error).splitlines()[0]}") from None
        if isinstance(globs, dict):
            if side not in globs:
                raise CaptureError(f"{where}: lists modules of the sides {', '.join(map(str, globs))}, not of {side!r}")
            where, globs = f"{where}: {side}", globs[side] or []
    if not isinstance(globs, list) or not all(isinstance(glob, str) for glob in globs):
        raise CaptureError(f"{where}: expected a list of module globs (or a mapping side -> list)")
    return globs


def _side_name(side: Any) -> str:
    """The side name, checked: it names the tree's dumps and is printed in reports."""
    if not is_safe_name(side):
        shown = repr(side[:80]) if isinstance(side, str) else repr(side)[:80]
        raise CaptureError(f"capture: side={shown} is not a safe side name: {NAME_RULE}, at most {MAX_NAME_CHARS} "
                           f"characters (e.g. side='paddle-bf16')")
    return side


def _listed(value: Any, parameter: str, kinds: tuple[type, ...], what: str) -> list:
    """A selection parameter as a list: None is none, one item (a text, a class) is one, else its items,
    each of `kinds`."""
    if value is None:
        return []
    if isinstance(value, kinds):
        return [value]
    try:
        items = list(value)
    except TypeError:
        raise CaptureError(f"capture: {parameter}={repr(value)[:80]} is not {what}, nor a list of them") from None
    for item in items:
        if not isinstance(item, kinds):
            raise CaptureError(f"capture: {parameter}: {repr(item)[:80]} is not {what}")
    return items


def _unsupported(adapter: FrameworkAdapter, tensor: Any) -> str | None:
    """What about `tensor` no dump holds (its layout, else its dtype), None when it can be recorded. Checked
    before the tensor is read: Paddle's .numpy() of a sparse tensor crashes the process, and of an fp8 one
    gives int8 values."""
    layout = adapter.unsupported_layout(tensor)
    if layout is not None:
        return layout
    dtype = getattr(tensor, "dtype", None)
    if dtype is None:
        return type(tensor).__name__
    try:
        return _UNSUPPORTED_DTYPES[dtype]
    except (KeyError, TypeError):  # a dtype not seen yet (each is named once: this runs per tensor per step)
        name = str(dtype).rpartition(".")[2]  # torch.float32, paddle.float32
        found = None if name in NUMPY_DTYPES else name
        try:
            _UNSUPPORTED_DTYPES[dtype] = found
        except TypeError:  # not hashable
            pass
        return found


_UNSUPPORTED_DTYPES: dict[Any, str | None] = {}  # a framework's dtype object -> what _unsupported says of it


@contextmanager
def _writing(what: str, after: str = "") -> Iterator[None]:
    """A write that fails (a full disk, no permission) as a CaptureWriteError naming `what`, with the operating
    system's words (safetensors wraps them in its own), then `after`."""
    try:
        yield
    except XfalignError:  # a refusal, or a write error named already
        raise
    except (OSError, SafetensorError, WriterProcessError) as error:
        words = error.strerror if isinstance(error, OSError) else None
        found = re.search(r"I/O error: (.+?) \(os error \d+\)", str(error))
        reason = words or (found[1] if found else str(error))
        raise CaptureWriteError(f"capture: cannot write {what}: {reason}{after}") from error


@dataclass
class _Batch:
    """Tensors digested together by `Capture._digest_batch` (FrameworkAdapter.device_digests: on a GPU one launch
    per dtype for the small ones, on the CPU one compiled call): a step's parameters, gradients and optimizer
    states, and the hooks' tensors deferred to the end of the step (DEFER_BYTES).
    Per tensor its name and its version when submitted; the names recorded again as one of them (a module's output
    is its parent's), and the bytes held."""

    tensors: list[tuple[str, Any]] = field(default_factory=list)
    versions: list[Any] = field(default_factory=list)  # FrameworkAdapter.tensor_version's
    aliases: list[tuple[str, str]] = field(default_factory=list)  # (name, the name of the tensor it is)
    names: set[str] = field(default_factory=set)
    nbytes: int = 0


_BATCHED: tuple = (None, None)  # a step's result while its batch is being made: filled by `_digest_batch`
_UNREAD = object()  # `_submit`'s version not read by its caller (None is a version: the framework counts none)

# The hooks' fast digests (module inputs, outputs and their gradients) are left to a batch digested as the step ends
# (with the parameters' and the gradients'), instead of one launch (or compiled call) and one handle each at the hook,
# unless the tensors held for it reach this many bytes first: a short step's host time per tensor is what its
# overhead is. The first step digests them at their hooks and learns which ones change
# in place before the batch would be digested (their version: torch's `_version`, Paddle's `inplace_version`;
# megatron-core's cross entropy changes the logits in place): those are digested at their hooks in every step. A
# tensor that changes so only in a later step is recorded as it is then, and the step's notes say so. A write its
# framework does not count (a kernel through a raw pointer) is not seen: XFALIGN_DEFER_BYTES=0 digests every tensor
# at its hook. Adapters without a version counter never defer.
DEFER_BYTES = int(os.environ.get("XFALIGN_DEFER_BYTES", 256 << 20))


def _nbytes(tensor: Any) -> int:
    return math.prod(tensor.shape) * tensor.element_size()


def _module_name(path: str) -> str:
    return path or ROOT


def _owner(path: str, selected: set[str]) -> str | None:
    """The nearest selected module at or above the dotted `path` ("" is the model)."""
    while True:
        if path in selected:
            return path
        if not path:
            return None
        path = path.rpartition(".")[0]


@dataclass
class _Step:
    """What one step has recorded so far."""

    records: list[tuple[str, int | None, str, list[str]]] = field(default_factory=list)
    # name -> (stored array, its work: a Future, or a PendingDigest started on the tensor's device)
    results: dict[str, tuple[np.ndarray | None, Future | _Done | PendingDigest]] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)  # module -> calls begun
    open_calls: dict[str, list[tuple[int, list[str]]]] = field(default_factory=dict)  # module -> (call, inputs)
    backward: dict[tuple[str, int], list[str]] = field(default_factory=dict)  # its record's tensor list
    grad_hooks: list = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # tensors of dtypes no dump holds: "name (dtype)"
    seen: dict[int, tuple] = field(default_factory=dict)  # id(tensor) -> (weak reference, version, full, name)
    started: bool = False  # the parameters' records made (by the first hook of the step)
    # per module: (path, its params record's names, its (name, parameter, version as the step began)), not yet recorded
    params_due: list[tuple[str, list[str], list[tuple[str, Any, Any]]]] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # parameters changed in place before `_record_params`
    deferred: _Batch = field(default_factory=_Batch)  # the hooks' tensors waiting for `_digest_batch`
    changed_later: list[str] = field(default_factory=list)  # deferred tensors changed in place after their hook
    # the first step's hook tensors, digested at their hooks: (name, tensor, version), checked where a batch would be
    watched: list[tuple[str, Any, Any]] = field(default_factory=list)
    depth: int = 0  # captured modules' calls under way
    grads_recorded: bool = False  # the parameters' gradients recorded (by step(), or by the optimizer's step)
    loss: list[str] = field(default_factory=list)  # the (train) loss record's tensors: placed before the backward
    # a grad norm xfalign computes when the step is written: its name -> the names of the gradients it is over
    norms: dict[str, list[str]] = field(default_factory=dict)
    held: dict[str, np.ndarray] = field(default_factory=dict)  # digest-only tensors' host copies, for a live check


class Capture:
    """The context manager `capture()` returns; see the module's note."""

    def __init__(self, model: Any, path: str | Path, mode: str = "full", modules: Iterable[str] | None = ("*",),
                 types: Iterable[str | type] | None = None, side: str | None = None,
                 refetch: str | Path | Sequence[str] | None = None, provenance: str | None = None,
                 threads: int | None = None, hash: str = "md5", optimizer: Any = None, reference: Any = None,
                 map: Any = None, on_divergence: str = "continue", writer: str | None = None):
        if mode not in MODES:
            raise CaptureError(f"capture: unknown mode {mode!r}; expected one of {', '.join(MODES)}")
        if hash not in HASHES:
            raise CaptureError(f"capture: unknown hash {hash!r}; expected one of {', '.join(HASHES)}")
        self.hash = hash
        self.model, self.path, self.mode = model, Path(path).absolute(), mode
        self.adapter = adapter_of(model)
        self.side = self.adapter.name if side is None else _side_name(side)
        self.module_globs: list[str] = _listed(modules, "modules", (str,),
                                               "a module glob (text such as 'decoder.layers.*.mlp' or '(root)')")
        self.types: list[str | type] = _listed(types, "types", (str, type), "a class or a class name (such as 'Linear')")
        self.refetch = load_refetch(refetch, self.side) if mode == "digests-then-full" else []
        if refetch is not None and mode != "digests-then-full":
            raise CaptureError(f"capture: refetch needs mode 'digests-then-full', not {mode!r}")
        self.provenance = provenance
        self.probe = None if optimizer is None else self.adapter.optimizer_probe(optimizer)
        if optimizer is not None and self.probe is None:
            raise CaptureError(f"capture: optimizer= is a {type(optimizer).__module__}.{type(optimizer).__name__}, not an "
                               f"optimizer of {self.adapter.name} this capture can read (the model is a {self.adapter.name} module)")
        if on_divergence not in ON_DIVERGENCE:
            raise CaptureError(f"capture: on_divergence={on_divergence!r}; expected one of {', '.join(ON_DIVERGENCE)}")
        if map is not None and reference is None:
            raise CaptureError("capture: map= names how this capture's tensors pair with a reference's: give reference= too")
        self.live = None if reference is None else LiveReference(reference, map)
        if writer is not None and writer not in WRITERS:
            raise CaptureError(f"capture: unknown writer {writer!r}; expected one of {', '.join(WRITERS)}")
        if writer == "process" and self.live is not None:
            raise CaptureError("capture: writer='process' cannot check a reference while it runs (reference=): "
                               "leave writer= out")
        self.writer = writer  # None: chosen once the model's device is known (__enter__)
        self.on_divergence = on_divergence
        self.diverged: Divergence | None = None
        self.threads = threads if threads is not None else min(4, os.cpu_count() or 1)
        self.rank: int | None = None
        self.world_size: int | None = None
        self._lock = threading.Lock()
        self._removers: list = []
        self._pool: ThreadPoolExecutor | None = None
        self._writer: ThreadPoolExecutor | None = None
        self._process: WriterProcess | None = None  # writer="process": makes and writes the dumps
        self._writing: deque[Future | _SentStep] = deque()  # the writes of the steps handed over, not waited for yet
        self._direct = False  # steps are sent to the writer process by the training's thread (_SentStep)
        self._write_failed: int | None = None  # the step whose write failed: no step handed over after it is written
        self._steps = 0  # steps handed to the writer
        self._step = _Step()
        self.folder = self.path  # where this process's tree goes: a rank's folder in it, with several ranks
        self._tree: TreeWriter | None = None  # writes the folder while the capture is entered
        self._switched = False  # the switch interval lowered (a GPU model) until the capture ends
        self._warned_skipped = False  # tensors left out are warned about once per capture (each step's meta lists them)
        self._eager: set[str] = set()  # hooks' tensors changed after their hook once: digested at the hook (DEFER_BYTES)

    # -- setup ------------------------------------------------------------------------------------------

    def _select(self) -> None:
        all_modules = self.adapter.named_modules(self.model)
        names, classes = [t for t in self.types if isinstance(t, str)], tuple(t for t in self.types if isinstance(t, type))

        def chosen(path: str, module: Any) -> bool:
            if any(fnmatch.fnmatchcase(_module_name(path), glob) for glob in self.module_globs):
                return True
            return isinstance(module, classes) or any(c.__name__ in names for c in type(module).__mro__)

        self.modules = {path: module for path, module in all_modules if chosen(path, module)}
        if not self.modules:
            raise CaptureError(f"capture: no module of the {type(self.model).__name__} matches modules="
                               f"{self.module_globs} types={[getattr(t, '__name__', t) for t in self.types]}")
        selected = set(self.modules)
        parents = {path: _owner(path.rpartition(".")[0], selected) if path else None for path in self.modules}
        self.infos = [ModuleInfo(name=_module_name(path), type=type(module).__name__,
                                 parent=None if parents[path] is None else _module_name(parents[path] or ""))
                      for path, module in self.modules.items()]
        # every parameter belongs to the nearest selected module above it (named relative to it)
        self.params: dict[str, list[tuple[str, Any]]] = {}
        seen: set[int] = set()
        for path, module in all_modules:
            owner = _owner(path, selected)
            for name, param in self.adapter.own_parameters(module):
                if owner is None or id(param) in seen:
                    continue
                seen.add(id(param))
                relative = path[len(owner):].lstrip(".")
                self.params.setdefault(owner, []).append((f"{relative}.{name}" if relative else name, param))
        self.full = {path: self.mode == "full" or any(fnmatch.fnmatchcase(_module_name(path), glob) for glob in self.refetch)
                     for path in self.modules}
        # steps of fast digests alone (no tensor kept in full, no host copy held) may be written behind (WRITES_AHEAD)
        self._digests_only = self.hash == "fast" and self.live is None and not any(self.full.values())
        self.full[TRAIN] = True  # a step's scalars are a few bytes: kept, so reports can print them

    def _manifest(self) -> CaptureManifest:
        """The tree's manifest (its steps: the TreeWriter's)."""
        return CaptureManifest.model_validate({
            "format": CAPTURE_FORMAT, "xfalign": __version__, "side": self.side, "framework": self.adapter.name,
            "mode": self.mode, "rank": self.rank, "world_size": self.world_size, "root": self.root, "steps": [],
            "optimizer": None if self.probe is None else self.probe.kind,
            "reference": None if self.live is None else self.live.path})

    def _environment(self, device: str) -> dict:
        from harness.numerics import NumericsProfile

        profile = NumericsProfile(name="unpinned", description="the training script's own process")
        return fingerprint.assemble(self.adapter, device, profile)

    def __enter__(self) -> Capture:
        if self._tree is not None:
            raise CaptureError(f"capture {self.folder}: this capture is active already (its `with` block has not "
                               "ended); enter a capture once at a time")
        self.rank, self.world_size = self.adapter.distributed() or (None, None)
        many = self.world_size is not None and self.world_size > 1
        self.folder = self.path / rank_folder(self.rank or 0) if many else self.path
        self.root = type(self.model).__name__
        self._select()
        self._steps = 0
        self._write_failed = None
        try:
            self._tree = TreeWriter(self.folder, self._manifest())
            with _writing(f"to {self.folder}"):
                try:
                    self._tree.open()
                except TreeBusyError as busy:
                    raise CaptureError(str(busy)) from None
            device = self.adapter.model_device(self.model)
            if device == "cuda":
                _SWITCHING.lower()
                self._switched = True
            if self.writer is None:
                # a GPU model's step leaves the CPU free, and a writer thread's Python would take the training's
                # GIL (on the H200 the process cut a MoE layer's overhead from 1.41-1.49x to 1.24-1.33x); on the
                # CPU the process only takes a core from the training (capture-guide.md, "The writer")
                self.writer = "process" if device == "cuda" and self.live is None else "thread"
            self.provenance = self.provenance or self._provenance()
            self.context = StepContext(
                side=self.side, framework=self.adapter.name, root=self.root, mode=self.mode, rank=self.rank,
                world_size=self.world_size, modules=[info.model_dump(mode="json") for info in self.infos],
                provenance=self.provenance, environment=self._environment(device))
            self._tensor = self.adapter.tensor_type()
            self._pool = ThreadPoolExecutor(max(1, self.threads), thread_name_prefix="xfalign-capture")
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="xfalign-capture-writer")
            if self.writer == "process":
                self._process = WriterProcess.take()
                self._process.open(self._tree, self.context)
            self._direct = self._process is not None and self._digests_only
            for path, module in self.modules.items():
                self._removers += self.adapter.hook_module(
                    module, lambda m, args, kwargs, path=path: self._before(path, args, kwargs),
                    lambda m, args, kwargs, out, path=path: self._after(path, out))
            if self.probe is not None:
                self._removers += self.probe.hook(self._optimizer_begins, self._optimizer_ends)
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, kind, error, trace) -> None:
        try:
            if kind is None and (self._step.started or self._step.records):
                self.step()
        finally:
            failed = self._close()
        if failed is not None:
            if error is None:
                raise failed
            cause = failed.__cause__ if isinstance(failed, CaptureWriteError) and failed.__cause__ else failed
            step = self._steps - 1 if self._write_failed is None else self._write_failed
            error.add_note(f"xfalign capture: writing step {step} also failed: {cause}")

    def _close(self) -> BaseException | None:
        """Remove every hook, drop the work of an unfinished step, wait for the last step's write and close the
        tree (TreeWriter.close: the steps written made durable, the folder let go); the write's error, if one
        failed."""
        for remove in self._removers + self._step.grad_hooks:
            remove()
        self._removers, self._step = [], _Step()
        failed = None
        while self._writing:  # every write waited for (those after a failed one return at once); the first error kept
            try:
                self._wait_written()
            except BaseException as error:  # noqa: BLE001 - handed to __exit__, which raises it or notes it
                failed = failed or error
        if self._tree is not None:
            try:
                with _writing(f"{self.folder} to disk (fsync)"):
                    if self._process is not None:  # the process finishes the steps it wrote
                        try:
                            self._process.close()
                        finally:
                            self._tree.release()
                    else:
                        self._tree.close()
            except CaptureWriteError as error:
                failed = failed or error
            self._tree = None
        self._process = None
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._switched:
            self._switched = False
            _SWITCHING.restore()
        return failed

    def flush(self) -> None:
        """Wait until every step handed to `step()` is written and listed in the tree's manifest (which is
        otherwise rewritten at most once a second: harness.store.tree.MANIFEST_INTERVAL); raise the error of a
        write that failed."""
        self._wait_written()
        if self._tree is not None:
            with _writing(f"the manifest of {self.folder}"):
                if self._process is not None:
                    self._process.list_steps()
                else:
                    self._tree.list_steps()

    def _wait_written(self, ahead: int = 0) -> None:
        """Wait until at most `ahead` steps handed to `step()` are not written yet (by default every one is written);
        raise the error of a write that failed."""
        writing = self._writing
        while len(writing) > ahead:
            writing.popleft().result()

    # -- recording (called from the hooks) ----------------------------------------------------------------

    def _leaves(self, value: Any, slot: str, found: list[tuple[str, Any]], counter: list[int] | None) -> None:
        """Tensor leaves of `value`: numbered from counter[0] on (positional), or named slot[.j] (keyword)."""
        if isinstance(value, self._tensor):
            if counter is not None:
                found.append((str(counter[0]), value))
                counter[0] += 1
            else:
                found.append((slot, value))
        elif isinstance(value, (tuple, list, dict)):
            items = value.values() if isinstance(value, dict) else value
            for j, item in enumerate(items):
                self._leaves(item, f"{slot}.{j}", found, counter)

    def _submit(self, step: _Step, name: str, tensor: Any, path: str, fresh: bool = False,
                batch: _Batch | None = None, version: Any = _UNREAD) -> str | None:
        """Copy the tensor to the host and queue its hashing (digest) or its stats (kept in full); None
        (and a note in the step's meta) for a dtype or layout no dump holds. With `batch`, a fast digest is left
        to `_digest_batch`, which the caller calls before anything else runs. `version`: the tensor's
        (FrameworkAdapter.tensor_version), where the caller has read it."""
        full = self.full[path]
        if version is _UNREAD:
            version = self.adapter.tensor_version(tensor)
        # fresh: changed by an optimizer kernel, which need not count as an in-place change (Paddle's do not)
        seen = None if fresh else step.seen.get(id(tensor))
        # recorded already (a module's output is its parent's: most of a step's tensors, checked first); one waiting
        # in another batch is digested again
        if seen is not None and seen[0]() is tensor and seen[1:3] == (version, full):
            first = seen[3]
            if step.results[first] is not _BATCHED or (batch is not None and first in batch.names):
                step.results[name] = step.results[first]
                if step.results[name] is _BATCHED:
                    batch.aliases.append((name, first))  # type: ignore[union-attr]
                if first in step.held:
                    step.held[name] = step.held[first]
                return name
        unsupported = _unsupported(self.adapter, tensor)
        if unsupported is not None:
            step.skipped.append(f"{name} ({unsupported})")
            return None
        fast = self.hash == "fast" and not full
        if fast and batch is not None:
            batch.tensors.append((name, tensor))
            batch.versions.append(version)
            batch.names.add(name)
            step.results[name] = _BATCHED
            if self.live is not None:
                step.held[name] = self.adapter.host_copy(tensor)
        elif (pending := self.adapter.device_digest(tensor) if fast else None) is not None:
            step.results[name] = (None, pending)
            if self.live is not None:
                step.held[name] = self.adapter.host_copy(tensor)
        else:
            array = self.adapter.host_copy(tensor)
            assert self._pool is not None
            if not full:
                step.results[name] = (None, self._pool.submit(fast_entry if fast else digest_entry, array))
            elif array.size <= INLINE_STATS:
                step.results[name] = (array, _Done(tensor_stats(array)))
            else:
                step.results[name] = (array, self._pool.submit(tensor_stats, array))
            if self.live is not None and not full:
                step.held[name] = array
        if version is not None:
            try:
                step.seen[id(tensor)] = (weakref.ref(tensor), version, full, name)
            except TypeError:  # a tensor type without weak references: hashed each time
                pass
        return name

    def _digest_batch(self, step: _Step, batch: _Batch | None = None) -> None:
        """Start the fast digests `_submit` left to `batch` (by default the step's deferred ones), together."""
        version = self.adapter.tensor_version
        if batch is None:
            batch, step.deferred = step.deferred, _Batch()
            watched, step.watched = step.watched, []
            self._eager.update(name for name, tensor, began in watched if version(tensor) != began)
        if not batch.tensors:
            return
        changed = [name for (name, tensor), began in zip(batch.tensors, batch.versions, strict=True)
                   if version(tensor) != began]
        if changed:  # in place after their hook: recorded as they are now (the step's notes), at the hook from now on
            step.changed_later += changed
            self._eager.update(changed)
        started = self.adapter.device_digests([tensor for _, tensor in batch.tensors])
        for (name, tensor), pending in zip(batch.tensors, started, strict=True):
            if pending is None:  # the adapter has no device digest: a host copy, hashed on the pool
                assert self._pool is not None
                step.results[name] = (None, self._pool.submit(fast_entry, self.adapter.host_copy(tensor)))
            else:
                step.results[name] = (None, pending)
        for name, first in batch.aliases:
            step.results[name] = step.results[first]
            if first in changed:
                step.changed_later.append(name)

    def _hook_submit(self, step: _Step, name: str, tensor: Any, path: str) -> str | None:
        """`_submit` of a hook's tensor: left to the step's deferred batch where DEFER_BYTES allows and the adapter
        batches it (FrameworkAdapter.batches), digested once it holds DEFER_BYTES."""
        version = self.adapter.tensor_version(tensor)
        if not DEFER_BYTES or name in self._eager or self.hash != "fast" or self.full[path] or version is None:
            return self._submit(step, name, tensor, path, version=version)
        nbytes = _nbytes(tensor)
        if not self.adapter.batches(tensor, nbytes):
            return self._submit(step, name, tensor, path, version=version)
        deferred = step.deferred
        if not self._steps:  # the first step: at the hook, its version watched (see DEFER_BYTES), held as deferred
            step.watched.append((name, tensor, version))
            submitted = self._submit(step, name, tensor, path, version=version)
            held = True
        else:
            before = len(deferred.tensors)
            submitted = self._submit(step, name, tensor, path, batch=deferred, version=version)
            held = len(deferred.tensors) > before  # not recorded already, nor left out
        if held:
            deferred.nbytes += nbytes
            if deferred.nbytes >= DEFER_BYTES:
                with self._lock:
                    self._digest_batch(step)
        return submitted

    def _start(self, step: _Step) -> None:
        """The step's first hook: every selected module's parameters, the step's first records. They are recorded
        (`_record_params`) as the forward pass ends, not now, when the device waits for the step's first kernel (one
        module's each as its call returns: more launches, measured slower), their fast digests with the step's last
        list (DEFER_BYTES). A parameter changed in place meanwhile is recorded as it is then, and the step's notes
        say so."""
        step.started = True
        version = self.adapter.tensor_version
        for path, params in self.params.items():
            names: list[str] = []
            step.records.append((_module_name(path), None, "params", names))
            step.params_due.append((path, names, [(name, param, version(param)) for name, param in params]))

    def _record_params(self, step: _Step, digest: bool = True) -> None:
        """Record the parameters `_start` left: as the forward pass ends, or before anything else that could change
        them (the backward pass, loss(), step(), the optimizer). Their fast digests join the step's deferred list,
        digested now, or with `digest=False` with that list's next digest (a change in place before it is seen
        by its version, as a hook's tensor's), unless the framework counts no versions."""
        if not step.params_due:
            return
        due, step.params_due = step.params_due, []
        version = self.adapter.tensor_version
        for path, names, params in due:
            module = _module_name(path)
            for name, param, began in params:
                digest = digest or began is None
                now = version(param)
                if submitted := self._submit(step, param_tensor(module, "param", name), param, path, batch=step.deferred,
                                             version=now):
                    names.append(submitted)
                    if now != began:
                        step.changed.append(submitted)
        if digest:
            self._digest_batch(step)

    def _before(self, path: str, args: tuple, kwargs: dict) -> None:
        step = self._step
        with self._lock:
            if not step.started:
                self._start(step)
            call = step.calls.get(path, 0)
            step.calls[path] = call + 1
            step.depth += 1
        leaves: list[tuple[str, Any]] = []
        self._leaves(args, "", leaves, [0])
        for key, value in (kwargs or {}).items():
            self._leaves(value, str(key), leaves, None)
        module = _module_name(path)
        names = [name for slot, tensor in leaves
                 if (name := self._hook_submit(step, call_tensor(module, call, "input", slot), tensor, path)) is not None]
        step.open_calls.setdefault(path, []).append((call, names))

    def _after(self, path: str, output: Any) -> None:
        step = self._step
        if not step.open_calls.get(path):
            return  # the call began before the capture did
        call, names = step.open_calls[path].pop()
        leaves: list[tuple[str, Any]] = []
        self._leaves(output, "", leaves, [0])
        module = _module_name(path)
        for slot, tensor in leaves:
            name = self._hook_submit(step, call_tensor(module, call, "output", slot), tensor, path)
            if name is None:
                continue  # not recorded: neither is its gradient (of the same dtype and layout)
            names.append(name)
            if self.adapter.tracks_grad(tensor):
                step.grad_hooks.append(self.adapter.hook_grad(tensor, self._grad_hook(step, path, call, slot)))
        with self._lock:
            step.records.append((module, call, "forward", names))
            step.depth -= 1
            if not step.depth:  # the forward pass has ended (the outermost captured call)
                # its fast digests left to the step's end, one list with the backward pass's and the gradients': a
                # short step's host time per launch is what its overhead is (H200, the 1.2 ms MLP: 1.90x against
                # 2.12x, 2026-12-04); without deferring, the parameters' list is digested now
                self._record_params(step, digest=not DEFER_BYTES)

    def _grad_hook(self, step: _Step, path: str, call: int, slot: str):
        name = call_tensor(_module_name(path), call, "grad_output", slot)
        return lambda grad: self._on_grad(step, (path, call), name, grad)

    def _on_grad(self, step: _Step, key: tuple[str, int], name: str, grad: Any) -> None:
        if step is not self._step or name in step.results or grad is None:
            return  # a later backward through a retained graph: the first gradient is the one recorded
        if step.params_due:  # the backward pass has begun before the forward pass ended
            with self._lock:
                self._record_params(step)
        if self._hook_submit(step, name, grad, key[0]) is None:
            return
        with self._lock:
            if key not in step.backward:
                step.backward[key] = []
                step.records.append((_module_name(key[0]), key[1], "backward", step.backward[key]))
            step.backward[key].append(name)

    # -- writing ------------------------------------------------------------------------------------------

    def loss(self, value: Any) -> None:
        """Record the step's loss (a 0-d tensor, or a number) as `(train):loss.0`, kept in full: call it once a
        step, after the forward pass (before or after the backward pass)."""
        step = self._step
        self._active("loss()")
        with self._lock:
            if not step.started:
                self._start(step)
            self._record_params(step, digest=not DEFER_BYTES)
            name = train_tensor("loss", 0)
            if self._record_scalar(step, name, value):
                step.loss = [name]

    def grad_norm(self, value: Any) -> None:
        """Record the global gradient norm the training code computed (torch's clip_grad_norm_ returns it) as
        `(train):grad_norm.reported`: a megatron-core optimizer's step reports its own."""
        self._active("grad_norm()")
        with self._lock:
            self._record_scalar(self._step, train_tensor("grad_norm", "reported"), value)

    def step(self) -> Path:
        """End the step: record the parameter gradients, start moving the fast digests to the host and hand
        the step to the writer thread, which writes step-0000k and the manifest (TreeWriter.write_step); the
        folder it will be.
        Call it after the backward pass and before the gradients are zeroed (or changed in place).
        With `optimizer=`, the step ends when the optimizer's step returns instead: step() then only records
        the gradients as they are before the optimizer clips them (without it, they are recorded as the
        optimizer's step begins), and returns the folder the step will be."""
        step = self._step
        self._active("step()")
        with self._lock:
            if not step.started:
                self._start(step)
            self._record_grads(step)
            if self.probe is not None:
                return self.folder / step_folder(self._steps)
            self._step = _Step()  # hooks from here on record the next step
        return self._hand_over(step)

    def _active(self, what: str) -> None:
        if self._pool is None or self._writer is None:
            raise CaptureError(f"capture: {what} called outside the `with capture(...)` block")

    def _record_grads(self, step: _Step) -> None:
        self._record_params(step)
        if step.grads_recorded:
            return
        step.grads_recorded = True
        for path, params in self.params.items():
            grads = [(name, self.adapter.parameter_grad(param)) for name, param in params]
            names = [submitted for name, grad in grads if grad is not None and
                     (submitted := self._submit(step, param_tensor(_module_name(path), "grad", name), grad, path,
                                                batch=step.deferred))]
            if names:
                step.records.append((_module_name(path), None, "grads", names))
        self._digest_batch(step)  # with the backward pass's deferred ones

    def _record_scalar(self, step: _Step, name: str, value: Any) -> bool:
        """A (train) scalar: a 0-d tensor as it is, a number as float64; False (and a note) for anything else."""
        if isinstance(value, self._tensor):
            return self._submit(step, name, value, TRAIN) is not None
        try:
            array = np.asarray(float(value), dtype=np.float64)
        except (TypeError, ValueError):
            step.skipped.append(f"{name} (a {type(value).__name__}, not a number)")
            return False
        step.results[name] = (array, _Done(tensor_stats(array)))
        return True

    def _optimizer_begins(self) -> None:
        step = self._step
        with self._lock:
            if not step.started:
                self._start(step)
            self._record_grads(step)  # before the optimizer's clipping, when step() has not recorded them

    def _optimizer_ends(self, reported_norm: float | None) -> None:
        """The optimizer's step has returned: record per parameter the gradient it applied, its state and the
        parameter as updated; the learning rates and grad norms; then end the step."""
        step, probe = self._step, self.probe
        assert probe is not None
        with self._lock:
            clipped, grads, first = [], [], len(step.records)
            batch = _Batch()
            for path, params in self.params.items():
                module, names = _module_name(path), []
                for param_name, param in params:
                    grad = probe.consumed_grad(param)
                    if grad is not None and (name := self._submit(step, param_tensor(module, "grad_clipped", param_name), grad, path,
                                                                  batch=batch)):
                        names.append(name)
                        clipped.append(name)
                    for state, tensor in probe.states(param):
                        if state not in STATE_ROLES:
                            step.skipped.append(f"{param_tensor(module, state, param_name)} (an optimizer state xfalign has no name for)")
                        elif (name := self._submit(step, param_tensor(module, state, param_name), tensor, path, fresh=True,
                                                   batch=batch)):
                            names.append(name)
                    if (name := self._submit(step, param_tensor(module, "updated", param_name), param, path, fresh=True,
                                             batch=batch)):
                        names.append(name)
                if names:
                    step.records.append((module, None, "optimizer", names))
                grads += [n for n in (param_tensor(module, "grad", p) for p, _ in params) if n in step.results]
            self._digest_batch(step, batch)
            rates = {train_tensor("lr", group): lr for group, lr in enumerate(probe.learning_rates())}
            scalars = [name for name, lr in rates.items() if self._record_scalar(step, name, lr)]
            reported = train_tensor("grad_norm", "reported")
            if reported_norm is not None:
                self._record_scalar(step, reported, reported_norm)
            if reported in step.results:  # the optimizer's, or told by grad_norm()
                scalars.append(reported)
            step.norms = {train_tensor("grad_norm", "pre_clip"): grads, train_tensor("grad_norm", "post_clip"): clipped}
            # the step's learning rates and norms come first: the updates follow from them
            step.records.insert(first, (TRAIN, None, "optimizer", scalars + list(step.norms)))
            self._step = self._carried(step)
        self._hand_over(step)

    @staticmethod
    def _carried(step: _Step) -> _Step:
        """The next step, knowing the updated parameters' digests: its `:param.` records are the same tensors,
        unchanged since (their version says so), not hashed again."""
        carried = _Step()
        for key, seen in step.seen.items():
            name = seen[3]
            if ":updated." in name:
                carried.seen[key], carried.results[name] = seen, step.results[name]
                if name in step.held:
                    carried.held[name] = step.held[name]
        return carried

    def _hand_over(self, step: _Step) -> Path:
        """Hand a recorded step to the writer thread, or send it to the writer process (`_send_step`), once fewer than
        WRITES_AHEAD steps are not written yet."""
        assert self._writer is not None
        if step.loss:  # the loss comes before the backward pass, whenever it was recorded
            at = next((i for i, record in enumerate(step.records) if record[2] == "backward"), len(step.records))
            step.records.insert(at, (TRAIN, None, "loss", step.loss))
        for remove in step.grad_hooks:
            remove()
        with self._lock:
            self._digest_batch(step)  # any deferred ones left (a step without parameters)
        pending = list({id(work): work for _, work in step.results.values()
                        if isinstance(work, PendingDigest) and not work.fetched}.values())
        rows = self.adapter.fetch_digests([p.values for p in pending]) if pending else None
        if self._direct:
            return self._send_step(step, pending, rows)
        # the writer thread writes the steps in order; a step holding full tensors waits for the one before
        self._wait_written(WRITES_AHEAD - 1 if self._digests_only else 0)
        index, self._steps = self._steps, self._steps + 1
        self._writing.append(self._writer.submit(self._write, step, index, pending, rows))
        if self.live is not None and self.on_divergence == "stop":
            self._wait_written()  # the check's verdict before training goes on
        return self.folder / step_folder(index)

    @contextmanager
    def _writing_step(self, index: int) -> Iterator[None]:
        """A step's write (or its part): its failure a CaptureWriteError naming it; no later step is written."""
        assert self._tree is not None
        kept = "; the earlier capture there is kept" if self._tree.replacing else ""
        try:
            with _writing(f"step {index} ({step_folder(index)}) of {self.folder}", kept):
                yield
        except BaseException:
            if self._write_failed is None:
                self._write_failed = index
            raise

    def _write(self, step: _Step, index: int, pending: list[PendingDigest], rows) -> None:
        """The writer thread's part of a step: its meta (while the device may still be digesting), the
        digests' values, then the dump, handed to the TreeWriter."""
        assert self._tree is not None
        if self._write_failed is not None:  # an earlier step's write failed (its error is raised): no later one is written
            return
        with self._writing_step(index):
            self._write_step(self._tree, step, index, pending, rows)

    def _send_step(self, step: _Step, pending: list[PendingDigest], rows) -> Path:
        """Send a step of digests alone to the writer process (the values of the steps before it that the device has
        first, the answers there read), once fewer than WRITES_AHEAD steps are not written yet."""
        assert self._process is not None
        sent_steps = cast(deque[_SentStep], self._writing)
        for sent in sent_steps:  # in order: the process writes them so
            if sent.rows is not None:
                if not sent.ready():
                    break
                self._send_values(sent)
        while sent_steps and sent_steps[0].rows is None and self._process.answered():
            sent_steps.popleft().result()
        self._wait_written(WRITES_AHEAD - 1)
        index, self._steps = self._steps, self._steps + 1
        if self._write_failed is None:
            with self._writing_step(index):
                self._process.send(("step", self._payload(step, index, pending)))
            self._writing.append(_SentStep(self, index, pending, rows))
        return self.folder / step_folder(index)

    def _send_values(self, sent: _SentStep) -> None:
        """Send a sent step's digests' values (waiting for the device), None once a write has failed; a step whose
        values cannot be fetched is dropped (the process told so), their error raised."""
        assert self._process is not None
        rows, sent.rows = sent.rows, None
        values = None
        try:
            if self._write_failed is None:
                with self._writing_step(sent.index):  # a fetch that fails: no later step is written
                    values = self._fetched(sent.pending, rows())
        finally:
            with self._writing_step(sent.index):
                self._process.send(("values", sent.index, values))

    def _settle_sent(self, sent: _SentStep) -> None:
        """A sent step written: its values sent, the process's answer read (its failure raised)."""
        assert self._process is not None
        try:
            if sent.rows is not None:
                self._send_values(sent)
        finally:
            with self._writing_step(sent.index):
                self._process.answer()

    def _write_step(self, tree: TreeWriter, step: _Step, index: int, pending: list[PendingDigest], rows) -> None:
        if self._process is not None:
            # the step goes to the writer process while the device still digests, its digests' values after them,
            # made into entries there: what this thread does once they are there (when the training's next step
            # begins, the host's busiest moment) is short
            self._process.write(self._payload(step, index, pending),
                                None if rows is None else lambda: self._fetched(pending, rows()))
            return
        if rows is not None:
            for started, row in zip(pending, rows(), strict=True):
                started.settle(row)
        payload = self._payload(step, index)
        dump = step_dump(self.context, payload)
        stop = self.live is not None and self._check_live(tree, step, index, dump)
        # the meta is made of validated parts: the schema check on writing is skipped (Dump.read checks it)
        tree.write_step(index, dump, validate=False)
        if stop:
            assert self.diverged is not None and self.live is not None
            raise CaptureDiverged(f"capture {self.folder}: step {index} differs from the reference {self.live.path} "
                                  f"first at {self.diverged.tensor} (written in full: {tree.folder / step_folder(index)}); "
                                  "stopped (on_divergence='stop')")

    @staticmethod
    def _fetched(pending: list[PendingDigest], values: np.ndarray) -> np.ndarray:
        """The digests' values kept by their PendingDigests (made into entries if asked: a carried parameter's)."""
        for work, row in zip(pending, values, strict=True):
            work.row = row
        return values

    def _payload(self, step: _Step, index: int, pending: Sequence[PendingDigest] = ()) -> StepPayload:
        """The step (the writer thread's part of a step): its digests settled, but those of `pending`, whose entries
        are their rows of the values (StepPayload.settle)."""
        tensors: dict[str, np.ndarray] = {}
        unstored: dict[str, dict | int] = {}
        stats: dict[str, dict] = {}
        rows = {id(work): row for row, work in enumerate(pending)}
        order = [name for *_, names in step.records for name in names]
        for name in order:
            if name in step.norms:
                continue
            array, work = step.results[name]
            if array is None:
                row = rows.get(id(work))
                unstored[name] = work.result() if row is None else row
            else:
                tensors[name], stats[name] = array, work.result()
        notes = []
        if step.skipped:
            notes.append(f"not recorded (a dtype or layout xfalign dumps do not hold): {', '.join(step.skipped)}")
            if not self._warned_skipped:
                self._warned_skipped = True
                warnings.warn(f"xfalign capture {self.folder}, step {index}: {notes[0]} (listed in each step's notes.capture)",
                              stacklevel=2)
        if step.changed:
            notes.append(f"parameters changed in place since the step began, recorded as the forward pass ended: "
                         f"{', '.join(step.changed)}")
        if step.changed_later:
            notes.append(f"changed in place after their hook (a parameter: after the forward pass), recorded as their "
                         f"list was digested (a hook's tensor: from the next step on at its hook): "
                         f"{', '.join(step.changed_later)}")
        note = "; ".join(notes) or None
        return StepPayload(index=index, records=step.records, order=order, tensors=tensors, stats=stats,
                           unstored=unstored, norms=step.norms, note=note,
                           digests=[(work.dtype, work.shape, work.nbytes) for work in pending])

    def _check_live(self, tree: TreeWriter, step: _Step, index: int, dump: Dump) -> bool:
        """Check the step against the reference's; the first step that differs is kept in full (its held
        arrays join the stored tensors) and recorded in the manifest. Whether to stop the training."""
        assert self.live is not None and dump.order is not None
        unstored, tensors, stats = dump.unstored, dict(dump.tensors), dump.stats
        entries = dict(unstored)
        if tensors:
            entries.update({name: digest.to_json() for name, digest in digests_of(tensors).items()})
        check = self.live.check(index, dump.order, entries, {**step.held, **tensors})
        if check is None:
            dump.meta.setdefault("notes", {})["live"] = f"not checked: the reference {self.live.path} has no step {index}"
            return False
        first = check.differing and self.diverged is None
        if first:
            for name in [name for name in dump.order if name in unstored and name in step.held]:
                tensors[name], stats[name] = step.held[name], unstored.pop(name)["stats"]
            check.full = True
            self.diverged = Divergence(step=index, tensor=check.differing[0])
            tree.manifest = tree.manifest.model_copy(update={"diverged": self.diverged})
        dump.tensors = tensors
        dump.meta["capture"]["live"] = check.model_dump(mode="json")
        return bool(first) and self.on_divergence == "stop"

    def _provenance(self) -> str:
        script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else "an interactive session"
        chosen = ", ".join(self.module_globs + [getattr(t, "__name__", str(t)) for t in self.types])
        how = f"{self.mode}, fast hash" if self.hash == "fast" and self.mode != "full" else self.mode
        return f"capture ({how}) of {self.root} modules [{chosen}] by {script}"


def capture(model: Any, path: str | Path, mode: str = "full", modules: Iterable[str] | None = ("*",),
            types: Iterable[str | type] | None = None, side: str | None = None,
            refetch: str | Path | Sequence[str] | None = None, provenance: str | None = None,
            threads: int | None = None, hash: str = "md5", optimizer: Any = None, reference: Any = None,
            map: Any = None, on_divergence: str = "continue", writer: str | None = None) -> Capture:
    """Capture `model` (a module of any framework whose adapter supports capture) into the tree at `path`; see the module's
    note. modules: fnmatch globs on module paths ("(root)" is the model); types: class names or classes,
    selected as well; side: the name in the dumps (default: the framework adapter's name);
    refetch (mode "digests-then-full"): the module globs, or the YAML file listing them, kept in full;
    threads: the hashing pool's size; hash (digest modes): "md5" (MD5 + XXH3 of a host copy) or "fast"
    (fast64, computed where the tensor lives: harness.store.fast_hash); optimizer: the training's optimizer
    (torch, megatron-core or Paddle), whose step then ends each captured step and is recorded too: the
    gradients it applied, its state and the updated parameters (harness.store.tree_format);
    reference: a tree (of an earlier run, or the other framework's) each step is checked against while it runs
    (harness.capture.live), through `map` (a map file or TensorMap: this capture is side B); the first step that
    differs is written in full, and on_divergence="stop" then raises CaptureDiverged, "continue" goes on;
    writer: where each step's dump is made and written, "thread" (in this process) or "process" (a writer
    process: harness.capture.step_writer, reused by this process's next capture); by default the process for a
    model on a GPU (unless reference= is given), else the thread."""
    return Capture(model, path, mode=mode, modules=modules, types=types, side=side, refetch=refetch,
                   provenance=provenance, threads=threads, hash=hash, optimizer=optimizer, reference=reference,
                   map=map, on_divergence=on_divergence, writer=writer)
