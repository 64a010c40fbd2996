"""Expectations: what a case holds a tensor pair to. Each kind is one class, registered by its YAML
key when defined: a word (`bitwise`, `report`) or a one-key mapping (`{max_ulp: 1}`, `{max_abs: 1.0e-3}`).

`check(pair)` judges the pair's differences (Pair.compare) and adds what it finds itself;
`describe()` is the canonical short spelling ("bitwise", "max_ulp 1"). A tolerance that has no
meaning for a pair's kind (a ULP bound on bool values) is a failing "not-applicable" finding, never
a pass.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Annotated, Any, ClassVar, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictInt,
    Tag,
    TypeAdapter,
    field_validator,
    model_serializer,
    model_validator,
)

from harness.compare.arbiter import NOT_GIVEN
from harness.compare.findings import ExactErrorOverBound, ExactMetric, Finding, NeedsValues, NoReference, NotApplicable, WorseThan, judged
from harness.compare.pairs import DigestPair, ExactPair, FloatPair, Pair

KINDS: dict[str, type[Expectation]] = {}  # YAML key -> class, in definition order


class Expectation(BaseModel, ABC):
    model_config = ConfigDict(extra="forbid", frozen=True)
    key: ClassVar[str]  # the YAML key; a kind without fields is written as the bare word

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "key" in cls.__dict__:
            KINDS[cls.key] = cls

    @model_validator(mode="before")
    @classmethod
    def _from_word(cls, data: Any) -> Any:
        return {} if data == getattr(cls, "key", None) and not cls.model_fields else data

    @model_serializer
    def _yaml_form(self) -> str | dict:
        """Back to the YAML form, so a case dumped to JSON reads back the same."""
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        return fields or self.key

    def describe(self) -> str:
        values = (getattr(self, name) for name in type(self).model_fields)
        return " ".join([self.key, *(f"{value:g}" if isinstance(value, float) else str(value) for value in values)])

    @abstractmethod
    def check(self, pair: Pair) -> list[Finding]:
        """Every difference, judged: passed=False where the expectation does not hold."""


class Bitwise(Expectation):
    key: ClassVar[str] = "bitwise"

    def check(self, pair: Pair) -> list[Finding]:
        return judged(pair.compare(), False, self.describe())


class Report(Expectation):
    """Measure and show; never fail."""

    key: ClassVar[str] = "report"

    def check(self, pair: Pair) -> list[Finding]:
        return judged(pair.compare(), True, self.describe())


class Tolerance(Expectation):
    """A bound on float differences. Exact values have no distance; any structural difference, and any
    NaN or Inf class mismatch, exceeds every bound. Differing digests without values (a side captured in
    digest mode) cannot be measured: a failing "needs-values" finding, never a pass."""

    def check(self, pair: Pair) -> list[Finding]:
        differences = pair.compare()
        if isinstance(pair, DigestPair) and differences:
            return [Finding(pair.name, False, NeedsValues(expectation=self.describe(), sides=list(pair.digests_only)),
                            self.describe())] + judged(differences, False, self.describe())
        if isinstance(pair, ExactPair):
            return [Finding(pair.name, False, NotApplicable(expectation=self.describe(), dtype=pair.a.dtype),
                            self.describe())] + judged(differences, False, self.describe())
        holds = isinstance(pair, FloatPair) and pair.stats.nan_mismatch + pair.stats.inf_mismatch == 0 \
            and self.within(pair)
        return judged(differences, holds, self.describe())

    @abstractmethod
    def within(self, pair: FloatPair) -> bool:
        """Whether the pair's finite differences are within the bound."""


class MaxUlp(Tolerance):
    key: ClassVar[str] = "max_ulp"
    max_ulp: StrictInt = Field(ge=0)

    def within(self, pair: FloatPair) -> bool:
        return pair.stats.max_ulp <= self.max_ulp


