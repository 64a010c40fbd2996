"""torch + megatron-core (`framework: megatron`): CPU or one CUDA GPU; execution modes compile and eager."""

from __future__ import annotations

import os
import re
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import StrictBool

from harness.dtypes import dtype_name
from harness.frameworks import triton_batch, triton_digest
from harness.frameworks.base import FrameworkAdapter, Pins, Threads, as_returned, outputs_in_order
from harness.frameworks.digest_tables import device_table
from harness.machine import cuda_library, nvidia_smi, version_of
from harness.store import fast_hash
from harness.store.fast_hash import HOST_BATCHED, SLOTS, PendingDigest, settled_digest

INDUCTOR_CACHE = Path.home() / ".cache" / "xfalign" / "inductor"
# torch._inductor.config.cpp.simdlen picks the vector ISA of that bit width; any other value falls back to
# no vectorization (or fails), which no profile means.
SIMD_WIDTHS = Literal[128, 256, 512]


class TorchPins(Pins):
    """A numerics profile's `torch:` section."""

    mkldnn: StrictBool | None = None  # torch.backends.mkldnn.enabled
    threads: Threads | None = None  # torch.set_num_threads
    inductor_simdlen: SIMD_WIDTHS | None = None  # torch._inductor.config.cpp.simdlen (vector bits of compiled code)


