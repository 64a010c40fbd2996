"""The words of every result, in one place: findings, verdicts, tables and gate lines. The terminal, JSON and
HTML reports, the command line and the pytest plugin say what a result is through this module (plain text; each
reporter escapes for its medium). Nothing here decides a verdict. The command line's own lines (progress, files
written, errors) are harness.cli_text's."""

from __future__ import annotations

from collections.abc import Callable
from itertools import groupby
from typing import TYPE_CHECKING, Any

from harness.compare.findings import (
    GOLDEN,
    PAIR_KINDS,
    DigestDiffers,
    DtypeDiffers,
    EnvironmentChanged,
    ExactErrorOverBound,
    ExactValues,
    Finding,
    FloatValues,
    InputChanged,
    Missing,
    NeedsValues,
    NoGolden,
    Nondeterministic,
    NoReference,
    NotApplicable,
    OtherGenerator,
    Payload,
    ReplicasDiffer,
    ShapeDiffers,
    WorseThan,
)
from harness.fingerprint import label as field_label

if TYPE_CHECKING:
    from harness.compare.case import CaseComparison, SideInfo, TensorResult
    from harness.compare.origins import Origin
    from harness.compare.pairs import Pair
    from harness.compare.replay import ExactOutput, ExactReplay
    from harness.compare.step_loss import StepLoss
    from harness.compare.trajectory import StepSummary, Trajectory
    from harness.compare.tree import Divergence, RecordView, StepComparison, TreeComparison, TreeSide
    from harness.golden_policy import GoldenUpdate

STATUS_LABELS = {"pass": "PASS", "fail": "FAIL", "n/a": "N/A"}
GATE_LABELS = {True: "GATE PASS", False: "GATE FAIL"}  # by whether the gate passed
NOT_MEASURED = "-"  # a number that does not apply (no stats, an exact dtype, only NaN/Inf mismatches)
NAN_INF = "NaN/Inf"  # a worst element's distance when it is a NaN/Inf class mismatch
TABLE_COLUMNS = ("tensor", "shape", "dtype", "md5 A", "md5 B", "bitwise", "differing", "NaN/Inf", "max ULP",
                 "max abs", "exact A|B ULP/u", "closer", "expect", "holds")
HEATMAP_AXES = ("leading dims flattened", "last dim")  # where the op does not name its last two axes


def status_label(status: str) -> str:
    return STATUS_LABELS[status]


def yes_no(value: bool, no: str = "no") -> str:
    return "yes" if value else no


def hash_text(digest, short: bool = True) -> str:
    """A side's hash in the "md5" columns: its MD5 (the first 8 hex digits when `short`), or, for a tensor
    captured with hash="fast" (no MD5), "fast:" and its fast64; NOT_MEASURED for a side without the tensor."""
    if digest is None:
        return NOT_MEASURED
    if digest.md5 is not None:
        return digest.md5[:8] if short else digest.md5
    return "fast:" + (digest.fast64[:8] if short else digest.fast64)


# -- numbers of a pair ---------------------------------------------------------------------------------


def _measured(pair: Pair):
    """The pair's element stats where its distances mean something, else None."""
    values = pair.values
    return values.stats if values is not None and getattr(values, "measured", False) else None


def ulp_text(pair: Pair) -> str:
    stats = _measured(pair)
    return NOT_MEASURED if stats is None else str(stats.max_ulp)


def exact_error_text(error, compact: bool = False) -> str:
    """A side against the float64 reference: "1 ULP, 0.43u" (max ULP to the correctly rounded value, normwise
    error in units of the dtype's unit roundoff; "abs" where the reference is all zeros), compactly "1/0.43"."""
    if error is None:
        return NOT_MEASURED
    mismatched = f"+{error.class_mismatch:,}nan" if error.class_mismatch else ""
    if compact:
        normwise = f"{error.normwise:.2g}abs" if error.normwise_absolute else f"{error.normwise_u:.2g}"
        return f"{error.max_ulp:,}/{normwise}{mismatched}"
    normwise = f"{error.normwise:.3g} abs" if error.normwise_absolute else f"{error.normwise_u:.3g}u"
    return f"{error.max_ulp:,} ULP, {normwise}" + (f", {error.class_mismatch:,} NaN/Inf" if error.class_mismatch else "")


