"""Check that the fast digest computed by torch on a device (harness.frameworks.torch `device_digest`, the
path a capture with hash="fast" takes) equals the numpy one of the same bytes on the host
(harness.store.fast_hash.fast64, and the statistics of harness.store.stats within fast_hash.stats_tolerance), for a
fixed set of tensors: several dtypes, odd sizes, empty, more than one block of words, NaN/Inf, views that
do not start on a 4-byte boundary, a transposed one. On CUDA the three paths of `device_digest` are
checked: "grouped" (the default: tensors up to triton_digest.group_bytes() copied into an arena and digested
together by `grouped_digest` at the step's end, larger ones by the fused kernel), "fused" (the Triton kernel of
harness.frameworks.triton_digest, `fused_device_digest`, one launch per tensor: XFALIGN_DIGEST_GROUP_BYTES=0) and
"torch" (torch ops, XFALIGN_FAST_DIGEST_KERNEL=torch); on the CPU the torch ops. One line per tensor and path; on
CUDA then a step of 100 small tensors (STEP: mixed sizes and dtypes, some not contiguous), checked per tensor
against numpy on the grouped and fused paths (and on the grouped path digested together, as a step's parameters
are: TorchAdapter.device_digests, three times: a plan made, launched again, and on the same tensors at other
addresses), and its CPU cost per tensor on each, side by side (the digests plus the step's fetch_digests, the GPU
kept busy so that nothing waits for it; --steps steps, the median and the range; together also at new addresses
each step, as for new gradients, and with a new plan each step, as for tensors not seen before),
the time of one digest of a large bf16 tensor per path, with --sweep the time of the default kernel under other
tile and grid settings (ROWS, WARPS, PROGRAMS_PER_SM; each also checked bit for bit), then "ALL EQUAL" (exit 0)
or the differences (exit 1; also when a Triton path is asked for and triton cannot be imported).
--turns N runs the check N times, a process each, and then sums up each way's host cost per tensor over the turns;
--baseline DIR also runs it, taking turns (the baseline first), on the harness of the checkout at DIR (this script,
that harness first on PYTHONPATH: e.g. `git worktree add DIR REV`), then per turn this code's median over the
baseline's: the host's speed drifts between calls, and within one, by more than a change to this path saves.

    python3 scripts/check_fast_digest.py [--device cuda|cpu] [--paths grouped fused torch] [--steps 20] [--sweep]
                                         [--turns N] [--baseline DIR] [--figures FILE]

--figures FILE writes the host costs per way (JSON); with --turns or --baseline, each turn's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import torch

from harness.frameworks import triton_batch, triton_digest
from harness.frameworks.torch import TorchAdapter, device_digest
from harness.store.fast_hash import BLOCK, fast64, stats_mismatches
from harness.store.stats import tensor_stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs_in_turns import is_checkout, median_range, on_checkout, turn_medians  # noqa: E402

HERE = Path(__file__).resolve().parent.parent  # this checkout, whose harness --turns and --baseline check
# path -> (XFALIGN_FAST_DIGEST_KERNEL, XFALIGN_DIGEST_GROUP_BYTES; None: unset, the default)
PATHS = {"grouped": ("auto", None), "fused": ("auto", "0"), "torch": ("torch", "0")}
# the step of small tensors whose CPU cost is measured: (count, dtype, shape, transposed), 100 tensors, ~16 MiB
STEP = ((40, torch.bfloat16, (4096,), False), (20, torch.float32, (4096,), False), (20, torch.bfloat16, (16, 4096), False),
        (10, torch.bfloat16, (1024, 512), False), (5, torch.int64, (16, 256), False), (5, torch.bfloat16, (64, 4096), True))
# (ROWS, WARPS, PROGRAMS_PER_SM) of triton_digest's default kernel that --sweep times (the first: the defaults)
# (PROGRAMS_PER_SM: an upper bound; the programs resident at once, from the registers, decide below it)
SWEEP = ((triton_digest.ROWS, triton_digest.WARPS, triton_digest.PROGRAMS_PER_SM), (4, 4, 8), (2, 4, 8), (16, 4, 8),
         (8, 8, 8), (4, 8, 8), (8, 4, 2))


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    normal = rng.standard_normal
    special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, 3.4e38, -2.5, np.nan], np.float32)
    return {
        "bf16 [7, 13]": normal((7, 13)).astype(ml_dtypes.bfloat16),
        "bf16 [4096, 1031] (> 1 block, odd)": normal((4096, 1031)).astype(ml_dtypes.bfloat16),
        "fp16 [3, 65537]": normal((3, 65537)).astype(np.float16),
        "fp32 [131075]": normal(BLOCK * 2 + 3).astype(np.float32),
        "fp32 [2048, 4096] (128 blocks)": normal((2048, 4096)).astype(np.float32),
        "fp32 NaN/Inf/-0/subnormal": special,
        "fp32 all NaN": np.full(5, np.nan, np.float32),
        "bf16 NaN/Inf/-0": special.astype(ml_dtypes.bfloat16),
        "fp16 NaN/Inf/-0": special.astype(np.float16),
        "fp64 NaN/Inf/-0": special.astype(np.float64),
        "fp64 [1001]": normal(1001),
        "fp64 [3, BLOCK + 1] (6 blocks)": normal((3, BLOCK + 1)),
        "bf16 [4096, 11008] (a weight of the layer)": normal((4096, 11008), np.float32).astype(ml_dtypes.bfloat16),
        "int32 [3, 5, 11]": rng.integers(-2**31, 2**31 - 1, size=(3, 5, 11), dtype=np.int32),
        "int64 [99999]": rng.integers(-2**63, 2**63 - 1, size=99999, dtype=np.int64),
        "bool [77]": rng.random(77) > 0.5,
        "bool [262147]": rng.random(4 * BLOCK + 3) > 0.5,
        "int64 [] (scalar)": np.array(-3, np.int64),
        "fp32 [0, 3] (empty)": np.zeros((0, 3), np.float32),
        "fp16 [] (scalar)": np.array(1.5, np.float16),
    }


def use(path: str) -> None:
    """Set the environment that makes `device_digest` take `path`."""
    kernel, group = PATHS[path]
    os.environ["XFALIGN_FAST_DIGEST_KERNEL"] = kernel
    if group is None:
        os.environ.pop("XFALIGN_DIGEST_GROUP_BYTES", None)
    else:
        os.environ["XFALIGN_DIGEST_GROUP_BYTES"] = group
    triton_digest.forget_route()  # read again at the next digest, not at the next step's


def digests(cases: list, path: str, adapter: TorchAdapter, together: bool = False) -> list[dict]:
    """The entries of `cases`' tensors digested by `path`: one by one (`device_digest`, as a capture's hooks do), or
    together (`TorchAdapter.device_digests`, as a step's parameters, gradients and optimizer states are)."""
    use(path)
    tensors = [tensor for _, tensor, _ in cases]
    pending = adapter.device_digests(tensors) if together else [device_digest(tensor) for tensor in tensors]
    for work, row in zip(pending, adapter.fetch_digests([p.values for p in pending])(), strict=True):
        work.settle(row)
    return [work.result() for work in pending]


def timing(tensor, path: str, repeat: int = 20) -> float:
    """Milliseconds of GPU time of one digest of `tensor` by `path` (CUDA events, after a warm-up; the GPU
    first sleeps ~5 ms so that the launches queue up: the time is the kernels', not the launches')."""
    use(path)
    device_digest(tensor)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(10_000_000)
    start.record()
    for _ in range(repeat):
        device_digest(tensor)
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / repeat


def host_timing(tensor, path: str, repeat: int = 20) -> float:
    """Milliseconds of CPU time of one call of device_digest (the launches) by `path`."""
    use(path)
    device_digest(tensor)
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # the GPU busy: the calls do not wait for it
    began = time.perf_counter()
    for _ in range(repeat):
        device_digest(tensor)
    seconds = time.perf_counter() - began
    torch.cuda.synchronize()
    return seconds * 1e3 / repeat


def step_tensors() -> list:
    """STEP's tensors on the GPU (normal values; the transposed ones are views, not contiguous)."""
    generator = torch.Generator(device="cuda").manual_seed(4)
    found = []
    for count, dtype, shape, transposed in STEP:
        for _ in range(count):
            if dtype.is_floating_point:
                tensor = torch.randn(shape, device="cuda", generator=generator).to(dtype)
            else:
                tensor = torch.randint(0, 50000, shape, device="cuda", generator=generator, dtype=dtype)
            found.append(tensor.t() if transposed else tensor)
    return found


def step_check(tensors: list, path: str, adapter: TorchAdapter, together: bool = False) -> int:
    """The step's tensors digested by `path` as one step, against numpy's fast64 and statistics; the differences."""
    entries = digests([("", tensor, None) for tensor in tensors], path, adapter, together)
    wrong = 0
    for tensor, entry in zip(tensors, entries, strict=True):
        array = TorchAdapter().to_numpy(tensor)
        wrong += entry["fast64"] != fast64(array) or bool(stats_mismatches(
            entry["stats"], tensor_stats(np.ascontiguousarray(array)), entry["dtype"]))
    return wrong


def step_host_cost(lists: list[list], path: str, adapter: TorchAdapter, steps: int,
                   together: bool = False, replan: bool = False) -> tuple[list, list, list]:
    """Per step (of `lists`' tensors, taking turns: lists of the same tensors at other addresses): microseconds of
    CPU per tensor for device_digest of each and the step's fetch_digests (the launches and the copy to the host
    started, not waited for: a capture's writer thread waits), the GPU kept busy by a sleep so that no call waits for
    it; the part of it in device_digest; and milliseconds of GPU time of the step's digests (CUDA events around them,
    the launches queued behind the sleep).
    Between steps this thread waits by torch.cuda.synchronize() (a spin), not by the rows' blocking event: in a
    capture the writer thread waits for the rows, and the training thread runs on; a thread woken from a sleep of
    the GPU's length ran the next step 1.7-3.0 us per tensor slower (6 runs, H200 host, torch 2.11, 2026-12-03)."""
    use(path)
    def digest_step(tensors: list) -> list:
        if replan:  # none kept: the step's tensors as if new ones, a plan made (triton_batch)
            triton_batch._PLANS.clear()
        return adapter.device_digests(tensors) if together else [device_digest(tensor) for tensor in tensors]

    for tensors in lists * 2:  # warm: compiled kernels, the pinned buffers, the arenas' sizes
        pending = digest_step(tensors)
        adapter.fetch_digests([p.values for p in pending])()
    host, digesting, device = [], [], []
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for step in range(steps):
        tensors = lists[step % len(lists)]
        torch.cuda.synchronize()
        torch.cuda._sleep(50_000_000)
        start.record()
        began = time.perf_counter()
        pending = digest_step(tensors)
        digested = time.perf_counter()
        rows = adapter.fetch_digests([p.values for p in pending])
        host.append((time.perf_counter() - began) * 1e6 / len(tensors))
        digesting.append((digested - began) * 1e6 / len(tensors))
        stop.record()
        torch.cuda.synchronize()
        for work, row in zip(pending, rows(), strict=True):
            work.settle(row)
        device.append(start.elapsed_time(stop))
    return host, digesting, device


def sweep(large, digest: str, adapter: TorchAdapter) -> int:
    """Time (and check) the default fused kernel on `large` under each setting of SWEEP; the differences."""
    saved = triton_digest.ROWS, triton_digest.WARPS, triton_digest.PROGRAMS_PER_SM
    nbytes, wrong = large.numel() * large.element_size(), 0
    try:
        for rows, warps, per_sm in SWEEP:
            triton_digest.ROWS, triton_digest.WARPS, triton_digest.PROGRAMS_PER_SM = rows, warps, per_sm
            found = digests([("", large, None)], "fused", adapter)[0]["fast64"]
            wrong += found != digest
            milliseconds = timing(large, "fused")
            resident = [v for k, v in triton_digest._RESIDENT.items() if ("ROWS", rows) in k and ("num_warps", warps) in k
                        and ("KIND", 2) in k and ("PARTIAL", False) in k]
            print(f"sweep ROWS={rows} WARPS={warps} PROGRAMS_PER_SM<={per_sm} (resident {resident}): {milliseconds:.3f} ms "
                  f"({nbytes / milliseconds / 1e6:.0f} GB/s), {'equal' if found == digest else 'DIFFERENT'}")
    finally:
        triton_digest.ROWS, triton_digest.WARPS, triton_digest.PROGRAMS_PER_SM = saved
    return wrong


def options() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--paths", choices=tuple(PATHS), nargs="+", default=None,
                        help="device_digest's paths to check (default: all three on cuda, torch on cpu)")
    parser.add_argument("--steps", type=int, default=20, help="steps of STEP timed per path (CPU cost per tensor)")
    parser.add_argument("--sweep", action="store_true",
                        help="on cuda, also time the default fused kernel under the settings of SWEEP")
    parser.add_argument("--turns", type=int, default=1, help="checks run, a process each, then summed up")
    parser.add_argument("--baseline", type=Path,
                        help="a checkout whose harness is checked too, taking turns; then this code over it per turn")
    parser.add_argument("--figures", type=Path, help="write the host costs per way to this JSON file (with --turns or "
                                                     "--baseline: per turn, {\"turns\": [...], \"baseline\": [...]})")
    return parser


