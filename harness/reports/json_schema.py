"""The JSON report's shape (harness.reports.json_report) as pydantic models, and its JSON Schema, shipped in the
package as report.schema.json (`python -m harness.reports.json_schema` writes it again after a change here;
tests/test_report_schema.py checks that the file is what these models make, and real reports against it).

The models describe the report; the writer builds plain dicts (no validation of every tensor on the way out).
Every float may be written as "inf", "-inf" or "nan" (json_report.finite_or_text): the schema says so of each.
A finding's `data` is its kind's payload (harness.compare.findings), with the fields its producer gave.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NotRequired, TypeAlias, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, create_model
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import core_schema
from typing_extensions import TypedDict

from harness.compare.findings import PAYLOADS
from harness.compare.trajectory import Kind
from harness.reports.json_report import FORMAT
from harness.store.tree_format import ModuleInfo

SCHEMA_PATH = Path(__file__).with_name("report.schema.json")
NON_FINITE = ("inf", "-inf", "nan")


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Digest(TypedDict):
    """A tensor's digest (harness.store.digest.Digest.to_json): its MD5, or its fast64 only, or both."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]
    dtype: str
    shape: list[int]
    md5: NotRequired[str]
    fast64: NotRequired[str]


class Side(_Entry):
    """A side that ran (or could not: `provenance` "-", no environment), or the float64 reference."""

    name: str
    framework: str
    impl: str
    mode: str | None
    provenance: str
    environment: dict[str, Any]  # the fingerprint: field -> value
    nondeterministic: dict[str, int]  # tensor -> distinct digests over the repeats


class Sides(_Entry):
    a: Side
    b: Side


def _finding(kind: str, payload: type) -> type[BaseModel]:
    """A finding of one kind (harness.compare.findings.Finding.to_json), with its words (`text`)."""
    tag: Any = Literal[kind]  # a literal made at run time
    return create_model(f"{payload.__name__}Finding", __base__=_Entry,
                        kind=(tag, ...), tensor=(str, ...), passed=(bool, ...), data=(payload, ...),
                        expected=(str | None, ...), text=(str, ...))


# One finding of each kind, told apart by "kind" (its payload's tag): made from PAYLOADS when imported, so the
# type checker sees a model.
if TYPE_CHECKING:
    Finding: TypeAlias = BaseModel
else:
    Finding = Annotated[Union[tuple(_finding(kind, payload) for kind, payload in PAYLOADS.items())],  # noqa: UP007
                        Field(discriminator="kind")]


class Worst(_Entry):
    flat_index: int
    ulp: int | None  # None: a NaN/Inf class mismatch
    a_bits: int
    b_bits: int


class Stats(_Entry):
    """The element-by-element comparison (harness.compare.metrics.ElementStats); distances are null where
    they do not apply (an integer or bool tensor; every difference a NaN/Inf class mismatch)."""

    elements: int
    differing: int
    signed_zero_only: int
    nan_payload_only: int
    nan_mismatch: int
    inf_mismatch: int
    max_ulp: int | None
    max_ulp_flat_index: int | None
    ulp_histogram: dict[str, int] | None
    max_abs: float | None
    max_abs_flat_index: int | None
    max_rel: float | None
    max_rel_flat_index: int | None
    worst: list[Worst]
    signed_zero_first_index: int | None
    nan_payload_first_index: int | None
    bitwise_equal: bool
    canonical_equal: bool


class ExactError(_Entry):
    """A side against the float64 reference (harness.compare.exact.ExactError)."""

    dtype: str
    elements: int
    finite: int
    nonfinite_agree: int
    class_mismatch: int
    max_ulp: int
    max_ulp_flat_index: int | None
    mean_ulp: float
    ulp_histogram: dict[str, int]
    unit_roundoff: float
    error_norm: float
    exact_norm: float
    normwise: float
    normwise_u: float
    normwise_absolute: bool


class Closeness(_Entry):
    elements: int
    a_closer: int
    b_closer: int
    ties: int
    identical: int
    a_share: float
    b_share: float
    tie_share: float


class ToExact(_Entry):
    """Both sides against the float64 reference (harness.compare.arbiter.ExactComparison)."""

    sides: list[str]
    missing: str | None  # why nothing was measured
    a: ExactError | None
    b: ExactError | None
    closeness: Closeness | None
    unmeasured: list[str | None]  # per side, why it was not measured


