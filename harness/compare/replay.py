"""What a float64 replay of one module call found (harness.capture.replay_exact runs it): per output, each
side's error against the exact value, and whether the two float64 copies agree (module note there)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from harness.compare.arbiter import ExactComparison
from harness.compare.exact import UNIT_ROUNDOFF, ExactError
from harness.compare.pairs import Pair

AGREE_U = 1 / 16  # the float64 copies agree: normwise difference at most this many units of the output's u
Closer = Literal["A", "B", "tie"]


@dataclass(frozen=True)
class ExactOutput:
    """One output of the replayed module: A's captured value against B's replayed one (`pair`, as replay
    compares them), with both against the exact value (`pair.exact`), and the two float64 copies' agreement."""

    pair: Pair  # its `exact` is set: harness.compare.arbiter.ExactComparison, sides ("A", "B")
    spread: ExactError | None = None  # the other float64 output against the exact one (in float64 ULPs)
    spread_missing: str | None = None  # why there is no spread

    @property
    def name(self) -> str:
        return self.pair.name

    @property
    def dtype(self) -> str:
        return self.pair.digest.dtype

    @property
    def exact(self) -> ExactComparison:
        assert self.pair.exact is not None
        return self.pair.exact

    @property
    def closer(self) -> Closer | None:
        """The side whose output is closer to exact by normwise error (fewer NaN/Inf mismatches first)."""
        a, b = self.exact.a, self.exact.b
        if a is None or b is None:
            return None
        key_a, key_b = (a.class_mismatch, a.normwise), (b.class_mismatch, b.normwise)
        return "tie" if key_a == key_b else "A" if key_a < key_b else "B"

    @property
    def spread_u(self) -> float | None:
        """The float64 copies' normwise difference in units of the output dtype's u (absolute where exact is 0)."""
        if self.spread is None:
            return None
        return self.spread.normwise if self.spread.normwise_absolute else self.spread.normwise / UNIT_ROUNDOFF[self.dtype]

    @property
    def agree(self) -> bool | None:
        """Whether the float64 copies compute one function (module note); None without a spread."""
        if self.spread is None:
            return None
        return self.spread.error_norm == 0 if self.spread.normwise_absolute else self.spread.normwise <= AGREE_U * UNIT_ROUNDOFF[self.dtype]

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "exact": self.exact.to_json(), "closer": self.closer,
                "spread": self.spread.to_json() if self.spread else None, "spread_u": self.spread_u,
                "agree": self.agree, "spread_missing": self.spread_missing}


@dataclass
class ExactReplay:
    """The float64 replay of one module call: whose float64 output is the exact one (`reference`, "A" or "B";
    None: N/A), why a side's copy did not run (`not_run`), per output the verdict, and the exact values."""

    module_a: str
    modules_b: list[str]
    step: int
    call: int
    reference: Literal["A", "B"] | None
    not_run: dict[str, str]  # side -> why its float64 copy did not run
    outputs: list[ExactOutput]
    values: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # exact outputs, A's names and layouts
    notes: list[str] = field(default_factory=list)

    @property
    def missing(self) -> str | None:
        """Why nothing could be measured (N/A), else None."""
        if self.reference is not None:
            return None
        return "; ".join(f"side {side}: {why}" for side, why in self.not_run.items())

    def to_json(self) -> dict:
        return {"module_a": self.module_a, "modules_b": self.modules_b, "step": self.step, "call": self.call,
                "reference": self.reference, "missing": self.missing, "not_run": self.not_run,
                "outputs": [output.to_json() for output in self.outputs], "notes": self.notes}
