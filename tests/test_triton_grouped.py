"""The grouped digest of small tensors (harness.frameworks.triton_digest `grouped_device_digest`: copied into a
per-dtype arena, digested together by one launch of `grouped_digest` at the step's end) gives, per tensor, the
numpy fast64 bit for bit and the numpy statistics (within fast_hash.stats_tolerance), for many small tensors of
mixed dtypes and sizes in one step: odd byte lengths, NaN/Inf, empty and 0-d tensors, views off a 4-byte
boundary, non-contiguous ones, segments of several programs and of more than one block; under the default
settings and under small ones (one tile per program, the last program's reduce and the segment search in passes
of 4, arenas so small that groups fill, launch early and grow). The handles go through TorchAdapter.fetch_digests
with a fused (ungrouped) one among them, so the rows come back in the handles' order.

Like tests/test_triton_digest.py, the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1) in a
subprocess (that file's triton_used, SITE, TRITON_NEEDED). On a GPU (`gpu` tests, skipped without one): the
grouped path of harness.frameworks.torch `device_digest` against numpy and against the ungrouped kernel
(XFALIGN_DIGEST_GROUP_BYTES=0), an in-place change right after the digest, a digest on a side stream, the arena
groups' kept tables and the fetch's kept pinned blocks.
Run as a script (what the subprocess does), this file prints one JSON line per tensor and setting.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from test_triton_digest import interpreter_results

from harness.store.fast_hash import stats_mismatches

ROOT = Path(__file__).resolve().parent.parent
# settings of triton_digest for the interpreter's runs: the defaults; then every loop of the kernel in several
# passes and every group launched early (a 4 KiB arena: most tensors fill it, and one is larger than it)
SETTINGS = ({}, {"ITEM_TILES": 1, "REDUCE_ROWS": 4, "SEARCH": 4, "ARENA_BYTES": 4096, "ROWS": 2, "WARPS": 1})


def arrays() -> dict[str, Any]:
    """Small tensors of a step, as numpy arrays (the views and the transposed one are made in `cases`)."""
    import ml_dtypes
    import numpy as np

    from harness.store.fast_hash import BLOCK

    rng = np.random.default_rng(0)
    normal = rng.standard_normal
    special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, 3.0, -7.5, np.nan], np.float32)
    with np.errstate(over="ignore"):
        return {
            "bf16 [7, 13]": normal((7, 13)).astype(ml_dtypes.bfloat16),
            "fp32 [5000] (3 tiles)": normal(5000).astype(np.float32),
            "bf16 [1]": np.array([-3.5], ml_dtypes.bfloat16),
            "fp32 [] (0-d)": np.array(2.5, np.float32),
            "bf16 NaN/Inf/-0/subnormal": special.astype(ml_dtypes.bfloat16),
            "fp32 [0, 3] (empty)": np.zeros((0, 3), np.float32),
            "fp16 [3, 4099] (odd bytes)": normal((3, 4099)).astype(np.float16),
            "fp32 NaN/Inf/-0/subnormal": special,
            "bf16 [9000] with NaN/Inf (several programs)": np.where(rng.random(9000) < 0.01, np.inf, normal(9000)).astype(
                ml_dtypes.bfloat16),
            "fp32 all NaN": np.full(5, np.nan, np.float32),
            "fp64 [1001]": normal(1001) * 1e3,
            "fp64 NaN/Inf": special.astype(np.float64),
            "int32 [3, 5, 11]": rng.integers(-2**31, 2**31 - 1, size=(3, 5, 11), dtype=np.int32),
            "int64 extremes": np.array([-2**63, 2**63 - 1, 0, -1, 1, -2**62, 2**62 + 12345, -7], np.int64),
            "int64 [] (0-d)": np.array(-3, np.int64),
            "bool [77] (odd bytes)": rng.random(77) > 0.5,
            "bool [3]": np.array([True, False, True]),
            "bool [0] (empty)": np.zeros(0, np.bool_),
            "fp16 [] (0-d)": np.array(1.5, np.float16),
            "bf16 [2*BLOCK+3] (2 blocks, odd bytes)": normal(2 * BLOCK + 3).astype(ml_dtypes.bfloat16),
            "fp32 [2*BLOCK+5] (3 blocks: whole-block tiles at 2 rows)": normal(2 * BLOCK + 5).astype(np.float32),
            "bf16 [5, 3]": normal((5, 3)).astype(ml_dtypes.bfloat16),
            "fp32 [17]": normal(17).astype(np.float32),
        }


def cases(device: str = "cpu") -> list[tuple[str, Any, Any]]:
    """(label, torch tensor on `device`, numpy array of the same bytes)."""
    import ml_dtypes
    import numpy as np

    from harness.frameworks.torch import TorchAdapter

    adapter = TorchAdapter()
    found = [(label, adapter.to_tensor(array, device, False), array) for label, array in arrays().items()]
    rng = np.random.default_rng(1)
    bf16 = rng.standard_normal(41).astype(ml_dtypes.bfloat16)
    found.append(("bf16 [40] view at byte offset 2", adapter.to_tensor(bf16, device, False)[1:], bf16[1:]))
    flags = rng.random(23) > 0.5
    for offset in (1, 3):
        found.append((f"bool view at byte offset {offset}", adapter.to_tensor(flags, device, False)[offset:offset + 13],
                      flags[offset:offset + 13]))
    matrix = rng.standard_normal((33, 65)).astype(np.float32)
    found.append(("fp32 [65, 33] transposed (not contiguous)", adapter.to_tensor(matrix, device, False).t(), matrix.T))
    cube = rng.standard_normal((4, 6, 5)).astype(ml_dtypes.bfloat16)
    found.append(("bf16 [4, 3, 5] strided slice", adapter.to_tensor(cube, device, False)[:, ::2], cube[:, ::2]))
    return found


def _run() -> None:
    """In the interpreter's subprocess: the cases as one step (grouped, and one tensor fused), per setting."""
    import numpy as np
    import torch

    from harness.dtypes import dtype_name
    from harness.frameworks import triton_batch, triton_digest
    from harness.frameworks.torch import TorchAdapter
    from harness.store.fast_hash import PendingDigest, fast64
    from harness.store.stats import tensor_stats

    adapter = TorchAdapter()
    found = cases()
    defaults = {name: getattr(triton_digest, name) for setting in SETTINGS for name in setting}
    for setting in SETTINGS:
        for name, value in {**defaults, **setting}.items():
            setattr(triton_digest, name, value)
        triton_digest._OPEN.clear()
        triton_digest._ARENA.clear()
        fused = next(i for i, (label, _, _) in enumerate(found) if label.startswith("fp64 [1001]"))
        pending = []
        for i, (_, tensor, array) in enumerate(found):
            handle = triton_digest.fused_device_digest(tensor) if i == fused else triton_digest.grouped_device_digest(tensor)
            pending.append(PendingDigest(dtype_name(array.dtype), tuple(array.shape), array.nbytes, handle))
        groups = {id(p.values.group) for p in pending if isinstance(p.values, triton_digest.GroupSlot)}
        rows = adapter.fetch_digests([p.values for p in pending])()
        for (label, _, array), work, row in zip(found, pending, rows, strict=True):
            work.settle(row)
            entry = work.result()
            with np.errstate(over="ignore", invalid="ignore"):
                expected, stats = fast64(np.asarray(array)), tensor_stats(np.ascontiguousarray(array))
            print(json.dumps({"label": f"{label} {setting}", "dtype": entry["dtype"], "fast64": entry["fast64"],
                              "expected": expected, "stats": entry["stats"], "expected_stats": stats,
                              "elements": float(row[4]), "size": int(array.size), "groups": len(groups)}), flush=True)
    # the cases at hand together, read in place (one launch per dtype over their addresses) where they can be
    # (contiguous, on a 16-byte boundary), from a contiguous copy where not, the empty ones by the fused kernel;
    # then again, the same tensors changed in place: the first call's plan launched again, on the values then; then
    # with one tensor replaced by a changed copy (another address): the same plan, its tables made for the copy's
    # address; then with one tensor seen in another shape: a plan of its own
    for name, value in defaults.items():
        setattr(triton_digest, name, value)
    tensors = [tensor for _, tensor, _ in found]
    first = None
    for round_ in ("", " again", " replaced", " reshaped", " other rows"):
        if round_ == " again":
            for tensor in tensors:
                if tensor.dtype == torch.bool:
                    tensor.logical_not_()
                elif tensor.is_floating_point():
                    tensor.mul_(-2)
                else:
                    tensor.add_(1)
        if round_ == " replaced":
            tensors[1] = tensors[1].clone().mul_(3)
        if round_ == " reshaped":
            tensors[0] = tensors[0].reshape(tensors[0].shape[::-1])
        if round_ == " other rows":  # a setting of the kernel changed: the same tensors, a plan of their own
            triton_digest.ROWS = 2
        before = dict(triton_batch.COUNTS)
        slots, plan = triton_batch.batched_device_digests(tensors)
        made = {kind: triton_batch.COUNTS[kind] - before[kind] for kind in ("lists", "plans", "tables")}
        first = first or plan
        handles = [triton_digest.fused_device_digest(tensor) if slot is None else slot
                   for tensor, slot in zip(tensors, slots, strict=True)]
        groups = [batch for batches in plan.devices for batch in batches]  # a launch each
        rows = adapter.fetch_digests(handles)()
        for (label, _, _), tensor, slot, row in zip(found, tensors, slots, rows, strict=True):
            array = adapter.to_numpy(tensor)  # its values now
            work = PendingDigest(dtype_name(array.dtype), tuple(array.shape), array.nbytes, None)
            work.settle(row)
            entry = work.result()
            with np.errstate(over="ignore", invalid="ignore"):
                expected, stats = fast64(np.asarray(array)), tensor_stats(np.ascontiguousarray(array))
            readable = tensor.numel() > 0  # in place, or from a contiguous copy (views, a transposed one)
            print(json.dumps({"label": f"{label} batched{round_}", "dtype": entry["dtype"],
                              "fast64": entry["fast64"], "expected": expected, "stats": entry["stats"],
                              "expected_stats": stats, "elements": float(row[4]), "size": int(array.size),
                              "groups": len(groups), "batched": slot is not None, "readable": readable,
                              "same plan": plan is first, "made": made}), flush=True)
    triton_digest.ROWS = defaults["ROWS"]