class TorchAdapter(FrameworkAdapter):
    # torch.compile (Megatron's jit_fuser) or eager, switched per case with torch.compiler.set_stance
    # ("force_eager": every torch.compile'd function runs its plain Python body). Not TORCHDYNAMO_DISABLE:
    # a torch.compile'd function first called while it is set stays uncompiled for the process's life, so
    # a compiled case after an eager one in the same worker silently ran eager.
    modes = ("compile", "eager")
    stance = "default"  # the torch.compiler stance set_mode chose (recorded in the fingerprint)
    default_impl = "megatron"
    tensor_kind = "a torch tensor"
    profile_section = "torch"
    pins = TorchPins
    numeric_env = ("TORCHDYNAMO_DISABLE", "TORCHINDUCTOR_EMULATE_PRECISION_CASTS", "ATEN_CPU_CAPABILITY")
    worker_env = ("TORCHINDUCTOR_*", "TRITON_*")  # compile caches (INDUCTOR_CACHE)
    version_fields = {"torch": "torch", "megatron_core": "megatron-core"}

    def before_import(self, profile, mode: str | None) -> None:
        super().before_import(profile, mode)
        os.environ.pop("TORCHDYNAMO_DISABLE", None)  # see `modes`: it would freeze compiled functions as eager
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(INDUCTOR_CACHE))

    def apply_profile(self, profile) -> None:
        import torch

        pins: TorchPins = self.pins_of(profile)
        if pins.mkldnn is not None:
            torch.backends.mkldnn.enabled = pins.mkldnn  # type: ignore[assignment]  # a ContextProp in the stubs
        if pins.threads is not None:
            torch.set_num_threads(pins.threads)
        if pins.inductor_simdlen is not None:
            import torch._inductor.config as inductor_config

            inductor_config.cpp.simdlen = pins.inductor_simdlen

    def unavailable(self, device: str) -> str | None:
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            return "case asks for cuda but torch sees no GPU"
        return None

    def import_framework(self) -> None:
        import torch  # noqa: F401

        try:
            import megatron.core  # noqa: F401  (most built-in implementations need it)
        except ImportError:
            pass

    def set_mode(self, mode: str | None) -> None:
        import torch

        self.stance = "force_eager" if (mode or self.default_mode) == "eager" else "default"
        torch.compiler.set_stance(self.stance)

    def save_state(self) -> dict:
        import torch

        state = {
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "rng": torch.get_rng_state(),
            "default_dtype": torch.get_default_dtype(),
            "grad": torch.is_grad_enabled(),
            "threads": torch.get_num_threads(),
            "mkldnn": torch.backends.mkldnn.enabled,
            "cudnn": (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
                      torch.backends.cudnn.allow_tf32),
            "matmul": (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        return state

    def restore_state(self, state: dict) -> None:
        import torch

        _destroy_process_groups()
        if "torch._dynamo" in sys.modules:
            torch._dynamo.reset()  # compiled code, guards and recompile counts of this case
        torch.compiler.set_stance("default")
        torch.use_deterministic_algorithms(state["deterministic"], warn_only=state["warn_only"])
        torch.set_rng_state(state["rng"])
        if "cuda_rng" in state:
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        torch.set_default_dtype(state["default_dtype"])
        torch.set_grad_enabled(state["grad"])
        torch.set_num_threads(state["threads"])
        torch.backends.mkldnn.enabled = state["mkldnn"]
        (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
         torch.backends.cudnn.allow_tf32) = state["cudnn"]
        torch.backends.cuda.matmul.allow_tf32 = state["matmul"][0]
        torch.set_float32_matmul_precision(state["matmul"][1])

    def kept_processes(self) -> frozenset[int]:
        """torch inductor's compile workers (started by a case's compilation, reused by the next ones): the
        sidecar of its SubprocPool, or the workers of a ProcessPoolExecutor."""
        async_compile = sys.modules.get("torch._inductor.async_compile")
        if async_compile is None or not async_compile.AsyncCompile.process_pool.cache_info().currsize:
            return frozenset()
        pool = async_compile.AsyncCompile.process_pool()
        sidecar = getattr(pool, "process", None)
        return frozenset([sidecar.pid] if sidecar is not None else getattr(pool, "_processes", None) or ())

    def compile_stats(self) -> dict:
        utils = sys.modules.get("torch._dynamo.utils")
        if utils is None:
            return {}
        counters = utils.counters
        return {"compile_s": sum(utils.compilation_time_metrics.get("_compile.compile_inner", [])),
                "fx_cache_hits": counters["inductor"].get("fxgraph_cache_hit", 0),
                "fx_cache_misses": counters["inductor"].get("fxgraph_cache_miss", 0),
                "aot_cache_hits": counters["aot_autograd"].get("autograd_cache_hit", 0),
                "aot_cache_misses": counters["aot_autograd"].get("autograd_cache_miss", 0)}

    def reset(self) -> None:
        import torch

        torch.use_deterministic_algorithms(False)

    def held_for_follow_up(self):
        """Megatron's one-process group (harness.frameworks.megatron_group), where this worker has Megatron."""
        if "megatron.core.parallel_state" not in sys.modules:
            return super().held_for_follow_up()
        from harness.frameworks.megatron_group import hold

        return hold()

    # -- tensors --------------------------------------------------------------------------------------

    def to_tensor(self, array: np.ndarray, device: str, requires_grad: bool):
        import ml_dtypes
        import torch

        if array.dtype == ml_dtypes.bfloat16:  # numpy has no bf16: move the bits as int16
            tensor = torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array.copy())
        return tensor.to(device).requires_grad_(requires_grad)

    def to_numpy(self, tensor) -> np.ndarray:
        import ml_dtypes
        import torch

        tensor = tensor.detach().cpu().contiguous()
        if tensor.dtype == torch.bfloat16:
            return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return tensor.numpy()

    def tensor_type(self) -> type:
        import torch

        return torch.Tensor

    def backward(self, outputs: list, grads: list) -> None:
        import torch

        torch.autograd.backward(outputs, grads)

    def grad_of(self, tensor):
        return tensor.grad

    def tracks_grad(self, tensor) -> bool:
        return bool(getattr(tensor, "requires_grad", False))

    def custom_function(self, forward, backward):
        import torch

        names: list[str] = []

        class UserFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, options, *inputs):
                ctx.options = options
                ctx.save_for_backward(*inputs)
                return outputs_in_order(forward(*inputs, options), names)

            @staticmethod
            def backward(ctx, *grads):
                return (None, *backward(*grads, *ctx.saved_tensors, ctx.options))

        def apply(*args):
            *inputs, options = args
            return as_returned(UserFunction.apply(options, *inputs), names)

        return apply

    @contextmanager
    def deterministic(self, enabled: bool):
        import torch

        previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(enabled)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(previous)

    # -- capture inside models (harness.capture) -------------------------------------------------------

    def owns_model(self, model) -> bool:
        torch = sys.modules.get("torch")  # a model of torch's means torch is loaded already
        return torch is not None and isinstance(model, torch.nn.Module)

    def named_modules(self, model) -> list:
        return list(model.named_modules())  # the model first (""), shared modules once

    def own_parameters(self, module) -> list:
        return list(module.named_parameters(recurse=False))

    def unsupported_layout(self, tensor) -> str | None:
        import torch

        return None if tensor.layout == torch.strided else str(tensor.layout).rpartition(".")[2]

    def float64_copy(self, model):
        return model.double()

    @contextmanager
    def no_grad_eager(self):
        import torch

        # stance force_eager: a torch.compile'd function runs its Python body, as the op cases' float64
        # reference does
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):
            yield

    def load_parameter(self, param, array: np.ndarray) -> None:
        import torch

        with torch.no_grad():
            param.copy_(self.to_tensor(array, param.device.type, False))

    def hook_module(self, module, before, after) -> list:
        handles = [module.register_forward_pre_hook(lambda m, args, kwargs: before(m, args, kwargs), with_kwargs=True),
                   module.register_forward_hook(lambda m, args, kwargs, out: after(m, args, kwargs, out), with_kwargs=True)]
        return [handle.remove for handle in handles]

    def host_copy(self, tensor) -> np.ndarray:
        array = self.to_numpy(tensor)
        return array if tensor.device.type != "cpu" else array.copy()  # .cpu() made a copy already

    def tensor_version(self, tensor) -> tuple[int, int] | int:
        # with the address: `tensor.data = ...` swaps the storage and bumps no counter (megatron-core's pipeline
        # schedule does so to a stage's output once sent, which a digest left to the step's end would then read)
        try:
            return tensor._version, tensor.data_ptr()
        except RuntimeError:  # no storage (a sparse tensor): its counter alone
            return tensor._version

    # A CPU tensor is hashed at once by numpy, on its own memory (no copy): measured faster than torch ops
    # in float64 and than a host copy hashed on the capture's pool (scripts/bench_capture.py). On a GPU,
    # torch ops (`device_digest` below).
    digest_on_cpu = False  # True: torch ops on the CPU too

    def device_digest(self, tensor) -> PendingDigest | None:
        if tensor.is_cpu and not self.digest_on_cpu:
            name = dtype_name_of(tensor)
            if name is None:
                raise ValueError(f"unsupported dtype {tensor.dtype}")
            # float32 and float64: numpy reads the bits as they are (no copy, no view; fast_entry orders them)
            return settled_digest(tensor.detach().numpy() if name in ("float32", "float64") else self.to_numpy(tensor))
        return device_digest(tensor)

    def device_digests(self, tensors: list) -> list[PendingDigest | None]:
        # CUDA tensors at hand together: one launch per dtype over their addresses (triton_batch) instead of a
        # launch (or an arena copy) each, where the Triton kernels digest; the rest one by one
        on_gpu = [getattr(tensor, "is_cuda", False) for tensor in tensors]
        if not any(on_gpu):
            return super().device_digests(tensors)  # in place, together, where host_layout says they may be
        if not triton_digest.route()[0] or not triton_digest.importable():
            return [self.device_digest(tensor) for tensor in tensors]
        every = all(on_gpu)
        batched = tensors if every else [tensor for tensor, gpu in zip(tensors, on_gpu, strict=True) if gpu]
        slots, plan = triton_batch.batched_device_digests(batched)
        assert plan is not None
        if plan.facts is None:  # what each digest's entry says of its tensor: the same while the plan is
            plan.facts = [None if slot is None else (dtype_name_of(tensor), tuple(tensor.shape), tensor.nbytes)
                          for tensor, slot in zip(batched, slots, strict=True)]
        started = [self.device_digest(tensor) if slot is None else PendingDigest(fact[0], fact[1], fact[2], slot)
                   for tensor, slot, fact in zip(batched, slots, plan.facts, strict=True)]
        if every:
            return started
        on_device = iter(started)  # the CPU's tensors one by one
        return [next(on_device) if gpu else self.device_digest(tensor) for tensor, gpu in zip(tensors, on_gpu, strict=True)]

    def batches(self, tensor, nbytes: int) -> bool:
        # a CUDA tensor larger than a list's grouped launch reads is launched alone by device_digests too: deferred,
        # it would only be held longer (H200, MoE layer: 1.19-1.22x deferred against 1.14-1.16x, 2026-12-04)
        return not tensor.is_cuda or nbytes <= triton_digest.route()[2]

    def host_layout(self, tensor) -> tuple[int, str, tuple[int, ...]] | None:
        if self.digest_on_cpu or not tensor.is_cpu or not tensor.is_contiguous() or not tensor.numel():
            return None
        name = dtype_name_of(tensor)
        return (tensor.data_ptr(), name, tuple(tensor.shape)) if name in HOST_BATCHED else None

    def fetch_digests(self, handles: list):
        # one copy and one transfer per device for every digest of the step (the grouped ones' launches first:
        # triton_digest.launch_groups); a GPU's into pinned memory, asynchronously, done when an event recorded
        # after it on the stream the digests ran on has passed
        # device -> [handle indices, each one's row among the device's parts stacked, the parts (1-D, rows of SLOTS),
        # their rows, whether its rows end in a run of a group's]; a grouped handle's row is its row of its group's
        # block, plus where that block's rows start (added per run of handles of one group: a list's come one after
        # another, as do a group's hooks' tensors)
        by_device: dict = {}
        state: list = []
        runs: list = []  # (group, its device's state, where its run starts among the state's rows; None: a run's end)
        width = len(SLOTS)
        last = None  # the group of the handle before
        for index, handle in enumerate(handles):
            if type(handle) is triton_digest.GroupSlot:
                group = handle.group
                if group is not last:
                    last = group
                    state = by_device.get(group.device) or by_device.setdefault(group.device, [[], [], [], 0, False])
                    indices, at = state[0], state[1]
                    runs.append((group, state, len(at)))
                    state[4] = True
                indices.append(index)
                at.append(handle.index)
            else:
                last = None
                state = by_device.get(handle.device) or by_device.setdefault(handle.device, [[], [], [], 0, False])
                if state[4]:  # the device's run of a group's handles ends: the rows from here on are not shifted
                    runs.append((None, state, len(state[1])))
                    state[4] = False
                state[0].append(index)
                state[1].append(state[3])
                state[2].append(handle)
                state[3] += handle.numel() // width
        triton_digest.launch_groups([group for group, _, _ in runs if group is not None])
        first_rows: dict = {}  # id of a block (groups launched together) -> its first row among its device's parts
        shifts: dict = {}  # id of a device's state -> [(where a run starts, its rows' shift)]
        for group, state, start in runs:
            if group is None:
                shifts[id(state)].append((start, 0))
                continue
            block = group.block
            first = first_rows.get(id(block))
            if first is None:
                first = first_rows[id(block)] = state[3]
                state[2].append(block.view(-1))
                state[3] += block.shape[0]
            shifts.setdefault(id(state), []).append((start, first + group.row0))
        moves: list[tuple[list[int], Any, Any, Any]] = []
        for device, state in by_device.items():
            indices, rows_at, parts, total, _ = state
            if id(state) in shifts:
                rows_at = _shifted(rows_at, shifts[id(state)])
            stacked = _stacked(parts, total, width)
            if device.type != "cuda":
                moves.append((indices, rows_at, stacked.numpy(), None))
                continue
            pinned = _pinned_block(device, stacked.numel())
            _copy_to_host(pinned, stacked, device)
            moves.append((indices, rows_at, pinned.array[:stacked.numel()].reshape(total, width), pinned))
        return _FetchedRows(len(handles), moves)

    def optimizer_probe(self, optimizer):
        from harness.frameworks.torch_optimizer import torch_optimizer_probe

        return torch_optimizer_probe(optimizer)

    def model_device(self, model) -> str:
        param = next(model.parameters(), None)
        return "cuda" if param is not None and param.device.type == "cuda" else "cpu"

    def distributed(self) -> tuple[int, int] | None:
        distributed = sys.modules.get("torch.distributed")
        if distributed is None or not distributed.is_available() or not distributed.is_initialized():
            return None
        return distributed.get_rank(), distributed.get_world_size()

    def join_world(self, rank: int, world: int, rendezvous: str, device: str) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            if (dist.get_rank(), dist.get_world_size()) != (rank, world):
                raise RuntimeError(f"this worker is rank {dist.get_rank()} of {dist.get_world_size()}, asked to be "
                                   f"rank {rank} of {world}")
            return
        # a FileStore in the run's temporary folder: no port to pick, nothing left behind
        store = dist.FileStore(rendezvous, world)
        dist.init_process_group("nccl" if device == "cuda" else "gloo", store=store, rank=rank, world_size=world)
        _World.joined = True

    # -- what decides the bits ------------------------------------------------------------------------

    def fingerprint(self, device: str, profile) -> dict:
        import torch

        fields = {
            "torch": str(torch.__version__),  # a str: its TorchVersion would import torch where it is unpickled
            "megatron_core": version_of("megatron-core"),
            "device": device,
            "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_mkldnn_enabled": torch.backends.mkldnn.enabled,
            "onednn": _build_info(r"MKL-DNN v([\w.]+)"),
            "mkl": _build_info(r"Math Kernel Library Version ([\w.]+)"),
            "torch_threads": torch.get_num_threads(),
        }
        if "torch._inductor.config" in sys.modules:
            from torch._inductor import config as inductor_config

            fields["inductor_simdlen"] = inductor_config.cpp.simdlen
        if "torch._inductor.cpu_vec_isa" in sys.modules and device == "cpu":
            from torch._inductor.cpu_vec_isa import pick_vec_isa

            fields["inductor_vec_isa"] = str(pick_vec_isa()) or "none"
        if device == "cuda":
            major, minor = torch.cuda.get_device_capability()
            fields |= {"compute_capability": f"{major}.{minor}", "driver": nvidia_smi("driver_version"),
                       "cuda": torch.version.cuda, "cublas": cuda_library("nvidia-cublas"),
                       "cudnn": torch.backends.cudnn.version()}
        return fields

    def runtime_fingerprint(self, device: str) -> dict:
        import torch

        fields: dict[str, bool | str] = {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
                                         "compile_stance": self.stance}
        if device == "cuda":
            matmul = torch.backends.cuda.matmul
            fields |= {"allow_tf32_matmul": matmul.allow_tf32, "allow_tf32_cudnn": torch.backends.cudnn.allow_tf32,
                       "float32_matmul_precision": torch.get_float32_matmul_precision(),
                       "bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
                       "fp16_reduced_precision_reduction": matmul.allow_fp16_reduced_precision_reduction,
                       "cudnn_deterministic": torch.backends.cudnn.deterministic,
                       "cudnn_benchmark": torch.backends.cudnn.benchmark}
        return fields


