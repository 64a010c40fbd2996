"""The fast digest of a CUDA tensor (harness.store.fast_hash: S, the fast64 block sum, and the SLOTS
statistics) by one Triton kernel, `digest` (harness.frameworks.triton_kernels), that reads the tensor once,
instead of the ~15 torch ops of harness.frameworks.torch `block_sum` / `device_digest`, which make full-size
float64 and int64 temporaries.

`fused_device_digest(tensor)` returns the same handle as the torch ops: a float64 tensor of fast_hash.SLOTS on
the tensor's device (sum, sum of squares, min, max of the finite values, the element count, the NaN and Inf
counts, S as the float64 whose bits are its uint64), so that PendingDigest.settle reads either alike. No
synchronisation: the kernel runs in the current stream's order. One launch per large tensor, one per dtype for a
step's small ones ("Small tensors" below): a launch costs tens of microseconds of CPU, and a capture digests
every input, output and gradient of a step, so the CPU work per tensor decides what a capture costs where the
step's CPU work is on its critical path.

How it works. The bytes are read as int32 words (units; 8-byte dtypes as int64 units, two words each),
never at the element's width: a tile is ROWS blocks x LANES units, one column range [c0, c0 + LANES) of ROWS
consecutive blocks, so each thread loads ROWS x 16 bytes per tile. S is summed by columns,
S = sum_c W[c] * (sum_b V[b] * w[b, c]) (the same ring identity mod 2**64 as the definition's order): per
tile, the ROWS words of a column times their V[b] are added within the thread, then times W[c] (LANES
table reads per tile, not one per word). The elements come from the word's bits: bf16 as (word << 16) and
(word & 0xFFFF0000) read as float32, fp16 from the 16-bit halves, bytes and shorts by shifts (arithmetic for
signed ones); min and max in float32 where that is exact (every dtype of <= 2 bytes, fp32), sums in float64 (for
2-byte floats, a column's ROWS values summed in float32 first: fast_hash.stats_tolerance). Each word's product with
V[b] is a widening signed 32 x 32-bit multiply and a 32-bit one (V's int32 halves), not a 64 x 64-bit one.
The accumulators are one row of LANES per program, reduced once at the end. A float tensor's statistics are
first taken without the NaN/Inf tests and masks (min, max, the sums: a third of the work per element); where
a program's float64 sum comes out NaN or Inf, it takes its tiles again carefully, statistics only. Tiles of ROWS whole blocks
(phase 0) load without masks (vectorised); the rest, at most ROWS blocks (phase 1), loads masked, and a last
word with 1 to 3 bytes of the tensor is read byte by byte. A tensor whose memory does not start on a 4-byte
boundary is copied first. Programs: at most PROGRAMS_PER_SM per multiprocessor (as many as can be resident),
in a grid-stride loop over the tiles; up to SINGLE_PROGRAM_TILES tiles, one program. Each program writes
its row of partials into the output buffer and counts its arrival with an atomic add; the program that
arrives last combines the rows into the handle (no second kernel).

The output buffer (float64, not zeroed): [0, 8) the handle, then the partial rows, 4 x programs float64 (sum,
squares, min, max) and 3 x programs int64 (S, NaN, NaN-or-Inf). The arrival counter is one of a ring kept per
device (`_next_counter`), which the last program sets back to zero.

Small tensors. A launch costs the CPU tens of microseconds (Triton's launcher, the plan, the output buffer),
whatever the tensor's size, and a step has many small tensors (biases, norms' weights, small activations, their
gradients). So a tensor of at most group_bytes() (GROUP_BYTES, XFALIGN_DIGEST_GROUP_BYTES; 0 turns grouping off;
read with XFALIGN_FAST_DIGEST_KERNEL once per step: `route`) is not digested at once: `grouped_device_digest`
copies it, in the current stream's order, into the next 16-byte aligned segment of an arena kept per device,
stream and dtype (a `Group`), and returns a GroupSlot, its row of the group's handles. The copy is one
cudaMemcpyAsync of the runtime torch loaded, called through ctypes (torch's copy_ costs ~5 us more CPU per
tensor); torch's copy_ where the tensor is not contiguous or not on the current device. At the step's end,
harness.frameworks.torch `fetch_digests` calls `launch_groups`: one `grouped_digest` launch per group, the
groups of a device together (their tables in one pinned buffer, one transfer, the arrival counters in it: no
zeroing; their handles in one block, moved to the host with the other digests). A program does an item,
ITEM_TILES tiles of one segment (a segment of k items is `digest`'s grid of k programs on that tensor alone:
its position weights restart at the segment's start, so its S is its tensor's); it finds its segment among
the table's first items (SEARCH at a time), and the segment's last program to arrive combines its rows. The
statistics' sums are split into programs otherwise than by the ungrouped kernel, so they may differ from its in
the last bits (fast_hash.stats_tolerance); S, min, max and the counts are the same. An arena that fills is
launched at once and the key's next one is twice as large (up to MAX_ARENA_BYTES); arenas come from torch's
caching allocator and go back to it after their launch (reused, in stream order, by the next step's). A group
filled on one stream and launched on another: the launching stream waits for the filling one.
Why a copy, not a table of the tensors' own addresses read at the step's end: between the hook and the step's
end a tensor may be changed in place (an activation by an in-place op, a parameter by the optimizer, a
gradient by accumulation, often by kernels that write through raw pointers: NCCL, fused optimizers, wgrad
accumulation, which bump no version counter) or freed and its memory reused; the copy keeps the digest that of
the tensor at the hook, as the ungrouped kernel's stream-ordered read does.
Measured (2026-12-03 22:02-22:03 UTC, one H200 of a virtual machine, driver 580.159.04, torch 2.11.0+cu130, Triton
3.6.0, the code of 75e4d7a; scripts/check_fast_digest.py, two runs, medians over 40 steps): a step of 100 small
tensors (15.8 MiB: bf16, fp32, int64, 5 not contiguous) costs 14.9 and 16.0 us of CPU per tensor grouped one by one
(device_digest each, then fetch_digests) against 21.1 and 21.8 with a launch each, and 0.26-0.28 ms of GPU per step
against 0.60-0.62; digested together (harness.frameworks.triton_batch, as a step's parameters, gradients and
optimizer states are) 4.7 and 7.0 us, 6.8 and 9.2 at new addresses. One by one, the copy is per tensor because
device_digest cannot know when the hook that calls it ends. In a training step a hook's call costs several times
what it does in such a loop: docs/capture-guide.md has the figures and the earlier ones.
GROUP_BYTES was chosen from 32 bf16 tensors per step (2026-12-02, the same H200, scripts/bench_digest_kernel.py
--grouped, by edc1ce8, whose kernels have changed since), GPU per tensor grouped vs one launch each (medians of 3 and of 5 rounds in
two runs alike, ranges within 0.5 us): 1 MiB 5.1 vs 10.8 us, 4 MiB 8.2 vs 9.8, 16 MiB 23.7 vs 15.7 (grouped, the copy
and the masked loads of `tile_pass`'s rest cost more than they save); their CPU figures then predate 75e4d7a.

What the bit-identity with numpy relies on (both on the GPU and in Triton's interpreter, TRITON_INTERPRET=1,
which runs the kernels with numpy arrays):
- int64 multiplication and addition, and tl.sum of int64, wrap mod 2**64 (LLVM's mul/add without nsw
  flags on the GPU; numpy's int64 arrays, which wrap without an error, in the interpreter), so the
  signed products equal the uint64 ones of the definition bit for bit, and the order of the sums does
  not matter;
- >> of a signed integer is an arithmetic shift (ashr; numpy's right_shift on signed arrays), << of int64
  and of int32 drops the high bits;
- .to(tl.int64) of int8/int16/int32 sign-extends; & with a constant masks the two's complement bits;
  .to(tl.int32) of int64 and .to(tl.int16) of int32 keep the low bits (trunc; numpy's astype);
  .to(tl.float32, bitcast=True) of int32 reinterprets the bits; a pointer cast (bitcast) reads the same
  address as another type;
- masked loads with other=0 read zeros.
The float statistics are float64 sums in another order than numpy's: equal up to the last bits.
"""

