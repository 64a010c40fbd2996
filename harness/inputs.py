"""Inputs: generated once from the case's seeds with numpy, handed bit-exactly to both sides."""

from __future__ import annotations

import math
import zlib
from pathlib import Path

import numpy as np

from harness.case import Case, CaseError, InputSpec
from harness.dtypes import FLOAT_DTYPES, to_numpy_dtype
from harness.ops import family_for
from harness.rounding import round_float64

# The version of this generator, recorded in dumps and goldens: harness.store.dump.GENERATOR (bump it whenever
# the bits of any input change).
DEFAULT_MAX_INPUT_GIB = 8.0
# A run holds about this many float64 copies of its inputs at its peak, all processes together (beyond what the
# workers hold idle: the frameworks, about 1 GiB): each side's inputs, outputs and gradients (outputs and
# gradients are about the inputs' size again) in the framework and in its dump, the float64 reference's, and
# the comparison, which reads both sides' dumps and the reference's and measures them in float64. The float64
# parts are most of it, so the peak follows the number of input elements more than their bytes: about 26x the
# inputs' bytes for bfloat16 inputs, 13x for float32. Measured 2026-12-01 (AMD EPYC, 2 cores, torch 2.13.0+cpu,
# paddle 3.3.1, megatron-core 0.16.1), swiglu weighted, compiled Megatron vs Paddle, with the reference: 45-48
# bytes per input element with bfloat16 inputs of 0.25 and 0.5 GiB (peaks of 6.5 and 12.8 GiB), 51 with
# float32 inputs of 0.5 GiB (7.2 GiB); 6.5 float64 copies are 52 bytes.
RUN_FLOAT64_COPIES = 6.5
# What generate_inputs allows when not told otherwise (the command line's --max-input-gib may set it).
MAX_INPUT_GIB = DEFAULT_MAX_INPUT_GIB
# Draws are made this many at a time in float64 and cast into the input: the same stream, and so the same
# bits, as one draw of the whole tensor, without a float64 copy of it.
CHUNK_ELEMENTS = 1 << 20
_GIB = 1 << 30


def input_bytes(case: Case) -> int:
    """Bytes the case's inputs take, as generated (before any framework copies them)."""
    return sum(math.prod(spec.shape) * to_numpy_dtype(spec.dtype).itemsize for spec in case.inputs.values())


def run_peak_bytes(case: Case) -> int:
    """About the most memory a run of the case holds at once, all processes together (RUN_FLOAT64_COPIES)."""
    return round(RUN_FLOAT64_COPIES * 8 * sum(math.prod(spec.shape) for spec in case.inputs.values()))


def machine_memory() -> int | None:
    """Bytes of memory this machine has (None: unknown), or its control group's limit where that is lower."""
    sizes = []
    try:
        total = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:"))
        sizes.append(int(total.split()[1]) * 1024)
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    try:
        sizes.append(int(Path("/sys/fs/cgroup/memory.max").read_text()))  # "max": no limit
    except (OSError, ValueError):
        pass
    return min(sizes, default=None)


def check_input_size(case: Case, limit_gib: float | None = None) -> int:
    """The case's inputs must fit in `limit_gib` GiB; checked before anything is allocated. Returns the bytes.
    With no limit given: DEFAULT_MAX_INPUT_GIB, and the run's peak (run_peak_bytes) must fit in this machine's
    memory; a limit given is the user's word, and replaces both.

    Raises CaseError: "cases/x.yaml: inputs need 74.5 GiB; limit 8 GiB (set --max-input-gib)"."""
    need = input_bytes(case)
    point = f" (in sweep point {case.name})" if case.sweep_of else ""
    limit = DEFAULT_MAX_INPUT_GIB if limit_gib is None else limit_gib
    if need > limit * _GIB:
        raise CaseError(f"{case.source}: inputs need {need / _GIB:,.1f} GiB; limit {limit:g} GiB "
                        f"(set --max-input-gib){point}")
    memory = machine_memory() if limit_gib is None else None
    if memory is not None and run_peak_bytes(case) > memory:
        raise CaseError(f"{case.source}: inputs need {need / _GIB:,.2f} GiB, and a run holds about "
                        f"{RUN_FLOAT64_COPIES:g} float64 copies of them at its peak ({run_peak_bytes(case) / _GIB:,.1f} "
                        f"GiB): more than this machine's {memory / _GIB:,.1f} GiB of memory (make the inputs smaller, "
                        f"or set --max-input-gib to run it anyway){point}")
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
