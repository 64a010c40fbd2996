"""The environment fingerprint: everything recorded about a side that decides its bits, in one place.

A fingerprint is a flat mapping of field -> value (str, int, bool or None), recorded in every dump
and golden: the fields here, which need no framework, and the framework adapter's
(harness.frameworks), read in the worker; the settings that can change while an op runs
(deterministic algorithms, TF32) are read right after the op's forward and backward.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from harness.machine import cpu_isa, version_of

# Environment variables that change numerics or kernel choice.
NUMERIC_ENV = ("TORCHDYNAMO_DISABLE", "TORCHINDUCTOR_EMULATE_PRECISION_CASTS", "ATEN_CPU_CAPABILITY",
               "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_NUM_THREADS",
               "OMP_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE", "CUDA_VISIBLE_DEVICES")
LIBRARIES = ("numpy", "ml_dtypes", "safetensors", "xxhash")


def _cpu() -> dict:
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


# -- comparing two fingerprints ----------------------------------------------------------------------


def label(field: str) -> str:
    return field if field.startswith("env.") else field.replace("_", " ")


def changed_fields(old: dict, new: dict) -> list[str]:
    """The fields whose values differ, new ones' order first; a field only one fingerprint recorded counts."""
    fields = list(new) + [f for f in old if f not in new]
    return [f for f in fields if (f in old, old.get(f)) != (f in new, new.get(f))]