from __future__ import annotations

import array
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from harness.frameworks import triton_launch
from harness.frameworks.digest_tables import device_table
from harness.store import fast_hash

# A tile is ROWS blocks x LANES units (LANES = 16 bytes per thread x 32 x WARPS units: 512 int32 words for 4
# warps), one column of ROWS blocks, so that each thread loads ROWS x 16 bytes per tile (vectorised: no masks
# outside the last ROWS blocks) and keeps accumulators of one row only.
# Programs: as many per multiprocessor as can be resident at once (from the compiled kernel's registers: 4 of 4
# warps for the float kernels on the H200 with triton 3.6), at most
# PROGRAMS_PER_SM, FIRST_PROGRAMS_PER_SM before a variant has run once (MAX_PROGRAMS instead, when set); tiles
# in a grid-stride loop: programs that cannot be resident would run after the others, doubling the time. Up
# to SINGLE_PROGRAM_TILES tiles: one program. ROWS and WARPS chosen on the H200 (torch 2.11, triton 3.6, 2026-12-02)
# by a copy of the kernel's loop timed with 4 and 8 of each and 2 to 16 programs per multiprocessor: 8 rows of 4
# warps at 4 programs (128 registers per thread: scripts/kernel_registers.py) read closest to torch's own sum.
ROWS = 8
WARPS = 4
PROGRAMS_PER_SM = 8
FIRST_PROGRAMS_PER_SM = 2
MAX_PROGRAMS: int | None = None
SINGLE_PROGRAM_TILES = 4
REDUCE_ROWS = 256  # partial rows the last program combines per pass: two per thread of 4 warps (1024 took 112
# registers per thread for the 7 accumulators, and so halved the programs resident per multiprocessor)
_RESIDENT: dict[tuple, int] = {}  # (device, meta of a compiled `digest`) -> programs resident per multiprocessor
_PLANS: dict[tuple, Launch] = {}  # (device, dtype, elements, settings) -> its launch, once the residency is known
_MAX_PLANS = 4096

_KERNELS: dict[str, Any] = {}
_IMPORT_FAILED: list[bool] = []


