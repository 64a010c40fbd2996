"""Inputs: generated once from the case's seeds with numpy, handed bit-exactly to both sides."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from harness.case import Case, InputSpec
from harness.dtypes import to_numpy_dtype
from harness.ops import family_for


def generate_input(name: str, spec: InputSpec, case: Case) -> np.ndarray:
    # Seeded by (seed, name): adding an input to a case leaves the others' bits unchanged.
    seed = spec.seed if spec.seed is not None else case.seed
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    made = family_for(case.op).generate_input(name, case, rng)
    if made is not None:
        return made
    if spec.dist == "normal":
        values = rng.normal(spec.mean, spec.std, size=spec.shape)
    else:
        values = rng.uniform(spec.low, spec.high, size=spec.shape)
    if spec.special_values and spec.special_fraction > 0:
        flat = values.reshape(-1)
        count = max(1, int(round(flat.size * spec.special_fraction)))
        where = rng.choice(flat.size, size=min(count, flat.size), replace=False)
        flat[where] = rng.choice(np.asarray(spec.special_values, dtype=np.float64), size=where.size)
    return values.astype(to_numpy_dtype(spec.dtype))  # float64 -> dtype: one round-to-nearest-even


def generate_inputs(case: Case) -> dict[str, np.ndarray]:
    return {name: generate_input(name, spec, case) for name, spec in case.inputs.items()}


def write_inputs(arrays: dict[str, np.ndarray], path: Path) -> None:
    save_file(arrays, path)


def read_inputs(path: Path) -> dict[str, np.ndarray]:
    return load_file(path)