def normwise_text(error) -> str:
    """The normwise error itself (relative, or absolute where the exact values are all zeros)."""
    return f"{error.normwise:.3g}" + (" (absolute: exact is all zeros)" if error.normwise_absolute else "")


def to_exact_text(pair: Pair) -> str:
    exact = pair.exact
    if exact is None or exact.missing:
        return "n/a"
    return f"{exact_error_text(exact.a, True)} | {exact_error_text(exact.b, True)}"


def closer_text(pair: Pair) -> str:
    """Which side is closer to exact, element by element: "=" (identical), "tie", or the shares, e.g. "A 76%, B 19%"."""
    closeness = pair.exact.closeness if pair.exact is not None else None
    if closeness is None:
        return "n/a"
    if closeness.identical == closeness.elements:
        return "="
    if not closeness.a_closer and not closeness.b_closer:
        return "tie"
    shares = sorted([("A", closeness.a_closer, closeness.a_share), ("B", closeness.b_closer, closeness.b_share)],
                    key=lambda item: -item[1])
    return " ".join(f"{label} {_share(count, share)}" for label, count, share in shares if count)


def _share(count: int, share: float) -> str:
    percent = f"{share:.0%}"
    return f"{count:,}" if percent == "0%" else percent


_REASONS = {"no-values": "this side kept no values of it", "not-float": "not a float tensor (no rounding error)",
            "other-shape": "its shape is not the reference's", "not-computed": "the float64 reference computed no such tensor",
            "not-given": "no float64 reference was given"}


def reason_text(reason: str | None) -> str:
    """Why the reference measured nothing: a code of harness.compare.arbiter in words, or a reason given as text."""
    return _REASONS.get(reason or "not-given", reason or "")


def reference_text(comparison: CaseComparison) -> str:
    """The arbiter in one line: the float64 reference, or why there is none."""
    if comparison.reference is not None:
        return f"exact: the float64 reference, run eagerly on the CPU by the {comparison.reference.framework} worker"
    return f"exact: n/a ({reason_text(comparison.reference_missing)})"


def _metric_text(metric: str, value: float) -> str:
    return f"{value:,.0f} ULP" if metric == "max_ulp" else f"{value:.3g}u normwise"


def _exact_error(d: ExactErrorOverBound) -> str:
    text = f"side {d.side} is {_metric_text(d.metric, d.measured)} from exact (bound {_metric_text(d.metric, d.bound)})"
    if d.class_mismatch:
        text += f"; {d.class_mismatch:,} elements NaN/Inf where exact is not, or the reverse"
    return text


def _no_worse(d: WorseThan) -> str:
    factor = f"{d.factor:g}x " if d.factor != 1 else ""
    text = (f"side {d.side} is {d.normwise_u:.3g}u normwise from exact, more than {factor}side {d.than}'s "
            f"{d.than_normwise_u:.3g}u")
    if d.class_mismatch > d.than_class_mismatch:
        text += f"; {d.class_mismatch:,} NaN/Inf mismatches against {d.than_class_mismatch:,}"
    return text


def error_text(value: float | None, digits: int = 3) -> str:
    return NOT_MEASURED if value is None else f"{value:.{digits}g}"


def abs_text(pair: Pair, digits: int = 3) -> str:
    stats = _measured(pair)
    return error_text(None if stats is None else stats.max_abs, digits)


def rel_text(pair: Pair, digits: int = 3) -> str:
    stats = _measured(pair)
    return error_text(None if stats is None else stats.max_rel, digits)


def classes_text(pair: Pair) -> str:
    """NaN and Inf mismatches, as "NaN/Inf" counts (floats only)."""
    values = pair.values
    if values is None or not hasattr(values, "measured"):
        return NOT_MEASURED
    return f"{values.stats.nan_mismatch}/{values.stats.inf_mismatch}"


def differing_text(pair: Pair) -> str:
    return NOT_MEASURED if pair.values is None else f"{pair.values.stats.differing:,}"