class Tensor(_Entry):
    name: str
    pair: Literal["FloatPair", "ExactPair", "OneSidedPair", "DigestPair", "MismatchedPair"]
    expectation: str
    holds: bool
    bitwise: bool
    a: Digest | None  # None: side A did not produce it
    b: Digest | None
    findings: list[Finding]
    note: str | None
    axes: list[str] | None
    stats: Stats | None  # None: no values compared (one side, or digests only)
    to_exact: ToExact | None
    closer: str


class Case(_Entry):
    case: str
    status: Literal["pass", "fail", "n/a"]
    passed: bool
    reason: str | None  # why it is N/A
    unavailable: dict[str, str]  # side -> why it could not run here
    verdict: str
    first_divergent: str | None
    sides: Sides
    reference: Side | None
    reference_missing: str | None
    inputs: dict[str, Digest]
    tensors: list[Tensor]


class TreeSide(_Entry):
    path: str
    side: str
    framework: str
    root: str
    mode: str
    steps: int
    ranks: list[int]


class Divergence(_Entry):
    step: str
    tensor: str
    module: str
    module_type: str | None
    phase: str
    text: str


class Record(_Entry):
    module: str
    type: str | None
    call: int | None
    phase: str
    title: str
    bitwise: bool
    holds: bool
    tensors: list[str]  # their details are in the step's case


class TensorOrigin(_Entry):
    """A differing tensor of a step, classed (harness.compare.origins): made by its module, or inherited."""

    tensor: str
    origin: bool
    module: str
    module_type: str | None
    phase: str
    rule: Literal["inputs", "backward", "first"] | None  # why it is an origin; null when inherited
    text: str | None  # the origin in words; null when inherited


class Step(_Entry):
    step: str
    status: Literal["pass", "fail", "n/a"]
    root: str
    first_divergent: Divergence | None
    modules: list[ModuleInfo]
    records: list[Record]
    origins: list[TensorOrigin]
    inherited: int  # differing tensors that only hand on an earlier difference
    origins_text: str | None  # null when nothing differs


class StepLoss(_Entry):
    """A step's loss as one side recorded it: `(train):loss.0`, else a 0-d `(root)#0:output.0`."""

    tensor: str
    value: float | None  # null: not known (a golden's digest; a digest-only infinity, whose sign is not kept)
    digest: Digest
    text: str


class StepLosses(_Entry):
    a: StepLoss | None
    b: StepLoss | None


class TrajectoryStep(_Entry):
    """One step of the trajectory (the ranks of a step together: `cases` names each one's case)."""

    index: int
    step: str
    cases: list[str]
    loss: StepLosses
    differing: int
    compared: int
    kind: Kind
    inherits_from: int | None  # for "inherits": the index of the step where its divergence began
    first_divergent: Divergence | None
    text: str


class Trajectory(_Entry):
    first_divergent_step: int | None  # the index of the first step that differs
    text: str
    steps: list[TrajectoryStep]


class Tree(_Entry):
    """Two capture trees compared (or a tree against its goldens: side A is the goldens)."""

    a: TreeSide
    b: TreeSide
    map: str | None
    status: Literal["pass", "fail"]
    passed: bool
    verdict: str
    findings: list[Finding]  # steps or ranks one tree lacks, goldens missing
    first_divergent: Divergence | None
    uncompared: dict[str, dict[str, str]]  # step -> tensor -> why it could not be compared
    trajectory: Trajectory
    steps: list[Step]


class Report(_Entry):
    """An xfalign JSON report: one case per case compared (per step, for capture trees)."""

    format: Literal[FORMAT]  # type: ignore[valid-type]
    cases: list[Case]
    tree: Tree | None = None  # only in a report of capture trees


class _NonFiniteAsText(GenerateJsonSchema):
    """Every float as JSON has it: a number, or one of NON_FINITE."""

    def float_schema(self, schema: core_schema.FloatSchema) -> dict[str, Any]:
        return {"anyOf": [super().float_schema(schema), {"enum": list(NON_FINITE)}]}


def report_schema() -> dict:
    schema = TypeAdapter(Report).json_schema(schema_generator=_NonFiniteAsText)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def schema_text() -> str:
    return json.dumps(report_schema(), indent=1) + "\n"


if __name__ == "__main__":
    SCHEMA_PATH.write_text(schema_text())
    print(SCHEMA_PATH)
