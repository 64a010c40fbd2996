"""What the storage fault tests' writer processes write: a dump and a golden made of seeded numpy arrays.
Imported by those processes, so it imports no pytest and no framework (each writer starts quickly)."""

from __future__ import annotations

import numpy as np

from harness.store.digest import Digest, digests_of
from harness.store.dump import Dump
from harness.store.golden import Golden

CASE_ID = "sweep[x=1,y=fp32]"  # a sweep point's id: '[', ',', '=' are not in its golden's file names


def make_dump(seed: int, side: str = "paddle", elements: int = 256) -> Dump:
    rng = np.random.default_rng(seed)
    tensors = {"out": rng.standard_normal(elements).astype(np.float32),
               "grad.x": rng.standard_normal((2, elements)).astype(np.float16)}
    meta = {"xfalign": "0.1.0", "case": {"op": "swiglu"}, "case_name": "c", "side": side, "framework": "paddle",
            "impl": "fp32_island", "mode": None, "axes": {}, "notes": {}, "provenance": "-",
            "environment": {"seed": seed},
            "inputs": {"x": Digest.of(np.zeros(4, np.float32)).to_json()}, "repeats": {}}
    return Dump(meta, tensors)


def make_golden(seed: int, case: str = CASE_ID, elements: int = 256, with_values: bool = True) -> Golden:
    rng = np.random.default_rng(seed)
    arrays = {"megatron/out": rng.standard_normal(elements).astype(np.float32),
              "paddle/out": rng.standard_normal(elements).astype(np.float32)}
    tensors = {side: digests_of({"out": arrays[f"{side}/out"]}) for side in ("megatron", "paddle")}
    return Golden(case, {"x": Digest.of(np.zeros(4, np.float32))}, {"megatron": {"seed": seed}, "paddle": {}},
                  tensors, arrays if with_values else None)