_DTYPES: dict = {}  # torch dtype -> the dtype's name in dumps (None: no dump holds it)
_CHUNK_BLOCKS = 256  # blocks widened to int64 at a time: bounds the temporary memory (128 MiB per chunk)


PINNED_BLOCKS = 6  # pinned blocks kept per device for fetch_digests' transfers (a capture has up to api.WRITES_AHEAD unread)
_PINNED: dict = {}  # device -> its _PinnedBlocks
_PINNED_LOCK = threading.Lock()  # captures in two threads must not take the same block


class _PinnedBlock:
    """A fetch's pinned host memory (`host`, float64), the event recorded after its transfer (`done`), and whether a
    fetch holds it until its rows are read (`taken`)."""

    __slots__ = ("host", "array", "address", "done", "taken")

    def __init__(self, count: int):
        import torch

        self.host = torch.empty(count, dtype=torch.float64, pin_memory=True)
        self.array, self.address = self.host.numpy(), self.host.data_ptr()
        self.done = torch.cuda.Event(blocking=True)  # its waiter sleeps: a spin would burn a core for the whole step
        self.taken = True


def _pinned_block(device, count: int) -> _PinnedBlock:
    """A pinned host block of at least `count` float64 for a fetch's transfer from `device`, taken until its rows are
    read: one not taken is filled again (a training fetches about the same count every step), without a pinned
    allocation and an event per step."""
    with _PINNED_LOCK:
        blocks = _PINNED.setdefault(device, [])
        for block in blocks:
            if not block.taken and block.host.numel() >= count:
                block.taken = True
                return block
        block = _PinnedBlock(max(count, 4096))
        free = [i for i, kept in enumerate(blocks) if not kept.taken]
        if len(blocks) < PINNED_BLOCKS:
            blocks.append(block)
        elif free:  # one too small: the larger one kept instead
            blocks[free[0]] = block
        return block