def main() -> int:
    parser = options()
    args = parser.parse_args()
    if args.turns < 1:
        parser.error(f"--turns {args.turns}: at least 1")
    if args.baseline is not None and not is_checkout(args.baseline):
        parser.error(f"--baseline {args.baseline}: no harness/ there (a checkout of xfalign, e.g. made by `git worktree add`)")
    if args.turns > 1 or args.baseline is not None:
        return take_turns(sys.argv[1:], args.turns, args.baseline, args.figures)
    device = args.device
    paths = args.paths or (list(PATHS) if device == "cuda" else ["torch"])
    adapter = TorchAdapter()
    with np.errstate(over="ignore", invalid="ignore"):  # 3.4e38 -> fp16 is inf; numpy's stats meet inf - inf
        cases = [(label, adapter.to_tensor(array, device, False), array) for label, array in arrays().items()]
    base = np.random.default_rng(1).standard_normal(41).astype(ml_dtypes.bfloat16)
    cases.append(("bf16 [40] view at byte offset 2", adapter.to_tensor(base, device, False)[1:], base[1:]))
    flags = np.random.default_rng(2).random(23) > 0.5
    cases.append(("bool [20] view at byte offset 3", adapter.to_tensor(flags, device, False)[3:], flags[3:]))
    matrix = np.random.default_rng(3).standard_normal((33, 65)).astype(np.float32)
    cases.append(("fp32 [65, 33] transposed", adapter.to_tensor(matrix, device, False).t(), matrix.T))
    with np.errstate(over="ignore", invalid="ignore"):
        expected = [(fast64(np.asarray(array)), tensor_stats(np.ascontiguousarray(array))) for _, _, array in cases]
    differences = checked = 0
    for path in paths:
        if path != "torch" and not (device == "cuda" and triton_digest.importable()):
            print(f"path {path}: not available ({'triton cannot be imported' if device == 'cuda' else 'CUDA only'})")
            differences += 1
            continue
        for (label, _, _), entry, (digest, stats) in zip(cases, digests(cases, path, adapter), expected, strict=True):
            same_hash, same = entry["fast64"] == digest, not stats_mismatches(entry["stats"], stats, entry["dtype"])
            differences += not (same_hash and same)
            checked += 1
            print(f"{label:<44} {device} {path:<8} {entry['fast64']}  numpy {digest}  "
                  f"{'equal' if same_hash else 'DIFFERENT'}, stats {'equal' if same else 'DIFFERENT'}"
                  + ("" if same else f" {entry['stats']} numpy {stats}"))
    if device == "cuda":
        tensors = step_tensors()
        triton_paths = [path for path in paths if path != "torch" and triton_digest.importable()]
        # (path, how): one by one ("each") as a capture's hooks digest, and on the grouped path also the step's
        # tensors digested together (TorchAdapter.device_digests, as a step's parameters, gradients and states are),
        # by the plan and tables of the same tensors the step before, by the plan of tensors of the same make at other
        # addresses (new tables: triton_batch.TABLES + 1 such lists in turn), and by a new plan each step
        ways = [(path, "each") for path in triton_paths] + [("grouped", how) for how in (
            "together", "together, new addresses", "together, new plan") if "grouped" in triton_paths]
        elsewhere = [tensors] + [step_tensors() for _ in range(triton_batch.TABLES)]
        costs: dict[tuple[str, str], tuple[list, list, list]] = {}
        for path, how in ways:
            if how != "each" and how != "together":
                continue  # as the checks of "together"
            # together three times: a plan made, launched again, and on the same tensors at other addresses
            checks = [tensors] if how == "each" else [tensors, tensors, elsewhere[1]]
            wrong = sum(step_check(step, path, adapter, how == "together") for step in checks)
            differences += wrong
            checked += len(tensors) * len(checks)
            print(f"step of {len(tensors)} small tensors, path {path}, {how}{' (three times)' * (len(checks) == 3)}: "
                  f"{'ALL EQUAL' if not wrong else f'{wrong} DIFFERENT'} to numpy")
        for _ in range(2):  # the ways take turns: the ranges are over both rounds' steps
            for path, how in ways:
                for kept, found in zip(costs.setdefault((path, how), ([], [], [])),
                                       step_host_cost(elsewhere if how == "together, new addresses" else [tensors], path,
                                                      adapter, args.steps, together=how != "each",
                                                      replan=how == "together, new plan"), strict=True):
                    kept.extend(found)
        if args.figures is not None:
            args.figures.write_text(json.dumps({f"path {path}, {way}": {"host": host, "digesting": digesting, "gpu": gpu}
                                                for (path, way), (host, digesting, gpu) in costs.items()}))
        for (path, way), (host, digesting, gpu) in costs.items():
            how = "device_digest each + fetch_digests; device_digest" if way == "each" else \
                "device_digests of all + fetch_digests; device_digests"
            print(f"step of {len(tensors)} small tensors ({sum(t.numel() * t.element_size() for t in tensors) / 2**20:.1f} MiB), "
                  f"path {path}, {way}: {statistics.median(host):.1f} us of CPU per tensor "
                  f"({min(host):.1f}-{max(host):.1f} over {len(host)} steps; {how} alone "
                  f"{statistics.median(digesting):.1f}), {statistics.median(gpu):.3f} ms of GPU per step "
                  f"({min(gpu):.3f}-{max(gpu):.3f})")
        large = next(tensor for label, tensor, _ in cases if label.startswith("bf16 [4096, 11008]"))
        nbytes = large.numel() * large.element_size()
        for path in paths:
            if path == "grouped":  # a large tensor is not grouped: the fused path's figures
                continue
            if not path.startswith("fused") or triton_digest.importable():
                milliseconds = timing(large, path)
                print(f"path {path}: one digest of bf16 [4096, 11008] {milliseconds:.3f} ms of GPU "
                      f"({nbytes / milliseconds / 1e6:.0f} GB/s of the tensor read), {host_timing(large, path):.3f} ms of CPU")
        if args.sweep and triton_digest.importable():
            differences += sweep(large, next(digest for (label, _, _), (digest, _) in zip(cases, expected, strict=True)
                                             if label.startswith("bf16 [4096, 11008]")), adapter)
    os.environ.pop("XFALIGN_FAST_DIGEST_KERNEL", None)
    os.environ.pop("XFALIGN_DIGEST_GROUP_BYTES", None)
    where = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"torch {torch.__version__} on {where}, paths {' '.join(paths)}: " +
          ("ALL EQUAL" if not differences else f"{differences} of {checked} DIFFER (or a path not available)"))
    return 1 if differences else 0