def _kernels() -> dict[str, Any]:
    """The jitted kernel (harness.frameworks.triton_kernels, imported on first use); ImportError when triton
    is not installed."""
    if not _KERNELS:
        from harness.frameworks import triton_kernels

        _KERNELS["digest"] = triton_kernels.digest
        _KERNELS["grouped"] = triton_kernels.grouped_digest
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


def _layout(tensor) -> tuple[int, bool, bool] | None:
    """KIND of `digest` (see there), whether its values are float64 (else float32, exact for the dtype),
    whether it is a float; None: a dtype `digest` does not read (complex, float8, uint64)."""
    if tensor.dtype not in _LAYOUTS:
        _LAYOUTS[tensor.dtype] = _layout_of(tensor)
    return _LAYOUTS[tensor.dtype]


_LAYOUTS: dict[Any, tuple[int, bool, bool] | None] = {}


def _layout_of(tensor) -> tuple[int, bool, bool] | None:
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
    return _layout(tensor) is not None


_SM_COUNT: dict[str, int] = {}


def _multiprocessors(device) -> int:
    import torch

    key = str(device)
    if key not in _SM_COUNT:
        _SM_COUNT[key] = torch.cuda.get_device_properties(device).multi_processor_count \
            if getattr(device, "type", "") == "cuda" else 132
    return _SM_COUNT[key]