def _shifted(rows: list[int], shifts: list[tuple[int, int]]) -> np.ndarray:
    """`rows` with each run's shift added from where it starts on (until the next run's start)."""
    found = np.array(rows, dtype=np.int64)
    for (start, shift), (end, _) in zip(shifts, [*shifts[1:], (len(rows), 0)], strict=True):
        found[start:end] += shift
    return found


def _stacked(parts: list, total: int, width: int):
    """The device's parts (1-D float64) one after another, as [total, width] (no copy for one part)."""
    import torch

    return (torch.cat(parts) if len(parts) > 1 else parts[0]).view(total, width)


def _copy_to_host(pinned: _PinnedBlock, stacked, device) -> None:
    """Start moving `stacked` (contiguous float64 on `device`) to the start of `pinned`, in the current stream, and
    record `pinned.done` after it: by cudaMemcpyAsync itself where `device` is the current one (torch's copy_ and
    current_stream cost tens of microseconds of CPU per step), else by torch's copy."""
    import torch

    memcpy, index = triton_digest.raw_memcpy(), device.index
    if memcpy is not None and stacked.is_contiguous() and triton_digest.current_device() == index:
        raw = triton_digest.raw_stream(index)
        error = memcpy(pinned.address, stacked.data_ptr(), stacked.numel() * 8, 2, raw)  # D2H
        if error:
            raise RuntimeError(f"cudaMemcpyAsync of the digests to the host: error {error}")
        stream = _STREAMS.get((index, raw))
        if stream is None:
            if len(_STREAMS) >= 64:
                _STREAMS.clear()
            stream = _STREAMS[(index, raw)] = torch.cuda.current_stream(device)
    else:
        pinned.host[:stacked.numel()].view(stacked.shape).copy_(stacked, non_blocking=True)
        stream = torch.cuda.current_stream(device)
    pinned.done.record(stream)


