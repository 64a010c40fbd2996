"""Inputs: generated once from the case's seeds with numpy, handed bit-exactly to both sides."""

from __future__ import annotations

import math
import zlib
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from harness.case import Case, CaseError, InputSpec
from harness.dtypes import FLOAT_DTYPES, to_numpy_dtype
from harness.ops import family_for
from harness.rounding import round_float64

# The version of the input generator: bump it whenever the bits of any input change. Version 1 cast the
# float64 draws with ml_dtypes' astype (whose float64 -> bfloat16 rounding changed between 0.6.0 and 0.7.0);
# version 2 rounds them with harness.rounding, which depends on nothing installed.
GENERATOR = 2
DEFAULT_MAX_INPUT_GIB = 8.0
# What generate_inputs allows when not told otherwise (the command line's --max-input-gib may set it).
MAX_INPUT_GIB = DEFAULT_MAX_INPUT_GIB
# Draws are made this many at a time in float64 and cast into the input: the same stream, and so the same
# bits, as one draw of the whole tensor, without a float64 copy of it.
CHUNK_ELEMENTS = 1 << 20
_GIB = 1 << 30


def input_bytes(case: Case) -> int:
    """Bytes the case's inputs take, as generated (before any framework copies them)."""
    return sum(math.prod(spec.shape) * to_numpy_dtype(spec.dtype).itemsize for spec in case.inputs.values())


def check_input_size(case: Case, limit_gib: float = DEFAULT_MAX_INPUT_GIB) -> int:
    """The case's inputs must fit in `limit_gib` GiB; checked before anything is allocated. Returns the bytes.

    Raises CaseError: "cases/x.yaml: inputs need 74.5 GiB; limit 8 GiB (set --max-input-gib)"."""
    need = input_bytes(case)
    if need > limit_gib * _GIB:
        point = f" (in sweep point {case.name})" if case.sweep_of else ""
        raise CaseError(f"{case.source}: inputs need {need / _GIB:,.1f} GiB; limit {limit_gib:g} GiB "
                        f"(set --max-input-gib){point}")
    return need


def generate_input(name: str, spec: InputSpec, case: Case) -> np.ndarray:
    # Seeded by (seed, name): adding an input to a case leaves the others' bits unchanged.
    seed = spec.seed if spec.seed is not None else case.seed
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    made = family_for(case.op, case.source).generate_input(name, case, rng)
    if made is not None:
        return made
    dtype = to_numpy_dtype(spec.dtype)
    if spec.dist == "arange":  # positions 0..n-1 along the last axis, the same in every row
        return np.ascontiguousarray(np.broadcast_to(np.arange(spec.shape[-1], dtype=dtype), spec.shape))
    if spec.dist == "randint":
        return rng.integers(int(spec.low), int(spec.high), size=spec.shape, dtype=np.int64).astype(dtype)
    values = np.empty(spec.shape, dtype=dtype)
    flat = values.reshape(-1)
    # The draws, in order, chunk by chunk; each float64 chunk -> dtype: one round-to-nearest-even per value
    # (xfalign's own, for float dtypes: a cast's rounding depends on what is installed).
    for start in range(0, flat.size, CHUNK_ELEMENTS):
        size = min(CHUNK_ELEMENTS, flat.size - start)
        if spec.dist == "normal":
            chunk = rng.normal(spec.mean, spec.std, size=size)
        else:
            chunk = rng.uniform(spec.low, spec.high, size=size)
        flat[start:start + size] = _to_dtype(chunk, spec.dtype)
    if spec.special_values and spec.special_fraction > 0:
        # After all the draws, as before: the positions, then the values planted there.
        count = max(1, round(flat.size * spec.special_fraction))
        where = rng.choice(flat.size, size=min(count, flat.size), replace=False)
        flat[where] = _to_dtype(rng.choice(np.asarray(spec.special_values, dtype=np.float64), size=where.size), spec.dtype)
    return values


def _to_dtype(draws: np.ndarray, dtype: str) -> np.ndarray:
    """float64 draws in the input's dtype: rounded by harness.rounding to a float dtype, cast to an integer one."""
    return round_float64(draws, dtype) if dtype in FLOAT_DTYPES else draws.astype(to_numpy_dtype(dtype))


def generate_inputs(case: Case, max_input_gib: float | None = None) -> dict[str, np.ndarray]:
    """Every input of the case; first checks they fit in `max_input_gib` (default: MAX_INPUT_GIB)."""
    check_input_size(case, MAX_INPUT_GIB if max_input_gib is None else max_input_gib)
    return {name: generate_input(name, spec, case) for name, spec in case.inputs.items()}


def write_inputs(arrays: dict[str, np.ndarray], path: Path) -> None:
    save_file(arrays, path)


def read_inputs(path: Path) -> dict[str, np.ndarray]:
    return load_file(path)
