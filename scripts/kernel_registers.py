"""Registers per thread of the fused digest kernel (harness.frameworks.triton_kernels `digest`) compiled for an
NVIDIA architecture without a GPU: Triton compiles it to a cubin with the ptxas its wheel carries, and its
cuobjdump reads the count. The registers decide how many programs a multiprocessor holds at once
(harness.frameworks.triton_digest `_resident`), and so how close the kernel comes to the memory's bandwidth.
One line per dtype, then a JSON line of the counts.

    PYTHONPATH=build/tritonsite python3 scripts/kernel_registers.py [--arch 90]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from harness.frameworks import triton_digest, triton_kernels  # noqa: E402

DTYPES = {"bf16": (2, 2, "*bf16"), "fp16": (2, 1, "*fp16"), "fp32": (4, 1, "*fp32")}  # width, KIND, pointer type
INTEGERS = ("n", "n_full", "n_blocks", "nbytes", "groups", "full_tiles", "tail_tiles")


def registers(width: int, kind: int, pointer: str, arch: int) -> int:
    grid = triton_digest.plan(1 << 30, width)
    meta = dict(WIDTH=width, KIND=kind, EPU=4 // width, VALUE64=False, IS_FLOAT=True, ROWS=grid["rows"],
                LANES=grid["lanes"], UNITS_PER_BLOCK=grid["per_block"], PARTIAL=False, REDUCE=triton_digest.REDUCE_ROWS)
    signature = {"src": pointer, "weights": "*i64", "factors": "*i64", "out": "*fp64", "counters": "*i32",
                 "counter": "i32", **dict.fromkeys(INTEGERS, "i64"),
                 **dict.fromkeys(meta, "constexpr")}
    compiled = triton.compile(ASTSource(fn=triton_kernels.digest, signature=signature, constexprs=meta),
                              target=GPUTarget("cuda", arch, 32), options={"num_warps": grid["warps"]})
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as folder:
        cubin = Path(folder) / "digest.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([str(tool), "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"REG:(\d+)", usage).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200)")
    args = parser.parse_args()
    counts = {name: registers(*spec, args.arch) for name, spec in DTYPES.items()}
    for name, count in counts.items():
        print(f"{name}: {count} registers per thread, sm_{args.arch}, triton {triton.__version__}")
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