def plan(nbytes: int, width: int, rows: int | None = None, warps: int | None = None) -> dict[str, int]:
    """The grid of `digest` for a tensor of `nbytes` bytes of `width`-byte elements: units (int32 words, or
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


class Launch(NamedTuple):
    """What a launch of `digest` for one (device, dtype, size) needs besides the tensor and its buffer."""

    programs: int
    args: tuple  # the kernel's integer arguments
    meta: dict  # its constexprs and num_warps
    weights: Any  # W and V on the device
    factors: Any
    resident_key: tuple  # _RESIDENT's key of the compiled variant


def _launch(flat, layout: tuple[int, bool, bool]) -> Launch:
    """The launch for a contiguous 1-D tensor: from _PLANS, else made (and kept once the programs resident
    per multiprocessor of its compiled variant are known)."""
    key = (flat.device, flat.dtype, flat.numel(), _settings())
    launch = _PLANS.get(key)
    if launch is not None:
        return launch
    kind, value64, is_float = layout
    n, width = flat.numel(), flat.element_size()
    nbytes = n * width
    grid = plan(nbytes, width)
    blocks = fast_hash.blocks_of(nbytes)
    meta = dict(WIDTH=width, KIND=kind, EPU=1 if width == 8 else 4 // width, VALUE64=value64, IS_FLOAT=is_float,
                ROWS=grid["rows"], LANES=grid["lanes"], UNITS_PER_BLOCK=grid["per_block"],
                PARTIAL=width < 4 and nbytes % 4 != 0, REDUCE=REDUCE_ROWS, num_warps=grid["warps"])
    resident_key = (str(flat.device), *sorted(meta.items()))
    resident = _RESIDENT.get(resident_key)
    cap = MAX_PROGRAMS or min(PROGRAMS_PER_SM, resident or FIRST_PROGRAMS_PER_SM) * _multiprocessors(flat.device)
    tiles = grid["full_tiles"] + grid["tail_tiles"]
    programs = 1 if tiles <= SINGLE_PROGRAM_TILES else max(1, min(tiles, cap))
    args = (n, grid["n_full"], blocks, nbytes, grid["groups"], grid["full_tiles"], grid["tail_tiles"])
    launch = Launch(programs, args, meta, device_table(flat.device, "W", fast_hash.BLOCK), device_table(flat.device, "V", blocks),
                    resident_key)
    if resident is not None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = launch
    return launch


def fused_device_digest(tensor) -> Any:
    """The handle of harness.frameworks.torch `device_digest` (fast_hash.SLOTS as float64 on the tensor's
    device), computed by `digest` in one launch of min(tiles, the programs resident at once) programs (one
    up to SINGLE_PROGRAM_TILES tiles). The tensor's bytes are read in place; a non-contiguous tensor is made
    contiguous first, and one whose memory does not start on a 4-byte boundary is copied (the views at byte
    offsets 1 to 3 of 1- and 2-byte dtypes). ValueError for a dtype it does not read (complex, float8,
    uint64: `supports`)."""
    import torch

    if tensor.is_contiguous():  # a size launched before: its launcher called at once (`_ready`)
        index = tensor.get_device()
        ready = triton_launch.READY.get((_FUSED, index, tensor.dtype, tensor.numel(), _settings()))
        if ready is not None and not (address := tensor.data_ptr()) % _ALIGN and triton_launch.direct_on(index):
            programs, size, weights, factors, counters, args, ring, run, function, packed, constants, _ = ready
            out = torch.empty(size, dtype=torch.float64, device=tensor.device)
            at = out.data_ptr()
            if not at % _ALIGN:  # as when the launcher was kept (torch's allocator aligns its blocks)
                # the tensors as their addresses (see triton_launch's note)
                run(programs, 1, 1, raw_stream(index), function, packed, None, None, None,
                    address, weights, factors, at, counters, _take(ring), *args, *constants)
                return out[:len(fast_hash.SLOTS)]
    kernel = _kernels()["digest"]
    layout = _layout(tensor)
    if layout is None:
        raise ValueError(f"unsupported dtype {tensor.dtype}")
    flat = tensor.detach()
    if not flat.is_contiguous():
        flat = flat.contiguous()
    flat = flat.view(-1)
    if flat.numel() == 0:
        return torch.zeros(len(fast_hash.SLOTS), dtype=torch.float64, device=flat.device)
    if flat.data_ptr() % 4:  # int32 words need 4-byte aligned memory
        flat = flat.clone()
    launch = _launch(flat, layout)
    out = torch.empty(8 + 7 * launch.programs, dtype=torch.float64, device=flat.device)
    counters, counter = _next_counter(flat.device)
    args = (flat, launch.weights, launch.factors, out, counters, counter, *launch.args)
    compiled = triton_launch.launch(kernel, launch.programs, args, launch.meta)
    if launch.resident_key not in _RESIDENT:
        resident = _resident(compiled, launch.meta["num_warps"])
        if resident:
            _RESIDENT[launch.resident_key] = resident
    elif flat.is_cuda and not (flat.data_ptr() % _ALIGN or out.data_ptr() % _ALIGN):
        _ready(flat, launch, args)
    return out[:len(fast_hash.SLOTS)]


_FUSED = "digest"  # triton_launch.READY's keys of `digest`: (_FUSED, device index, dtype, elements, _settings())


def _settings() -> tuple:
    return (ROWS, WARPS, PROGRAMS_PER_SM, FIRST_PROGRAMS_PER_SM, MAX_PROGRAMS, SINGLE_PROGRAM_TILES, REDUCE_ROWS)


def _ready(flat, launch: Launch, args: tuple) -> None:
    """Keep what launching `digest` again on a tensor of this dtype and size takes, once its launch is planned for
    good (the programs resident known) and Triton's launcher for it is known (`triton_launch.launcher`): the
    arguments but the tensor, its output and its counter are the same every time, and so is the specialization of
    a tensor and an output that start on 16-byte boundaries (what `fused_device_digest` checks before calling it):
    no detach, view, plan lookup nor binding of 13 arguments per launch."""
    key = (_FUSED, flat.get_device(), flat.dtype, flat.numel(), _settings())
    if key in triton_launch.READY:  # first: a size's tensors that miss its launcher (views' copies) come here each time
        return
    if _PLANS.get((flat.device, *key[2:])) is not launch or not triton_launch.direct_on(key[1]):
        return
    found = triton_launch.launcher(_kernels()["digest"], args, launch.meta)
    if found is None:
        return
    if len(triton_launch.READY) >= _MAX_PLANS:
        triton_launch.READY.clear()
    ring = _COUNTERS[flat.device]
    # the tables and counters by address, and kept alive with the entry
    triton_launch.READY[key] = (launch.programs, 8 + 7 * launch.programs, launch.weights.data_ptr(),
                                launch.factors.data_ptr(), ring[0].data_ptr(), launch.args, ring, *found,
                                (launch.weights, launch.factors))


COUNTERS = 1 << 16  # arrival counters per device, taken in turn by `digest`'s launches
_COUNTERS: dict[Any, list] = {}  # device -> [its int32 counters (zero between launches), the next one's index]


def _next_counter(device) -> tuple[Any, int]:
    """The counters of `device` and the index of the next launch's. The launch's last program sets its counter
    back to zero, so no buffer is zeroed per launch (a second kernel per digest, which a 64 MiB tensor's read at
    the bandwidth, ~15 us, cannot hide). A counter is taken again only COUNTERS launches later: the launches
    still queued on the device are far fewer."""
    import torch

    ring = _COUNTERS.get(device)
    if ring is None:
        ring = _COUNTERS[device] = [torch.zeros(COUNTERS, dtype=torch.int32, device=device), 0]
    return ring[0], _take(ring)


def _take(ring: list) -> int:
    """The index of a device's next counter (`_COUNTERS`' ring), taken."""
    index = ring[1]
    ring[1] = (index + 1) % COUNTERS
    return index


def kernel_choice() -> str:
    """XFALIGN_FAST_DIGEST_KERNEL: "torch" forces the torch-ops path; anything else (or unset: "auto") the
    Triton kernel where triton is importable and the dtype is read by it (else the torch ops)."""
    return os.environ.get("XFALIGN_FAST_DIGEST_KERNEL", "auto").strip().lower() or "auto"


# -- Small tensors, grouped (see the note, "Small tensors") ------------------------------------------------------

GROUP_BYTES = 4 << 20  # tensors of at most this many bytes are grouped (XFALIGN_DIGEST_GROUP_BYTES; 0: none)
# tensors of at most this many bytes are read by a list's grouped launch (harness.frameworks.triton_batch; where
# grouping is on), above GROUP_BYTES, which bounds what a hook copies into an arena: read in place, a tensor costs no
# copy, and a short step's host time per launch is what its overhead is (H200, the 1024/4096 MLP step captured with
# the hooks' tensors batched: 3.1-3.3 ms against 3.4-3.9 ms with lists up to GROUP_BYTES; the TransformerLayer's the
# same 27.0-27.1 ms; 3 and 2 runs, 2026-12-04). Larger ones read faster by the fused kernel.
BATCH_BYTES = 32 << 20
ITEM_TILES = 8  # tiles (rows of LANES units: 2 KiB for 4 warps) per program of `grouped_digest`
ARENA_BYTES = 16 << 20  # a group's first arena; doubled (up to MAX_ARENA_BYTES) when a step needs more
MAX_ARENA_BYTES = 256 << 20
SEARCH = 256  # segments `grouped_digest` compares at once to find a program's segment
RAW_COPY = True  # copy a contiguous tensor into its arena by cudaMemcpyAsync itself (else torch's copy_)
_ALIGN = 16  # bytes: each segment starts on a 16-byte boundary of the arena (vector loads, int64 units)
_OPEN: dict[tuple, Group] = {}  # (device index, stream, dtype) -> the group that takes that key's small tensors
_ARENA: dict[tuple, int] = {}  # the same key -> the arena's size in bytes that its groups start with
_GROUP_META: dict[tuple, dict] = {}
_ROUTE: list[tuple[bool, int, int]] = []  # `route()` read for this step
_MEMCPY: list[Any] = []  # [cudaMemcpyAsync of the CUDA runtime torch loaded, or None], looked up once (`raw_memcpy`)
_CUDA_CALLS: list[Any] = []  # `_cuda_calls`


def group_bytes() -> int:
    """XFALIGN_DIGEST_GROUP_BYTES: tensors of at most this many bytes are digested grouped (`grouped_device_digest`),
    larger ones by one launch each (`fused_device_digest`); 0 turns grouping off. Unset: GROUP_BYTES."""
    return _bytes_setting("XFALIGN_DIGEST_GROUP_BYTES", GROUP_BYTES)


def batch_bytes() -> int:
    """XFALIGN_DIGEST_BATCH_BYTES, else BATCH_BYTES: the largest tensor a list's grouped launch reads."""
    return _bytes_setting("XFALIGN_DIGEST_BATCH_BYTES", BATCH_BYTES)