def dtype_text(pair: Pair, separator: str = "/") -> str:
    if pair.a and pair.b and pair.a.dtype != pair.b.dtype:
        return f"{pair.a.dtype}{separator}{pair.b.dtype}"
    return pair.digest.dtype


def expectation_text(result: TensorResult) -> str:
    return result.expectation.describe()


def note_text(name: str, note: str) -> str:
    return f"{name} is {note}"


# -- findings ------------------------------------------------------------------------------------------


def _first(index: int | None) -> str:
    return "" if index is None else f" (first at flat index {index})"


def _float_values(d: FloatValues) -> str:
    parts = [f"{d.differing:,} of {d.elements:,} elements differ"]
    if d.measured:
        where = f" (max at flat index {d.max_ulp_flat_index})" if d.max_ulp_flat_index is not None else ""
        parts += [f"max {d.max_ulp} ULP{where}", f"max abs {d.max_abs:.3g}"]
    if d.nan_mismatch or d.inf_mismatch:
        parts.append(f"{d.nan_mismatch} NaN and {d.inf_mismatch} Inf mismatches")
    if d.signed_zero_only:
        parts.append(f"{d.signed_zero_only} differ only in the sign of zero" + _first(d.signed_zero_first_index))
    if d.nan_payload_only:
        parts.append(f"{d.nan_payload_only} differ only in NaN payload" + _first(d.nan_payload_first_index))
    return ", ".join(parts)


def distinct_prefixes(a: str, b: str, least: int = 8) -> tuple[str, str]:
    """The first `least` characters of two hashes, or more where those are equal: up to the first that differs."""
    common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return a[:max(least, common + 1)], b[:max(least, common + 1)]


def _hash_of(d: dict) -> str:
    return d["md5"] if d.get("md5") else f"fast:{d.get('fast64', '')}"


def _input_change(d: InputChanged) -> str:
    """An input's digest in the golden and now: dtype, shape, and as much of each hash as tells them apart."""
    hashes = distinct_prefixes(_hash_of(d.golden) if d.golden else "", _hash_of(d.now) if d.now else "")
    texts = [f"{j['dtype']} {j['shape']} {h}" if j is not None else "none" for j, h in zip((d.golden, d.now), hashes)]
    return f"{texts[0]} → {texts[1]}"


def _recorded(value) -> str:
    return "not recorded" if value is None else str(value)


def _stats_change(stats: dict[str, dict | None]) -> str:
    """Where both sides recorded stats of a digest-only tensor: the first that differs, e.g. "norm 3.2 vs 3.21"."""
    a, b = stats.get("a"), stats.get("b")
    if not a or not b:
        return ""
    for key in ("nan", "inf", "norm", "mean", "min", "max"):
        if a.get(key) != b.get(key):
            return f"; {key} {error_text(a.get(key), 9) if key in ('norm', 'mean', 'min', 'max') else a.get(key)} vs " \
                   f"{error_text(b.get(key), 9) if key in ('norm', 'mean', 'min', 'max') else b.get(key)}"
    return ""


def _digest_change(d: DigestDiffers) -> str:
    if not d.comparable:  # a capture with hash="fast" against one with MD5 only
        hashes = d.hashes or ["?", "?"]
        return (f"not comparable: side A recorded {_HASH_NAMES.get(hashes[0], hashes[0])}, side B "
                f"{_HASH_NAMES.get(hashes[1], hashes[1])}; capture both with the same hash "
                "(capture(..., hash=\"md5\") or hash=\"fast\" on both sides)")
    a, b = distinct_prefixes(d.a or "", d.b or "")
    change = f"{'fast hash' if d.hash == 'fast64' else 'digest'} {a} → {b}"
    if d.values:
        return change + ", yet every element is equal"
    if d.digests_only:  # a capture in digest mode
        return change + f" (side {' and '.join(d.digests_only)} recorded digests only: no values to measure ULP)" \
            + _stats_change(d.stats or {})
    return change + " (the golden holds no values to measure ULP)"


def _no_golden(d: NoGolden) -> str:
    if d.unreadable:
        return f"golden unreadable: {d.unreadable}; repair it, or rewrite it with --update"
    if d.written:
        return f"no golden yet: wrote {d.written}; this fails once: run the gate again to check against it"
    return "no golden yet, and the check policy writes none: run without it to write one"


