"""The fast digest of a CUDA tensor (harness.capture.fast_hash: S, the fast64 block sum, and the SLOTS
statistics) by Triton kernels that read the tensor once, instead of the ~15 torch ops of
harness.frameworks.torch `block_sum` / `device_digest`, which make full-size float64 and int64 temporaries.

Two versions. `fused_device_digest` (the default; kernel `_digest`, "v2") and `fused_device_digest_v1`
(kernels `_partials` and `_reduce`, XFALIGN_FAST_DIGEST_KERNEL=fused-v1, kept as a fallback) return the same
handle, bit for bit.

v2. The bytes are read as int32 words (units; 8-byte dtypes as int64 units, two words each), never at the
element's width: a tile is ROWS blocks x LANES units, one column range [c0, c0 + LANES) of ROWS consecutive
blocks, so each thread loads ROWS x 16 bytes per tile. S is summed by columns,
S = sum_c W[c] * (sum_b V[b] * w[b, c]) (the same ring identity mod 2**64 as the definition's order): per
tile, the ROWS words of a column times their V[b] are added within the thread, then times W[c] (LANES
table reads per tile, not one per word). The elements come from the word's bits: bf16 as (word << 16) and
(word & 0xFFFF0000) read as float32, fp16 from the 16-bit halves, bytes and shorts by shifts (arithmetic for
signed ones); min and max in float32 where that is exact (every dtype of <= 2 bytes, fp32), sums in float64.
The accumulators are one row of LANES per program, reduced once at the end. Tiles of ROWS whole blocks
(phase 0) load without masks (vectorised); the rest, at most ROWS blocks (phase 1), loads masked, and a last
word with 1 to 3 bytes of the tensor is read byte by byte. A tensor whose memory does not start on a 4-byte
boundary is copied first. Programs: at most PROGRAMS_PER_SM per multiprocessor, in a grid-stride loop over
the tiles, writing partial rows that `_reduce` combines; up to SINGLE_PROGRAM_TILES_V2 tiles, one program
writes the handle itself (one launch). The interpreter-checked operations are those listed below.

v1, as first written:

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
- (v2) << of int32 drops the high bits; .to(tl.int32) of int64 and .to(tl.int16) of int32 keep the low
  bits (trunc; numpy's astype); .to(tl.float32, bitcast=True) of int32 reinterprets the bits;
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

# `_digest` (the default path): a tile is ROWS blocks x LANES units (LANES = 16 bytes per thread x 32 x WARPS
# units: 512 int32 words for 4 warps), one column of ROWS blocks, so that each thread loads ROWS x 16 bytes
# per tile (vectorised: no masks outside the last ROWS blocks) and keeps accumulators of one row only.
# Programs: as many per multiprocessor as can be resident at once (from the compiled kernel's registers:
# ptxas of triton 3.7 for sm_90a gives the bf16 kernel 168 registers with ROWS 8, 111 with 4, 96 with 2, so
# 3, 4 and 5 programs of 4 warps), at most PROGRAMS_PER_SM, FIRST_PROGRAMS_PER_SM before a variant has run
# once (MAX_PROGRAMS_V2 instead, when set); tiles in a grid-stride loop: programs that cannot be resident
# would run after the others, doubling the time. Up to SINGLE_PROGRAM_TILES_V2 tiles: one program, one launch.
ROWS = 8
WARPS = 4
PROGRAMS_PER_SM = 8
FIRST_PROGRAMS_PER_SM = 2
MAX_PROGRAMS_V2: int | None = None
SINGLE_PROGRAM_TILES_V2 = 4
_RESIDENT: dict[tuple, int] = {}  # (device, meta of a compiled `_digest`) -> programs resident per multiprocessor

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

    @triton.jit(do_not_specialize=["n", "n_full", "n_blocks", "nbytes", "groups", "full_tiles", "tail_tiles", "chunks"])
    def _digest(units, raw, weights, factors, out_f, out_i, n, n_full, n_blocks, nbytes, groups, full_tiles,
                tail_tiles, chunks, WIDTH: tl.constexpr, KIND: tl.constexpr, EPU: tl.constexpr,
                VALUE64: tl.constexpr, IS_FLOAT: tl.constexpr, ROWS: tl.constexpr, LANES: tl.constexpr,
                UNITS_PER_BLOCK: tl.constexpr, PARTIAL: tl.constexpr, FINAL: tl.constexpr):
        # The second kernel (the default "fused" path; see the module's note, "v2"). KIND: 0 signed integer,
        # 1 IEEE float (fp16, fp32, fp64), 2 bfloat16, 3 bool, 4 unsigned integer. A unit is an int32 word
        # (WIDTH <= 4: EPU = 4 // WIDTH elements) or an int64 element (WIDTH 8, two words).
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        rows = tl.arange(0, ROWS)
        cols = tl.arange(0, LANES)
        offs = rows[:, None] * UNITS_PER_BLOCK + cols[None, :]  # int32 [ROWS, LANES]: a column of ROWS blocks
        one = tl.arange(0, 1)
        offs_one = one[:, None] * UNITS_PER_BLOCK + cols[None, :]  # int32 [1, LANES]: the masked tiles' row
        acc_s = tl.zeros([LANES], dtype=tl.int64)
        acc_sum = tl.zeros([LANES], dtype=tl.float64)
        acc_sq = tl.zeros([LANES], dtype=tl.float64)
        if VALUE64:
            acc_min = tl.full([LANES], float("inf"), dtype=tl.float64)
            acc_max = tl.full([LANES], float("-inf"), dtype=tl.float64)
        else:
            acc_min = tl.full([LANES], float("inf"), dtype=tl.float32)
            acc_max = tl.full([LANES], float("-inf"), dtype=tl.float32)
        acc_nan = tl.zeros([LANES], dtype=tl.int32)
        acc_bad = tl.zeros([LANES], dtype=tl.int32)  # NaN or Inf
        for phase in tl.static_range(2):  # 0: tiles of ROWS whole blocks, no masks; 1: the rest, masked, by rows
            if phase == 0:
                stop = full_tiles
            else:
                stop = tail_tiles
            for t in range(pid, stop, programs):
                if phase == 0:  # tile t: chunk t % chunks of the ROWS blocks of group t // chunks
                    group = t // chunks
                    chunk = t - group * chunks
                    block0 = group.to(tl.int64) * ROWS
                    base = block0 * UNITS_PER_BLOCK + (chunk * LANES).to(tl.int64)  # int64: the tile's first unit
                    x = tl.load(units + base + offs)
                    fac = tl.load(factors + block0 + rows)
                else:  # tile t: one row, units [start + t * LANES, + LANES) after the groups (start: a block's)
                    base = groups.to(tl.int64) * (ROWS * UNITS_PER_BLOCK) + tl.cast(t * LANES, tl.int64)
                    block0 = base // UNITS_PER_BLOCK
                    chunk = ((base - block0 * UNITS_PER_BLOCK) // LANES).to(tl.int32)
                    index = base + offs_one.to(tl.int64)  # [1, LANES] int64
                    x = tl.load(units + index, mask=index < n_full.to(tl.int64), other=0)
                    fac = tl.load(factors + block0 + one)  # [1]: the tile starts before the end, in block block0
                    if PARTIAL:  # the last word holds 1 to 3 bytes of the tensor: read those bytes alone
                        at = n_full.to(tl.int64) * 4
                        k4 = tl.arange(0, 4)
                        b4 = tl.load(raw + at + k4, mask=(at + k4.to(tl.int64)) < nbytes.to(tl.int64), other=0)
                        word = tl.sum((b4.to(tl.int64) & 255) << (k4.to(tl.int64) * 8), axis=0).to(tl.int32)
                        x = tl.where(index == n_full.to(tl.int64), word, x)
                # S: the words of column c summed over the blocks b of the tile with V[b], then times W[c]
                if WIDTH == 8:
                    low = (x << 32) >> 32
                    high = x >> 32
                    w_low = tl.load(weights + 2 * (chunk * LANES + cols))
                    w_high = tl.load(weights + 2 * (chunk * LANES + cols) + 1)
                    acc_s += tl.sum(low * fac[:, None], axis=0) * w_low + tl.sum(high * fac[:, None], axis=0) * w_high
                else:
                    w_c = tl.load(weights + chunk * LANES + cols)
                    acc_s += tl.sum(x.to(tl.int64) * fac[:, None], axis=0) * w_c
                for k in tl.static_range(EPU):  # the statistics, element k of each unit
                    if KIND == 2:  # bf16: the 16 bits as the high half of a float32
                        if k == 0:
                            v = (x << 16).to(tl.float32, bitcast=True)
                        else:
                            v = (x & -65536).to(tl.float32, bitcast=True)
                    elif KIND == 1:
                        if WIDTH == 2:
                            if k == 0:
                                v = x.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
                            else:
                                v = (x >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
                        elif WIDTH == 4:
                            v = x.to(tl.float32, bitcast=True)
                        else:
                            v = x.to(tl.float64, bitcast=True)
                    elif KIND == 3:  # bool: a byte, nonzero is True
                        v = (((x >> (8 * k)) & 255) != 0).to(tl.float32)
                    elif KIND == 4:  # unsigned
                        if WIDTH == 1:
                            v = ((x >> (8 * k)) & 255).to(tl.float32)
                        elif WIDTH == 2:
                            v = ((x >> (16 * k)) & 65535).to(tl.float32)
                        else:
                            v = (x.to(tl.int64) & 4294967295).to(tl.float64)
                    else:  # signed: sign-extended by an arithmetic shift
                        if WIDTH == 1:
                            v = ((x << (24 - 8 * k)) >> 24).to(tl.float32)
                        elif WIDTH == 2:
                            v = ((x << (16 - 16 * k)) >> 16).to(tl.float32)
                        else:
                            v = x.to(tl.float64)
                    if phase == 1:
                        valid = (index * EPU + k) < n.to(tl.int64)
                    if IS_FLOAT:
                        d = v - v  # 0 for finite values, NaN for Inf and NaN
                        finite = d == 0
                        acc_nan += tl.sum((v != v).to(tl.int32), axis=0)
                        acc_bad += tl.sum((d != 0).to(tl.int32), axis=0)
                        kept = tl.where(finite, v, 0.0)
                        if phase == 1:
                            finite = finite & valid
                        low_in = tl.where(finite, v, float("inf"))
                        high_in = tl.where(finite, v, float("-inf"))
                    else:
                        kept = v
                        if phase == 1:
                            low_in = tl.where(valid, v, float("inf"))
                            high_in = tl.where(valid, v, float("-inf"))
                        else:
                            low_in = v
                            high_in = v
                    acc_min = tl.minimum(acc_min, tl.min(low_in, axis=0))
                    acc_max = tl.maximum(acc_max, tl.max(high_in, axis=0))
                    kept64 = kept.to(tl.float64)
                    acc_sum += tl.sum(kept64, axis=0)
                    acc_sq += tl.sum(kept64 * kept64, axis=0)
        s = tl.sum(acc_s, axis=0)
        total = tl.sum(acc_sum, axis=0)
        squares = tl.sum(acc_sq, axis=0)
        low_value = tl.min(acc_min, axis=0).to(tl.float64)
        high_value = tl.max(acc_max, axis=0).to(tl.float64)
        nan = tl.sum(acc_nan.to(tl.int64), axis=0)
        inf = tl.sum(acc_bad.to(tl.int64), axis=0) - nan
        if FINAL:  # one program: the handle (SLOTS) itself
            tl.store(out_f + 0, total)
            tl.store(out_f + 1, squares)
            tl.store(out_f + 2, low_value)
            tl.store(out_f + 3, high_value)
            tl.store(out_f + 4, n.to(tl.float64))
            tl.store(out_f + 5, nan.to(tl.float64))
            tl.store(out_f + 6, inf.to(tl.float64))
            tl.store(out_f + 7, s.to(tl.float64, bitcast=True))
        else:  # partial rows, as _partials writes them (combined by _reduce)
            tl.store(out_f + pid, total)
            tl.store(out_f + programs + pid, squares)
            tl.store(out_f + 2 * programs + pid, low_value)
            tl.store(out_f + 3 * programs + pid, high_value)
            tl.store(out_i + pid, s)
            tl.store(out_i + programs + pid, nan)
            tl.store(out_i + 2 * programs + pid, inf)

    _KERNELS.update(partials=_partials, reduce=_reduce, digest=_digest)
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


def fused_device_digest_v1(tensor) -> Any:
    """The handle of harness.frameworks.torch `device_digest` (fast_hash.SLOTS as float64 on the tensor's
    device), computed by the first kernels (`_partials`, `_reduce`; XFALIGN_FAST_DIGEST_KERNEL=fused-v1): no
    temporary larger than the partial rows (a non-contiguous tensor is made contiguous first, as C-order bytes
    need). ValueError for a dtype the kernels do not read
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


