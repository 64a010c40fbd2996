"""The fused Triton digest (harness.frameworks.triton_digest `fused_device_digest`, under several tile and
grid settings, one program or many combined by the last to arrive) gives the numpy fast64 bit for bit and the
numpy statistics (within fast_hash.stats_tolerance), for every dtype a dump holds, odd byte lengths, empty tensors, views
that start 1 to 3 bytes off a 4-byte boundary, NaN/Inf, integer extremes, and tensors of many blocks and
many tiles per program (both the unmasked tiles of whole blocks and the masked rest). The integer dtypes no
dump holds (int8, int16, uint8) are checked by S and the statistics against numpy directly.

Triton is not installed beside torch (it could change torch.compile's behaviour for the cases):
scripts/setup.sh puts it into build/tritonsite, and the kernels run in Triton's CPU interpreter
(TRITON_INTERPRET=1), in a subprocess whose PYTHONPATH puts that folder (or XFALIGN_TRITON_SITE) in front;
where neither exists, the triton the interpreter can import (e.g. the one a CUDA build of torch brings):

    python3 -m pip install --no-deps --target build/tritonsite triton==3.7.0
    python3 -m pytest -m slow tests/test_triton_digest.py

The interpreter needs Triton >= 3.7.0 (TRITON_NEEDED): 3.6.0's fails on these kernels (`InterpreterError ...
only 0-dimensional arrays`). Skipped, with the reason, where the triton it would use is older or there is none.
On a GPU, scripts/check_fast_digest.py and tests/test_gpu.py check the compiled kernels.
Run as a script (what the subprocess does), this file prints one JSON line per case.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.store.fast_hash import stats_mismatches

ROOT = Path(__file__).resolve().parent.parent
SITE = os.environ.get("XFALIGN_TRITON_SITE", "") or (str(ROOT / "build" / "tritonsite")
                                                     if (ROOT / "build" / "tritonsite" / "triton").is_dir() else "")
TRITON_NEEDED = (3, 7, 0)  # what scripts/setup.sh installs; 3.6.0's interpreter fails on the kernels


def triton_used() -> tuple[str | None, str]:
    """The version of the triton the interpreter's subprocess imports (SITE's, else the importable one; read from
    its __init__.py, not imported) and where it is; (None, why) where there is none."""
    if SITE:
        package = Path(SITE) / "triton"
    else:
        spec = importlib.util.find_spec("triton")
        if spec is None or not spec.origin:
            return None, ("no build/tritonsite (scripts/setup.sh installs triton 3.7.0 there), XFALIGN_TRITON_SITE "
                          "is unset and no triton can be imported: the fused kernels run in Triton's interpreter")
        package = Path(spec.origin).parent
    init = package / "__init__.py"
    found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", init.read_text(), re.M) if init.is_file() else None
    return (found.group(1) if found else None), str(package)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _cases() -> list[tuple[str, Any, Any, int]]:
    """(label, torch tensor, numpy array of the same bytes, MAX_PROGRAMS to run it with)."""
    import ml_dtypes
    import numpy as np
    import torch

    from harness.frameworks.torch import TorchAdapter
    from harness.store.fast_hash import BLOCK

    rng = np.random.default_rng(0)
    normal = rng.standard_normal
    special = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, 3.0, -7.5, np.nan]
    extremes64 = np.array([-2**63, 2**63 - 1, 0, -1, 1, -2**62, 2**62 + 12345, -7], np.int64)
    extremes32 = np.array([-2**31, 2**31 - 1, 0, -1, 1, -2**30, 2**30 + 123], np.int32)
    arrays = {
        "bf16 [9*BLOCK+3] (9 blocks, odd bytes: unmasked groups and the rest)":
            (normal(18 * BLOCK + 3).astype(ml_dtypes.bfloat16), 7),
        "fp32 [5*BLOCK+1] (5 blocks + 1 word)": (normal(5 * BLOCK + 1).astype(np.float32), 6),
        "fp64 [5*BLOCK//2+3] (6 blocks)": (normal(5 * BLOCK // 2 + 3) * 1e5, 5),
        "bool [12*BLOCK+1] (3 blocks, odd bytes)": (rng.random(12 * BLOCK + 1) > 0.5, 9),
        "fp16 [8*BLOCK+3] (4 blocks, odd bytes)": (normal(8 * BLOCK + 3).astype(np.float16), 8),
        "int32 [4*BLOCK+5] with extremes": (np.concatenate([rng.integers(-2**31, 2**31 - 1, size=4 * BLOCK - 2,
                                                                         dtype=np.int32), extremes32]), 4),
        "int64 [3*BLOCK//2] with extremes": (np.concatenate([rng.integers(-2**63, 2**63 - 1, size=3 * BLOCK // 2 - 8,
                                                                          dtype=np.int64), extremes64]), 3),
        "int64 extremes": (extremes64, 1024),
        "bf16 NaN/Inf spread over blocks": (np.where(rng.random(4 * BLOCK + 1) < 0.001,
                                                     rng.choice([np.nan, np.inf, -np.inf], 4 * BLOCK + 1),
                                                     normal(4 * BLOCK + 1)).astype(ml_dtypes.bfloat16), 4),
        "fp32 all Inf": (np.full(7, np.inf, np.float32), 1024),
        "bf16 [1]": (np.array([-3.5], ml_dtypes.bfloat16), 1024),
        "bool [3]": (np.array([True, False, True]), 1024),
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
    big_flags = rng.random(4 * BLOCK + 9) > 0.5
    for offset in (1, 2, 3):
        cases.append((f"bool view at byte offset {offset}", adapter.to_tensor(flags, "cpu", False)[offset:offset + 13],
                      flags[offset:offset + 13], 1024))
        cases.append((f"bool [4*BLOCK+...] view at byte offset {offset} (odd bytes)",
                      adapter.to_tensor(big_flags, "cpu", False)[offset:], big_flags[offset:], 3))
    fp16 = normal(4 * BLOCK + 3).astype(np.float16)
    cases.append(("fp16 view at byte offset 2 (2 blocks)", adapter.to_tensor(fp16, "cpu", False)[1:], fp16[1:], 5))
    cases.append(("fp16 view at byte offset 4, 6 elements", adapter.to_tensor(fp16, "cpu", False)[2:8], fp16[2:8], 1024))
    matrix = normal((33, 65)).astype(np.float32)
    cases.append(("fp32 [65, 33] transposed (not contiguous)", adapter.to_tensor(matrix, "cpu", False).t(), matrix.T, 1024))
    assert all(isinstance(t, torch.Tensor) for _, t, _, _ in cases)
    return cases


# (ROWS, WARPS, SINGLE_PROGRAM_TILES, whether MAX_PROGRAMS takes the case's program count) of the runs of
# `fused_device_digest`: the defaults; 2 rows (unmasked tiles from 2 whole blocks on) with 1 warp's lanes
SETTINGS = ((8, 4, 4, False), (2, 1, 1, True))  # the default; small tiles over many programs


def _other_ints() -> list[tuple[str, Any, Any]]:
    """int8, int16, uint8 (no dump holds them: checked by S and the statistics)."""
    import numpy as np
    import torch

    from harness.store.fast_hash import BLOCK

    rng = np.random.default_rng(5)
    arrays = {"int8 [2*BLOCK*4+3] with extremes": np.concatenate([rng.integers(-128, 128, 8 * BLOCK, dtype=np.int8),
                                                                  np.array([-128, 127, -1], np.int8)]),
              "int16 [2*BLOCK*2+1] with extremes": np.concatenate([rng.integers(-2**15, 2**15, 4 * BLOCK, dtype=np.int16),
                                                                   np.array([-2**15], np.int16)]),
              "uint8 [4*BLOCK*2+7]": rng.integers(0, 256, 8 * BLOCK + 7, dtype=np.uint8),
              "int8 [5]": np.array([-128, 127, 0, -1, 3], np.int8)}
    return [(label, torch.from_numpy(array.copy()), array) for label, array in arrays.items()]


def _settings(setting: tuple, programs: int) -> None:
    from harness.frameworks import triton_digest

    rows, warps, single, capped = setting
    triton_digest.ROWS, triton_digest.WARPS, triton_digest.SINGLE_PROGRAM_TILES = rows, warps, single
    triton_digest.MAX_PROGRAMS = programs if capped and programs < 1024 else None
    triton_digest.REDUCE_ROWS = 4 if capped else 1024  # capped: the last program combines the rows in passes


def _run() -> None:
    """In the interpreter's subprocess: one JSON line per case and run (fused vs numpy)."""
    import numpy as np

    from harness.dtypes import dtype_name
    from harness.frameworks import triton_digest
    from harness.store.fast_hash import PendingDigest, block_sum, fast64, raw_bytes
    from harness.store.stats import tensor_stats

    for label, tensor, array, programs in _cases():
        expected, expected_stats = fast64(np.asarray(array)), tensor_stats(np.ascontiguousarray(array))
        for setting in SETTINGS:
            _settings(setting, programs)
            handle = triton_digest.fused_device_digest(tensor)
            work = PendingDigest(dtype_name(array.dtype), tuple(array.shape), array.nbytes, handle)
            work.settle(handle.numpy())
            entry = work.result()
            print(json.dumps({"label": f"{label} {setting}", "dtype": entry["dtype"], "fast64": entry["fast64"], "expected": expected,
                              "stats": entry["stats"], "expected_stats": expected_stats,
                              "elements": float(handle[4]), "size": int(array.size)}), flush=True)
    for label, tensor, array in _other_ints():
        s = int(np.array(block_sum(raw_bytes(array)), dtype=np.uint64).view(np.int64))
        for setting in SETTINGS:
            _settings(setting, 3)
            handle = triton_digest.fused_device_digest(tensor)
            row = handle.numpy()
            found_s = int(row[7:8].view(np.int64)[0])
            work = PendingDigest("int32", tuple(array.shape), array.nbytes, handle)  # stats only (the name is unused)
            work.settle(row)
            stats = work.result()["stats"]
            print(json.dumps({"label": f"{label} {setting}", "dtype": str(array.dtype), "fast64": str(found_s), "expected": str(s),
                              "stats": stats, "expected_stats": tensor_stats(array),
                              "elements": float(row[4]), "size": int(array.size)}), flush=True)