class MaxAbs(Tolerance):
    key: ClassVar[str] = "max_abs"
    max_abs: float = Field(ge=0, allow_inf_nan=False)

    @field_validator("max_abs", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("max_abs is a number, not a boolean")  # noqa: TRY004 (pydantic wants a ValueError)
        return value

    def within(self, pair: FloatPair) -> bool:
        return math.isfinite(pair.stats.max_abs) and pair.stats.max_abs <= self.max_abs


# -- against the float64 reference (pair.exact, harness.compare.arbiter) ----------------------------------

Bound = Annotated[float, Field(ge=0, allow_inf_nan=False)]
UlpBound = Annotated[StrictInt, Field(ge=0)]


class ExactExpectation(Expectation):
    """A property of each side against the float64 reference, not of one side against the other: the
    sides' differences are reported, never judged; what fails is a side outside its bound, or a bound that
    cannot be measured ("no-reference": no reference ran, or a side kept no values)."""

    def check(self, pair: Pair) -> list[Finding]:
        return judged(pair.compare(), True, self.describe()) + self.exact_findings(pair)

    def sides_named(self) -> set[str]:
        """The case's side names this expectation names (checked against the case's sides)."""
        return set()

    def _unmeasured(self, pair: Pair, side: str | None = None) -> Finding:
        reason = pair.exact.why_unmeasured(side) if pair.exact is not None and side else \
            (pair.exact.missing if pair.exact is not None else None) or NOT_GIVEN
        return Finding(pair.name, False, NoReference(expectation=self.describe(), side=side, reason=reason), self.describe())

    @abstractmethod
    def exact_findings(self, pair: Pair) -> list[Finding]:
        """A failing finding for each side outside its bound, or that cannot be measured."""


class _PerSideBound(ExactExpectation):
    """`{key: N}`: both sides within N; `{key: {side: N, ...}}`: each named side within its own N."""

    metric: ClassVar[ExactMetric]  # the ExactError field bounded

    def bounds(self, sides: tuple[str, str]) -> dict[str, float]:
        value = getattr(self, self.key)
        return dict(value) if isinstance(value, dict) else dict.fromkeys(sides, value)

    def sides_named(self) -> set[str]:
        value = getattr(self, self.key)
        return set(value) if isinstance(value, dict) else set()

    def describe(self) -> str:
        value = getattr(self, self.key)
        if isinstance(value, dict):
            return f"{self.key} " + ", ".join(f"{side} {bound:g}" for side, bound in value.items())
        return f"{self.key} {value:g}"

    def exact_findings(self, pair: Pair) -> list[Finding]:
        exact = pair.exact
        if exact is None or exact.missing:
            return [self._unmeasured(pair)]
        findings = []
        for side, bound in self.bounds(exact.sides).items():
            error = exact.error_of(side)
            if error is None:
                findings.append(self._unmeasured(pair, side))
                continue
            measured = self.measure(error)
            if error.class_mismatch or not measured <= bound:
                findings.append(Finding(pair.name, False, ExactErrorOverBound(
                    side=side, metric=self.metric, measured=measured, bound=bound, class_mismatch=error.class_mismatch),
                    self.describe()))
        return findings

    def measure(self, error) -> float:
        return getattr(error, self.metric)


class MaxUlpToExact(_PerSideBound):
    """Elementwise results: each element at most N ULP from the correctly rounded value."""

    key: ClassVar[str] = "max_ulp_to_exact"
    metric: ClassVar[ExactMetric] = "max_ulp"
    max_ulp_to_exact: UlpBound | dict[str, UlpBound]


class NormwiseToExact(_PerSideBound):
    """Reductions and cancellations: ||side - exact||_2 / ||exact||_2 at most N units of the dtype's unit
    roundoff (where the reference is all zeros: the side is all zeros too)."""

    key: ClassVar[str] = "max_normwise_to_exact"
    metric: ClassVar[ExactMetric] = "normwise_u"
    max_normwise_to_exact: Bound | dict[str, Bound]

    def measure(self, error) -> float:
        return (0.0 if error.error_norm == 0 else math.inf) if error.normwise_absolute else error.normwise_u


class NoWorseSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    side: str
    factor: float = Field(1.0, ge=1.0, allow_inf_nan=False)


class NoWorseThan(ExactExpectation):
    """`{no_worse_than: S}` or `{no_worse_than: {side: S, factor: F}}`: the other side's normwise error
    against the reference is at most F (default 1) times side S's, and it has no more NaN/Inf mismatches."""

    key: ClassVar[str] = "no_worse_than"
    no_worse_than: str | NoWorseSpec

    @property
    def spec(self) -> NoWorseSpec:
        value = self.no_worse_than
        return value if isinstance(value, NoWorseSpec) else NoWorseSpec(side=value, factor=1.0)

    def sides_named(self) -> set[str]:
        return {self.spec.side}

    def describe(self) -> str:
        spec = self.spec
        return f"no_worse_than {spec.side}" + (f" x{spec.factor:g}" if spec.factor != 1 else "")

    def exact_findings(self, pair: Pair) -> list[Finding]:
        exact, spec = pair.exact, self.spec
        if exact is None or exact.missing:
            return [self._unmeasured(pair)]
        other = next(side for side in exact.sides if side != spec.side)
        mine, theirs = exact.error_of(other), exact.error_of(spec.side)
        if mine is None or theirs is None:
            return [self._unmeasured(pair, other if mine is None else spec.side)]
        if mine.class_mismatch <= theirs.class_mismatch and mine.normwise <= spec.factor * theirs.normwise:
            return []
        return [Finding(pair.name, False, WorseThan(
            side=other, than=spec.side, factor=spec.factor, normwise_u=mine.normwise_u,
            than_normwise_u=theirs.normwise_u, class_mismatch=mine.class_mismatch,
            than_class_mismatch=theirs.class_mismatch), self.describe())]


def sides_named(expectation: Expectation) -> set[str]:
    """The side names an expectation names (none for the kinds that compare the sides with each other)."""
    return expectation.sides_named() if isinstance(expectation, ExactExpectation | AllOf) else set()


def _kind_of(value: Any) -> str | None:
    """The class name of the kind `value` is written as (a pydantic tag), or None."""
    if isinstance(value, Expectation):
        return type(value).__name__
    if isinstance(value, str):
        kind = KINDS.get(value)
        return kind.__name__ if kind and not kind.model_fields else None
    if isinstance(value, dict) and len(value) == 1:
        kind = KINDS.get(next(iter(value)))
        return kind.__name__ if kind and kind.model_fields else None
    if isinstance(value, list):
        return AllOf.__name__
    return None


def spellings() -> list[str]:
    """How each kind is written in YAML (for the case loader's message that refuses anything else)."""
    return [key if not kind.model_fields else f"{{{key}: N}}" for key, kind in KINDS.items()] + ["[...]"]


def tag_names() -> set[str]:
    """The names pydantic puts in an error's location for the kind it validated (to leave out of field names)."""
    return {kind.__name__ for kind in KINDS.values()} | {AllOf.__name__}


def expectation_type(refusal: str) -> Any:
    """The pydantic type of a YAML expectation: one of the registered kinds, chosen by its key, or a list
    of them (AllOf); `refusal` is the error message for a value that is none of them."""
    kinds: list[type[Expectation]] = [*KINDS.values(), AllOf]
    members = tuple(Annotated[kind, Tag(kind.__name__)] for kind in kinds)
    return Annotated[Union[members], Discriminator(  # noqa: UP007 (a runtime tuple of members)
        _kind_of, custom_error_type="expectation_type", custom_error_message=refusal)]


class AllOf(Expectation):
    """A YAML list of expectations: at most one of the two sides against each other (bitwise, max_ulp,
    ...), any number against the reference. Not a kind of its own (no key)."""

    parts: tuple[Any, ...]  # each validated as one kind (expectation_type)

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, data: Any) -> Any:
        return {"parts": data} if isinstance(data, list | tuple) else data

    @model_validator(mode="after")
    def _one_pairwise(self) -> AllOf:
        if not self.parts:
            raise ValueError("an empty list of expectations")
        if not all(isinstance(part, Expectation) and not isinstance(part, AllOf) for part in self.parts):
            raise ValueError("each item of a list of expectations is one expectation")
        pairwise = [part.describe() for part in self.parts if not isinstance(part, ExactExpectation)]
        if len(pairwise) > 1:
            raise ValueError(f"at most one expectation of the sides against each other, got {', '.join(pairwise)}")
        return self

    @model_serializer
    def _yaml_form(self) -> list:  # type: ignore[override]
        return [part._yaml_form() for part in self.parts]

    def describe(self) -> str:
        return ", ".join(part.describe() for part in self.parts)

    def sides_named(self) -> set[str]:
        return set().union(*(part.sides_named() for part in self.parts if isinstance(part, ExactExpectation)))

    def check(self, pair: Pair) -> list[Finding]:
        pairwise = next((part for part in self.parts if not isinstance(part, ExactExpectation)), None)
        findings = pairwise.check(pair) if pairwise else judged(pair.compare(), True, self.describe())
        return findings + [f for part in self.parts if isinstance(part, ExactExpectation) for f in part.exact_findings(pair)]

    @field_validator("parts", mode="before")
    @classmethod
    def _each_a_kind(cls, parts: Any) -> Any:
        adapter = TypeAdapter(expectation_type(", ".join(spellings()[:-1])))
        return tuple(part if isinstance(part, Expectation) else adapter.validate_python(part) for part in parts)