def _v2_layout(tensor) -> tuple[int, bool, bool] | None:
    """KIND of `_digest` (see there), whether its values are float64 (else float32, exact for the dtype),
    whether it is a float; None: a dtype `_digest` does not read (complex, float8, uint64)."""
    import torch

    width = tensor.element_size()
    if tensor.dtype == torch.bfloat16:
        return 2, False, True
    if tensor.dtype in (torch.float16, torch.float32, torch.float64):
        return 1, width == 8, True
    if tensor.dtype == torch.bool:
        return 3, False, False
    if tensor.is_floating_point() or tensor.is_complex() or width not in (1, 2, 4, 8):
        return None
    if tensor.dtype.is_signed:
        return 0, width >= 4, False
    return (4, width == 4, False) if width <= 4 else None


def supports(tensor) -> bool:
    """Whether `fused_device_digest` reads this tensor's dtype."""
    return _v2_layout(tensor) is not None


_SM_COUNT: dict[str, int] = {}


def _multiprocessors(device) -> int:
    import torch

    key = str(device)
    if key not in _SM_COUNT:
        _SM_COUNT[key] = torch.cuda.get_device_properties(device).multi_processor_count \
            if getattr(device, "type", "") == "cuda" else 132
    return _SM_COUNT[key]


def plan(nbytes: int, width: int, rows: int | None = None, warps: int | None = None) -> dict[str, int]:
    """The grid of `_digest` for a tensor of `nbytes` bytes of `width`-byte elements: units (int32 words, or
    the int64 elements of 8-byte dtypes), LANES units per tile row (16 bytes per thread of the warps), the
    chunks of LANES units a block has, the full groups of ROWS whole blocks, the tiles of those (ROWS x LANES,
    no masks) and the masked tiles of the rest (1 x LANES; the rest is less than ROWS + 1 blocks)."""
    rows = ROWS if rows is None else rows
    warps = WARPS if warps is None else warps
    unit = 8 if width == 8 else 4
    per_block = fast_hash.BLOCK * 4 // unit
    lanes = (16 // unit) * 32 * warps
    assert per_block % lanes == 0, (per_block, lanes)
    chunks = per_block // lanes
    n_full = nbytes // unit  # whole units
    n_units = -(-nbytes // unit)
    groups = n_full // per_block // rows
    tail_tiles = -(-(n_units - groups * rows * per_block) // lanes)  # tiles of one row of LANES units
    return dict(unit=unit, per_block=per_block, lanes=lanes, chunks=chunks, n_full=n_full, groups=groups,
                full_tiles=groups * chunks, tail_tiles=tail_tiles, rows=rows, warps=warps)


def _resident(compiled: Any, warps: int) -> int | None:
    """Programs of `warps` warps that a multiprocessor of compute capability 8.0 to 9.0 holds at once (65536
    registers, allocated per warp in units of 256; 64 warps; 32 programs), by the compiled kernel's
    registers per thread (known once it has run); None when unknown (the interpreter)."""
    regs = getattr(compiled, "n_regs", None)
    if not isinstance(regs, int) or regs <= 0:
        return None
    per_warp = -(-regs * 32 // 256) * 256
    return max(1, min(65536 // (per_warp * warps), 64 // warps, 32))


def fused_device_digest(tensor) -> Any:
    """The handle of harness.frameworks.torch `device_digest` (fast_hash.SLOTS as float64 on the tensor's
    device), computed by `_digest` (the default fused path): one launch when the tensor has at most
    SINGLE_PROGRAM_TILES_V2 tiles, else one of min(tiles, the programs resident at once) programs and
    `_reduce`. The tensor's bytes are read as int32 words (int64 for 8-byte dtypes) in place; a
    non-contiguous tensor is made contiguous first, and one whose memory does not start on a 4-byte boundary
    is copied (the views at byte offsets 1 to 3 of 1- and 2-byte dtypes). ValueError for a dtype it does not
    read (complex, float8, uint64: `supports`)."""
    import torch

    from harness.frameworks.torch import _table

    kernels = _kernels()
    layout = _v2_layout(tensor)
    if layout is None:
        raise ValueError(f"unsupported dtype {tensor.dtype}")
    kind, value64, is_float = layout
    flat = tensor.detach().contiguous().reshape(-1)
    n = flat.numel()
    if n == 0:
        return torch.zeros(len(fast_hash.SLOTS), dtype=torch.float64, device=flat.device)
    width = flat.element_size()
    nbytes = n * width
    raw = flat.view(torch.uint8)
    if raw.data_ptr() % 4 or raw.storage_offset() % 4:  # int32 words need 4-byte aligned memory
        flat = flat.clone()
        raw = flat.view(torch.uint8)
    grid = plan(nbytes, width)
    units = flat.view(torch.int64) if width == 8 else raw[:grid["n_full"] * 4].view(torch.int32)
    weights = _table(flat.device, "W", fast_hash.BLOCK)
    blocks = fast_hash.blocks_of(nbytes)
    factors = _table(flat.device, "V", blocks)
    handle = torch.empty(len(fast_hash.SLOTS), dtype=torch.float64, device=flat.device)
    args = (n, grid["n_full"], blocks, nbytes, grid["groups"], grid["full_tiles"], grid["tail_tiles"], grid["chunks"])
    meta = dict(WIDTH=width, KIND=kind, EPU=1 if width == 8 else 4 // width, VALUE64=value64, IS_FLOAT=is_float,
                ROWS=grid["rows"], LANES=grid["lanes"], UNITS_PER_BLOCK=grid["per_block"],
                PARTIAL=width < 4 and nbytes % 4 != 0, num_warps=grid["warps"])
    raw_signed = raw.view(torch.int8)
    key = (str(flat.device), *sorted(meta.items()))
    cap = MAX_PROGRAMS_V2 or min(PROGRAMS_PER_SM, _RESIDENT.get(key, FIRST_PROGRAMS_PER_SM)) * _multiprocessors(flat.device)
    tiles = grid["full_tiles"] + grid["tail_tiles"]
    programs = 1 if tiles <= SINGLE_PROGRAM_TILES_V2 else max(1, min(tiles, cap))
    if programs == 1:
        kernels["digest"][(1,)](units, raw_signed, weights, factors, handle, handle, *args, FINAL=True, **meta)
        return handle
    part_f = torch.empty(4 * programs, dtype=torch.float64, device=flat.device)
    part_i = torch.empty(3 * programs, dtype=torch.int64, device=flat.device)
    compiled = kernels["digest"][(programs,)](units, raw_signed, weights, factors, part_f, part_i, *args, FINAL=False,
                                              **meta)
    resident = _resident(compiled, grid["warps"])
    if resident:
        _RESIDENT[key] = resident
    kernels["reduce"][(1,)](part_f, part_i, handle, programs, n, P=max(triton.next_power_of_2(programs), 2))
    return handle


def kernel_choice() -> str:
    """XFALIGN_FAST_DIGEST_KERNEL: "torch" forces the torch-ops path, "fused-v1" the first Triton kernels
    (`fused_device_digest_v1`), anything else (or unset: "auto") the default `fused_device_digest` where
    triton is importable and the dtype is read by it (else the torch ops)."""
    return os.environ.get("XFALIGN_FAST_DIGEST_KERNEL", "auto").strip().lower() or "auto"
