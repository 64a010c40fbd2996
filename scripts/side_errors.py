"""One side's error against the float64 reference, per case point, tensor and seed, for sides that run on
different machines (the GPU cases: Megatron on the GPU machine, Paddle here):

    python scripts/side_errors.py SIDE OUT.json [--seeds N] CASES ...

Runs `xfalign run CASES --side SIDE` and `--side exact` (both on the case's own seed and on N others) into
a temporary folder, then measures each tensor of SIDE against the reference (harness.compare.exact). OUT.json:
{"side", "machine", "points": {point: {tensor: {"max_ulp", "normwise_u", "normwise", "class_mismatch", "dtype",
"md5"}}}}.
Two such files (one per side) give both sides' errors on the same inputs: inputs are made by xfalign's own
generator, the same bits on every machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.case import REFERENCE_SIDE
from harness.compare.exact import error_to_exact
from harness.store.dump import Dump


def dumps(cases: list[str], side: str, seeds: int, folder: Path) -> None:
    for run, extra in (("own", []), ("seeds", ["--seeds", str(seeds)])):
        done = subprocess.run([sys.executable, "-m", "harness.cli", "run", *cases, "--side", side, "--dump",
                               str(folder / run), *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            print(done.stdout[-3000:])
            sys.exit(f"side {side}: exit {done.returncode}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("side")
    parser.add_argument("output", type=Path)
    parser.add_argument("cases", nargs="+")
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    points: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="xfalign-side-errors-") as tmp:
        for side in (args.side, REFERENCE_SIDE):
            dumps(args.cases, side, args.seeds, Path(tmp) / side)
        for run in ("own", "seeds"):
            root = Path(tmp) / args.side / run
            for folder in sorted(p for p in root.rglob("meta.json")):
                side_dump = Dump.read(folder.parent)
                exact = Dump.read(Path(tmp) / REFERENCE_SIDE / run / folder.parent.relative_to(root))
                assert exact.meta["inputs"] == side_dump.meta["inputs"]
                errors = {}
                for name in side_dump.names:
                    values, reference = side_dump.tensors[name], exact.tensors[name]
                    if values.shape != reference.shape and values.size == reference.size:
                        values = values.reshape(reference.shape)  # e.g. [N] vs [N, 1]: compared flattened, as compare does
                    error = error_to_exact(values, reference)
                    errors[name] = {"max_ulp": error.max_ulp, "normwise_u": error.normwise_u, "normwise": error.normwise,
                                    "class_mismatch": error.class_mismatch, "dtype": error.dtype,
                                    "md5": side_dump.digests[name].md5}  # two sides' files: bitwise or not
                points[side_dump.meta["case_name"]] = errors
    args.output.write_text(json.dumps({"side": args.side, "machine": platform.node(), "points": points}, indent=1))
    print(f"{len(points)} case points measured; {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
