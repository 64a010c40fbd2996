"""The environment fingerprint: everything recorded about a side that decides its bits, in one place.

A fingerprint is a flat mapping of field -> value (str, int, bool or None), recorded in every dump
and golden, and assembled here (`assemble`) for op runs and captures alike: the machine's facts
(harness.machine), the environment variables that decide bits, the framework adapter's fields
(harness.frameworks, read in the worker or the training process), the settings that can change while an op
runs (deterministic algorithms, TF32: read right after the op's forward and backward) and the environment
class.
"""

from __future__ import annotations

import os

from harness import machine
from harness.frameworks import FrameworkAdapter, adapter_for, known_frameworks
from harness.frameworks.base import names_matching
from harness.numerics import NumericsProfile, environment_class

# Environment variables that change numerics or kernel choice in libraries any framework may load; each
# framework adapter adds its own (FrameworkAdapter.numeric_env).
NUMERIC_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_NUM_THREADS",
               "OMP_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE", "CUDA_VISIBLE_DEVICES")
LIBRARIES = ("numpy", "ml_dtypes", "safetensors", "xxhash")
# Fields older dumps and goldens recorded that fingerprints no longer hold: not compared (a report derives
# the versions it shows from the version fields: FrameworkAdapter.version_line).
RETIRED = ("version_line",)


def assemble(adapter: FrameworkAdapter, device: str, profile: NumericsProfile, runtime: dict | None = None,
             device_class: str | None = None) -> dict:
    """The fingerprint of a side that ran with `adapter` on `device` under `profile`; `runtime`: the adapter's
    runtime fields as read right after the op (read now when not given); `device_class`: the environment class
    of `device` as the run resolved it once (computed here when not given: a capture)."""
    if runtime is None:
        runtime = adapter.runtime_fingerprint(device)
    return (_common(profile.name) | adapter.fingerprint(device, profile) | runtime
            | {"environment_class": device_class or environment_class(profile, [device])})


def numeric_env() -> list[str]:
    """The variables set now that decide bits: every known framework's, on every side (as always recorded:
    goldens compare them field by field), then the libraries'."""
    patterns = tuple(pattern for name in known_frameworks() for pattern in adapter_for(name).numeric_env)
    return names_matching(patterns + NUMERIC_ENV, list(os.environ))


def _common(profile_name: str) -> dict:
    from harness import __version__

    return {
        "xfalign": __version__,
        "python": machine.python_version(),
        **{name: machine.version_of(name) for name in LIBRARIES},
        "os": machine.operating_system(),
        "cpu_model": machine.cpu_model(),
        "cpu_isa": machine.cpu_isa(),
        "numerics_profile": profile_name,
        **{f"env.{name}": os.environ[name] for name in numeric_env()},
    }


# -- comparing two fingerprints ----------------------------------------------------------------------


def label(field: str) -> str:
    return field if field.startswith("env.") else field.replace("_", " ")


def changed_fields(old: dict, new: dict) -> list[str]:
    """The fields whose values differ, new ones' order first; a field only one fingerprint recorded counts,
    except a retired one (RETIRED)."""
    fields = [f for f in list(new) + [f for f in old if f not in new] if f not in RETIRED]
    return [f for f in fields if (f in old, old.get(f)) != (f in new, new.get(f))]
