"""The options of one run (the CLI's `run` or `gate`, a pytest session), resolved once at its start and handed
down: every case's numerics profile is read once per run, and its environment classes computed once."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from harness.case import Case
from harness.numerics import NumericsProfile, Profiles, environment_class

# Per side, from the job's start (for a worker started for that job: from the worker's start, framework
# import and compilation included); `--timeout` on the command line, else a case's `timeout`, else this.
DEFAULT_SIDE_TIMEOUT_S = 600


@dataclass(frozen=True)
class CaseSettings:
    """One case's settings in a run."""

    profile: NumericsProfile
    # Goldens are kept per class (harness.numerics.environment_class). The case's class, over the devices of
    # all its sides, names its golden folder (<baseline>/<class>/); a side's, over its one device, is
    # recorded in its dump's fingerprint; the float64 reference runs on the CPU.
    environment_class: str
    side_classes: dict[str, str]
    reference_class: str
    timeout: float  # seconds per side


@dataclass(frozen=True)
class RunOptions:
    repeat: int = 1  # each side runs its op this many times (a nondeterminism check)
    numerics: str | None = None  # a profile that replaces every case's (--numerics)
    timeout: float | None = None  # seconds per side, replacing every case's (--timeout)
    max_input_gib: float | None = None
    reference: bool = True  # the float64 reference runs where the case's family has one
    profiles: Profiles = field(default_factory=Profiles, repr=False, compare=False)  # the run's: each read once
    _classes: dict[tuple[str | None, tuple[str, ...]], str] = field(default_factory=dict, init=False, repr=False,
                                                                     compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.numerics is not None:
            self.profiles.load(self.numerics)  # a profile that does not load is refused before any case is read

    def settings(self, case: Case) -> CaseSettings:
        """The case's profile (--numerics, else the case's, else the default), classes and side timeout."""
        profile = self.profiles.load(self.numerics or case.numerics, None if self.numerics else case.source)
        timeout = self.timeout if self.timeout is not None else case.timeout
        return CaseSettings(
            profile, self._class(profile, [case.device_of(side) for side in case.sides]),
            {side: self._class(profile, [case.device_of(side)]) for side in case.sides}, self._class(profile, ["cpu"]),
            float(timeout) if timeout is not None else float(DEFAULT_SIDE_TIMEOUT_S))

    def _class(self, profile: NumericsProfile, devices: list[str]) -> str:
        # it depends on the profile's pinned class and the devices only; a GPU's is asked of nvidia-smi
        key = (profile.environment_class, tuple(devices))
        with self._lock:
            if key not in self._classes:
                self._classes[key] = environment_class(profile, devices)
            return self._classes[key]