_HASH_NAMES = {"md5": "MD5 only", "fast64": "the fast hash only (fast64)", "md5+fast64": "MD5 and the fast hash"}

# Each kind's payload (harness.compare.findings) in words; the argument is of the key's class.
_DETAILS: dict[type[Payload], Callable[[Any], str]] = {
    Missing: lambda d: f"missing on side {d.side}" + (f" ({d.reason})" if d.reason else ""),
    DtypeDiffers: lambda d: f"dtype differs: {d.a} vs {d.b}",
    ShapeDiffers: lambda d: f"shape differs: {d.a} vs {d.b}" + ("; values compared flattened" if d.flattened else ""),
    FloatValues: _float_values,
    ExactValues: lambda d: f"{d.differing:,} of {d.elements:,} elements differ",
    NotApplicable: lambda d: f"{d.expectation} does not apply to {d.dtype} values, which are equal or not (expect bitwise)",
    DigestDiffers: _digest_change,
    NeedsValues: lambda d: f"{d.expectation} needs full tensors: side {' and '.join(d.sides)} recorded "
                           "digests only (capture this module in full: compare --refetch FILE, then "
                           "capture(..., mode=\"digests-then-full\", refetch=FILE))",
    ExactErrorOverBound: _exact_error,
    WorseThan: _no_worse,
    NoReference: lambda d: f"{d.expectation} cannot be judged" + (f" for side {d.side}" if d.side else "")
                           + f": {reason_text(d.reason)}",
    InputChanged: _input_change,
    OtherGenerator: lambda d: (f"inputs made by generator {d.golden}, this run uses {d.now}: update the goldens "
                                 "(xfalign gate ... --update); the tensors were not compared with them"),
    Nondeterministic: lambda d: f"{d.distinct} different digests in {d.repeats} repeats on side {d.side} "
                                "(nondeterministic there; not a cross-framework difference)",
    ReplicasDiffer: lambda d: (f"side {d.side} ran on {d.world} ranks, and rank{'s' if len(d.ranks) > 1 else ''} "
                               f"{', '.join(map(str, d.ranks))} hold{'' if len(d.ranks) > 1 else 's'} other bits than "
                               "rank 0 of a tensor every rank must hold alike (replicated)"),
    NoGolden: _no_golden,
    EnvironmentChanged: lambda d: f"{field_label(d.field)} {_recorded(d.golden)} → {_recorded(d.now)}",
}


def detail_text(finding: Finding) -> str:
    """What was found, without whose it is: e.g. "3 of 64 elements differ, max 1 ULP, max abs 0.002"."""
    if finding.expected == GOLDEN and isinstance(finding.data, Missing):
        return "new tensor, not in the golden" if finding.data.side == "A" else "in the golden, not produced now"
    return _DETAILS[type(finding.data)](finding.data)


def _lead(finding: Finding) -> str:
    """Whose the finding is, and what it was held to, before its details."""
    if isinstance(finding.data, InputChanged):
        return f"input {finding.tensor}: "
    drifted = finding.expected == GOLDEN and not isinstance(finding.data, Missing)
    if drifted:
        return f"{finding.tensor}: drifted from the golden: "
    if finding.expected not in (None, GOLDEN) and not finding.passed:
        return f"{finding.tensor}: expected {finding.expected}, but "
    return f"{finding.tensor}: " if finding.tensor else ""


def finding_text(finding: Finding) -> str:
    """One finding in one line, with whose it is and what it was held to."""
    return _lead(finding) + detail_text(finding)


def _grouped(findings: list[Finding]) -> list[list[Finding]]:
    """A tensor's findings under one judgement together (e.g. its shape and its values); others alone."""
    def key(finding: Finding):
        return (finding.tensor, finding.expected, finding.passed) if finding.kind in PAIR_KINDS else id(finding)

    return [list(group) for _, group in groupby(findings, key=key)]


def _line(group: list[Finding]) -> str:
    return _lead(group[0]) + "; ".join(detail_text(f) for f in group)


def findings_lines(findings: list[Finding]) -> list[str]:
    """One line per tensor and judgement, one per other finding."""
    return [_line(group) for group in _grouped(findings)]


