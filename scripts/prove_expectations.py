"""Proof that the built-in expectations state properties, not one seed's measurement:

    python scripts/prove_expectations.py [--seeds 20] [-j N] [CASES ...]   (default: cases/*.yaml)

1. Runs every case point with N seed sets other than its own (`xfalign run --seeds N`): every expectation
   must hold on every one.
2. Runs the built-in weighted SwiGLU case with its Paddle side replaced by a variant made less accurate
   (tests/data/degraded_variants.py: silu(gate) rounded to bf16 before the product) on the same N seeds: each
   seed must fail, on the Paddle side, a bound against the exact result (exact-error or no-worse-than).

Prints per case point the seeds that failed (none, for part 1), and per tensor and side the range over the
seeds of the max ULP to exact and the normwise error (in u), which the docs quote. Exit 0 when both hold.
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


def run(cases: list[str], seeds: int, jobs: int, folder: Path, name: str) -> tuple[int, dict, float]:
    report = folder / f"{name}.json"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", *cases, "--seeds", str(seeds), "-j", str(jobs),
                           "--json", str(report), "--html", str(folder / name)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not report.exists():
        print(done.stdout[-3000:])
        sys.exit(f"{name}: no report (exit {done.returncode})")
    return done.returncode, json.loads(report.read_text()), time.perf_counter() - started


def base_name(case: str) -> str:
    """The point without its seed: 'rmsnorm[dtype=bf16,seed=1041]' -> 'rmsnorm[dtype=bf16]'."""
    head, _, rest = case.partition("[")
    parts = [p for p in rest.rstrip("]").split(",") if p and not p.startswith("seed=")]
    return f"{head}[{','.join(parts)}]" if parts else head


def ranges(report: dict) -> dict:
    """(point, tensor, side letter) -> [min, max] of max ULP to exact and of normwise u over the seeds."""
    found: dict = defaultdict(lambda: [[float("inf"), 0], [float("inf"), 0.0]])
    for case in report["cases"]:
        for tensor in case["tensors"]:
            exact = tensor.get("to_exact") or {}
            for letter in ("a", "b"):
                error = exact.get(letter)
                if not error:
                    continue
                entry = found[(base_name(case["case"]), tensor["name"], letter)]
                for slot, value in ((0, error["max_ulp"]), (1, error["normwise_u"])):
                    if isinstance(value, (int, float)):
                        entry[slot] = [min(entry[slot][0], value), max(entry[slot][1], value)]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    cases = [str(Path(c).resolve()) for c in args.cases] or sorted(glob.glob(str(ROOT / "cases" / "*.yaml")))
    ok = True
    with tempfile.TemporaryDirectory(prefix="xfalign-proof-") as tmp:
        folder = Path(tmp)
        code, report, wall = run(cases, args.seeds, args.jobs, folder, "all")
        failed: dict[str, list[str]] = defaultdict(list)
        points = set()
        for case in report["cases"]:
            points.add(base_name(case["case"]))
            if case["status"] == "fail":
                failed[base_name(case["case"])].append(case["case"].rpartition("seed=")[2].rstrip("]"))
        print(f"1. {len(points)} case points x {args.seeds} seeds = {len(report['cases'])} runs in {wall:.0f} s "
              f"(exit {code}): {sum(map(len, failed.values()))} failed")
        for point, seeds in sorted(failed.items()):
            print(f"   FAIL {point}: seeds {', '.join(seeds)}")
        ok &= code == 0 and not failed
        print("   ranges over the seeds (max ULP to exact; normwise error in u), side A | side B:")
        found = ranges(report)
        for (point, tensor, letter) in sorted(found):
            if letter == "b":
                continue
            a, b = found[(point, tensor, "a")], found.get((point, tensor, "b"))
            text = f"{a[0][0]}-{a[0][1]} ULP, {a[1][0]:.2g}-{a[1][1]:.2g}u"
            if b:
                text += f" | {b[0][0]}-{b[0][1]} ULP, {b[1][0]:.2g}-{b[1][1]:.2g}u"
            print(f"     {point} {tensor}: {text}")

        case = folder / "swiglu_weighted.yaml"
        shutil.copy(ROOT / "tests" / "data" / "degraded_variants.py", folder / "degraded.py")
        case.write_text((ROOT / "cases" / "swiglu_weighted.yaml").read_text()
                        .replace("impl: fp32_island}", "impl: 'degraded.py:early_rounding'}"))
        code, report, wall = run([str(case)], args.seeds, args.jobs, folder, "degraded")
        caught = 0
        for result in report["cases"]:
            failing = [f for t in result["tensors"] for f in t["findings"] if not f["passed"]]
            if failing and all(f["kind"] in ("exact-error", "no-worse-than") and f["data"]["side"] == "paddle"
                               for f in failing):
                caught += 1
            else:
                print(f"   NOT CAUGHT {result['case']}: {[f['text'] for f in failing]}")
        print(f"2. less accurate Paddle variant (silu rounded to bf16 early) on swiglu_weighted: caught on {caught} of "
              f"{len(report['cases'])} seeds ({wall:.0f} s)")
        ok &= caught == len(report["cases"]) == args.seeds
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