def take_turns(argv: list[str], turns: int, baseline: Path | None, figures_to: Path | None = None) -> int:
    """Run the check `turns` times (and as many on `baseline`'s harness, the two taking turns, the baseline first), a
    process each, their output as it comes; then `turn_summary`, and the turns' figures written to `figures_to`. 1
    where a check found differences."""
    worst = 0
    found: list[dict] = []
    based: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for turn in range(turns):
            for into, root in [(based, baseline), (found, HERE)] if baseline is not None else [(found, HERE)]:
                print(f"turn {turn + 1} of {turns}" + ("" if baseline is None else
                                                        ", the baseline" if into is based else ", this code") + ":", flush=True)
                figures = Path(tmp) / f"turn-{turn}-{'base' if into is based else 'new'}.json"
                command, environment = turn_command(argv, figures, root)
                worst = max(worst, subprocess.run(command, env=environment).returncode)
                into.append(json.loads(figures.read_text()) if figures.is_file() else {})
    if figures_to is not None:
        figures_to.write_text(json.dumps({"turns": found, "baseline": based if baseline is not None else None}))
    print(turn_summary(found, based or None, baseline))
    return 1 if worst else 0


def turn_command(argv: list[str], figures: Path, root: Path) -> tuple[list[str], dict[str, str]]:
    """One turn of `take_turns`: this script with these options but --turns, --baseline and --figures (taken out by
    argparse's own matching, any spelling), writing its figures to `figures`, on the harness of the checkout `root`
    (first on PYTHONPATH)."""
    rest, environment = on_checkout(argv, ("--turns", "--baseline", "--figures"), root)
    return [sys.executable, str(Path(__file__).resolve()), *rest, "--figures", str(figures)], environment


def turn_summary(found: list[dict], based: list[dict] | None, baseline: Path | None) -> str:
    """Per way timed: each turn's median of host us per tensor (this code's, and the baseline's), and with a baseline
    the median and range over the turns of this code's median over the baseline's (below 1: this code costs less)."""
    ways = [way for way in (found[0] if found else {}) if all(way in turn for turn in found + (based or []))]
    if not ways:
        return "no host costs to sum up (they are timed on cuda only)"
    lines = [f"host us per tensor, each turn's median, {len(found)} turns" +
             ("" if based is None else f"; the baseline {baseline}, then this code over it per turn")]
    for way in ways:
        mine = turn_medians(found, way)
        line = f"  {way}: " + ", ".join(f"{value:.1f}" for value in mine)
        if based is not None:
            theirs = turn_medians(based, way)
            over = [a / b for a, b in zip(mine, theirs, strict=True)]
            line += f"; baseline {', '.join(f'{value:.1f}' for value in theirs)}; {median_range(over)}"
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