def _gate_label(finding: Finding) -> str:
    if finding.expected == GOLDEN:
        return "drift"
    return "expectation" if finding.expected is not None else finding.kind


def gate_lines(findings: list[Finding]) -> list[str]:
    """As findings_lines, each after its kind in brackets: [expectation], [drift], [input], ..."""
    return [f"[{_gate_label(group[0])}] {_line(group)}" for group in _grouped(findings)]


def environment_change_text(finding: Finding) -> str:
    """One changed fingerprint field: `side: field golden → now`."""
    return f"{finding.tensor}: {detail_text(finding)}"


# -- cases ---------------------------------------------------------------------------------------------


def not_available_text(reason: str) -> str:
    return f"not available here: {reason}"


def unavailable_text(comparison: CaseComparison) -> str | None:
    """Why nothing was compared (a side could not run here), or None."""
    if not comparison.unavailable:
        return None
    return "; ".join(f"side {side!r}: {reason}" for side, reason in comparison.unavailable.items())


def summary_text(comparison: CaseComparison) -> str:
    if comparison.status == "n/a":
        return not_available_text(unavailable_text(comparison) or "")
    bitwise = sum(result.pair.bitwise for result in comparison.tensors)
    return f"{len(comparison.tensors)} tensors, {bitwise} bitwise equal"


def verdict_text(comparison: CaseComparison) -> str:
    """The case's verdict after its label, e.g. "case: 3 tensors, 3 bitwise equal; every expectation holds"."""
    summary = f"{comparison.case_name}: {summary_text(comparison)}"
    if comparison.status == "pass":
        return f"{summary}; every expectation holds"
    if comparison.status == "fail":
        failures = [finding for result in comparison.failing for finding in result.failures]
        return f"{summary}; " + "; ".join(findings_lines(failures))
    return summary


def side_text(label: str, side: SideInfo) -> str:
    """A side in one line: what ran, where, and the versions its framework adapter named."""
    mode = f" ({side.mode})" if side.mode else ""
    device = side.environment.get("device_name") or side.environment.get("device")
    where = f" on {device}" if device else ""  # a side that could not run records no environment
    versions = side.versions
    return f"{label} {side.name}: {side.impl}{mode}{where}" + (f"; {versions}" if versions else "")


def nondeterministic_text(side: str, tensor: str, distinct: int) -> str:
    return f"{tensor} is nondeterministic on side {side}: {distinct} different digests over the repeats"


def side_dumped_text(case_name: str, side: str, tensors: int, path) -> str:
    return f"{case_name}: side {side} dumped {tensors} tensors to {path}"


def side_unavailable_text(case_name: str, side: str, reason: str) -> str:
    return f"N/A {case_name}: side {side} is {not_available_text(reason)}"


def index_title(statuses: list[str]) -> str:
    """Heading of a report over several cases."""
    title = f"{statuses.count('pass')} of {len(statuses)} cases pass"
    if statuses.count("n/a"):
        title += f", {statuses.count('n/a')} N/A"
    return title


# -- capture trees -------------------------------------------------------------------------------------

TREE_COLUMNS = ("module", "call", "phase", "tensor", "shape", "dtype", "md5 A", "md5 B", "bitwise", "max ULP",
                "max abs", "expect", "holds")
PHASE_LABELS = {"params": "params (start)", "forward": "forward", "loss": "loss", "backward": "backward",
                "grads": "grads (end)", "optimizer": "optimizer (step)", "": "-"}
ORIGIN_LABEL = "origin"  # a differing tensor its own module made (harness.compare.origins)
INHERITED_LABEL = "inherited"
ORIGIN_RULES = {"inputs": "its inputs and parameters are bitwise equal",
                "backward": "the module's inputs, outputs, parameters and the gradients arriving at its outputs are "
                            "bitwise equal",
                "first": "nothing recorded earlier in the step differs"}
