"""The environment fingerprint: everything recorded about a side that decides its bits, in one place.

A fingerprint is a flat mapping of field -> value (str, int, bool or None), recorded in every dump
and golden: the fields here, which need no framework, and the framework adapter's
(harness.frameworks), read in the worker; the settings that can change while an op runs
(deterministic algorithms, TF32) are read right after the op's forward and backward.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

# Environment variables that change numerics or kernel choice.
NUMERIC_ENV = ("TORCHDYNAMO_DISABLE", "TORCHINDUCTOR_EMULATE_PRECISION_CASTS", "ATEN_CPU_CAPABILITY",
               "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_NUM_THREADS",
               "OMP_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE", "CUDA_VISIBLE_DEVICES")
LIBRARIES = ("numpy", "ml_dtypes", "safetensors", "xxhash")


@functools.cache  # read from the installed metadata once per process: it takes milliseconds each time
def version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu() -> dict:
    from harness.numerics import cpu_isa

    model = None
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), None)
    except OSError:
        pass
    return {"cpu_model": model or platform.processor() or None, "cpu_isa": cpu_isa()}


def common(profile_name: str) -> dict:
    from harness import __version__

    return {
        "xfalign": __version__,
        "python": platform.python_version(),
        **{name: version_of(name) for name in LIBRARIES},
        "os": f"{platform.system()} {platform.machine()}",
        **_cpu(),
        "numerics_profile": profile_name,
        **{f"env.{name}": os.environ[name] for name in NUMERIC_ENV if name in os.environ},
        **{f"env.{name}": value for name, value in sorted(os.environ.items()) if name.startswith("FLAGS_")},
    }


# -- shared by the framework adapters ------------------------------------------------------------


def nvidia_smi(field: str) -> str | None:
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                              check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def cuda_library(prefix: str) -> str | None:
    """Version of the pip CUDA library torch loads (nvidia-cublas*, ...), where installed that way."""
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().startswith(prefix):
            return f"{name} {dist.version}"
    return None


# -- comparing two fingerprints ----------------------------------------------------------------------


def label(field: str) -> str:
    return field if field.startswith("env.") else field.replace("_", " ")


def changed_fields(old: dict, new: dict) -> list[str]:
    """The fields whose values differ, new ones' order first; a field only one fingerprint recorded counts."""
    fields = list(new) + [f for f in old if f not in new]
    return [f for f in fields if (f in old, old.get(f)) != (f in new, new.get(f))]
