"""The Triton kernel of harness.frameworks.triton_digest (see its note for what it computes and how), in a
module of its own: it imports triton, which CPU-only installs do not have, so triton_digest imports it on
first use; and Triton's interpreter resolves a kernel's calls among the module's globals."""

import triton
import triton.language as tl


@triton.jit
def unit_stats(x, index, n, acc_sum, acc_sq, acc_min, acc_max, acc_nan, acc_bad, phase: tl.constexpr,
               WIDTH: tl.constexpr, KIND: tl.constexpr, EPU: tl.constexpr, IS_FLOAT: tl.constexpr, FAST: tl.constexpr):
    # The statistics' accumulators updated with the elements of the units x ([R, LANES]; `index`, the units'
    # indices, masks phase 1's, whose last may be past the end)
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
        if FAST and phase == 0:  # no masks, no NaN/Inf tests
            acc_min = tl.minimum(acc_min, tl.min(v, axis=0))
            acc_max = tl.maximum(acc_max, tl.max(v, axis=0))
            if KIND == 2 or (KIND == 1 and WIDTH == 2):
                # 2-byte floats: a column's ROWS values summed in float32 first (half the float64
                # conversions, which bound the kernel below the memory's bandwidth otherwise); squares
                # past float32's range come out Inf, and the program takes the careful pass
                acc_sum += tl.sum(v, axis=0).to(tl.float64)
                acc_sq += tl.sum(v * v, axis=0).to(tl.float64)
            else:
                v64 = v.to(tl.float64)
                acc_sum += tl.sum(v64, axis=0)
                acc_sq += tl.sum(v64 * v64, axis=0)
        else:
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
    return acc_sum, acc_sq, acc_min, acc_max, acc_nan, acc_bad


