"""Numerics profiles: what a run pins so that a CPU's instruction set does not decide its bits.

A profile is a YAML file in harness/profiles/ (package data: an installed xfalign has them too), or a path
relative to the case. It sets environment
variables before a framework is imported and framework switches after; the framework adapter applies
it in the worker and the dump's fingerprint records it. Cases name one with `numerics:`, a run with `--numerics`.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from harness.case import Strict
from harness.errors import XfalignError, field_text, validation_problem

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
DEFAULT_PROFILE = "portable-avx2"


class ProfileError(XfalignError):
    """A profile that does not exist or does not validate; the message is one line."""


class TorchPins(Strict):
    mkldnn: bool | None = None  # torch.backends.mkldnn.enabled
    threads: int | None = None  # torch.set_num_threads
    inductor_simdlen: int | None = None  # torch._inductor.config.cpp.simdlen (vector bits of compiled code)


class PaddlePins(Strict):
    threads: int | None = None


class NumericsProfile(Strict):
    name: str
    description: str = ""
    environment_class: str | None = None  # None: the class is the CPU's own (cpu-native-<isa>)
    env: dict[str, str] = {}
    torch: TorchPins = TorchPins()
    paddle: PaddlePins = PaddlePins()


def profile_path(name: str, relative_to: str | Path | None = None) -> Path:
    """A profile name is a built-in profile (harness/profiles/NAME.yaml); a value with a slash or .yaml is a path."""
    if "/" in name or name.endswith((".yaml", ".yml")):
        base = Path(relative_to).parent if relative_to else Path.cwd()
        return (base / name).resolve()
    return PROFILES_DIR / f"{name}.yaml"


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name: str | None, relative_to: str | Path | None = None) -> NumericsProfile:
    name = name or DEFAULT_PROFILE
    path = profile_path(name, relative_to)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError:
        known = ", ".join(available_profiles()) or "none"
        raise ProfileError(f"no numerics profile {name!r} ({path}); known: {known}") from None
    except yaml.YAMLError as error:
        raise ProfileError(f"{path}: not valid YAML: {str(error).splitlines()[0]}") from None
    try:
        return NumericsProfile(name=Path(name).stem, **data)
    except TypeError as error:
        raise ProfileError(f"{path}: (top level): {error}") from None
    except ValidationError as error:
        location, message = validation_problem(error)
        raise ProfileError(f"{path}: {field_text(location)}: {message}") from None


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


def _gpu_class() -> str:
    """cuda-<device name>-sm<capability>, from nvidia-smi (the parent process imports no framework)."""
    from harness.fingerprint import nvidia_smi

    name, capability = nvidia_smi("name") or "unknown", nvidia_smi("compute_cap") or ""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return f"cuda-{slug}-sm{capability.replace('.', '')}" if capability else f"cuda-{slug}"


def environment_class(profile: NumericsProfile, devices: list[str]) -> str:
    """Goldens are kept per class: runs of one class give the same bits on any machine of that class.
    CPU sides: the profile's class, or the CPU's own instruction set when it pins nothing; GPU sides: the GPU."""
    classes = [_gpu_class() if device == "cuda" else profile.environment_class or f"cpu-native-{cpu_isa()}"
               for device in devices]
    return "_".join(dict.fromkeys(classes))