MAX_ORIGIN_NAMES = 5  # origins named in a step's summary line (every one is marked in the table, JSON and HTML)
def tree_side_text(label: str, side: TreeSide) -> str:
    """A capture tree in one line: `A megatron (megatron): MLP, 3 steps, mode digest, at dumps/megatron`."""
    ranks = f", ranks {', '.join(map(str, side.ranks))}" if side.ranks else ""
    steps = f"{side.steps} step" + ("" if side.steps == 1 else "s")
    return f"{label} {side.side} ({side.framework}): {side.root}, {steps}{ranks}, mode {side.mode}, at {side.path}"


def map_text(path: str | None) -> str:
    return f"map: {path}" if path else "map: none (tensor names compared as they are)"


def record_text(view: RecordView) -> str:
    """A record's heading: `decoder.mlp#0 forward (MLP)`."""
    call = "" if view.call is None else f"#{view.call}"
    kind = f" ({view.type})" if view.type else ""
    return f"{view.module}{call} {PHASE_LABELS.get(view.phase, view.phase)}{kind}"


def call_text(call: int | None) -> str:
    return NOT_MEASURED if call is None else str(call)


def phase_text(phase: str) -> str:
    return PHASE_LABELS.get(phase, phase)


def slot_text(name: str, module: str) -> str:
    """A tensor's name without its module (shown beside it): `#0:output.0` -> `output.0`."""
    if name.startswith(module):
        rest = name[len(module):]
        return rest.split(":", 1)[1] if ":" in rest else rest
    return name


def divergence_text(divergence: Divergence | None, uncompared: int = 0) -> str:
    if divergence is None and uncompared:
        return (f"no divergence among the tensors compared; {uncompared} could not be compared from digests "
                "(the map changes their layout): capture those modules in full (compare --refetch lists them)")
    if divergence is None:
        return "every tensor is bitwise equal"
    kind = f" ({divergence.module_type})" if divergence.module_type else ""
    return (f"first divergent tensor: {divergence.name} in {divergence.step}, module {divergence.module}{kind}, "
            f"{phase_text(divergence.phase)}")


def origin_label_text(origin: Origin) -> str:
    """`origin (Linear)`: a tensor its module made (the HTML report's badge)."""
    return ORIGIN_LABEL + (f" ({origin.module_type})" if origin.module_type else "")


def tensor_mark_text(first_divergent: bool, origin: Origin | None) -> str:
    """After a tensor's name in a table: ` <- first divergent, origin (Linear)`, either, or ""."""
    marks = ["first divergent"] if first_divergent else []
    if origin is not None and origin.origin:
        marks.append(origin_label_text(origin))
    return f" <- {', '.join(marks)}" if marks else ""


def origin_text(name: str, origin: Origin) -> str:
    """Why a tensor is an origin: `act#0:output.0 (GELU, forward): its inputs and parameters are bitwise equal`."""
    kind = f"{origin.module_type}, " if origin.module_type else ""
    return f"{name} ({kind}{phase_text(origin.phase)}): {ORIGIN_RULES.get(origin.rule, origin.rule)}"


def origins_text(step: StepComparison) -> str | None:
    """A step's differing tensors, classed: which modules made a difference, how many only hand one on; None
    where nothing differs."""
    if not step.origins:
        return None
    made = [name for name, origin in step.origins.items() if origin.origin]
    count = step.inherited
    inherited = (f"{count} differing tensor{'' if count == 1 else 's'} {INHERITED_LABEL} (handed on from an origin, "
                 "or from the step's parameters or inputs)")
    if not made:
        return f"no module made a difference in {step.label}: {inherited}"
    named = "; ".join(origin_text(name, step.origins[name]) for name in made[:MAX_ORIGIN_NAMES])
    more = f" and {len(made) - MAX_ORIGIN_NAMES} more" if len(made) > MAX_ORIGIN_NAMES else ""
    return f"{len(made)} {ORIGIN_LABEL}{'' if len(made) == 1 else 's'} in {step.label}: {named}{more}; {inherited}"


def step_summary_text(step: StepComparison) -> str:
    tensors = step.comparison.tensors
    bitwise = sum(result.pair.bitwise for result in tensors)
    records = len(step.records)
    return f"{step.label}: {len(tensors)} tensors in {records} records, {bitwise} bitwise equal"