def _bytes_setting(variable: str, default: int) -> int:
    text = os.environ.get(variable)
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{variable}={text!r}: not a whole number of bytes") from None


def route() -> tuple[bool, int, int]:
    """Whether the Triton kernels digest (kernel_choice() is not "torch"), group_bytes(), and the largest tensor a
    list's grouped launch reads (0 where group_bytes() is 0, else at least it: batch_bytes()): read at a step's
    first digest and kept for the step (`launch_groups`, at its end, forgets them): reading the environment
    costs about a microsecond per variable, per tensor otherwise. `forget_route` makes the next digest read it."""
    if not _ROUTE:
        grouped = group_bytes()
        _ROUTE.append((kernel_choice() != "torch", grouped, grouped and max(grouped, batch_bytes())))
    return _ROUTE[0]


def forget_route() -> None:
    _ROUTE.clear()


def raw_memcpy() -> Any:
    """cudaMemcpyAsync of the CUDA runtime that torch loaded (found among the process's mapped files), as a
    ctypes function; None where there is no such library (a static runtime) or RAW_COPY is off."""
    if not _MEMCPY:
        _MEMCPY.append(_find_memcpy())
    return _MEMCPY[0] if RAW_COPY else None


def _find_memcpy() -> Any:
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split(None, 5)[5].strip() for line in maps
                            if "libcudart.so" in line and len(line.split(None, 5)) == 6})
    except OSError:
        return None
    for path in paths:
        try:
            # PyDLL: a call of a few us made holding the interpreter's lock; a CDLL call releases it, and another
            # thread (the writer's, autograd's) may hold it when the call returns (the small MLP's copies into the
            # arena on the H200: 53-69 us per hook against 93 us; one run each, 2026-12-03)
            function = ctypes.PyDLL(path).cudaMemcpyAsync
        except (OSError, AttributeError):
            continue
        function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        function.restype = ctypes.c_int
        return function
    return None


class GroupSlot:
    """The handle of a grouped digest: row `index` of its group's handles (rows row0.. of its `block`, fast_hash.SLOTS
    as float64 per segment), there once the group is launched (`launch_groups`, at the step's end)."""

    __slots__ = ("group", "index")

    def __init__(self, group: Group | Launched, index: int):
        self.group, self.index = group, index

    @property
    def device(self):
        return self.group.device


class Launched:
    """A batch plan's groups of one device as one call launched them (triton_batch), as a GroupSlot's `group`: its
    handles' `block`, from row 0 on."""

    __slots__ = ("block", "device", "row0")

    def __init__(self, block, device):
        self.block, self.device, self.row0 = block, device, 0