def _check(result: dict) -> None:
    label = result["label"]
    assert result["fast64"] == result["expected"], label
    assert result["elements"] == result["size"], label
    assert not stats_mismatches(result["stats"], result["expected_stats"], result["dtype"]), (label, result)


@pytest.mark.slow
def test_grouped_digest_equals_numpy_per_tensor_in_triton_interpreter():
    results = interpreter_results(__file__)
    count = len(cases())
    assert len(results) == (len(SETTINGS) + 5) * count, results[-3:]
    for result in results:
        _check(result)
    dtypes = {result["dtype"] for result in results}
    # the default arena holds a step's tensors: one group per dtype; the 4 KiB one fills and launches early
    assert {r["groups"] for r in results[:count]} == {len(dtypes)}, results[0]
    assert all(r["groups"] > len(dtypes) for r in results[count:len(SETTINGS) * count]), results[-1]
    # batched: every tensor not empty (in place, or a copy of a view), one group per dtype among them; again, on the
    # same tensors changed in place, by the same plan (its tables launched again, its copies made again); with one
    # tensor replaced, by the same plan (tables made for the new address); with one reshaped, by another plan
    batched = results[len(SETTINGS) * count:]
    assert [r["batched"] for r in batched] == [r["readable"] for r in batched]
    assert sum(r["batched"] for r in batched) >= count * 2
    assert {r["groups"] for r in batched} == {len({r["dtype"] for r in batched if r["batched"]})}
    again, replaced, reshaped, other_rows = (batched[k * count:(k + 1) * count] for k in (1, 2, 3, 4))
    assert all(r["same plan"] and r["label"].endswith(" again") for r in again)
    assert all(r["same plan"] and r["label"].endswith(" replaced") for r in replaced)
    assert not any(r["same plan"] for r in reshaped) and all(r["label"].endswith(" reshaped") for r in reshaped)
    assert not any(r["same plan"] for r in other_rows) and all(r["label"].endswith(" other rows") for r in other_rows)
    # what each round made (triton_batch.COUNTS): a plan and its tables; nothing; new tables; a plan and its tables;
    # a plan and its tables (a launch is made for its settings: triton_digest.group_settings)
    made = [batched[k * count]["made"] for k in range(5)]
    assert made == [{"lists": 1, "plans": plans, "tables": tables}
                    for plans, tables in ((1, 1), (0, 0), (0, 1), (1, 1), (1, 1))], made


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float64", "int8"])
def test_a_batch_read_in_place_has_the_segment_rows_one_by_one_would_make(dtype):
    """Group.in_place makes its segments' rows for the whole batch at once (numpy), and `placed` their first units:
    the same rows, item count and largest segment as `_segment` called per tensor, for tensors of many sizes
    (empty-sized ones excepted: the batch leaves them out) at 16-byte aligned addresses in any order, some items
    long; placed at an address off a 16-byte boundary, no group."""
    import numpy as np
    import torch

    from harness.frameworks import triton_digest

    dtype_ = getattr(torch, dtype)
    rng = np.random.default_rng(7)
    sizes = [1, 3, 7, 8, 9, 1000, 4097, 70_001, 2, 129, 300_000, 5]
    width = torch.empty(0, dtype=dtype_).element_size()
    align = 16 // width
    offsets, at = [], 0
    for n in sizes:
        offsets.append(at)
        at += -(-n // align) * align + align * int(rng.integers(0, 3))  # gaps between segments
    buffer = torch.zeros(at + align, dtype=dtype_)
    start = (-buffer.data_ptr() % 16) // width  # the first 16-byte boundary in the buffer
    order = rng.permutation(len(sizes))  # the batch in another order than the addresses
    tensors = [buffer[start + offsets[i]:start + offsets[i] + sizes[i]] for i in order]
    addresses = [tensor.data_ptr() for tensor in tensors]
    counts = [tensor.numel() for tensor in tensors]
    layout = triton_digest._layout(tensors[0])
    key = (-1, 0, dtype_)
    template = triton_digest.Group.in_place(key, tensors[0], counts, layout)
    group = template.placed(addresses)
    assert group is not None and template.placed([*addresses[:-1], addresses[-1] + width]) is None
    one_by_one = triton_digest.Group(key, tensors[0], layout, 16)
    base = min(addresses)
    for address, n in zip(addresses, counts, strict=True):
        one_by_one._segment((address - base) // one_by_one.unit, n)
    assert list(group.rows) == list(one_by_one.rows)
    assert (group.items, group.largest) == (one_by_one.items, one_by_one.largest)
    assert tensors[group.lowest].data_ptr() == base


def test_a_fetch_finds_each_handles_row_whatever_the_order_of_grouped_and_single_handles(torch):
    """fetch_digests over grouped handles of two launches (triton_digest.Launched blocks, rows in any order, a
    launch's run broken by single handles and taken up again) and single handles (a tensor of SLOTS each): each
    handle's row is its own. On the host: the rows' bookkeeping is the GPU's, without a kernel."""
    from harness.frameworks.torch import TorchAdapter
    from harness.frameworks.triton_digest import GroupSlot, Launched
    from harness.store.fast_hash import SLOTS

    width = len(SLOTS)
    cpu = torch.device("cpu")
    blocks = [torch.arange(rows * width, dtype=torch.float64).view(rows, width) + 1000 * (k + 1)
              for k, rows in enumerate((5, 3))]
    launched = [Launched(block, cpu) for block in blocks]
    single = [torch.full((width,), -1.0 - k, dtype=torch.float64) for k in range(4)]
    order = [(0, 3), (0, 0), ("single", 0), (0, 4), (1, 2), ("single", 1), ("single", 2), (1, 0), (0, 1), (1, 1),
             (0, 2), ("single", 3)]
    handles = [single[row] if which == "single" else GroupSlot(launched[which], row) for which, row in order]
    rows = TorchAdapter().fetch_digests(handles)()
    expected = [single[row] if which == "single" else blocks[which][row] for which, row in order]
    assert [row.tolist() for row in rows] == [row.tolist() for row in expected]


def test_group_bytes_names_the_variable_on_bad_input(monkeypatch):
    from harness.frameworks import triton_digest

    monkeypatch.setenv("XFALIGN_DIGEST_GROUP_BYTES", "1M")
    with pytest.raises(ValueError, match="XFALIGN_DIGEST_GROUP_BYTES='1M'"):
        triton_digest.group_bytes()
    monkeypatch.setenv("XFALIGN_DIGEST_GROUP_BYTES", "0")
    assert triton_digest.group_bytes() == 0
    monkeypatch.delenv("XFALIGN_DIGEST_GROUP_BYTES")
    assert triton_digest.group_bytes() == triton_digest.GROUP_BYTES


# -- on the GPU ---------------------------------------------------------------------------------------------------


def _device_step(torch, grouped: bool, monkeypatch) -> list[dict]:
    """The cases on the GPU as one step through harness.frameworks.torch `device_digest` and fetch_digests."""
    from harness.frameworks import triton_digest
    from harness.frameworks.torch import TorchAdapter, device_digest

    monkeypatch.setenv("XFALIGN_DIGEST_GROUP_BYTES", str(triton_digest.GROUP_BYTES if grouped else 0))
    monkeypatch.delenv("XFALIGN_FAST_DIGEST_KERNEL", raising=False)
    triton_digest.forget_route()  # read at a step's first digest
    pending = [device_digest(tensor) for _, tensor, _ in cases("cuda")]
    assert all(isinstance(p.values, triton_digest.GroupSlot) is grouped for p in pending)
    for work, row in zip(pending, TorchAdapter().fetch_digests([p.values for p in pending])(), strict=True):
        work.settle(row)
    return [work.result() for work in pending]


def _expected(label: str, array, entry: dict) -> dict:
    import numpy as np

    from harness.store.fast_hash import fast64
    from harness.store.stats import tensor_stats

    with np.errstate(over="ignore", invalid="ignore"):
        stats = tensor_stats(np.ascontiguousarray(array))
    return {"label": label, "dtype": entry["dtype"], "fast64": entry["fast64"], "expected": fast64(np.asarray(array)),
            "stats": entry["stats"], "expected_stats": stats, "elements": float(array.size), "size": int(array.size)}


@pytest.mark.gpu
def test_grouped_digest_on_the_device_equals_numpy_and_the_ungrouped_kernel(torch, monkeypatch):
    from harness.frameworks import triton_digest

    if not triton_digest.importable():
        pytest.skip("triton cannot be imported: the digest kernels are Triton kernels")
    grouped, single = _device_step(torch, True, monkeypatch), _device_step(torch, False, monkeypatch)
    for (label, _, array), entry, alone in zip(cases(), grouped, single, strict=True):
        _check(_expected(label, array, entry))
        assert entry["fast64"] == alone["fast64"], label
        for key in ("min", "max", "nan", "inf"):  # exact in both; the sums in another order
            assert entry["stats"][key] == alone["stats"][key] or entry["stats"][key] != entry["stats"][key], (label, key)


@pytest.mark.gpu
def test_launches_after_the_first_of_a_specialization_skip_tritons_binding_and_digest_alike(torch, monkeypatch):
    """A kernel's later launches of a specialization call its compiled launcher directly (harness.frameworks
    .triton_launch), the fused digest of a dtype and size launched before without binding its arguments (READY):
    the same digests as the first launches, for every case (views at odd addresses are their own
    specializations), grouped and fused; and on the current stream, behind what that stream does first."""
    from harness.frameworks import triton_digest, triton_launch
    from harness.frameworks.torch import TorchAdapter, device_digest
    from harness.store.fast_hash import fast64

    if not triton_digest.importable():
        pytest.skip("triton cannot be imported: the digest kernels are Triton kernels")
    from triton.runtime.jit import JITFunction

    fused = triton_digest._kernels()["digest"]
    bound = []  # launches of the fused kernel through triton_launch.launch: the others are its kept launchers' (READY)
    launch = triton_launch.launch
    monkeypatch.setattr(triton_launch, "launch", lambda kernel, *args: bound.append(kernel is fused) or launch(kernel, *args))
    triton_launch.READY.clear()  # kept by the tests before: the first pass keeps them again
    first = [json.dumps(entry, sort_keys=True) for grouped in (True, False) for entry in _device_step(torch, grouped, monkeypatch)]
    known, bound_first = len(triton_launch._FAST), sum(bound)
    bound.clear()
    tritons = []  # launches through Triton's own binding (`kernel[grid](...)` calls JITFunction.run)
    run = JITFunction.run
    monkeypatch.setattr(JITFunction, "run", lambda self, *args, **kwargs: tritons.append(self) or run(self, *args, **kwargs))
    again = [json.dumps(entry, sort_keys=True) for grouped in (True, False) for entry in _device_step(torch, grouped, monkeypatch)]
    monkeypatch.setattr(JITFunction, "run", run)
    assert known and len(triton_launch._FAST) == known  # no specialization new
    assert tritons == []  # every launch the second time direct
    # the contiguous tensors at 16-byte boundaries were launched by the launchers kept for their dtype and size
    assert triton_launch.READY and sum(bound) < bound_first, (sum(bound), bound_first)
    assert again == first
    for n in (70_000, 3_000_000):  # grouped, fused
        source = torch.randn(n, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        found = []
        with torch.cuda.stream(side):
            for _ in range(2):  # the first launch Triton's, the second direct
                target = torch.zeros_like(source)
                torch.cuda._sleep(50_000_000)  # the copy waits on the side stream: so must the digest
                target.copy_(source)
                work = device_digest(target)
                (row,) = TorchAdapter().fetch_digests([work.values])()
                work.settle(row)
                found.append(work.result()["fast64"])
        assert found == [fast64(source.cpu().numpy())] * 2, n


@pytest.mark.gpu
def test_grouped_digest_is_of_the_tensor_as_it_was_when_digested(torch, monkeypatch):
    """The copy into the arena runs in stream order: an in-place change right after, or a digest on another
    stream than the step's end, does not change what is digested."""
    from harness.frameworks import triton_digest
    from harness.frameworks.torch import TorchAdapter, device_digest
    from harness.store.fast_hash import fast64

    if not triton_digest.importable():
        pytest.skip("triton cannot be imported: the digest kernels are Triton kernels")
    monkeypatch.delenv("XFALIGN_DIGEST_GROUP_BYTES", raising=False)
    monkeypatch.delenv("XFALIGN_FAST_DIGEST_KERNEL", raising=False)
    triton_digest.forget_route()
    tensors = [torch.randn(n, device="cuda") for n in (1000, 3, 70000)]
    expected = [fast64(t.cpu().numpy()) for t in tensors]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    pending = [device_digest(tensors[0])]
    tensors[0].mul_(3.0)
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # the side stream's copies wait: the step's end must wait for them
        pending += [device_digest(t) for t in tensors[1:]]
        tensors[2].add_(1.0)
    assert len({id(p.values.group) for p in pending}) == 2
    for work, row in zip(pending, TorchAdapter().fetch_digests([p.values for p in pending])(), strict=True):
        work.settle(row)
    assert [work.result()["fast64"] for work in pending] == expected
    assert [fast64(t.cpu().numpy()) != digest for t, digest in zip(tensors, expected, strict=True)] == [True, False, True]


@pytest.mark.gpu
def test_batched_digest_reads_the_tensors_in_place_as_they_are_then(torch, monkeypatch):
    """Tensors at hand together are digested where they are by one launch per dtype (TorchAdapter.device_digests):
    each digest is numpy's and the ungrouped kernel's, and an in-place change right after does not reach it; the
    same tensors again give the digests of their values then."""
    from harness.frameworks import triton_digest
    from harness.frameworks.torch import TorchAdapter

    if not triton_digest.importable():
        pytest.skip("triton cannot be imported: the digest kernels are Triton kernels")
    monkeypatch.delenv("XFALIGN_FAST_DIGEST_KERNEL", raising=False)
    triton_digest.forget_route()
    found = cases("cuda")
    adapter = TorchAdapter()
    pending = adapter.device_digests([tensor for _, tensor, _ in found])
    batched = [isinstance(work.values, triton_digest.GroupSlot) and work.values.group.block is not None for work in pending]
    assert sum(batched) >= len(found) // 2
    for _, tensor, _ in found:
        if tensor.is_floating_point() and tensor.numel():
            tensor.mul_(3.0)  # after the launch: not digested (the numpy arrays below are the values before)
    for work, row in zip(pending, adapter.fetch_digests([p.values for p in pending])(), strict=True):
        work.settle(row)
    for (label, _, array), work in zip(found, pending, strict=True):
        _check(_expected(label, array, work.result()))
    # the same tensors again, changed since: the plan made above is launched again, on the values now
    again = adapter.device_digests([tensor for _, tensor, _ in found])
    assert [type(work.values) for work in again] == [type(work.values) for work in pending]
    for work, row in zip(again, adapter.fetch_digests([p.values for p in again])(), strict=True):
        work.settle(row)
    for (label, tensor, _), work in zip(found, again, strict=True):
        _check(_expected(label, adapter.to_numpy(tensor), work.result()))


@pytest.mark.gpu
def test_one_fetch_of_lists_hooks_and_large_tensors_interleaved_on_a_side_stream_gives_each_its_row(torch, monkeypatch):
    """One fetch_digests of handles of every kind interleaved: three calls of one list's plan (the later ones by
    Triton's launchers called at once, on other values), an arena group's, a large tensor's, on a side stream whose
    work waits behind a sleep; each digest is numpy's of the values when it was started."""
    from harness.frameworks import triton_batch, triton_digest
    from harness.frameworks.torch import TorchAdapter, device_digest

    if not triton_digest.importable():
        pytest.skip("triton cannot be imported: the digest kernels are Triton kernels")
    monkeypatch.delenv("XFALIGN_FAST_DIGEST_KERNEL", raising=False)
    monkeypatch.delenv("XFALIGN_DIGEST_GROUP_BYTES", raising=False)
    triton_digest.forget_route()
    adapter = TorchAdapter()
    listed = [torch.randn(n, device="cuda").to(dtype) for n, dtype in
              ((4096, torch.bfloat16), (333, torch.float32), (70000, torch.bfloat16), (8, torch.float32))]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)
        expected, pending = [], []
        for round_ in range(3):
            work = adapter.device_digests(listed)
            expected += [adapter.to_numpy(tensor).copy() for tensor in listed]
            pending += work
            for tensor in listed:
                tensor.mul_(-3.0)  # after its digest: the next round's values
            hooked = torch.randn(1000 + round_, device="cuda")  # an arena's, one by one
            large = torch.randn(5_000_000, device="cuda")
            pending += [device_digest(hooked), device_digest(large)]
            expected += [adapter.to_numpy(hooked).copy(), adapter.to_numpy(large).copy()]
        assert [type(work.values) for work in pending] == ([triton_digest.GroupSlot] * 5 + [torch.Tensor]) * 3
        plan = list(triton_batch._PLANS.values())[-1]  # the list's, the last used
        assert all(launch.direct is not None for made in plan.made for launch, _ in made.values())
        order = [*range(1, len(pending), 2), *range(0, len(pending), 2)]  # interleaved otherwise than started
        rows = adapter.fetch_digests([pending[i].values for i in order])()
    for i, row in zip(order, rows, strict=True):
        pending[i].settle(row)
    for k, (array, work) in enumerate(zip(expected, pending, strict=True)):
        _check(_expected(f"digest {k}", array, work.result()))


@pytest.mark.gpu
def test_tensors_at_hand_together_on_the_host_and_the_gpu_are_each_digested_where_they_live(torch, monkeypatch):
    """One TorchAdapter.device_digests call over CPU and CUDA tensors interleaved: the CUDA ones batched, the CPU
    ones digested on the host, every digest numpy's, in the order given."""
    from harness.frameworks import triton_digest
    from harness.frameworks.torch import TorchAdapter

    if not triton_digest.importable():
        pytest.skip("triton cannot be imported: the digest kernels are Triton kernels")
    monkeypatch.delenv("XFALIGN_FAST_DIGEST_KERNEL", raising=False)
    triton_digest.forget_route()
    mixed = [case for pair in zip(cases("cpu"), cases("cuda"), strict=True) for case in pair]
    adapter = TorchAdapter()
    pending = adapter.device_digests([tensor for _, tensor, _ in mixed])
    assert all(not isinstance(work.values, triton_digest.GroupSlot) for work in pending[::2])  # the host's
    assert sum(isinstance(work.values, triton_digest.GroupSlot) for work in pending[1::2]) >= len(mixed) // 4
    unsettled = [work for work in pending if not work.fetched]
    for work, row in zip(unsettled, adapter.fetch_digests([work.values for work in unsettled])(), strict=True):
        work.settle(row)
    for (label, _, array), work in zip(mixed, pending, strict=True):
        _check(_expected(label, array, work.result()))


@pytest.mark.gpu
def test_arena_groups_of_the_same_sizes_launch_on_their_kept_table_and_digest_the_values_then(torch, monkeypatch):
    """Two steps copying the same sizes in the same order into the arena: the second launches on the table the first
    made (triton_digest._kept_launch: one kept), and its digests are numpy's of the values then (the kept table's
    arrival counters were reset by the launch before)."""
    from harness.frameworks import triton_digest
    from harness.frameworks.torch import TorchAdapter, device_digest
    from harness.store.fast_hash import fast64

    if not triton_digest.importable():
        pytest.skip("triton cannot be imported: the digest kernels are Triton kernels")
    monkeypatch.delenv("XFALIGN_DIGEST_GROUP_BYTES", raising=False)
    monkeypatch.delenv("XFALIGN_FAST_DIGEST_KERNEL", raising=False)
    monkeypatch.setattr(triton_digest, "_LAUNCHES", {})
    tensors = [torch.randn(n, device="cuda") for n in (1000, 3, 70000)]
    for _ in range(2):
        triton_digest.forget_route()  # read at a step's first digest
        pending = [device_digest(tensor) for tensor in tensors]
        assert all(isinstance(work.values, triton_digest.GroupSlot) for work in pending)
        for work, row in zip(pending, TorchAdapter().fetch_digests([work.values for work in pending])(), strict=True):
            work.settle(row)
        assert [work.result()["fast64"] for work in pending] == [fast64(tensor.cpu().numpy()) for tensor in tensors]
        for tensor in tensors:
            tensor.mul_(3.0)  # the next step's values
    assert len(triton_digest._LAUNCHES) == 1


@pytest.mark.gpu
def test_fetches_fill_a_pinned_block_again_once_read_never_one_still_unread(torch, monkeypatch):
    """fetch_digests keeps its pinned blocks: a fetch not read yet keeps its block (the next fetch fills another, and
    the first's rows, read after, are still its own), a fetch read hands its block on; rows() read twice gives the
    same array."""
    from harness.frameworks import torch as torch_adapter
    from harness.frameworks.torch import TorchAdapter, device_digest
    from harness.store.fast_hash import fast64

    monkeypatch.setattr(torch_adapter, "_PINNED", {})
    adapter = TorchAdapter()
    tensors = [torch.randn(n, device="cuda") for n in (5000, 70000, 300)]
    pending = [device_digest(tensor) for tensor in tensors]
    first, second = (adapter.fetch_digests([work.values]) for work in pending[:2])  # the first not read yet
    (blocks,) = torch_adapter._PINNED.values()
    assert [block.taken for block in blocks] == [True, True] and blocks[0] is not blocks[1]
    for work, rows in ((pending[1], second), (pending[0], first)):
        work.settle(rows()[0])
    assert first() is first()
    assert [block.taken for block in blocks] == [False, False]
    third = adapter.fetch_digests([pending[2].values])
    assert len(blocks) == 2 and sum(block.taken for block in blocks) == 1
    pending[2].settle(third()[0])
    assert [work.result()["fast64"] for work in pending] == [fast64(tensor.cpu().numpy()) for tensor in tensors]


@pytest.mark.gpu
def test_a_list_groups_tensors_up_to_batch_bytes_read_in_place_and_each_digest_is_numpys(torch, monkeypatch):
    """Tensors at hand together above the hooks' group_bytes() and up to triton_digest.BATCH_BYTES (read in place,
    no arena) are digested by the list's grouped launch, each equal to numpy's; a larger one by its own launch."""
    import numpy as np

    from harness.frameworks import triton_digest
    from harness.frameworks.torch import TorchAdapter

    if not triton_digest.importable():
        pytest.skip("triton cannot be imported: the digest kernels are Triton kernels")
    monkeypatch.delenv("XFALIGN_FAST_DIGEST_KERNEL", raising=False)
    monkeypatch.delenv("XFALIGN_DIGEST_GROUP_BYTES", raising=False)
    triton_digest.forget_route()
    rng = np.random.default_rng(7)
    sizes = [(triton_digest.GROUP_BYTES + 2, torch.bfloat16), (16 << 20, torch.bfloat16),
             (triton_digest.BATCH_BYTES, torch.bfloat16), ((9 << 20) + 4, torch.float32),
             (triton_digest.BATCH_BYTES + 4, torch.float32)]
    tensors = [torch.from_numpy(rng.standard_normal(nbytes // torch.tensor([], dtype=dtype).element_size(),
                                                    dtype=np.float32)).to("cuda", dtype) for nbytes, dtype in sizes]
    adapter = TorchAdapter()
    pending = adapter.device_digests(tensors)
    grouped = [isinstance(work.values, triton_digest.GroupSlot) for work in pending]
    assert grouped == [True, True, True, True, False]
    for work, row in zip(pending, adapter.fetch_digests([p.values for p in pending])(), strict=True):
        work.settle(row)
    for (nbytes, dtype), tensor, work in zip(sizes, tensors, pending, strict=True):
        _check(_expected(f"{dtype} of {nbytes} bytes", adapter.to_numpy(tensor), work.result()))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _run()