def interpreter_results(script: str) -> list[dict]:
    """The JSON lines `script` prints, run by Triton's interpreter (TRITON_INTERPRET=1) with the triton of
    XFALIGN_TRITON_SITE or build/tritonsite; the test skipped where that triton is missing or too old."""
    version, where = triton_used()
    if SITE:
        assert (Path(SITE) / "triton").is_dir(), f"no triton in XFALIGN_TRITON_SITE={SITE}"
    if version is None:
        pytest.skip(where if not SITE else f"cannot read the version of the triton in {where}")
    needed = ".".join(map(str, TRITON_NEEDED))
    if _version(version) < TRITON_NEEDED:
        pytest.skip(f"needs Triton >= {needed} for its interpreter; the one it would use is {version} ({where}), whose "
                    f"interpreter fails on these kernels: scripts/setup.sh installs triton {needed} into build/tritonsite")
    path = ([SITE] if SITE else []) + [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run([sys.executable, script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_fused_digest_equals_numpy_in_triton_interpreter():
    results = interpreter_results(__file__)
    assert len(results) == len(SETTINGS) * (len(_cases()) + 4), results[-3:]
    for result in results:
        label = result["label"]
        assert result["fast64"] == result["expected"], label
        assert result["elements"] == result["size"], label
        assert not stats_mismatches(result["stats"], result["expected_stats"], result["dtype"]), (label, result)


@pytest.mark.slow
def test_kernel_registers_leave_four_programs_resident_on_sm90():
    """Compiled for sm_90 without a GPU (scripts/kernel_registers.py: the ptxas of the triton in build/tritonsite),
    every 2- and 4-byte float kernel needs at most 128 registers per thread: four programs of 4 warps fit a
    multiprocessor at once, enough loads in flight to approach the memory's bandwidth (the last program's reduce,
    1024 wide, once took 177 and left room for two)."""
    version, where = triton_used()
    if version is None or not (Path(where) / "backends" / "nvidia" / "bin" / "ptxas").is_file():
        pytest.skip(f"no triton with its ptxas to compile the kernel for sm_90 ({where})")
    path = ([SITE] if SITE else []) + [str(ROOT)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(path)
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "kernel_registers.py"), "--arch", "90"], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    counts = json.loads(done.stdout.splitlines()[-1])
    # 65536 registers per multiprocessor: 4 programs x 4 warps x 32 threads x 128
    assert max(counts.values()) <= 128, counts


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _run()
