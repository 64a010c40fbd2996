"""What a gate does with goldens: one policy for `xfalign gate`, `gate --tree` and the pytest plugin.

- `check`: write nothing; a missing golden fails ("no golden yet").
- `write-missing` (the default): a missing golden is written and its case fails once, saying it was written
  (as pytest-regressions and syrupy do); a golden that drifted is left as it is.
- `force-regen`: every golden that fails (missing, drifted, changed inputs, unreadable) is rewritten and its
  case is checked against the new one: it passes unless an expectation or determinism fails.
- `regen-all`: every golden is rewritten, failing or not, and checked as with `force-regen`.

With every policy, a golden that drifted and was not rewritten gets `<stem>.golden.obtained.yaml` beside it:
what this run produced, in the golden's YAML format (`diff x.golden.yaml x.golden.obtained.yaml`); it is removed
when the golden passes again or is rewritten.

Older options map onto it: `gate --update` is `regen-all`, `gate --update --only-failing` is `force-regen`
(so is pytest's `--xfalign-update`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from harness.compare.findings import Finding


class GoldenPolicy(Enum):
    CHECK = "check"
    WRITE_MISSING = "write-missing"
    FORCE_REGEN = "force-regen"
    REGEN_ALL = "regen-all"

    @classmethod
    def choices(cls) -> list[str]:
        return [policy.value for policy in cls]

    def writes(self, missing: bool, failing: bool) -> bool:
        """Whether a golden is written: `missing` (there is none), `failing` (rewriting it would change what it
        says: drift, changed inputs, or missing)."""
        if self is GoldenPolicy.CHECK:
            return False
        if self is GoldenPolicy.WRITE_MISSING:
            return missing
        if self is GoldenPolicy.FORCE_REGEN:
            return missing or failing
        return True

    @property
    def rewrites_unreadable(self) -> bool:
        """Whether a golden that cannot be read is rewritten (a golden of another case never is)."""
        return self in (GoldenPolicy.FORCE_REGEN, GoldenPolicy.REGEN_ALL)

    @property
    def passes_written(self) -> bool:
        """Whether a case whose golden was written now is checked against it (else it fails once)."""
        return self in (GoldenPolicy.FORCE_REGEN, GoldenPolicy.REGEN_ALL)


DEFAULT = GoldenPolicy.WRITE_MISSING


def from_update(update: bool, only_failing: bool, policy: str | None) -> GoldenPolicy:
    """The policy of the command line's options: `--golden MODE`, or the older `--update [--only-failing]`
    (regen-all, force-regen). Raises ValueError with the one line to show when they contradict."""
    if only_failing and not update:
        raise ValueError("--only-failing goes with --update (or use --golden force-regen)")
    if update:
        implied = GoldenPolicy.FORCE_REGEN if only_failing else GoldenPolicy.REGEN_ALL
        if policy is not None and GoldenPolicy(policy) is not implied:
            raise ValueError(f"--update{' --only-failing' if only_failing else ''} is --golden {implied.value}, "
                             f"not --golden {policy}: give one of them")
        return implied
    return GoldenPolicy(policy) if policy is not None else DEFAULT


@dataclass
class GoldenUpdate:
    """What writing a golden changed (harness.reports.text.update_text says it)."""
    created: bool  # there was none (or none readable)
    tensors: list[str] = field(default_factory=list)  # side/tensor whose digest changed
    inputs: list[str] = field(default_factory=list)  # inputs whose digest changed
    environment: list[Finding] = field(default_factory=list)  # fingerprint fields that changed
