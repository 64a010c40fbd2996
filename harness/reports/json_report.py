"""The full comparison as JSON: strict (no Infinity/NaN literals: non-finite floats are the strings
"inf", "-inf", "nan"), versioned, and one shape for one case or many:
{"format": "xfalign-report/2", "cases": [...]}. Each tensor carries its findings as data, each with
its words from reports/text.py. Its JSON Schema ships in the package: report.schema.json beside this module,
made from the models of harness.reports.json_schema.

/2 (from /1): per tensor, "pair" (its kind) and "findings" as objects; "exact" is gone (pair says it);
per case, "unavailable" (side -> reason) beside "reason".

Two capture trees (`xfalign compare TREE_A TREE_B`) write the same shape, one case per step (named by its
step folder), plus a top-level "tree" section: both trees, the map, the verdict, the steps or ranks one
tree lacks, the first divergent tensor with its module, and per step A's records in the table's order
(forward, loss, backward, parameters, gradients, the optimizer step), each naming its tensors (their details
are in "cases"); and "trajectory": the first divergent step and, per step (the ranks of a step together),
both losses, the tensors that differ, its kind (harness.compare.trajectory) and its first divergent tensor.
An addition: readers of /2 that do not know "tree" read the cases as before. A tensor whose side kept
only digests has "pair": "DigestPair" and "stats": null.
Another addition: per tree step "origins" (each differing tensor compared on both sides: whether its module made
the difference, harness.compare.origins, and why), "inherited" (how many only hand one on) and "origins_text".
Another addition: per case "reference" (the float64 reference that arbitrates, as a side) and
"reference_missing" (why there is none, else null); per tensor "to_exact": each side's error against it
(harness.compare.exact.ExactError: max/mean ULP to the correctly rounded value, histogram, normwise error and
in units of the dtype's unit roundoff), "closeness" (elements where A, B is closer, ties) and "missing".
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from harness.compare.case import CaseComparison, TensorResult
from harness.compare.pairs import FloatPair
from harness.compare.step_loss import StepLoss
from harness.compare.trajectory import Trajectory, trajectory_of
from harness.compare.tree import Divergence, TreeComparison
from harness.reports.text import (
    closer_text,
    divergence_text,
    expectation_text,
    finding_text,
    loss_text,
    origin_text,
    origins_text,
    record_text,
    step_title_text,
    trajectory_text,
    tree_verdict_text,
    unavailable_text,
    verdict_text,
)
from harness.store.atomic import write_text_atomic

FORMAT = "xfalign-report/2"
# Numbers that do not apply to a pair are null: ULP on integer/bool tensors, and distances when every
# difference is a NaN/Inf class mismatch (their counts are nan_mismatch and inf_mismatch).
_ULP_KEYS = ("max_ulp", "max_ulp_flat_index", "ulp_histogram")
_ERROR_KEYS = ("max_abs", "max_abs_flat_index", "max_rel", "max_rel_flat_index")


def finite_or_text(value):
    """JSON has no inf or NaN: non-finite floats become "inf", "-inf", "nan" (recursively)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {key: finite_or_text(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_text(item) for item in value]
    return value


def _stats(result: TensorResult) -> dict | None:
    values = result.pair.values
    if values is None:
        return None
    s = values.stats
    stats = dataclasses.asdict(s) | {"bitwise_equal": s.bitwise_equal, "canonical_equal": s.canonical_equal}
    if not isinstance(values, FloatPair):
        return stats | dict.fromkeys(_ERROR_KEYS + _ULP_KEYS)
    return stats if values.measured else stats | dict.fromkeys(_ERROR_KEYS + _ULP_KEYS[:2])


def _tensor(result: TensorResult) -> dict:
    pair = result.pair
    return {
        "name": pair.name,
        "pair": type(pair).__name__,
        "expectation": expectation_text(result),
        "holds": result.holds,
        "bitwise": pair.bitwise,
        "a": pair.a and pair.a.to_json(),
        "b": pair.b and pair.b.to_json(),
        "findings": [finding.to_json() | {"text": finding_text(finding)} for finding in result.findings],
        "note": pair.note,
        "axes": pair.axes,
        "stats": _stats(result),
        "to_exact": pair.exact.to_json() if pair.exact is not None else None,
        "closer": closer_text(pair),
    }


def comparison_json(comparison: CaseComparison) -> dict:
    first = comparison.first_divergent
    return {
        "case": comparison.case_name,
        "status": comparison.status,  # "pass" | "fail" | "n/a"
        "passed": comparison.status == "pass",
        "reason": unavailable_text(comparison),  # why it is N/A, else null
        "unavailable": comparison.unavailable,
        "verdict": verdict_text(comparison),
        "first_divergent": first and first.name,
        "sides": {"a": dataclasses.asdict(comparison.a), "b": dataclasses.asdict(comparison.b)},
        "reference": comparison.reference and dataclasses.asdict(comparison.reference),
        "reference_missing": comparison.reference_missing,
        "inputs": {name: d.to_json() for name, d in comparison.inputs.items()},
        "tensors": [_tensor(result) for result in comparison.tensors],
    }


def write_json(comparisons: list[CaseComparison], path: str | Path) -> Path:
    data = {"format": FORMAT, "cases": [comparison_json(c) for c in comparisons]}
    return write_text_atomic(path, json.dumps(finite_or_text(data), indent=1, allow_nan=False) + "\n")


def _divergence(divergence: Divergence | None) -> dict | None:
    if divergence is None:
        return None
    return {"step": divergence.step, "tensor": divergence.name, "module": divergence.module,
            "module_type": divergence.module_type, "phase": divergence.phase, "text": divergence_text(divergence)}


def _loss(loss: StepLoss | None) -> dict | None:
    if loss is None:
        return None
    return {"tensor": loss.tensor, "value": loss.value, "digest": loss.digest.to_json(), "text": loss_text(loss)}


def trajectory_json(trajectory: Trajectory) -> dict:
    first = trajectory.first_divergent
    return {
        "first_divergent_step": first and first.index,
        "text": trajectory_text(trajectory),
        "steps": [{
            "index": step.index,
            "step": step.label,
            "cases": [member.label for member in step.steps],
            "loss": {"a": _loss(step.loss_a), "b": _loss(step.loss_b)},
            "differing": step.differing,
            "compared": step.compared,
            "kind": step.kind,
            "inherits_from": step.inherits_from,
            "first_divergent": _divergence(step.divergence),
            "text": step_title_text(step, trajectory),
        } for step in trajectory.steps],
    }


def tree_json(tree: TreeComparison) -> dict:
    return {
        "a": dataclasses.asdict(tree.a),
        "b": dataclasses.asdict(tree.b),
        "map": tree.map,
        "status": tree.status,
        "passed": tree.passed,
        "verdict": tree_verdict_text(tree),
        "findings": [finding.to_json() | {"text": finding_text(finding)} for finding in tree.findings],
        "first_divergent": _divergence(tree.divergence),
        "uncompared": {step.label: step.left_out for step in tree.steps if step.left_out},  # tensor -> why
        "trajectory": trajectory_json(trajectory_of(tree.steps)),
        "steps": [{
            "step": step.label,
            "status": step.status,
            "root": step.root,
            "first_divergent": _divergence(step.divergence),
            "modules": [module.model_dump(mode="json") for module in step.modules],
            "records": [{"module": view.module, "type": view.type, "call": view.call, "phase": view.phase,
                         "title": record_text(view), "bitwise": view.bitwise, "holds": view.holds,
                         "tensors": [result.name for result in view.tensors]} for view in step.records],
            "origins": [{"tensor": name, "origin": origin.origin, "module": origin.module,
                         "module_type": origin.module_type, "phase": origin.phase, "rule": origin.rule or None,
                         "text": origin_text(name, origin) if origin.origin else None}
                        for name, origin in step.origins.items()],
            "inherited": step.inherited,
            "origins_text": origins_text(step),
        } for step in tree.steps],
    }


def write_tree_json(tree: TreeComparison, path: str | Path) -> Path:
    data = {"format": FORMAT, "cases": [comparison_json(c) for c in tree.comparisons], "tree": tree_json(tree)}
    return write_text_atomic(path, json.dumps(finite_or_text(data), indent=1, allow_nan=False) + "\n")
