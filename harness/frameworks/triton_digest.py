"""The fast digest of a CUDA tensor (harness.capture.fast_hash: S, the fast64 block sum, and the SLOTS
statistics) by two Triton kernels that read the tensor once, instead of the ~15 torch ops of
harness.frameworks.torch `block_sum` / `device_digest`, which make full-size float64 and int64 temporaries.

`fused_device_digest(tensor)` returns the same handle as `device_digest` builds today: a float64 tensor of
fast_hash.SLOTS on the tensor's device (sum, sum of squares, min, max of the finite values, the element
count, the NaN and Inf counts, S as the float64 whose bits are its uint64), so that PendingDigest.settle
reads either alike. No synchronisation: the kernels run in the current stream's order.

How it works. The tensor's contiguous memory is read as signed integers of its element's width (int8,
int16, int32, int64: a view, no copy). One program of the first kernel (`_partials`) takes tiles of
TILE_ELEMENTS elements, tile t from pid, pid + programs, ...; a tile is a [ROWS, K] block:

    element width 1, 2, 4 bytes: K = 4 / width elements make one int32 word per row
                                 (bytes little-endian: word = sum_k (x_k & mask) << (8 * width * k),
                                 then sign-extended from 32 bits by (u << 32) >> 32)
    element width 8:             K = 1, each row gives two words, lo = (x << 32) >> 32 and hi = x >> 32

Elements past the end load as 0: exactly the zero padding of the definition (a byte length that is not a
multiple of 4), and they are masked out of the statistics. A tile holds a whole number of words that
divides BLOCK, so its words share one block b and one factor V[b]: S += w * W[c] * V[b] per word, in
int64 arithmetic. The statistics decode the same integers (bitcast to the float type; bf16 as its bits
shifted into a float32; integers and bools converted) into float64 and accumulate sum, sum of squares,
min, max of the finite values and the NaN and Inf counts. Each program writes one partial row; the second
kernel (`_reduce`, one program) combines the rows into the handle; with a single program the first kernel
writes the handle itself (one launch for a small tensor: up to SINGLE_PROGRAM_TILES tiles). A view that starts at any byte offset needs no
copy: every load is of whole elements.

What the bit-identity with numpy relies on (both on the GPU and in Triton's interpreter, TRITON_INTERPRET=1,
which runs the kernels with numpy arrays):
- int64 multiplication and addition, and tl.sum of int64, wrap mod 2**64 (LLVM's mul/add without nsw
  flags on the GPU; numpy's int64 arrays, which wrap without an error, in the interpreter), so the
  signed products equal the uint64 ones of the definition bit for bit, and the order of the sums does
  not matter;
- >> of a signed integer is an arithmetic shift (ashr; numpy's right_shift on signed arrays), << of int64
  drops the high bits;
- .to(tl.int64) of int8/int16/int32 sign-extends; & with a constant masks the two's complement bits;
- masked loads with other=0 read zeros.
The float statistics are float64 sums in another order than numpy's: equal up to the last bits.
"""

from __future__ import annotations

import os
from typing import Any

from harness.capture import fast_hash

# Tuned on the H200 (torch 2.11, triton 3.6) on a bf16 [4096, 11008] and an fp32 [4096, 4096] tensor:
# 1024 elements, 8 warps, ~8 programs per multiprocessor read ~680 and ~580 GB/s (2048 elements: ~400 and ~570;
# 4096 and more spill). A launch costs ~27 us of CPU there, which is why small tensors get one program.
TILE_ELEMENTS = 1024  # elements per tile: 256 to 2048 words, a divisor of BLOCK (65536) for every width
MAX_PROGRAMS = 1056  # programs of the first kernel at most (the partial rows the second one combines)
SINGLE_PROGRAM_TILES = 8  # up to this many tiles: one program, one launch (it writes the handle itself)
NUM_WARPS = 8

triton: Any = None  # the modules, imported by _kernels() (lazily: CPU-only installs have no triton)
tl: Any = None
_KERNELS: dict[str, Any] = {}
_IMPORT_FAILED: list[bool] = []


