"""Check that the fast digest computed by torch on a device (harness.frameworks.torch `device_digest`, the
path a capture with hash="fast" takes) equals the numpy one of the same bytes on the host
(harness.capture.fast_hash.fast64), for a fixed set of tensors: several dtypes, odd sizes, empty, more than
one block of words, a view that does not start on a 4-byte boundary. One line per tensor, then
"ALL EQUAL" (exit 0) or the differences (exit 1).

    python3 scripts/check_fast_digest.py [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import sys

import ml_dtypes
import numpy as np
import torch

from harness.capture.fast_hash import BLOCK, fast64
from harness.frameworks.torch import TorchAdapter, device_digest


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    normal = rng.standard_normal
    special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, 3.4e38], np.float32)
    return {
        "bf16 [7, 13]": normal((7, 13)).astype(ml_dtypes.bfloat16),
        "bf16 [4096, 1031] (> 1 block, odd)": normal((4096, 1031)).astype(ml_dtypes.bfloat16),
        "fp16 [3, 65537]": normal((3, 65537)).astype(np.float16),
        "fp32 [131075]": normal(BLOCK * 2 + 3).astype(np.float32),
        "fp32 [2048, 4096] (128 blocks)": normal((2048, 4096)).astype(np.float32),
        "fp32 NaN/Inf/-0/subnormal": special,
        "fp64 [1001]": normal(1001),
        "int32 [3, 5, 11]": rng.integers(-2**31, 2**31 - 1, size=(3, 5, 11), dtype=np.int32),
        "int64 [99999]": rng.integers(-2**63, 2**63 - 1, size=99999, dtype=np.int64),
        "bool [77]": rng.random(77) > 0.5,
        "bool [262147]": rng.random(4 * BLOCK + 3) > 0.5,
        "fp32 [0, 3] (empty)": np.zeros((0, 3), np.float32),
        "fp16 [] (scalar)": np.array(1.5, np.float16),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    device = parser.parse_args().device
    adapter = TorchAdapter()
    cases = [(label, adapter.to_tensor(array, device, False), array) for label, array in arrays().items()]
    base = np.random.default_rng(1).standard_normal(41).astype(ml_dtypes.bfloat16)
    cases.append(("bf16 [40] view at byte offset 2", adapter.to_tensor(base, device, False)[1:], base[1:]))
    pending = [device_digest(tensor) for _, tensor, _ in cases]
    for work, row in zip(pending, adapter.collect_digests([p.values for p in pending]), strict=True):
        work.settle(row)
    differences = 0
    for (label, _, array), work in zip(cases, pending, strict=True):
        found, expected = work.result()["fast64"], fast64(array)
        same = found == expected
        differences += not same
        print(f"{label:<38} {device} {found}  numpy {expected}  {'equal' if same else 'DIFFERENT'}")
    where = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"torch {torch.__version__} on {where}: " + ("ALL EQUAL" if not differences else
                                                        f"{differences} of {len(cases)} DIFFER"))
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