TRAJECTORY_COLUMNS = ("step", "loss A", "loss B", "differing", "kind", "first divergent tensor (phase)")
KIND_LABELS = {"equal": "equal", "input-differs": "input differs", "diverges": "diverges", "inherits": "inherits"}


def loss_text(loss: StepLoss | None) -> str:
    """A step's loss and its hash: `2.3025851 3f1c9a0e` (`fast:` and the fast64 where no MD5 was recorded)."""
    if loss is None:
        return NOT_MEASURED
    return hash_text(loss.digest) if loss.value is None else f"{loss.value:.8g} {hash_text(loss.digest)}"


def kind_text(step: StepSummary, trajectory: Trajectory) -> str:
    """`inherits step-00003` (the step where its divergence began), `diverges`, ..."""
    if step.inherits_from is not None:
        return f"inherits {trajectory.steps[step.inherits_from].label}"
    return KIND_LABELS[step.kind]


def step_divergence_text(step: StepSummary) -> str:
    divergence = step.divergence
    return NOT_MEASURED if divergence is None else f"{divergence.name} ({phase_text(divergence.phase)})"


def differing_count_text(step: StepSummary) -> str:
    return f"{step.differing}/{step.compared}"


def step_title_text(step: StepSummary, trajectory: Trajectory) -> str:
    """A step in one line (the HTML strip's titles): `step-00003: loss A 2.3025851 3f1c9a0e | B ...; 4/40 differ;
    diverges`."""
    return (f"{step.label}: loss A {loss_text(step.loss_a)} | B {loss_text(step.loss_b)}; "
            f"{differing_count_text(step)} differ; {kind_text(step, trajectory)}")


def trajectory_text(trajectory: Trajectory) -> str:
    """The trajectory in one line: where it first diverges, and which steps only inherit that."""
    first = trajectory.first_divergent
    count = len(trajectory.steps)
    if first is None:
        return f"none of the {count} steps differs"
    inheriting = [step.label for step in trajectory.steps if step.inherits_from == first.index]
    text = f"first divergent step: {first.label} ({KIND_LABELS[first.kind]}) of {count}"
    if first.divergence is not None:
        text += f", at {first.divergence.name} ({phase_text(first.divergence.phase)})"
    if inheriting:
        text += f"; {_steps_span(inheriting)} only inherit{'s' if len(inheriting) == 1 else ''} it"
    return text


