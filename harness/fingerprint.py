"""The environment fingerprint: everything recorded about a side that decides its bits, in one place.

A fingerprint is a flat mapping of field -> value (str, int, bool or None), recorded in every dump
and golden. Framework fields are read in the worker (torch and paddle are imported only there); the
settings that can change while an op runs (deterministic algorithms, TF32) are read right after the
op's forward and backward, before anything restores them.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

# Environment variables that change numerics or kernel choice.
NUMERIC_ENV = ("TORCHDYNAMO_DISABLE", "TORCHINDUCTOR_EMULATE_PRECISION_CASTS", "ATEN_CPU_CAPABILITY",
               "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_NUM_THREADS",
               "OMP_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE", "CUDA_VISIBLE_DEVICES")
LIBRARIES = ("numpy", "ml_dtypes", "safetensors", "xxhash")


def _version(distribution: str) -> str | None:
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
        **{name: _version(name) for name in LIBRARIES},
        "os": f"{platform.system()} {platform.machine()}",
        **_cpu(),
        "numerics_profile": profile_name,
        **{f"env.{name}": os.environ[name] for name in NUMERIC_ENV if name in os.environ},
        **{f"env.{name}": value for name, value in sorted(os.environ.items()) if name.startswith("FLAGS_")},
    }


# -- torch (Megatron side) --------------------------------------------------------------------------


def _torch_build(pattern: str) -> str | None:
    import torch

    match = re.search(pattern, torch.__config__.show())
    return match.group(1) if match else None


def nvidia_smi(field: str) -> str | None:
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def _cuda_library(prefix: str) -> str | None:
    """Version of the pip CUDA library torch loads (nvidia-cublas*, ...), where installed that way."""
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().startswith(prefix):
            return f"{name} {dist.version}"
    return None


def torch_fields(device: str) -> dict:
    import torch

    fields = {
        "torch": torch.__version__,
        "megatron_core": _version("megatron-core"),
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_mkldnn_enabled": torch.backends.mkldnn.enabled,
        "onednn": _torch_build(r"MKL-DNN v([\w.]+)"),
        "mkl": _torch_build(r"Math Kernel Library Version ([\w.]+)"),
        "torch_threads": torch.get_num_threads(),
    }
    if "torch._inductor.config" in sys.modules:
        from torch._inductor import config as inductor_config

        fields["inductor_simdlen"] = inductor_config.cpp.simdlen
    if "torch._inductor.cpu_vec_isa" in sys.modules and device == "cpu":
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        fields["inductor_vec_isa"] = str(pick_vec_isa()) or "none"
    if device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        fields |= {"compute_capability": f"{major}.{minor}", "driver": nvidia_smi("driver_version"),
                   "cuda": torch.version.cuda, "cublas": _cuda_library("nvidia-cublas"),
                   "cudnn": torch.backends.cudnn.version()}
    return fields


def torch_runtime(device: str) -> dict:
    """Settings an op may change while it runs: read inside the op's region."""
    import torch

    fields = {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}
    if device == "cuda":
        matmul = torch.backends.cuda.matmul
        fields |= {"allow_tf32_matmul": matmul.allow_tf32, "allow_tf32_cudnn": torch.backends.cudnn.allow_tf32,
                   "float32_matmul_precision": torch.get_float32_matmul_precision(),
                   "bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
                   "fp16_reduced_precision_reduction": matmul.allow_fp16_reduced_precision_reduction,
                   "cudnn_deterministic": torch.backends.cudnn.deterministic,
                   "cudnn_benchmark": torch.backends.cudnn.benchmark}
    return fields


# -- paddle ------------------------------------------------------------------------------------------


def paddle_fields(device: str, threads: int | None) -> dict:
    import paddle

    core = paddle.base.core
    fields = {
        "paddle": paddle.__version__,
        "paddle_commit": paddle.version.commit,
        "device": device,
        "device_name": "cpu" if device == "cpu" else paddle.device.cuda.get_device_name(),
        "paddle_with_mkl": paddle.version.with_mkl,
        "paddle_onednn": core.is_compiled_with_onednn(),
        "paddle_cpu_avx512f": core.supports_avx512f(),
        "paddle_cpu_bf16": core.supports_bfloat16(),
        "paddle_threads": threads if threads is not None else "default",
    }
    if device == "cuda":
        fields |= {"cuda": paddle.version.cuda(), "cudnn": paddle.version.cudnn(), "driver": nvidia_smi("driver_version")}
    return fields


# -- comparing two fingerprints ----------------------------------------------------------------------


def label(field: str) -> str:
    return field if field.startswith("env.") else field.replace("_", " ")


def differences(old: dict, new: dict) -> list[str]:
    """Every field that differs, as `field old → new`; a field only one side recorded counts."""
    fields = list(new) + [f for f in old if f not in new]
    return [f"{label(f)} {old.get(f, 'not recorded')} → {new.get(f, 'not recorded')}"
            for f in fields if old.get(f, "not recorded") != new.get(f, "not recorded")]