_STREAMS: dict[tuple[int, int], Any] = {}  # (device index, raw stream) -> torch's Stream of it (`_copy_to_host`)


class _FetchedRows:
    """fetch_digests' function: the rows once moved (waiting for the transfers), read once (the pinned blocks may be
    another fetch's since); `ready`: whether they are moved (no wait)."""

    def __init__(self, count: int, moves: list):
        self.count, self.moves = count, moves
        self.read: np.ndarray | None = None

    def ready(self) -> bool:
        return self.read is not None or all(pinned is None or pinned.done.query() for *_, pinned in self.moves)

    def __call__(self) -> np.ndarray:
        if self.read is None:
            values = np.zeros((self.count, len(SLOTS)))
            for indices, rows_at, host, pinned in self.moves:
                if pinned is not None:
                    pinned.done.synchronize()
                values[indices] = host[rows_at]
                if pinned is not None:
                    pinned.taken = False  # read: the next fetch may fill it
            self.read, self.moves = values, []
        return self.read


def dtype_name_of(tensor) -> str | None:
    """The name (harness.dtypes) of the numpy dtype a torch tensor's bits become; None: none a dump holds."""
    name = _DTYPES.get(tensor.dtype, False)  # per tensor digested: no import, one lookup, where known
    if name is not False:
        return name
    import torch

    if tensor.dtype not in _DTYPES:
        try:
            _DTYPES[tensor.dtype] = dtype_name(TorchAdapter().to_numpy(torch.empty(0, dtype=tensor.dtype)).dtype)
        except (TypeError, ValueError):
            _DTYPES[tensor.dtype] = None
    return _DTYPES[tensor.dtype]