@triton.jit
def tile_pass(units, raw, weights, factors, n, n_full, nbytes, groups, full_tiles, tail_tiles, pid, programs,
              WIDTH: tl.constexpr, KIND: tl.constexpr, EPU: tl.constexpr, VALUE64: tl.constexpr,
              IS_FLOAT: tl.constexpr, ROWS: tl.constexpr, LANES: tl.constexpr, UNITS_PER_BLOCK: tl.constexpr,
              PARTIAL: tl.constexpr, WITH_S: tl.constexpr, FAST: tl.constexpr, ROW_WISE: tl.constexpr):
    # One pass over this program's tiles: S (WITH_S) and the statistics' accumulators, one row of LANES.
    # FAST: the unmasked tiles' statistics without the NaN/Inf tests (right when the tiles hold neither,
    # which the caller checks by the float64 sum; else it runs a careful pass, FAST=False, for them).
    # ROW_WISE (the careful pass, statistics only): the tiles of whole blocks a row at a time, in a loop, so
    # that this rare pass needs fewer registers than the fast one: the kernel's count, and so the programs
    # resident per multiprocessor, is the fast pass's.
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
            if phase == 0:  # tile t: chunk t % chunks of the ROWS blocks of group t // chunks (a power of two)
                chunks: tl.constexpr = UNITS_PER_BLOCK // LANES
                group = t // chunks
                chunk = t - group * chunks
                block0 = group.to(tl.int64) * ROWS
                base = block0 * UNITS_PER_BLOCK + (chunk * LANES).to(tl.int64)  # int64: the tile's first unit
                index = base  # unused: no masks here
                if ROW_WISE:
                    for r in range(ROWS):
                        x = tl.load(units + base + r * UNITS_PER_BLOCK + offs_one)
                        acc_sum, acc_sq, acc_min, acc_max, acc_nan, acc_bad = unit_stats(
                            x, index, n, acc_sum, acc_sq, acc_min, acc_max, acc_nan, acc_bad, phase, WIDTH, KIND, EPU,
                            IS_FLOAT, FAST)
                else:
                    x = tl.load(units + base + offs)
                vrow = block0 + rows  # the tile's blocks: V's rows
            else:  # tile t: one row, units [start + t * LANES, + LANES) after the groups (start: a block's)
                base = groups.to(tl.int64) * (ROWS * UNITS_PER_BLOCK) + tl.cast(t * LANES, tl.int64)
                block0 = base // UNITS_PER_BLOCK
                chunk = ((base - block0 * UNITS_PER_BLOCK) // LANES).to(tl.int32)
                index = base + offs_one.to(tl.int64)  # [1, LANES] int64
                x = tl.load(units + index, mask=index < n_full.to(tl.int64), other=0)
                vrow = block0 + one  # [1]: the tile starts before the end, in block block0
                if PARTIAL:  # the last word holds 1 to 3 bytes of the tensor: read those bytes alone
                    at = n_full.to(tl.int64) * 4
                    k4 = tl.arange(0, 4)
                    b4 = tl.load(raw + at + k4, mask=(at + k4.to(tl.int64)) < nbytes.to(tl.int64), other=0)
                    word = tl.sum((b4.to(tl.int64) & 255) << (k4.to(tl.int64) * 8), axis=0).to(tl.int32)
                    x = tl.where(index == n_full.to(tl.int64), word, x)
            if WITH_S:  # the words of column c summed over the blocks b of the tile with V[b], then times W[c]
                if WIDTH == 8:
                    fac = tl.load(factors + vrow)
                    low = (x << 32) >> 32
                    high = x >> 32
                    w_low = tl.load(weights + 2 * (chunk * LANES + cols))
                    w_high = tl.load(weights + 2 * (chunk * LANES + cols) + 1)
                    acc_s += tl.sum(low * fac[:, None], axis=0) * w_low + tl.sum(high * fac[:, None], axis=0) * w_high
                else:
                    # V[b] = hi * 2**32 + lo with lo and hi signed 32-bit (hi takes the carry when lo's top bit is
                    # set), so w * V = w * lo + ((w * hi) mod 2**32) * 2**32 mod 2**64: a widening 32 x 32-bit
                    # multiply and a 32-bit one per word instead of a 64 x 64-bit one. lo and hi are loaded as the
                    # int32 words of V (little-endian): a sign-extended load is what the widening multiply takes.
                    w_c = tl.load(weights + chunk * LANES + cols)
                    halves = factors.to(tl.pointer_type(tl.int32), bitcast=True)
                    lo = tl.load(halves + 2 * vrow)
                    hi = tl.load(halves + 2 * vrow + 1) + (lo < 0).to(tl.int32)
                    part_lo = tl.sum(x.to(tl.int64) * lo.to(tl.int64)[:, None], axis=0)
                    part_hi = tl.sum(x * hi[:, None], axis=0)
                    acc_s += (part_lo + (part_hi.to(tl.int64) << 32)) * w_c
            if phase == 1 or not ROW_WISE:
                acc_sum, acc_sq, acc_min, acc_max, acc_nan, acc_bad = unit_stats(
                    x, index, n, acc_sum, acc_sq, acc_min, acc_max, acc_nan, acc_bad, phase, WIDTH, KIND, EPU, IS_FLOAT, FAST)
    return acc_s, acc_sum, acc_sq, acc_min, acc_max, acc_nan, acc_bad


@triton.jit
def combine_rows(part_f, part_i, first, count, stride, handle, n, REDUCE: tl.constexpr):
    # The last program to arrive: rows [first, first + count) of the partials (part_f: [4, stride] float64 sum,
    # squares, min, max; part_i: [3, stride] int64 s, nan, inf) combined into the 8 slots of the handle
    r = tl.arange(0, REDUCE)
    r_sum = tl.zeros([REDUCE], dtype=tl.float64)
    r_sq = tl.zeros([REDUCE], dtype=tl.float64)
    r_min = tl.full([REDUCE], float("inf"), dtype=tl.float64)
    r_max = tl.full([REDUCE], float("-inf"), dtype=tl.float64)
    r_s = tl.zeros([REDUCE], dtype=tl.int64)
    r_nan = tl.zeros([REDUCE], dtype=tl.int64)
    r_inf = tl.zeros([REDUCE], dtype=tl.int64)
    for start in range(0, count, REDUCE):  # volatile: the other programs' rows, not a cached copy
        i = start + r
        used = i < count
        row = first + i
        r_sum += tl.load(part_f + row, mask=used, other=0.0, volatile=True)
        r_sq += tl.load(part_f + stride + row, mask=used, other=0.0, volatile=True)
        r_min = tl.minimum(r_min, tl.load(part_f + 2 * stride + row, mask=used, other=float("inf"), volatile=True))
        r_max = tl.maximum(r_max, tl.load(part_f + 3 * stride + row, mask=used, other=float("-inf"), volatile=True))
        r_s += tl.load(part_i + row, mask=used, other=0, volatile=True)
        r_nan += tl.load(part_i + stride + row, mask=used, other=0, volatile=True)
        r_inf += tl.load(part_i + 2 * stride + row, mask=used, other=0, volatile=True)
    tl.store(handle + 0, tl.sum(r_sum, axis=0))
    tl.store(handle + 1, tl.sum(r_sq, axis=0))
    tl.store(handle + 2, tl.min(r_min, axis=0))
    tl.store(handle + 3, tl.max(r_max, axis=0))
    tl.store(handle + 4, n.to(tl.float64))
    tl.store(handle + 5, tl.sum(r_nan, axis=0).to(tl.float64))
    tl.store(handle + 6, tl.sum(r_inf, axis=0).to(tl.float64))
    tl.store(handle + 7, tl.sum(r_s, axis=0).to(tl.float64, bitcast=True))


@triton.jit(do_not_specialize=["counter", "n", "n_full", "n_blocks", "nbytes", "groups", "full_tiles", "tail_tiles"])
def digest(src, weights, factors, out, counters, counter, n, n_full, n_blocks, nbytes, groups, full_tiles, tail_tiles,
           WIDTH: tl.constexpr, KIND: tl.constexpr, EPU: tl.constexpr, VALUE64: tl.constexpr,
           IS_FLOAT: tl.constexpr, ROWS: tl.constexpr, LANES: tl.constexpr, UNITS_PER_BLOCK: tl.constexpr,
           PARTIAL: tl.constexpr, REDUCE: tl.constexpr):
    # See harness.frameworks.triton_digest's note. KIND: 0 signed integer, 1 IEEE float (fp16, fp32, fp64), 2 bfloat16, 3 bool,
    # 4 unsigned integer. A unit is an int32 word (WIDTH <= 4: EPU = 4 // WIDTH elements) or an int64
    # element (WIDTH 8, two words); src's bytes are read through pointers of those types.
    if WIDTH == 8:
        units = src.to(tl.pointer_type(tl.int64), bitcast=True)
    else:
        units = src.to(tl.pointer_type(tl.int32), bitcast=True)
    raw = src.to(tl.pointer_type(tl.int8), bitcast=True)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    acc_s, acc_sum, acc_sq, acc_min, acc_max, acc_nan, acc_bad = tile_pass(
        units, raw, weights, factors, n, n_full, nbytes, groups, full_tiles, tail_tiles, pid, programs,
        WIDTH, KIND, EPU, VALUE64, IS_FLOAT, ROWS, LANES, UNITS_PER_BLOCK, PARTIAL, True, IS_FLOAT, False)
    if IS_FLOAT:
        seen = tl.sum(acc_sum, axis=0) + tl.sum(acc_sq, axis=0)
        if seen - seen != 0:  # a NaN or Inf (or a sum past the largest float): the careful pass
            _, acc_sum, acc_sq, acc_min, acc_max, acc_nan, acc_bad = tile_pass(
                units, raw, weights, factors, n, n_full, nbytes, groups, full_tiles, tail_tiles, pid,
                programs, WIDTH, KIND, EPU, VALUE64, IS_FLOAT, ROWS, LANES, UNITS_PER_BLOCK, PARTIAL, False, False, True)
    s = tl.sum(acc_s, axis=0)
    total = tl.sum(acc_sum, axis=0)
    squares = tl.sum(acc_sq, axis=0)
    low_value = tl.min(acc_min, axis=0).to(tl.float64)
    high_value = tl.max(acc_max, axis=0).to(tl.float64)
    nan = tl.sum(acc_nan.to(tl.int64), axis=0)
    inf = tl.sum(acc_bad.to(tl.int64), axis=0) - nan
    # this program's row of partials; the last program to finish combines every row into the handle
    part_f = out + 8  # [4, programs] float64: sum, squares, min, max
    part_i = (out + 8 + 4 * programs).to(tl.pointer_type(tl.int64), bitcast=True)  # [3, programs]: s, nan, inf
    tl.store(part_f + pid, total)
    tl.store(part_f + programs + pid, squares)
    tl.store(part_f + 2 * programs + pid, low_value)
    tl.store(part_f + 3 * programs + pid, high_value)
    tl.store(part_i + pid, s)
    tl.store(part_i + programs + pid, nan)
    tl.store(part_i + 2 * programs + pid, inf)
    tl.debug_barrier()  # every thread's stores before the arrival is counted (the atomic releases them)
    arrived = tl.atomic_add(counters + counter, 1, sem="acq_rel")
    if arrived == programs - 1:
        tl.store(counters + counter, 0)  # every program has arrived: the counter is free for a later launch
        combine_rows(part_f, part_i, 0, programs, programs, out, n, REDUCE)


@triton.jit(do_not_specialize=["segments", "items_total"])
def grouped_digest(arena, table, weights, factors, out, parts, segments, items_total,
                   WIDTH: tl.constexpr, KIND: tl.constexpr, EPU: tl.constexpr, VALUE64: tl.constexpr,
                   IS_FLOAT: tl.constexpr, ROWS: tl.constexpr, LANES: tl.constexpr, UNITS_PER_BLOCK: tl.constexpr,
                   UNIT: tl.constexpr, REDUCE: tl.constexpr, SEARCH: tl.constexpr):
    # The digests of many small tensors of one dtype, copied one after another into `arena` (segments), in one
    # launch (see harness.frameworks.triton_digest's note, "Small tensors"). table: int64 [5, segments], per
    # segment its first item (program), its items, its first unit in the arena (16-byte aligned), its elements
    # and its arrival counter (zero; counted in its low int32 half, zero again once the segment is done). Item i
    # of a segment of k items is `digest`'s program i of k on that segment alone (tile_pass with the segment's own
    # sizes: the position weights restart at each segment), so each segment's S is its tensor's. out: [segments,
    # 8] float64, the handles; parts: the partial rows of every item, 4 x items_total float64 and 3 x items_total
    # int64.
    if UNIT == 8:
        units = arena.to(tl.pointer_type(tl.int64), bitcast=True)
    else:
        units = arena.to(tl.pointer_type(tl.int32), bitcast=True)
    pid = tl.program_id(0).to(tl.int64)
    found = tl.zeros([SEARCH], dtype=tl.int32)  # the segments whose first item is at or before this program
    for at_segment in range(0, segments, SEARCH):
        j = at_segment + tl.arange(0, SEARCH)
        first_items = tl.load(table + j, mask=j < segments, other=items_total)
        found += (first_items <= pid).to(tl.int32)
    seg = tl.sum(found, axis=0) - 1
    first = tl.load(table + seg)
    programs = tl.load(table + segments + seg)
    at = tl.multiple_of(tl.load(table + 2 * segments + seg), 16 // UNIT)
    n = tl.load(table + 3 * segments + seg)
    item = pid - first
    # the segment's grid, as triton_digest.plan computes a tensor's
    nbytes = n * WIDTH
    n_full = nbytes // UNIT
    n_units = (nbytes + UNIT - 1) // UNIT
    groups = n_full // UNITS_PER_BLOCK // ROWS
    full_tiles = groups * (UNITS_PER_BLOCK // LANES)
    tail_tiles = (n_units - groups * ROWS * UNITS_PER_BLOCK + LANES - 1) // LANES
    src = units + at
    raw = src.to(tl.pointer_type(tl.int8), bitcast=True)
    # PARTIAL for every segment of 1- and 2-byte elements: where the last word is whole, the bytes it reads past
    # the segment's end are masked and the word it replaces is past the end (a zero either way)
    acc_s, acc_sum, acc_sq, acc_min, acc_max, acc_nan, acc_bad = tile_pass(
        src, raw, weights, factors, n, n_full, nbytes, groups, full_tiles, tail_tiles, item, programs,
        WIDTH, KIND, EPU, VALUE64, IS_FLOAT, ROWS, LANES, UNITS_PER_BLOCK, WIDTH < 4, True, IS_FLOAT, False)
    if IS_FLOAT:
        seen = tl.sum(acc_sum, axis=0) + tl.sum(acc_sq, axis=0)
        if seen - seen != 0:  # a NaN or Inf (or a sum past the largest float): the careful pass
            _, acc_sum, acc_sq, acc_min, acc_max, acc_nan, acc_bad = tile_pass(
                src, raw, weights, factors, n, n_full, nbytes, groups, full_tiles, tail_tiles, item, programs,
                WIDTH, KIND, EPU, VALUE64, IS_FLOAT, ROWS, LANES, UNITS_PER_BLOCK, WIDTH < 4, False, False, True)
    part_f = parts  # [4, items_total] float64: sum, squares, min, max
    part_i = (parts + 4 * items_total).to(tl.pointer_type(tl.int64), bitcast=True)  # [3, items_total]: s, nan, inf
    tl.store(part_f + pid, tl.sum(acc_sum, axis=0))
    tl.store(part_f + items_total + pid, tl.sum(acc_sq, axis=0))
    tl.store(part_f + 2 * items_total + pid, tl.min(acc_min, axis=0).to(tl.float64))
    tl.store(part_f + 3 * items_total + pid, tl.max(acc_max, axis=0).to(tl.float64))
    nan = tl.sum(acc_nan.to(tl.int64), axis=0)
    tl.store(part_i + pid, tl.sum(acc_s, axis=0))
    tl.store(part_i + items_total + pid, nan)
    tl.store(part_i + 2 * items_total + pid, tl.sum(acc_bad.to(tl.int64), axis=0) - nan)
    tl.debug_barrier()  # every thread's stores before the arrival is counted (the atomic releases them)
    counters = (table + 4 * segments).to(tl.pointer_type(tl.int32), bitcast=True)
    arrived = tl.atomic_add(counters + 2 * seg, 1, sem="acq_rel")
    if arrived == programs - 1:  # the segment's last item to finish: its rows into its handle
        tl.store(counters + 2 * seg, 0)  # every item has arrived: the table can be launched again (a batch plan's)
        combine_rows(part_f, part_i, first, programs, items_total, out + 8 * seg, n, REDUCE)
