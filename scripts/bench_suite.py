"""Wall time of the built-in suite against its floor.

    python3 scripts/bench_suite.py [-j N] [--warmup] [CASES ...]     (default: cases/*.yaml)

Runs the real command, `python -m harness.cli run CASES -j N` (reports into a temporary folder), timed
from outside, with XFALIGN_TIMINGS set so that the workers' own measurements come back: per side the
framework import (a worker's first job), the op (forward + backward, per repeat), how much of the op was
torch.compile (dynamo + inductor, cache hits and misses), reading the inputs, writing the dump,
resetting the worker; per case the parent's input generation and comparison.

    floor = one import per framework + the sum of the raw op times (compilation excluded)

The issue's targets: suite <= 1.5 x floor and <= 45 s on 2 cores with a warm compile cache (--warmup
runs the suite once first, so the inductor cache is warm). Also printed: the floor with the per-case
compilation counted as op time, and where the rest of the time goes.

    python3 scripts/bench_suite.py --reference-cost [--rounds N] [CASES ...]

The float64 reference's cost: after a warm-up run, N rounds (default 3) of the suite without the reference
(`--no-reference`) and with it, side by side in this one invocation (alternating, so drift on the machine
hits both); prints each wall time and the ratio with/without per round (target <= 1.3).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_suite(cases: list[str], jobs: int, folder: Path, reference: bool = True) -> tuple[float, int, dict]:
    timings = folder / "timings.json"
    env = dict(os.environ, XFALIGN_TIMINGS=str(timings))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", *cases, "-j", str(jobs),
                           "--json", str(folder / "result.json"), "--html", str(folder / "html"),
                           *([] if reference else ["--no-reference"])],
                          cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0 and reference:  # without the reference, bounds against it fail: expected
        print(done.stdout[-3000:])
    return wall, done.returncode, json.loads(timings.read_text()) if timings.exists() else {"cases": [], "spawned": {}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="case files (default: cases/*.yaml)")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--warmup", action="store_true", help="run the suite once first (warm compile cache)")
    parser.add_argument("--reference-cost", action="store_true", help="the suite without and with the float64 reference")
    parser.add_argument("--rounds", type=int, default=3, help="with --reference-cost: rounds of both runs")
    parser.add_argument("--keep-json", type=Path, help="with --reference-cost: keep the last run's JSON report here")
    args = parser.parse_args()
    cases = [str(Path(c).resolve()) for c in args.cases] or sorted(glob.glob(str(ROOT / "cases" / "*.yaml")))
    if args.reference_cost:
        return reference_cost(cases, args.jobs, args.rounds, args.keep_json)
    with tempfile.TemporaryDirectory(prefix="xfalign-bench-") as tmp:
        if args.warmup:
            wall, code, _ = run_suite(cases, args.jobs, Path(tmp))
            print(f"warm-up run: {wall:.1f} s (exit {code})")
        wall, code, measured = run_suite(cases, args.jobs, Path(tmp))
    imports: dict[str, float] = defaultdict(float)
    first_import: dict[str, float] = {}
    sums: dict[str, float] = defaultdict(float)
    busy: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for _, timings in measured["cases"]:
        sums["inputs"] += timings.get("inputs", 0)
        sums["compare"] += timings.get("compare", 0)
        for side, record in timings.items():
            if not isinstance(record, dict):
                continue
            framework = record.get("framework", side)
            if "import_s" in record:
                imports[framework] += record["import_s"]
                first_import.setdefault(framework, record["import_s"])
            sums["op"] += sum(record.get("op_s", []))
            for name in ("compile_s", "read_inputs_s", "dump_s", "reset_s"):
                sums[name] += record.get(name, 0)
            for name in ("fx_cache_hits", "fx_cache_misses", "aot_cache_hits", "aot_cache_misses"):
                counts[name] += int(record.get(name, 0))
            busy[framework] += record.get("total_s", 0)
    one_import = sum(first_import.values())
    raw_ops = sums["op"] - sums["compile_s"]
    floor = one_import + raw_ops
    floor_with_compile = one_import + sums["op"]
    points = sum(not name.startswith("(start") for name, _ in measured["cases"])  # not the workers' early starts
    print(f"suite: {points} case points, -j {args.jobs}, {os.cpu_count()} cores, exit {code}")
    print(f"suite seconds: {wall:.1f}")
    print(f"floor: {floor:.1f} s = one import per framework {one_import:.1f} s "
          f"({', '.join(f'{k} {v:.1f}' for k, v in first_import.items())}) + raw op time {raw_ops:.1f} s")
    print(f"ratio: {wall / floor:.2f} x floor (target <= 1.5); suite {'<=' if wall <= 45 else '>'} 45 s")
    print(f"floor counting per-case torch.compile (warm cache) as op time: {floor_with_compile:.1f} s, "
          f"ratio {wall / floor_with_compile:.2f}")
    print("where the time goes (seconds summed over cases; the two frameworks' workers run at once):")
    print(f"  worker processes started: {measured['spawned']}; imports in all: {sum(imports.values()):.1f}")
    print(f"  op {sums['op']:.1f} (of which torch.compile {sums['compile_s']:.1f}: "
          f"FX graph cache {counts['fx_cache_hits']} hits / {counts['fx_cache_misses']} misses, "
          f"AOT autograd cache {counts['aot_cache_hits']} hits / {counts['aot_cache_misses']} misses)")
    print(f"  workers: read inputs {sums['read_inputs_s']:.1f}, write dumps (hashing included) {sums['dump_s']:.1f}, "
          f"reset between cases {sums['reset_s']:.1f}")
    print(f"  parent: generate inputs {sums['inputs']:.1f}, compare {sums['compare']:.1f}")
    print(f"  busy per worker key: {', '.join(f'{k} {v:.1f}' for k, v in busy.items())}")
    return 0 if code == 0 else 1


def reference_cost(cases: list[str], jobs: int, rounds: int, keep_json: Path | None = None) -> int:
    """The suite's wall time without and with the float64 reference, alternating, after one warm-up run."""
    with tempfile.TemporaryDirectory(prefix="xfalign-bench-") as tmp:
        wall, code, _ = run_suite(cases, jobs, Path(tmp))
        print(f"warm-up run (with the reference): {wall:.1f} s (exit {code})")
        ratios, codes = [], set()
        for round_ in range(1, rounds + 1):
            without, code_without, _ = run_suite(cases, jobs, Path(tmp), reference=False)
            with_, code_with, measured = run_suite(cases, jobs, Path(tmp))
            codes |= {code_with}
            reference_s = sum(t.get("exact", {}).get("reference_s", 0) for _, t in measured["cases"])
            ratios.append(with_ / without)
            print(f"round {round_}: without {without:.1f} s (exit {code_without}), with {with_:.1f} s (exit {code_with}; "
                  f"the reference's own op time {reference_s:.1f} s summed over cases): ratio {with_ / without:.3f}")
        if keep_json is not None:
            shutil.copy(Path(tmp) / "result.json", keep_json)
    print(f"ratio with/without the reference over {rounds} rounds: {min(ratios):.3f}-{max(ratios):.3f} (target <= 1.3); "
          f"{len(cases)} case files, -j {jobs}, {os.cpu_count()} cores")
    return 0 if max(ratios) <= 1.3 and codes == {0} else 1


if __name__ == "__main__":
    sys.exit(main())
