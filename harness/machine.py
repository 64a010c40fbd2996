"""Facts about this machine, each read in one place: the CPU (model and widest vector extension), the
operating system and Python, the GPU (through nvidia-smi: the parent process imports no framework) and the
installed distributions (which provides a package, their versions)."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path


@functools.cache  # read from the installed metadata once per process: it takes milliseconds each time
def version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distribution_of(package: str) -> str | None:
    """The installed distribution that provides the top-level `package` (None: none does, a user's file)."""
    found = _distributions().get(package)
    return found[0] if found else None


def python_version() -> str:
    return platform.python_version()


def operating_system() -> str:
    return f"{platform.system()} {platform.machine()}"


def cpu_model() -> str | None:
    model = None
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), None)
    except OSError:
        pass
    return model or platform.processor() or None


def cpu_isa() -> str:
    """The widest x86 vector extension this CPU has, as the classes name it."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    for flag, isa in (("amx_tile", "amx"), ("avx512_bf16", "avx512-bf16"), ("avx512f", "avx512"), ("avx2", "avx2")):
        if flag in flags:
            return isa
    return "baseline"


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