def _kernels() -> dict[str, Any]:
    """The two jitted kernels (triton imported on first use); ImportError when triton is not installed."""
    global triton, tl
    if _KERNELS:
        return _KERNELS
    import triton as triton_module
    import triton.language as language

    triton, tl = triton_module, language

    @triton.jit(do_not_specialize=["n", "n_tiles"])
    def _partials(src, weights, factors, out_f, out_i, n, n_tiles, WIDTH: tl.constexpr, K: tl.constexpr,
                  ROWS: tl.constexpr, KIND: tl.constexpr, BLOCK_WORDS: tl.constexpr, FINAL: tl.constexpr):
        # KIND: 0 integer or bool (signed), 1 IEEE float of the width (fp16, fp32, fp64), 2 bfloat16
        pid = tl.program_id(0).to(tl.int64)
        programs = tl.num_programs(0)
        rows = tl.arange(0, ROWS)
        cols = tl.arange(0, K)
        inner = rows[:, None] * K + cols[None, :]  # [ROWS, K]: the element's index in its tile
        acc_s = tl.zeros([ROWS], dtype=tl.int64)
        acc_sum = tl.zeros([ROWS, K], dtype=tl.float64)
        acc_sq = tl.zeros([ROWS, K], dtype=tl.float64)
        acc_min = tl.full([ROWS, K], float("inf"), dtype=tl.float64)
        acc_max = tl.full([ROWS, K], float("-inf"), dtype=tl.float64)
        acc_nan = tl.zeros([ROWS, K], dtype=tl.int32)
        acc_inf = tl.zeros([ROWS, K], dtype=tl.int32)
        for t in range(pid, n_tiles, programs):
            start = t * (ROWS * K)  # int64: the tile's first element
            index = start + inner
            valid = index < n
            x = tl.load(src + index, mask=valid, other=0)
            word0 = start * WIDTH // 4  # the tile's first word; its words all lie in block word0 // BLOCK_WORDS
            c0 = word0 % BLOCK_WORDS
            factor = tl.load(factors + word0 // BLOCK_WORDS)
            if WIDTH == 8:
                value = tl.sum(x, axis=1)  # K == 1
                low = (value << 32) >> 32
                high = value >> 32
                acc_s += (low * tl.load(weights + c0 + 2 * rows) + high * tl.load(weights + c0 + 2 * rows + 1)) * factor
            else:
                shifts = (cols * (8 * WIDTH)).to(tl.int64)
                unsigned = tl.sum((x.to(tl.int64) & ((1 << (8 * WIDTH)) - 1)) << shifts[None, :], axis=1)
                word = (unsigned << 32) >> 32
                acc_s += word * tl.load(weights + c0 + rows) * factor
            if KIND == 2:
                v = ((x.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True).to(tl.float64)
            elif KIND == 1:
                if WIDTH == 2:
                    v = x.to(tl.float16, bitcast=True).to(tl.float32).to(tl.float64)
                elif WIDTH == 4:
                    v = x.to(tl.float32, bitcast=True).to(tl.float64)
                else:
                    v = x.to(tl.float64, bitcast=True)
            else:
                v = x.to(tl.float64)
            if KIND == 0:
                finite = valid
            else:
                finite = valid & ((v - v) == 0)  # inf - inf and NaN - NaN are NaN
                acc_nan += (valid & (v != v)).to(tl.int32)
                acc_inf += (valid & (v == v) & ((v - v) != 0)).to(tl.int32)
            kept = tl.where(finite, v, 0.0)
            acc_sum += kept
            acc_sq += kept * kept
            acc_min = tl.minimum(acc_min, tl.where(finite, v, float("inf")))
            acc_max = tl.maximum(acc_max, tl.where(finite, v, float("-inf")))
        s = tl.sum(acc_s, axis=0)
        total = tl.sum(tl.sum(acc_sum, axis=1), axis=0)
        squares = tl.sum(tl.sum(acc_sq, axis=1), axis=0)
        low_value = tl.min(tl.min(acc_min, axis=1), axis=0)
        high_value = tl.max(tl.max(acc_max, axis=1), axis=0)
        nan = tl.sum(tl.sum(acc_nan.to(tl.int64), axis=1), axis=0)
        inf = tl.sum(tl.sum(acc_inf.to(tl.int64), axis=1), axis=0)
        if FINAL:  # one program: the handle (SLOTS) itself
            tl.store(out_f + 0, total)
            tl.store(out_f + 1, squares)
            tl.store(out_f + 2, low_value)
            tl.store(out_f + 3, high_value)
            tl.store(out_f + 4, n.to(tl.float64))
            tl.store(out_f + 5, nan.to(tl.float64))
            tl.store(out_f + 6, inf.to(tl.float64))
            tl.store(out_f + 7, s.to(tl.float64, bitcast=True))
        else:  # partial rows: out_f [4, programs] float64, out_i [3, programs] int64
            tl.store(out_f + pid, total)
            tl.store(out_f + programs + pid, squares)
            tl.store(out_f + 2 * programs + pid, low_value)
            tl.store(out_f + 3 * programs + pid, high_value)
            tl.store(out_i + pid, s)
            tl.store(out_i + programs + pid, nan)
            tl.store(out_i + 2 * programs + pid, inf)

    @triton.jit(do_not_specialize=["programs", "n"])
    def _reduce(part_f, part_i, out, programs, n, P: tl.constexpr):
        i = tl.arange(0, P)
        used = i < programs
        tl.store(out + 0, tl.sum(tl.load(part_f + i, mask=used, other=0.0), axis=0))
        tl.store(out + 1, tl.sum(tl.load(part_f + programs + i, mask=used, other=0.0), axis=0))
        tl.store(out + 2, tl.min(tl.load(part_f + 2 * programs + i, mask=used, other=float("inf")), axis=0))
        tl.store(out + 3, tl.max(tl.load(part_f + 3 * programs + i, mask=used, other=float("-inf")), axis=0))
        tl.store(out + 4, n.to(tl.float64))
        tl.store(out + 5, tl.sum(tl.load(part_i + programs + i, mask=used, other=0), axis=0).to(tl.float64))
        tl.store(out + 6, tl.sum(tl.load(part_i + 2 * programs + i, mask=used, other=0), axis=0).to(tl.float64))
        tl.store(out + 7, tl.sum(tl.load(part_i + i, mask=used, other=0), axis=0).to(tl.float64, bitcast=True))

    _KERNELS.update(partials=_partials, reduce=_reduce)
    return _KERNELS


def importable() -> bool:
    """Whether triton can be imported (tried once)."""
    if _KERNELS:
        return True
    if not _IMPORT_FAILED:
        try:
            _kernels()
        except Exception:  # not installed, or broken: the torch-ops path is used
            _IMPORT_FAILED.append(True)
    return bool(_KERNELS)


def available(tensor: Any) -> bool:
    """Whether `fused_device_digest` can digest this tensor: a CUDA tensor, triton importable."""
    return getattr(tensor, "is_cuda", False) and importable()


def _layout(tensor) -> tuple[Any, int]:
    """The integer dtype of the element's width that the kernels read, and KIND (see _partials)."""
    import torch

    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    if tensor.dtype == torch.bfloat16:
        return ints[2], 2
    if tensor.dtype in (torch.float16, torch.float32, torch.float64):
        return ints[tensor.element_size()], 1
    if tensor.dtype == torch.bool or (not tensor.is_floating_point() and not tensor.is_complex()
                                      and tensor.dtype.is_signed):
        return ints[tensor.element_size()], 0
    raise ValueError(f"unsupported dtype {tensor.dtype}")


def fused_device_digest(tensor) -> Any:
    """The handle of harness.frameworks.torch `device_digest` (fast_hash.SLOTS as float64 on the tensor's
    device), computed by the Triton kernels: no temporary larger than the partial rows (a non-contiguous
    tensor is made contiguous first, as C-order bytes need). ValueError for a dtype the kernels do not read
    (unsigned integers other than bool, complex, float8)."""
    import torch

    from harness.frameworks.torch import _table

    kernels = _kernels()
    int_dtype, kind = _layout(tensor)
    flat = tensor.detach().contiguous().reshape(-1)
    n = flat.numel()
    if n == 0:
        return torch.zeros(len(fast_hash.SLOTS), dtype=torch.float64, device=flat.device)
    handle = torch.empty(len(fast_hash.SLOTS), dtype=torch.float64, device=flat.device)
    width = flat.element_size()
    ints = flat.view(int_dtype)
    k = 1 if width == 8 else 4 // width
    rows = TILE_ELEMENTS // k
    n_tiles = -(-n // TILE_ELEMENTS)
    programs = 1 if n_tiles <= SINGLE_PROGRAM_TILES else min(n_tiles, MAX_PROGRAMS)
    weights = _table(flat.device, "W", fast_hash.BLOCK)
    factors = _table(flat.device, "V", fast_hash.blocks_of(n * width))
    meta = dict(WIDTH=width, K=k, ROWS=rows, KIND=kind, BLOCK_WORDS=fast_hash.BLOCK, num_warps=NUM_WARPS)
    if programs == 1:
        kernels["partials"][(1,)](ints, weights, factors, handle, handle, n, n_tiles, FINAL=True, **meta)
        return handle
    part_f = torch.empty(4 * programs, dtype=torch.float64, device=flat.device)
    part_i = torch.empty(3 * programs, dtype=torch.int64, device=flat.device)
    kernels["partials"][(programs,)](ints, weights, factors, part_f, part_i, n, n_tiles, FINAL=False, **meta)
    kernels["reduce"][(1,)](part_f, part_i, handle, programs, n, P=max(triton.next_power_of_2(programs), 2))
    return handle


def kernel_choice() -> str:
    """XFALIGN_FAST_DIGEST_KERNEL: "torch" forces the torch-ops path, anything else (or unset) lets CUDA
    tensors take the Triton kernels where triton is importable."""
    return os.environ.get("XFALIGN_FAST_DIGEST_KERNEL", "auto").strip().lower() or "auto"