def _steps_span(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else f"{len(labels)} steps ({labels[0]} .. {labels[-1]})"


def all_steps_hint_text() -> str:
    return "tables of every step: xfalign compare A B --steps all"


def tree_verdict_text(tree: TreeComparison) -> str:
    """The trees' verdict after its label: steps compared, how many pass, the first divergence."""
    passing = sum(step.status == "pass" for step in tree.steps)
    summary = f"{tree.a.side} vs {tree.b.side}: {len(tree.steps)} step{'' if len(tree.steps) == 1 else 's'} compared, {passing} pass"
    if tree.findings:
        summary += "; " + "; ".join(findings_lines(tree.findings))
    return summary


def tree_title(tree: TreeComparison) -> str:
    return f"{tree.a.side} vs {tree.b.side}"


def details_left_out_text(count: int) -> str:
    return f"{count} more differing tensors have no detail section here (every tensor is in the table and the JSON)"


def more_lines_text(count: int) -> str:
    return f"... and {count} more (every tensor is in the JSON and HTML reports)"


def tree_gate_pass_text(label: str) -> str:
    return f"{label}: digests match the golden"


def first_drift_text(tensor: str, module: str | None) -> str:
    where = f" (module {module})" if module else ""
    return f"first drifting tensor: {tensor}{where}"


# -- the gate ------------------------------------------------------------------------------------------


def gate_pass_text(case_name: str) -> str:
    return f"{case_name}: expectations hold, digests match the golden"


def environment_changed_text(changes: list[Finding]) -> str:
    """The fingerprint fields that changed since the golden (GateResult.environment_changes)."""
    return "environment changed since the golden: " + "; ".join(environment_change_text(f) for f in changes)


CODE_CHANGED = "environment fingerprint unchanged since the golden: the code changed"
INPUTS_CHANGED = ("the inputs differ from the golden's: the golden belongs to another case (or this case's seed, "
                  "shapes or dtypes changed), so its tensors differ too; check the golden's `case:`, or rewrite it "
                  "with --update")


def update_text(update: GoldenUpdate) -> str:
    """What a golden update did: `created`, `updated: paddle/out, input x, ...`, `unchanged`."""
    if update.created:
        return "created"
    changed = [*update.tensors, *(f"input {name}" for name in update.inputs),
               *(environment_change_text(finding) for finding in update.environment)]
    return "updated: " + ", ".join(changed) if changed else "unchanged"


def obtained_text(case_name: str, path) -> str:
    """A golden drifted and was left as it is: what the run produced is beside it, to diff."""
    return f"golden {case_name}: drifted; this run's digests are in {path} (diff it with the golden)"


def unused_golden_text(path) -> str:
    """`--warn-unused`: a golden in the baseline folder that no case (or step) of this run produced."""
    return f"unused golden: {path}: no case of this run produces it"


def golden_written_text(case_name: str, update: GoldenUpdate, folder, fails: bool) -> str:
    """The pytest plugin wrote a golden: missing (the item fails once), or rewritten by force-regen/regen-all."""
    tail = "; this test fails once: run it again to check against it" if fails else ""
    return f"golden {case_name}: {update_text(update)} in {folder}{tail}"


def golden_update_text(case_name: str, update: GoldenUpdate, path) -> str:
    """The gate wrote a golden (the command line, a tree's step): what it changed, and where."""
    return f"golden {case_name}: {update_text(update)} (wrote {path})"


def warning_line(text: str) -> str:
    """A warning of the command line or the pytest plugin (e.g. an unused golden)."""
    return f"xfalign: warning: {text}"


# -- float64 replay (harness.capture.replay_exact) -----------------------------------------------------


def exact_replay_text(exact: ExactReplay) -> str:
    """The float64 replay's heading: whose float64 output is exact, or why there is none."""
    if exact.missing:
        return f"float64 replay of {exact.module_a}: n/a ({exact.missing})"
    others = "".join(f"; side {side}'s float64 copy n/a: {why}" for side, why in exact.not_run.items())
    return f"float64 replay of {exact.module_a} on {', '.join(exact.modules_b)}: exact = side {exact.reference}'s module in float64{others}"


def exact_output_text(output: ExactOutput, reference: str | None) -> str:
    """One output against exact: `(root)#0:output.0: to exact A 3 ULP, 0.52u | B 1 ULP, 0.31u; elements closer
    B 61% A 20%; B is closer (normwise); float64 copies agree (1.5e-05u)`."""
    exact = output.exact
    errors = f"to exact A {exact_error_text(exact.a)} | B {exact_error_text(exact.b)}"
    if output.closer is None:
        unmeasured = "; ".join(f"side {side}: {reason_text(exact.why_unmeasured(side))}" for side, error in zip("AB", (exact.a, exact.b))
                               if error is None)
        return f"{output.name}: {errors}; closer n/a ({unmeasured})"
    closeness = exact.closeness
    elements = "identical" if closeness and closeness.identical == closeness.elements else f"elements closer {closer_text(output.pair)}"
    closer = "tie" if output.closer == "tie" else f"{output.closer} is closer"
    return f"{output.name}: {errors}; {elements}; {closer} (normwise){_spread_text(output, reference)}"


def _spread_text(output: ExactOutput, reference: str | None) -> str:
    if output.spread is None:
        return f"; float64 copies not compared ({output.spread_missing})" if output.spread_missing else ""
    if output.agree:
        return f"; float64 copies agree ({output.spread_u:.2g}u)"
    return (f"; the float64 copies differ by {output.spread_u:.3g}u (different functions, or a copy that rounds inside): "
            f"closer is against side {reference}'s")


def exact_replay_lines(exact: ExactReplay) -> list[str]:
    """The heading, then one line per output (none when N/A), as a replay's terminal output shows them."""
    if exact.missing:
        return [exact_replay_text(exact)]
    if not exact.outputs:
        return [exact_replay_text(exact) + "; no output of A has a counterpart in B to measure"]
    return [exact_replay_text(exact)] + ["    " + exact_output_text(output, exact.reference) for output in exact.outputs]
