"""The fused Triton digest (harness.frameworks.triton_digest) gives the numpy fast64 bit for bit and the
numpy statistics (to 1e-12 relative), for every dtype a dump holds, odd byte lengths, empty tensors, a view
that starts off a 4-byte boundary, NaN/Inf, and tensors of many blocks and many tiles per program.

Triton is not installed beside torch (it could change torch.compile's behaviour for the cases):
scripts/setup.sh puts it into build/tritonsite, and the kernels run in Triton's CPU interpreter
(TRITON_INTERPRET=1), in a subprocess whose PYTHONPATH puts that folder (or XFALIGN_TRITON_SITE) in front:

    python3 -m pip install --no-deps --target build/tritonsite triton==3.7.0
    python3 -m pytest -m slow tests/test_triton_digest.py

Skipped where neither folder exists. On a GPU, scripts/check_fast_digest.py checks the compiled kernels.
Run as a script (what the subprocess does), this file prints one JSON line per case.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = os.environ.get("XFALIGN_TRITON_SITE", "") or (str(ROOT / "build" / "tritonsite")
                                                     if (ROOT / "build" / "tritonsite" / "triton").is_dir() else "")
STATS = ("min", "max", "mean", "norm", "nan", "inf")


def _cases() -> list[tuple[str, Any, Any, int]]:
    """(label, torch tensor, numpy array of the same bytes, MAX_PROGRAMS to run it with)."""
    import ml_dtypes
    import numpy as np
    import torch

    from harness.capture.fast_hash import BLOCK
    from harness.frameworks.torch import TorchAdapter

    rng = np.random.default_rng(0)
    normal = rng.standard_normal
    special = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, 3.0, -7.5, np.nan]
    arrays = {
        "bf16 [7, 13]": (normal((7, 13)).astype(ml_dtypes.bfloat16), 1024),
        "bf16 [2*BLOCK+1] (2 blocks, odd bytes)": (normal(2 * BLOCK + 1).astype(ml_dtypes.bfloat16), 4),
        "bf16 NaN/Inf/-0/subnormal": (np.array(special, np.float32).astype(ml_dtypes.bfloat16), 1024),
        "fp16 [3, 4099] (odd bytes, 7 tiles)": (normal((3, 4099)).astype(np.float16), 1024),
        "fp16 NaN/Inf": (np.array(special, np.float16), 1024),
        "fp32 [BLOCK+37] (2 blocks)": (normal(BLOCK + 37).astype(np.float32), 3),
        "fp32 NaN/Inf/-0/subnormal": (np.array(special, np.float32), 1024),
        "fp32 all NaN": (np.full(5, np.nan, np.float32), 1024),
        "fp64 [BLOCK+5] (3 blocks)": (normal(BLOCK + 5) * 1e3, 4),
        "fp64 NaN/Inf": (np.array(special, np.float64), 1024),
        "int32 [3, 5, 11]": (rng.integers(-2**31, 2**31 - 1, size=(3, 5, 11), dtype=np.int32), 1024),
        "int64 [BLOCK // 2 + 9] (2 blocks)": (rng.integers(-2**63, 2**63 - 1, size=BLOCK // 2 + 9, dtype=np.int64), 2),
        "bool [77] (odd bytes)": (rng.random(77) > 0.5, 1024),
        "bool [4*BLOCK+3] (2 blocks)": (rng.random(4 * BLOCK + 3) > 0.5, 5),
        "fp32 [0, 3] (empty)": (np.zeros((0, 3), np.float32), 1024),
        "bool [0] (empty)": (np.zeros(0, np.bool_), 1024),
        "fp16 [] (scalar)": (np.array(1.5, np.float16), 1024),
        "int64 [] (scalar)": (np.array(-3, np.int64), 1024),
    }
    adapter = TorchAdapter()
    cases = [(label, adapter.to_tensor(array, "cpu", False), array, programs) for label, (array, programs) in arrays.items()]
    bf16 = normal(41).astype(ml_dtypes.bfloat16)
    cases.append(("bf16 [40] view at byte offset 2", adapter.to_tensor(bf16, "cpu", False)[1:], bf16[1:], 1024))
    flags = rng.random(23) > 0.5
    cases.append(("bool [20] view at byte offset 3", adapter.to_tensor(flags, "cpu", False)[3:], flags[3:], 1024))
    matrix = normal((33, 65)).astype(np.float32)
    cases.append(("fp32 [65, 33] transposed (not contiguous)", adapter.to_tensor(matrix, "cpu", False).t(), matrix.T, 1024))
    assert all(isinstance(t, torch.Tensor) for _, t, _, _ in cases)
    return cases


def _run() -> None:
    """In the interpreter's subprocess: one JSON line per case (fused vs numpy)."""
    import numpy as np

    from harness.capture.fast_hash import PendingDigest, fast64
    from harness.capture.stats import tensor_stats
    from harness.dtypes import dtype_name
    from harness.frameworks import triton_digest

    for label, tensor, array, programs in _cases():
        triton_digest.MAX_PROGRAMS = programs  # few programs: many tiles each, and the partial rows' reduction
        triton_digest.SINGLE_PROGRAM_TILES = 1 if programs < 1024 else 8
        handle = triton_digest.fused_device_digest(tensor)
        work = PendingDigest(dtype_name(array.dtype), tuple(array.shape), array.nbytes, handle)
        work.settle(handle.numpy())
        entry = work.result()
        print(json.dumps({"label": label, "fast64": entry["fast64"], "expected": fast64(np.asarray(array)),
                          "stats": entry["stats"], "expected_stats": tensor_stats(np.ascontiguousarray(array)),
                          "elements": float(handle[4]), "size": int(array.size)}), flush=True)


def _close(found, expected) -> bool:
    if found is None or expected is None:
        return found is expected
    return math.isclose(found, expected, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.slow
@pytest.mark.skipif(not SITE, reason="no build/tritonsite (scripts/setup.sh installs triton there) and XFALIGN_TRITON_SITE "
                                     "is unset: the fused kernels run in Triton's interpreter from such a folder")
def test_fused_digest_equals_numpy_in_triton_interpreter():
    assert (Path(SITE) / "triton").is_dir(), f"no triton in XFALIGN_TRITON_SITE={SITE}"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([SITE, str(ROOT)])}
    done = subprocess.run([sys.executable, __file__], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(results) == 21, done.stdout
    for result in results:
        label = result["label"]
        assert result["fast64"] == result["expected"], label
        assert result["elements"] == result["size"], label
        for key in STATS:
            assert _close(result["stats"][key], result["expected_stats"][key]), (label, key, result)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _run()
