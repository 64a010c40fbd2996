"""The fast digest (harness.store.fast_hash: S, the fast64 block sum, and the SLOTS statistics) of a Paddle
tensor where it lives, for harness.frameworks.paddle `device_digest`; the handle is the same as torch's, a
float64 tensor of fast_hash.SLOTS (S as the float64 whose bits are its uint64), read by `fetch_digests`.

Two routes, picked per tensor by `digest`:
- DLPack into torch (`dlpack_digest`): a CUDA tensor is handed to torch without a copy and digested by
  harness.frameworks.torch `device_digest` (the fused Triton kernel, or torch ops with
  XFALIGN_FAST_DIGEST_KERNEL=torch), on a torch stream wrapping Paddle's current CUDA stream: the kernel runs
  after Paddle's pending writes of the tensor and before any later in-place change, and the memory Paddle frees
  after the hook is reused only in that stream's order. Taken where torch sees CUDA and triton is importable.
- Paddle ops (`ops_digest`), on any place: the integer arithmetic of torch's ops. Everywhere else, and with
  XFALIGN_FAST_DIGEST_KERNEL=paddle.

What the Paddle ops' bit-identity with numpy rests on (checked on CPU, Paddle 3.3.1, tests/test_paddle_device_digest.py):
Paddle's int64 multiply, add and sum wrap mod 2**64 (two's complement; a uint64 product and sum have the same
bits), and int32 -> int64 casts sign-extend. Paddle has uint64 only as a storage type, so W and V are int64
tensors of the uint64 bits, as in torch. A dtype view (uint8 -> int32) is only taken of a tensor whose memory
starts at its allocation: Paddle's view_dtype scales a tensor's byte offset by the ratio of the sizes
(phi ViewDtypeKernel, `meta.offset = input.offset() * times`), so the view of a slice reads the wrong bytes.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.dtypes import FLOAT_DTYPES, NUMPY_DTYPES
from harness.store import fast_hash
from harness.store.fast_hash import PendingDigest

_CHUNK_BLOCKS = 256  # blocks widened to int64 at a time: bounds the temporary memory (128 MiB per chunk)
_DTYPES: dict = {}  # paddle dtype -> its name in dumps (None: no dump holds it)
_TABLES: dict = {}  # (place, "W" or "V") -> the table as int64 (the uint64 bits) on that place
_TORCH: list = []  # [torch] once found importable with CUDA, [None] once found not


def dtype_name_of(tensor) -> str | None:
    """The dump's name (harness.dtypes) of a Paddle tensor's dtype; None: no dump holds it."""
    if tensor.dtype not in _DTYPES:
        name = str(tensor.dtype).rpartition(".")[2]  # paddle.bfloat16 -> bfloat16
        _DTYPES[tensor.dtype] = name if name in NUMPY_DTYPES else None
    return _DTYPES[tensor.dtype]


def _table(place, name: str, count: int):
    import paddle

    key = (str(place), name)
    table = _TABLES.get(key)
    if table is None or table.shape[0] < count:
        values = fast_hash.block_weights() if name == "W" else fast_hash.block_factors(max(count, 1) * 2)
        table = paddle.to_tensor(values.view(np.int64), place=place)
        _TABLES[key] = table
    return table[:count]


def _unshifted(tensor):
    """The tensor, detached, C-contiguous and starting at its allocation (copied only where it is not)."""
    flat = tensor.detach()
    if not flat.is_contiguous():
        flat = flat.contiguous()
    if flat._offset():  # a view into another tensor's memory: its dtype views would be misplaced
        flat = flat.clone()
    return flat.reshape([-1])


def block_sum(flat):
    """S of a non-empty 1-D Paddle tensor from `_unshifted`: a 0-dim int64 tensor (the uint64's bits) on its place."""
    import paddle

    raw = flat.view(paddle.uint8)
    nbytes, place = raw.shape[0], raw.place
    whole = nbytes - nbytes % 4
    words = raw[:whole].view(paddle.int32)  # viewed before any slice is taken: at offset 0
    full = whole // (4 * fast_hash.BLOCK)
    weights = _table(place, "W", fast_hash.BLOCK)
    factors = _table(place, "V", fast_hash.blocks_of(nbytes))
    parts = []
    for start in range(0, full, _CHUNK_BLOCKS):
        stop = min(full, start + _CHUNK_BLOCKS)
        rows = words[start * fast_hash.BLOCK: stop * fast_hash.BLOCK].reshape([stop - start, fast_hash.BLOCK])
        inner = (rows.cast(paddle.int64) * weights).sum(axis=1)
        parts.append((inner * factors[start:stop]).sum())
    tail = words[full * fast_hash.BLOCK:]
    if whole < nbytes:  # 1 to 3 bytes left: a last word, padded with zeros (a new tensor: at offset 0 too)
        last = paddle.concat([raw[whole:], paddle.zeros([4 - nbytes % 4], dtype=paddle.uint8, device=place)])
        tail = paddle.concat([tail, last.view(paddle.int32)])
    if tail.shape[0]:
        parts.append((tail.cast(paddle.int64) * weights[:tail.shape[0]]).sum() * factors[full])
    return parts[0] if len(parts) == 1 else paddle.stack(parts).sum()


def ops_digest(tensor) -> PendingDigest:
    """The digest by Paddle ops on the tensor's place (no host copy, no synchronisation: on a GPU the ops run
    in stream order); ValueError for a dtype no dump holds. The handle as torch's (harness.frameworks.torch
    `device_digest`), with the element count where PendingDigest.settle takes NaN and Inf off."""
    import paddle

    name = dtype_name_of(tensor)
    if name is None:
        raise ValueError(f"unsupported dtype {tensor.dtype}")
    shape = tuple(int(n) for n in tensor.shape)
    nbytes = math.prod(shape) * tensor.element_size()  # from the shape: Paddle's numel() is an op
    place = tensor.place
    if nbytes == 0:
        return PendingDigest(name, shape, 0, paddle.zeros([len(fast_hash.SLOTS)], dtype=paddle.float64, device=place))
    flat = _unshifted(tensor)
    s = block_sum(flat).reshape([1]).view(paddle.float64)
    values = flat.cast(paddle.float64)
    if name in FLOAT_DTYPES:
        finite = paddle.isfinite(values)
        nan = paddle.isnan(values).cast(paddle.float64).sum()
        inf = paddle.isinf(values).cast(paddle.float64).sum()
        kept = paddle.where(finite, values, paddle.zeros_like(values))  # adds nothing to the sums
        low = paddle.where(finite, values, paddle.full_like(values, np.inf)).min()
        high = paddle.where(finite, values, paddle.full_like(values, -np.inf)).max()
    else:  # integers and bools: every value finite
        kept, low, high = values, values.min(), values.max()
        nan = inf = paddle.zeros([], dtype=paddle.float64, device=place)
    count = paddle.full([], float(flat.shape[0]), dtype=paddle.float64, device=place)
    scalars = paddle.stack([kept.sum(), paddle.dot(kept, kept), low, high, count, nan, inf])
    return PendingDigest(name, shape, nbytes, paddle.concat([scalars, s]))


def _torch():
    """torch, where it is importable and sees CUDA; else None (found once)."""
    if not _TORCH:
        try:
            import torch

            _TORCH.append(torch if torch.cuda.is_available() else None)
        except ImportError:
            _TORCH.append(None)
    return _TORCH[0]


def dlpack_route(tensor) -> bool:
    """Whether `digest` hands this CUDA tensor to torch: torch with CUDA, and triton for its fused kernel (or
    XFALIGN_FAST_DIGEST_KERNEL=torch, which asks for torch's ops); never with XFALIGN_FAST_DIGEST_KERNEL=paddle."""
    from harness.frameworks import triton_digest

    choice = triton_digest.kernel_choice()
    if choice == "paddle" or not tensor.place.is_gpu_place() or _torch() is None:
        return False
    return choice == "torch" or triton_digest.importable()


def torch_stream(device_id: int):
    """A torch stream over Paddle's current CUDA stream of the device (its default stream where Paddle's is 0)."""
    import paddle

    torch = sys.modules["torch"]
    handle = paddle.device.cuda.current_stream(device_id).cuda_stream
    device = torch.device("cuda", device_id)
    return torch.cuda.default_stream(device) if handle == 0 else torch.cuda.ExternalStream(handle, device=device)


@dataclass(frozen=True)
class TorchHandle:
    """The handle of a digest `dlpack_digest` had torch make: torch's own (whatever its device_digest returns),
    and the CUDA device on whose Paddle stream it ran (None: the CPU)."""

    values: Any
    device_id: int | None


def dlpack_digest(tensor) -> PendingDigest:
    """The digest of harness.frameworks.torch `device_digest` on the tensor's memory, handed to torch by
    DLPack (no copy); a CUDA tensor's on a torch stream over Paddle's current one. The handle: a TorchHandle."""
    import torch

    from harness.frameworks.torch import device_digest

    name = dtype_name_of(tensor)
    if name is None:
        raise ValueError(f"unsupported dtype {tensor.dtype}")
    if not tensor.place.is_gpu_place():  # a CPU tensor (tests): no stream
        pending = device_digest(torch.from_dlpack(tensor.detach()))
        device_id = None
    else:
        device_id = tensor.place.gpu_device_id()
        with torch.cuda.stream(torch_stream(device_id)):
            # torch.from_dlpack passes the current stream to Paddle's __dlpack__, which orders it after Paddle's
            # (the same stream here: nothing to wait for)
            pending = device_digest(torch.from_dlpack(tensor.detach()))
    pending.values = TorchHandle(pending.values, device_id)
    return pending


def digest(tensor) -> PendingDigest:
    """A GPU tensor's digest by the route `dlpack_route` picks; on other places, Paddle ops."""
    return dlpack_digest(tensor) if dlpack_route(tensor) else ops_digest(tensor)


def fetch(handles: list):
    """harness.frameworks.base `fetch_digests` for the handles of `ops_digest` (Paddle tensors) and
    `dlpack_digest` (TorchHandle), in any mix: one transfer per kind and place, a GPU's into pinned memory without
    waiting, done when an event recorded after it on the stream that digested them has passed (Paddle's current
    stream, as at the digests; one GPU per process, whose device is current). Torch's handles are fetched by
    torch's fetch_digests, on a torch stream over that Paddle stream."""
    import paddle

    moves: list[tuple[list[int], Any, Any]] = []
    groups: dict = {}
    for index, handle in enumerate(handles):
        key = ("torch", handle.device_id) if isinstance(handle, TorchHandle) else ("paddle", str(handle.place))
        groups.setdefault(key, []).append(index)
    for (kind, device_id), indices in groups.items():
        if kind == "torch":
            moves.append((indices, _torch_rows([handles[i].values for i in indices], device_id), None))
            continue
        stacked = paddle.stack([handles[i] for i in indices])
        if not stacked.place.is_gpu_place():
            moves.append((indices, stacked, None))
            continue
        host = stacked.pin_memory(blocking=False)  # on the place's current stream, after the digests
        done = paddle.device.Event()  # of the current device
        done.record(paddle.device.current_stream(f"gpu:{stacked.place.gpu_device_id()}"))
        moves.append((indices, host, done))

    def rows() -> np.ndarray:
        values = np.zeros((len(handles), len(fast_hash.SLOTS)))
        for indices, host, done in moves:
            if done is not None:
                done.synchronize()
            values[indices] = host() if callable(host) else host.numpy()
        return values

    return rows


def _torch_rows(handles: list, device_id: int | None):
    """torch's fetch_digests of its handles; of those made on a GPU, on a torch stream over Paddle's current one,
    so that what it launches and copies comes after the digests that stream ran."""
    import torch

    from harness.frameworks.torch import TorchAdapter

    if device_id is None:
        return TorchAdapter().fetch_digests(handles)
    with torch.cuda.stream(torch_stream(device_id)):
        return TorchAdapter().fetch_digests(handles)
