"""A CPU Paddle tensor's fast digest (fast64 and statistics, harness.store.fast_hash) two ways, interleaved
per round; medians over the rounds, in ms per tensor:

- "host copy + numpy": what a capture does for a CPU Paddle tensor (harness.frameworks.paddle `host_copy`,
  then `fast_entry`, compiled with numba where it is installed); the capture runs the hashing on its pool,
  off the training's thread, so the copy alone is also shown.
- "Paddle ops": harness.frameworks.paddle_digest `ops_digest` (the GPU's path without torch) plus the fetch
  and settle of its row.

Each is checked to give the same fast64 first.

    python3 scripts/bench_paddle_digest.py [--rounds 15] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import ml_dtypes
import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None, help="paddle.base.core.set_num_threads")
    args = parser.parse_args()

    import paddle

    from harness.frameworks import paddle_digest
    from harness.frameworks.paddle import PaddleAdapter
    from harness.store.fast_hash import fast_entry

    if args.threads:
        paddle.base.core.set_num_threads(args.threads)
    adapter = PaddleAdapter()
    rng = np.random.default_rng(0)
    cases = {f"fp32 [{n}]": rng.standard_normal(n).astype(np.float32) for n in (1024, 65536, 1 << 20, 1 << 24)}
    cases["bf16 [1048576]"] = rng.standard_normal(1 << 20).astype(ml_dtypes.bfloat16)

    def host(tensor) -> dict:
        return fast_entry(adapter.host_copy(tensor))

    def ops(tensor) -> dict:
        pending = paddle_digest.ops_digest(tensor)
        pending.settle(paddle_digest.fetch([pending.values])()[0])
        return pending.result()

    print(f"paddle {paddle.__version__}, numpy {np.__version__}; medians of {args.rounds} rounds, ms per tensor")
    print(f"{'tensor':<18} {'host copy':>10} {'copy+numpy':>11} {'Paddle ops':>11}")
    for label, array in cases.items():
        tensor = adapter.to_tensor(array, "cpu", False)
        assert host(tensor)["fast64"] == ops(tensor)["fast64"], label  # also the warm-up (numba's compile)
        times: dict[str, list[float]] = {"copy": [], "host": [], "ops": []}
        for _ in range(args.rounds):
            for name, run in (("copy", adapter.host_copy), ("host", host), ("ops", ops)):
                start = time.perf_counter()
                run(tensor)
                times[name].append((time.perf_counter() - start) * 1e3)
        copy, hashed, by_ops = (statistics.median(times[k]) for k in ("copy", "host", "ops"))
        print(f"{label:<18} {copy:>10.3f} {hashed:>11.3f} {by_ops:>11.3f}")


if __name__ == "__main__":
    main()