def block_sum(tensor):
    """S of harness.store.fast_hash, computed where the tensor lives: a 0-dim int64 tensor (the uint64's
    bits) on its device; torch's int64 arithmetic wraps mod 2**64, as the definition asks. Few kernels:
    on a GPU each launch costs more than the work of a small tensor."""
    import torch

    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    nbytes = raw.numel()
    if nbytes == 0:
        return torch.zeros((), dtype=torch.int64, device=raw.device)
    if raw.storage_offset() % 4:  # int32 words need 4-byte aligned storage
        raw = raw.clone()
    block_bytes = 4 * fast_hash.BLOCK
    full = nbytes // block_bytes
    weights = device_table(raw.device, "W", fast_hash.BLOCK)
    factors = device_table(raw.device, "V", fast_hash.blocks_of(nbytes))
    parts = []
    for start in range(0, full, _CHUNK_BLOCKS):
        stop = min(full, start + _CHUNK_BLOCKS)
        words = raw[start * block_bytes: stop * block_bytes].view(torch.int32).view(stop - start, fast_hash.BLOCK)
        inner = (words.to(torch.int64) * weights).sum(dim=1)
        parts.append((inner * factors[start:stop]).sum())
    tail = raw[full * block_bytes:]
    if tail.numel():
        if tail.numel() % 4:  # zero padding to whole words
            padded = torch.zeros(fast_hash.words_of(tail.numel()) * 4, dtype=torch.uint8, device=raw.device)
            padded[:tail.numel()] = tail
            tail = padded
        words = tail.view(torch.int32).to(torch.int64)
        parts.append((words * weights[:words.numel()]).sum() * factors[full])
    return parts[0] if len(parts) == 1 else torch.stack(parts).sum()


