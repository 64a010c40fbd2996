"""What a tensor-parallel case point costs against a TP=1 point of the same shape, once the workers are warm.

    python3 scripts/bench_tensor_parallel.py [--rounds N] [--parallel column|row] [--tp 2]

The points of cases/linear_tensor_parallel.yaml (Megatron on rank workers vs Paddle's tp_sharded, with the
float64 reference), and the same shape at tensor_parallel 1. Both run once to warm their workers (the TP point's
rank workers, their world, compiled code), then N rounds alternate the two (drift on the machine hits both),
each timed around `run_case` in one WorkerPool. Prints each round's wall times, the medians and their ratio
(issue 21's target: TP=2 <= 2 x TP=1).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.load import load_cases  # noqa: E402
from harness.run_options import RunOptions  # noqa: E402
from harness.runner import WorkerPool, run_case  # noqa: E402


def point(tp: int, parallel: str, folder: Path):
    text = (ROOT / "cases" / "linear_tensor_parallel.yaml").read_text()
    text = text.replace("options.tensor_parallel: [2, 4]", f"options.tensor_parallel: [{tp}]")
    text = text.replace("options.parallel: [column, row]", f"options.parallel: [{parallel}]")
    path = folder / f"tp{tp}.yaml"
    path.write_text(text)
    [case] = load_cases(path)
    return case


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--parallel", choices=("column", "row"), default="column")
    parser.add_argument("--tp", type=int, choices=(2, 4), default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, WorkerPool(jobs=2) as pool:
        cases = {1: point(1, args.parallel, Path(folder)), args.tp: point(args.tp, args.parallel, Path(folder))}
        options = RunOptions()
        for case in cases.values():  # warm: workers started, worlds joined, code compiled
            run_case(case, None, options, pool)
        times: dict[int, list[float]] = {tp: [] for tp in cases}
        for round_ in range(args.rounds):
            for tp, case in cases.items():
                started = time.perf_counter()
                run = run_case(case, None, options, pool)
                times[tp].append(time.perf_counter() - started)
                assert run.comparison is not None and run.comparison.status == "pass", run.comparison
            print(f"round {round_ + 1}: TP=1 {times[1][-1]:.2f} s, TP={args.tp} {times[args.tp][-1]:.2f} s")
    one, many = statistics.median(times[1]), statistics.median(times[args.tp])
    print(f"{args.parallel}, {args.rounds} rounds: median TP=1 {one:.2f} s (range {min(times[1]):.2f}-{max(times[1]):.2f}), "
          f"TP={args.tp} {many:.2f} s (range {min(times[args.tp]):.2f}-{max(times[args.tp]):.2f}); ratio {many / one:.2f} "
          f"(per round {min(m / o for m, o in zip(times[args.tp], times[1])):.2f}-"
          f"{max(m / o for m, o in zip(times[args.tp], times[1])):.2f}; target <= 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
