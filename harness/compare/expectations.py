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
    field_validator,
    model_serializer,
    model_validator,
)

from harness.compare.findings import Finding, judged
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
        return {} if data == cls.key and not cls.model_fields else data

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
            return [Finding("needs-values", pair.name, False,
                            {"expectation": self.describe(), "sides": list(pair.digests_only)},
                            self.describe())] + judged(differences, False, self.describe())
        if isinstance(pair, ExactPair):
            return [Finding("not-applicable", pair.name, False, {"expectation": self.describe(), "dtype": pair.a.dtype},
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
    return None


def spellings() -> list[str]:
    """How each kind is written in YAML (for the case loader's message that refuses anything else)."""
    return [key if not kind.model_fields else f"{{{key}: N}}" for key, kind in KINDS.items()]


def tag_names() -> set[str]:
    """The names pydantic puts in an error's location for the kind it validated (to leave out of field names)."""
    return {kind.__name__ for kind in KINDS.values()}


def expectation_type(refusal: str) -> Any:
    """The pydantic type of a YAML expectation: one of the registered kinds, chosen by its key;
    `refusal` is the error message for a value that is none of them."""
    members = tuple(Annotated[kind, Tag(kind.__name__)] for kind in KINDS.values())
    return Annotated[Union[members], Discriminator(  # noqa: UP007 (a runtime tuple of members)
        _kind_of, custom_error_type="expectation_type", custom_error_message=refusal)]
