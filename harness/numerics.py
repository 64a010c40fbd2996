"""Numerics profiles: what a run pins so that a CPU's instruction set does not decide its bits.

A profile is a YAML file in harness/profiles/ (package data: an installed xfalign has them too), or a path
relative to the case. It sets environment variables before a framework is imported and framework switches
after: each framework's switches are its section of the profile (`torch:`, `paddle:`), whose model its
adapter owns (FrameworkAdapter.pins) and applies in the worker; the dump's fingerprint records them. Cases
name one with `numerics:`, a run with `--numerics`.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError, create_model, field_validator

from harness.errors import XfalignError, describe_value, validation_problem
from harness.frameworks import adapter_for, known_frameworks
from harness.machine import cpu_isa, nvidia_smi
from harness.schema import NAME_RULE, Strict, is_safe_name
from harness.yamlio import line_and_field, read_yaml

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
DEFAULT_PROFILE = "portable-avx2"
MAX_PROFILE_BYTES = 64 << 10  # a profile is a few lines a person writes
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ProfileError(XfalignError):
    """A profile that does not exist or does not validate; the message is one line `file:line: field: ...`."""


class _Profile(Strict):
    """The fields of every profile; NumericsProfile adds one section per framework."""

    name: str
    description: str = ""
    environment_class: str | None = None  # None: the class is the CPU's own (cpu-native-<isa>)
    env: dict[str, str] = {}

    @field_validator("environment_class")
    @classmethod
    def _one_folder_name(cls, name: str | None) -> str | None:
        # goldens of the class are kept in <baseline>/<class>/: a path here would write them anywhere
        if name is not None and not is_safe_name(name):
            raise ValueError(f"{name!r} is not a safe class name (it names the baseline's folder): {NAME_RULE}")
        return name

    @field_validator("env")
    @classmethod
    def _variables(cls, env: dict[str, str]) -> dict[str, str]:
        for variable, value in env.items():
            if not _ENV_NAME.match(variable):
                raise ValueError(f"{variable!r} is not an environment variable name (letters, digits, '_')")
            if "\0" in value:
                raise ValueError(f"{variable}: the value holds a NUL character")
        return env


def _with_framework_sections() -> type[_Profile]:
    """_Profile with each framework adapter's section (its `pins` model, every switch unset by default)."""
    sections: dict[str, Any] = {}
    for framework in known_frameworks():
        adapter = adapter_for(framework)
        if not adapter.profile_section:
            continue
        if sections.get(adapter.profile_section, (adapter.pins,))[0] is not adapter.pins:
            raise TypeError(f"framework {framework}: another framework's pins use the profile section "
                            f"{adapter.profile_section!r}")
        sections[adapter.profile_section] = (adapter.pins, adapter.pins())
    return create_model("NumericsProfile", __base__=_Profile, __module__=__name__, **sections)


if TYPE_CHECKING:
    NumericsProfile = _Profile
else:
    NumericsProfile = _with_framework_sections()
FIELDS = ", ".join(name for name in NumericsProfile.model_fields if name not in ("name", "description"))


def profile_path(name: str, relative_to: str | Path | None = None) -> Path:
    """A profile name is a built-in profile (harness/profiles/NAME.yaml); a value with a slash or .yaml is a path."""
    if "/" in name or name.endswith((".yaml", ".yml")):
        base = Path(relative_to).parent if relative_to else Path.cwd()
        return (base / name).resolve()
    return PROFILES_DIR / f"{name}.yaml"


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name: str | None, relative_to: str | Path | None = None) -> NumericsProfile:
    """The profile, validated as case files are: each problem is one line naming the file, line and field."""
    name = name or DEFAULT_PROFILE
    path = profile_path(name, relative_to)
    if not path.is_file():
        known = ", ".join(available_profiles()) or "none"
        raise ProfileError(f"no numerics profile {name!r} ({path}); known: {known}")
    data, lines = read_yaml(path, "numerics profile", ProfileError, MAX_PROFILE_BYTES)
    if data is None or data == {}:
        raise ProfileError(f"{path}:1: (top level): the profile is empty and pins nothing; set {FIELDS} "
                           "(the built-in profile `native` is the one that pins nothing)")
    if not isinstance(data, dict):
        raise ProfileError(f"{path}:1: (top level): a numerics profile is a mapping of fields ({FIELDS}), "
                           f"got {describe_value(data)}")
    if "name" in data:
        raise ProfileError(f"{path}:{lines.get(('name',), 1)}: name: a profile is named by its file "
                           f"({path.stem}); remove the key")
    try:
        return NumericsProfile(name=Path(name).stem, **data)
    except ValidationError as error:
        location, message = validation_problem(error)
        line, field = line_and_field(lines, location)
        raise ProfileError(f"{path}:{line}: {field}: {message}") from None


class Profiles:
    """The numerics profiles of one run, each file read once however many cases (and sweep points) name it.
    One per run, never shared between runs: a profile edited between two runs is read anew."""

    def __init__(self) -> None:
        self._read: dict[Path, NumericsProfile] = {}
        self._lock = threading.Lock()  # cases are run from several threads

    def load(self, name: str | None, relative_to: str | Path | None = None) -> NumericsProfile:
        """`load_profile`'s profile, read the first time its file is asked for."""
        path = profile_path(name or DEFAULT_PROFILE, relative_to)
        with self._lock:
            if path not in self._read:
                self._read[path] = load_profile(name, relative_to)
            return self._read[path]


def _gpu_class() -> str:
    """cuda-<device name>-sm<capability>, from nvidia-smi (the parent process imports no framework)."""
    name, capability = nvidia_smi("name") or "unknown", nvidia_smi("compute_cap") or ""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return f"cuda-{slug}-sm{capability.replace('.', '')}" if capability else f"cuda-{slug}"


def environment_class(profile: NumericsProfile, devices: list[str]) -> str:
    """Goldens are kept per class: runs of one class give the same bits on any machine of that class.
    CPU sides: the profile's class, or the CPU's own instruction set when it pins nothing; GPU sides: the GPU."""
    classes = [_gpu_class() if device == "cuda" else profile.environment_class or f"cpu-native-{cpu_isa()}"
               for device in devices]
    return "_".join(dict.fromkeys(classes))
