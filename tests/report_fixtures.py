"""Dumps with known differences, made without running a framework (for report tests and scripts)."""

import ml_dtypes
import numpy as np

from harness.store.digest import Digest
from harness.store.dump import Dump

CASE_JSON = {"name": "known_diff", "op": "swiglu", "expect": {"all": "bitwise"}}


def side_meta(side: str, framework: str, inputs: dict) -> dict:
    return {"case": CASE_JSON, "case_name": "known_diff", "side": side, "framework": framework,
            "impl": "fixture", "mode": None, "provenance": f"test fixture ({side})",
            "environment": {"python": "3.11", "device_name": "cpu", framework: "0.0"},
            "inputs": {n: Digest.of(a).to_json() for n, a in inputs.items()},
            "axes": {"out": ["token", "hidden"]}}


def known_diff_dumps(rows: int = 64, cols: int = 128) -> tuple[Dump, Dump]:
    """out: one element 1 ULP apart; grad.x: bitwise equal; grad.probs: three elements 1 ULP apart."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, 2 * cols)).astype(ml_dtypes.bfloat16)
    out = rng.standard_normal((rows, cols)).astype(ml_dtypes.bfloat16)
    grad_x = rng.standard_normal((rows, 2 * cols)).astype(ml_dtypes.bfloat16)
    probs = rng.uniform(size=(rows, 1)).astype(np.float32)
    out_b, probs_b = out.copy(), probs.copy()
    out_b.view(np.uint16)[3, 5] += 1
    probs_b.view(np.uint32)[[1, 7, 9], 0] += 1
    inputs = {"x": x}
    a = Dump(side_meta("megatron", "megatron", inputs), {"out": out, "grad.x": grad_x, "grad.probs": probs})
    b = Dump(side_meta("paddle", "paddle", inputs), {"out": out_b, "grad.x": grad_x.copy(), "grad.probs": probs_b})
    return a, b


def dumps_of(a_tensors: dict, b_tensors: dict, name: str = "known_diff") -> tuple[Dump, Dump]:
    """Two dumps of the given tensors, with the same inputs."""
    inputs = {"x": np.zeros(2, np.float32)}
    a, b = Dump(side_meta("megatron", "megatron", inputs), a_tensors), Dump(side_meta("paddle", "paddle", inputs), b_tensors)
    for dump in (a, b):
        dump.meta["case_name"] = name
    return a, b