def device_digest(tensor) -> PendingDigest:
    """The fast digest and statistics of a torch tensor, started where it lives (no host copy, no
    synchronisation: on a GPU the kernels run in stream order, before any later in-place change of the
    tensor); ValueError for a dtype no dump holds. The handle: fast_hash.SLOTS as float64 (the count of
    finite values as the element count here; PendingDigest.settle takes NaN and Inf off).
    A CUDA tensor takes the fused Triton kernel of harness.frameworks.triton_digest (one read of the tensor:
    `fused_device_digest`) where triton is importable and the kernel reads the dtype, and a small one (at most
    triton_digest.group_bytes()) its grouped form (`grouped_device_digest`: one launch per dtype for the step's
    small tensors, at `fetch_digests`); the torch ops below with XFALIGN_FAST_DIGEST_KERNEL=torch (or without
    triton). Those two variables are read at a step's first digest (triton_digest.route)."""
    name = dtype_name_of(tensor)
    if name is None:
        raise ValueError(f"unsupported dtype {tensor.dtype}")
    if tensor.is_cuda:
        kernels, limit, _ = triton_digest.route()
        if kernels and triton_digest.available(tensor) and triton_digest.supports(tensor):
            nbytes = tensor.numel() * tensor.element_size()
            # a small tensor copied into its group's arena, digested with the step's others in one launch; a
            # larger one by a launch of its own (both detach the tensor themselves)
            values = triton_digest.grouped_device_digest(tensor) if nbytes <= limit and limit \
                else triton_digest.fused_device_digest(tensor)
            return PendingDigest(name, tuple(tensor.shape), nbytes, values)
    import torch

    detached = tensor.detach()
    values = detached.reshape(-1).to(torch.float64)
    s = block_sum(detached).reshape(1).view(torch.float64)
    if not values.numel():
        scalars = values.new_zeros(6)
    elif tensor.is_floating_point():
        nan, inf = torch.isnan(values).sum(dtype=torch.float64), torch.isinf(values).sum(dtype=torch.float64)
        kept = torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)  # adds nothing to the sums
        low = torch.nan_to_num(values, nan=torch.inf, neginf=torch.inf).min()
        high = torch.nan_to_num(values, nan=-torch.inf, posinf=-torch.inf).max()
        scalars = torch.stack([kept.sum(), torch.dot(kept, kept), low, high, nan, inf])
    else:  # integers and bools: every value finite
        low, high = torch.aminmax(values)
        zero = values.new_zeros(())
        scalars = torch.stack([values.sum(), torch.dot(values, values), low, high, zero, zero])
    handle = torch.cat([scalars[:4], values.new_full((1,), float(values.numel())), scalars[4:], s])
    return PendingDigest(name, tuple(int(n) for n in tensor.shape), detached.numel() * detached.element_size(), handle)


class _World:
    joined = False  # this worker is a rank of a world (join_world): kept, with Megatron's state on it, for its life


def _destroy_process_groups() -> None:
    """Megatron's parallel state and every torch.distributed group a case left behind; not the group a job
    holds for its float64 reference (harness.frameworks.megatron_group.hold), torn down when the hold ends,
    nor a rank worker's world (its next case runs in it)."""
    group = sys.modules.get("harness.frameworks.megatron_group")
    if group is not None and group.holds_world():
        return
    megatron_state = sys.modules.get("megatron.core.parallel_state")
    if megatron_state is not None:
        random = sys.modules.get("megatron.core.tensor_parallel.random")
        if random is not None and hasattr(random, "get_cuda_rng_tracker"):
            try:
                random.get_cuda_rng_tracker().reset()
            except Exception:  # no tracker made on this path
                pass
        if _World.joined:
            return
        megatron_state.destroy_model_parallel()
    if _World.joined:
        return
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.destroy_process_group()


def _build_info(pattern: str) -> str | None:
    import torch

    match = re.search(pattern, torch.__config__.show())
    return match.group(1) if match else None