class Group:
    """A dtype's small tensors on one device and stream, copied one after another into an arena (16-byte aligned
    segments) as they are digested, so that `grouped_digest` digests them all in one launch. The copy runs in
    stream order where the fused kernel would have run: later in-place changes of a tensor do not reach it."""

    def __init__(self, key: tuple, tensor, layout: tuple[int, bool, bool], capacity: int | None):
        import torch

        self.key, self.device, self.layout = key, tensor.device, layout
        self.index, self.raw_stream = key[0], key[1]
        self.width = tensor.element_size()
        self.unit = 8 if self.width == 8 else 4
        self.align = _ALIGN // self.width
        self.item_units = ITEM_TILES * (16 // self.unit) * 32 * WARPS
        self.cuda = tensor.is_cuda
        # capacity None: no arena (`in_place`: the segments are the tensors themselves, read in the current stream,
        # launched at once: no stream of copies to wait for, no copy)
        copies = self.cuda and capacity is not None
        self.stream: Any = torch.cuda.current_stream(self.device) if copies else None
        self.capacity = 0 if capacity is None else capacity // self.width  # elements
        self.arena: Any = None if capacity is None else torch.empty(self.capacity, dtype=tensor.dtype, device=self.device)
        self.base = 0 if self.arena is None else self.arena.data_ptr()
        self.memcpy = raw_memcpy() if copies else None
        self.used = 0  # elements
        # per segment: first item, items, first unit, elements (`in_place`: the same as a flat int64 array)
        self.rows: Any = array.array("q")
        self.items = 0
        self.largest = 0  # bytes of the largest segment: the factors V it needs
        self.block: Any = None  # once launched: its handles, rows row0.. of `block` ([rows, 8] float64, the launch's)
        self.row0 = 0
        self.lowest = 0  # `in_place`: the member at the lowest address, whose address the table counts from


    def add(self, tensor, n: int) -> GroupSlot:
        """Copy the tensor (n elements) into the arena's next segment (room for it checked by the caller)."""
        start, nbytes = self.used, n * self.width
        if n:
            memcpy = self.memcpy
            # the raw copy where the stream is the current device's (a NULL stream means the current device's)
            if memcpy is not None and tensor.is_contiguous() and _CUDA_CALLS[0]() == self.index:
                error = memcpy(self.base + start * self.width, tensor.data_ptr(), nbytes, 3, self.raw_stream)  # D2D
                if error:
                    raise RuntimeError(f"cudaMemcpyAsync of a {tensor.dtype} tensor into the digest arena: error {error}")
            else:
                self._copy(tensor, start)
        self.used = start + -(-n // self.align) * self.align
        return self._segment(start * self.width // self.unit, n)

    def _segment(self, first_unit: int, n: int) -> GroupSlot:
        """A segment of n elements from unit `first_unit` of the arena on: its row of the table, its handle."""
        nbytes = n * self.width
        units = -(-nbytes // self.unit)
        items = -(-units // self.item_units) or 1
        self.rows.extend((self.items, items, first_unit, n))
        self.items += items
        if nbytes > self.largest:
            self.largest = nbytes
        return GroupSlot(self, len(self.rows) // 4 - 1)

    @classmethod
    def in_place(cls, key: tuple, tensor, counts: Sequence[int], layout: tuple[int, bool, bool]) -> Group:
        """A group whose segments will be tensors themselves (contiguous, of its key, of `counts` elements; `tensor`
        one of them), read where they are: its segments' rows as `_segment` makes them, for all at once (segment i
        the i-th tensor), but their first units, which `placed` sets from the tensors' addresses. No arena is kept
        (no tensor of the caller's): a batch plan (triton_batch) keeps the launch of its placed groups
        (`GroupsLaunch`) and calls it on the tensors of each call, a group's arena the tensor at its lowest place then
        (nothing is copied: a later change of a tensor must not come between a call and its launch)."""
        import numpy as np

        group = cls(key, tensor, layout, None)
        elements = np.array(counts, dtype=np.int64)
        units = -(-elements * group.width // group.unit)
        items = np.maximum(-(-units // group.item_units), 1)
        ends = np.cumsum(items)
        rows = np.zeros((len(counts), 4), dtype=np.int64)
        rows[:, 0], rows[:, 1], rows[:, 3] = ends - items, items, elements
        group.rows = rows
        group.items = int(ends[-1])
        group.largest = int(elements.max()) * group.width
        return group

    def placed(self, addresses: Sequence[int]) -> Group | None:
        """This `in_place` group for its tensors at `addresses` (in segment order): each segment's first unit
        counted from the address of the member at the lowest (`lowest`); None where one does not start on a
        16-byte boundary."""
        import numpy as np

        at = np.array(addresses, dtype=np.int64)
        if (at % _ALIGN).any():
            return None
        group = object.__new__(Group)  # a shallow copy (copy.copy's reduce protocol costs more)
        group.__dict__.update(self.__dict__)
        lowest = group.lowest = int(at.argmin())
        rows = self.rows.copy()
        rows[:, 2] = (at - at[lowest]) // self.unit
        group.rows = rows.reshape(-1)
        return group

    def _copy(self, tensor, start: int) -> None:
        """torch's copy_ into the segment, as C-order (any strides, any device guard)."""
        segment = self.arena.narrow(0, start, tensor.numel()).view(tensor.shape)
        # detached: a copy from a tensor that requires grad would put the arena into the autograd graph
        segment.copy_(tensor.detach() if tensor.requires_grad else tensor)


def launch_on_device(groups: list[Group]) -> None:
    """`grouped_digest` over each arena group's segments (groups of one device), in the current stream (after the
    copies' stream, where another), by a `GroupsLaunch` (on a GPU one kept for groups of the same keys and rows:
    `_kept_launch`); each group's handles rows row0.. of the launch's `block`."""
    import torch

    if groups[0].cuda:
        current = raw_stream(groups[0].index)
        for group in groups:
            if group.stream is not None and group.raw_stream != current:  # the copies ran on the group's stream
                stream = torch.cuda.current_stream(group.device)
                stream.wait_stream(group.stream)
                group.arena.record_stream(stream)
        launch = _kept_launch(groups, current)
    else:
        launch = GroupsLaunch(groups, group_tables(groups))
    block = launch([group.arena for group in groups])
    row = 0
    for group in groups:
        group.block, group.row0 = block, row
        group.arena = None  # back to torch's allocator (reused, in stream order, by the next step's arena)
        row += len(group.rows) // 4


class GroupsLaunch:
    """`grouped_digest` over a device's groups, launched together on their arenas (a call): each group's table, one
    buffer for their handles (rows one after another: the `block` a call returns) and partial rows; no zeroing (each
    segment's last program resets its arrival counter). What a call needs but the arenas is worked out once: a batch
    plan (triton_batch) keeps one per set of addresses, `_kept_launch` one per arena layout, and each is called every
    step. Once its launches have gone through triton_launch's direct path (`triton_launch.launch_kept`: from the
    second call of a specialization in the process), each group's launch is that launcher called at once: its
    arguments are the same every call but the arena's and the buffer's addresses, and so is their specialization
    while those start on 16-byte boundaries (checked per call)."""

    def __init__(self, groups: list[Group], tables: list):
        first = groups[0]
        self.device, self.index = first.device, first.index
        self.rows = sum(len(group.rows) // 4 for group in groups)
        weights = device_table(self.device, "W", fast_hash.BLOCK)
        # per group: its programs, table, W, V, first handle row and first partial row (float64 offsets in the
        # buffer), segments, and the kernel's constexprs
        self.calls: list[tuple] = []
        row, parts = 0, 8 * self.rows
        for group, table in zip(groups, tables, strict=True):
            count = len(group.rows) // 4
            factors = device_table(self.device, "V", fast_hash.blocks_of(group.largest))
            self.calls.append((group.items, table, weights, factors, 8 * row, parts, count,
                               _grouped_meta(group.key[2], group.width, group.layout)))
            row += count
            parts += -(-7 * group.items // 2) * 2
        self.size = parts
        self.direct: list[tuple] | None = None  # per group: Triton's launcher and its fixed arguments (addresses)

    def __call__(self, arenas: list) -> Any:
        """Launch on `arenas` (a tensor per group, in group order) in the current stream; the handles' block,
        [rows, 8] float64."""
        import torch

        work = torch.empty(self.size, dtype=torch.float64, device=self.device)
        base, addresses = work.data_ptr(), [arena.data_ptr() for arena in arenas]
        # a launcher is called at once on this device only, and on addresses aligned as when it was kept
        direct = not base % _ALIGN and not any(address % _ALIGN for address in addresses) and \
            triton_launch.direct_on(self.index)
        if direct and self.direct is not None:
            stream = raw_stream(self.index)
            for (run, function, packed, constants, programs, fixed, row, parts, count), address in zip(
                    self.direct, addresses, strict=True):
                run(programs, 1, 1, stream, function, packed, None, None, None, address, *fixed, base + 8 * row,
                    base + 8 * parts, count, programs, *constants)
            return work[:8 * self.rows].view(self.rows, 8)
        kernel = _kernels()["grouped"]
        kept: list[tuple] = []
        for (programs, table, weights, factors, row, parts, count, meta), arena in zip(self.calls, arenas, strict=True):
            launcher = triton_launch.launch_kept(kernel, programs, (arena, table, weights, factors, work[row:],
                                                                    work[parts:], count, programs), meta)
            if launcher is not None:  # the tables by address (kept alive by self.calls)
                kept.append((*launcher, programs, (table.data_ptr(), weights.data_ptr(), factors.data_ptr()), row,
                             parts, count))
        if direct and len(kept) == len(self.calls):  # every launch was direct
            self.direct = kept
        return work[:8 * self.rows].view(self.rows, 8)


KEPT_LAUNCHES = 16  # arena groups' launches kept (`_kept_launch`)
_LAUNCHES: dict[tuple, GroupsLaunch] = {}  # (stream, group_settings(), per group its key and rows) -> their launch


def _kept_launch(groups: list[Group], stream: int) -> GroupsLaunch:
    """The launch of arena groups on `stream`, kept for groups of the same keys and rows (a training's steps copy
    the same sizes in the same order every step): no pinned block and transfer of tables per step. A kept table is
    launched again in the same stream only (its arrival counters, reset by the launch that used them, are then
    zero)."""
    key = (stream, group_settings(), *[(group.key, group.rows.tobytes()) for group in groups])
    launch = _LAUNCHES.get(key)
    if launch is None:
        if len(_LAUNCHES) >= KEPT_LAUNCHES:
            del _LAUNCHES[next(iter(_LAUNCHES))]
        launch = _LAUNCHES[key] = GroupsLaunch(groups, group_tables(groups))
    return launch


def _table_sizes(segments: list[int]) -> list[int]:
    # per group [5, segments] int64: first item, items, first unit, elements, arrivals; each group's table, handles
    # and partial rows start on a 16-byte boundary (the kernel's pointer arguments specialise alike every step)
    return [-(-5 * count // 2) * 2 for count in segments]


def group_tables(groups: list[Group]) -> list:
    """Each group's table (groups of one device), one after another on that device: filled in pinned memory and
    moved by one transfer in the current stream (the pinned block is kept until the copy is done); arrivals zero."""
    import numpy as np
    import torch

    segments = [len(group.rows) // 4 for group in groups]
    sizes = _table_sizes(segments)
    pinned = torch.zeros(sum(sizes), dtype=torch.int64, pin_memory=groups[0].cuda)
    host = pinned.numpy()
    starts, at = [], 0
    for group, count, size in zip(groups, segments, sizes, strict=True):
        host[at:at + 4 * count].reshape(4, count)[:] = np.frombuffer(group.rows, dtype=np.int64).reshape(count, 4).T
        starts.append(at)
        at += size
    table = pinned.to(groups[0].device, non_blocking=True) if groups[0].cuda else pinned
    return [table[start:] for start in starts]


def group_settings() -> tuple:
    """The module's settings a `GroupsLaunch` is made for (its groups' rows, its kernels' constexprs): part of the
    keys it is kept by."""
    return ROWS, WARPS, REDUCE_ROWS, SEARCH, ITEM_TILES


def _grouped_meta(dtype, width: int, layout: tuple[int, bool, bool]) -> dict:
    settings = (dtype, ROWS, WARPS, REDUCE_ROWS, SEARCH)
    meta = _GROUP_META.get(settings)
    if meta is None:
        kind, value64, is_float = layout
        grid = plan(0, width)
        meta = dict(WIDTH=width, KIND=kind, EPU=1 if width == 8 else 4 // width, VALUE64=value64, IS_FLOAT=is_float,
                    ROWS=grid["rows"], LANES=grid["lanes"], UNITS_PER_BLOCK=grid["per_block"], UNIT=grid["unit"],
                    REDUCE=REDUCE_ROWS, SEARCH=SEARCH, num_warps=grid["warps"])
        _GROUP_META[settings] = meta
    return meta


def grouped_device_digest(tensor) -> GroupSlot:
    """The handle of a small tensor's digest (`fused_device_digest`'s values, computed with the other small
    tensors of its dtype, device and stream by one launch of `grouped_digest` at the step's end: `launch_groups`).
    The tensor is copied into its group's arena now, in stream order. ValueError for a dtype it does not read."""
    layout = _layout(tensor)
    if layout is None:
        raise ValueError(f"unsupported dtype {tensor.dtype}")
    index = tensor.get_device()
    key = (index, (_CUDA_CALLS or _cuda_calls())[1](index) if index >= 0 else 0, tensor.dtype)
    group = _OPEN.get(key)
    n = tensor.numel()
    if group is None or group.used + n > group.capacity:
        if group is not None:  # full: launched now, and the key's next arena twice as large
            del _OPEN[key]
            launch_on_device([group])
            _ARENA[key] = min(2 * _ARENA.get(key, ARENA_BYTES), MAX_ARENA_BYTES)
        group = Group(key, tensor, layout, max(_ARENA.get(key, ARENA_BYTES), n * tensor.element_size()))
        _OPEN[key] = group
    return group.add(tensor, n)


def _launch_by_device(groups: list[Group]) -> None:
    """`launch_on_device` of the groups of each device together."""
    by_device: dict[Any, list[Group]] = {}
    for group in groups:
        by_device.setdefault(group.device, []).append(group)
    for same_device in by_device.values():
        launch_on_device(same_device)


def raw_stream(index: int) -> int:
    """The current raw stream of CUDA device `index`; 0 for the CPU (index -1)."""
    return (_CUDA_CALLS or _cuda_calls())[1](index) if index >= 0 else 0


def current_device() -> int:
    """torch's current CUDA device index (torch.cuda.current_device() without its checks)."""
    return (_CUDA_CALLS or _cuda_calls())[0]()


def _cuda_calls() -> list:
    """_CUDA_CALLS: torch's current device and current raw stream (of a device), looked up once (the imports
    and attribute lookups cost more than the calls)."""
    import torch

    _CUDA_CALLS[:] = [torch._C._cuda_getDevice, torch._C._cuda_getCurrentRawStream]
    return _CUDA_CALLS


def launch_groups(groups: list[Group | Launched]) -> None:
    """Launch those of `groups` (the groups of a fetch's grouped handles) not launched yet, those of a device
    together (`launch_on_device`); and forget the step's `route`."""
    _ROUTE.clear()
    waiting = {id(group): group for group in groups if type(group) is Group and group.block is None}
    for open_group in waiting.values():
        if _OPEN.get(open_group.key) is open_group:
            del _OPEN[open_group.key]
    _launch_by_device(list(waiting.values()))
