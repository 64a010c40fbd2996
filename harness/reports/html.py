"""Self-contained HTML report (inline CSS, JS and SVG; no network), made from Jinja2 templates."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

import numpy as np
from jinja2 import Environment, PackageLoader

from harness.compare.case import CaseComparison, SideInfo, TensorResult
from harness.compare.findings import STRUCTURAL
from harness.compare.metrics import ULP_BUCKETS
from harness.compare.pairs import FloatPair
from harness.compare.trajectory import KINDS, Trajectory, trajectory_of
from harness.compare.tree import StepComparison, TreeComparison
from harness.dtypes import to_numpy_dtype
from harness.errors import safe_name, shortened
from harness.fingerprint import RETIRED
from harness.reports.text import (
    HEATMAP_AXES,
    KIND_LABELS,
    NAN_INF,
    NOT_MEASURED,
    TREE_COLUMNS,
    abs_text,
    call_text,
    classes_text,
    closer_text,
    details_left_out_text,
    divergence_text,
    dtype_text,
    expectation_text,
    findings_lines,
    hash_text,
    index_title,
    map_text,
    nondeterministic_text,
    normwise_text,
    note_text,
    origin_label_text,
    origin_text,
    origins_text,
    phase_text,
    reason_text,
    reference_text,
    rel_text,
    slot_text,
    status_label,
    step_summary_text,
    step_title_text,
    summary_text,
    to_exact_text,
    trajectory_text,
    tree_side_text,
    tree_title,
    tree_verdict_text,
    ulp_text,
    unavailable_text,
    verdict_text,
)
from harness.store.atomic import write_text_atomic

STATUS_CLASSES = {"pass": "pass", "fail": "fail", "n/a": "na"}
MAX_FILE_STEM = 120

_env = Environment(loader=PackageLoader("harness.reports", "templates"), autoescape=True,
                   trim_blocks=True, lstrip_blocks=True)


def _value(bits: int, dtype: str) -> str:
    array = np.array([bits], dtype=np.uint64).astype({2: np.uint16, 4: np.uint32, 8: np.uint64}[to_numpy_dtype(dtype).itemsize])
    return repr(float(array.view(to_numpy_dtype(dtype))[0]))


def _hex(bits: int, dtype: str) -> str:
    return f"0x{bits:0{to_numpy_dtype(dtype).itemsize * 2}x}"


def _index(flat: int | None, shape: tuple[int, ...]) -> str:
    if flat is None:
        return "-"
    return "[" + ", ".join(str(int(i)) for i in np.unravel_index(flat, shape)) + "]" if shape else "[]"


def _tensor_view(result: TensorResult, first_divergent: str | None) -> dict:
    pair = result.pair
    view = {
        "name": pair.name, "anchor": "t-" + pair.name.replace(".", "-"),
        "shape": list(pair.digest.shape), "dtype": dtype_text(pair, " / "),
        "md5_a": hash_text(pair.a, short=False), "md5_b": hash_text(pair.b, short=False),
        "md5_a_short": hash_text(pair.a), "md5_b_short": hash_text(pair.b),
        "bitwise": pair.bitwise, "holds": result.holds, "expectation": expectation_text(result),
        "findings": _finding_lines(result),
        "first_divergent": pair.name == first_divergent, "stats": None,
        "note": pair.note and note_text(pair.name, pair.note), "classes": classes_text(pair),
    }
    view["to_exact"], view["closer"] = _exact_view(pair), closer_text(pair)
    view["to_exact_short"] = to_exact_text(pair)
    values = pair.values
    if values is None:
        return view
    stats, shape, dtype = values.stats, values.a.shape, values.a.dtype
    exact = not isinstance(values, FloatPair)
    total = max(sum(stats.ulp_histogram.values()), 1)
    measured = isinstance(values, FloatPair) and values.measured
    at = (lambda flat: _index(flat, shape)) if measured else (lambda flat: NOT_MEASURED)
    view["stats"] = {
        "elements": stats.elements, "differing": stats.differing, "canonical_equal": stats.canonical_equal,
        "exact": exact,
        "signed_zero_only": stats.signed_zero_only, "nan_payload_only": stats.nan_payload_only,
        "nan_mismatch": stats.nan_mismatch, "inf_mismatch": stats.inf_mismatch,
        "max_ulp": ulp_text(pair), "max_ulp_at": at(stats.max_ulp_flat_index),
        "max_abs": abs_text(pair, 6), "max_abs_at": at(stats.max_abs_flat_index),
        "max_rel": rel_text(pair, 6), "max_rel_at": at(stats.max_rel_flat_index),
        "histogram": [{"bucket": b, "count": stats.ulp_histogram[b],
                       "height": 0 if not stats.ulp_histogram[b] else max(2, round(100 * stats.ulp_histogram[b] / total))}
                      for b in ULP_BUCKETS],
        "worst": [{"index": _index(w.flat_index, shape), "ulp": NAN_INF if w.ulp is None else w.ulp,
                   "a": _value(w.a_bits, dtype), "b": _value(w.b_bits, dtype),
                   "a_bits": _hex(w.a_bits, dtype), "b_bits": _hex(w.b_bits, dtype)}
                  for w in stats.worst],
    }
    if values.mismatches is not None:
        m = values.mismatches
        rows, cols = pair.axes or HEATMAP_AXES
        view["heatmap"] = json.dumps({"rows": m.rows, "cols": m.cols, "rowStep": m.row_step, "colStep": m.col_step,
                                      "rowLabel": rows, "colLabel": cols, "counts": m.counts, "maxUlp": m.max_ulp},
                                     separators=(",", ":"))
    return view


def _exact_view(pair) -> dict | None:
    """Each side against the float64 reference, in full; None without a reference (the reason is the case's)."""
    exact = pair.exact
    if exact is None or exact.missing:
        return None
    shape = tuple(pair.digest.shape)
    rows = []
    for label, side, error in (("A", exact.sides[0], exact.a), ("B", exact.sides[1], exact.b)):
        if error is None:
            rows.append({"label": label, "side": side, "unmeasured": reason_text(exact.why_unmeasured(side))})
            continue
        rows.append({"label": label, "side": side, "unmeasured": None, "max_ulp": f"{error.max_ulp:,}",
                     "max_ulp_at": _index(error.max_ulp_flat_index, shape), "mean_ulp": f"{error.mean_ulp:.3g}",
                     "histogram": [(bucket, f"{count:,}") for bucket, count in error.ulp_histogram.items()],
                     "normwise": normwise_text(error),
                     "normwise_u": "-" if error.normwise_absolute else f"{error.normwise_u:.3g}",
                     "class_mismatch": f"{error.class_mismatch:,}", "dtype": error.dtype, "u": f"2^{int(math.log2(error.unit_roundoff))}"})
    c = exact.closeness
    closeness = None if c is None else {
        "a": f"{c.a_closer:,} ({c.a_share:.1%})", "b": f"{c.b_closer:,} ({c.b_share:.1%})",
        "ties": f"{c.ties:,} ({c.tie_share:.1%})", "identical": f"{c.identical:,}"}
    return {"rows": rows, "closeness": closeness, "buckets": list(ULP_BUCKETS)}


def _finding_lines(result: TensorResult) -> list[dict]:
    """What fails the tensor, and its structural differences that only are reported (the numbers are in the table)."""
    failing = [f for f in result.findings if not f.passed]
    reported = [f for f in result.findings if f.passed and isinstance(f.data, STRUCTURAL)]
    return ([{"text": line, "passed": False} for line in findings_lines(failing)]
            + [{"text": line, "passed": True} for line in findings_lines(reported)])


def _recorded(environment: dict) -> dict:
    return {k: v for k, v in environment.items() if v not in (None, {}, "") and k not in RETIRED}


def _shown(fingerprint: dict, name: str) -> str | None:
    return str(fingerprint[name]) if name in fingerprint else None


def _differs(one: dict, other: dict, name: str) -> bool:
    """Whether a field differs between two fingerprints (one that only one recorded does)."""
    return (name in one, one.get(name)) != (name in other, other.get(name))


def fingerprint_view(a: SideInfo, b: SideInfo, golden: Mapping[str, dict] | None = None) -> dict:
    """Both sides' fingerprints as one table: a row per field either side recorded (A's order, then B's
    own; a value is None where that side did not record it), marked where the values differ (a field only
    one side recorded differs); and how many differ. With a gate's golden (side name -> the fingerprint the
    golden recorded), a column per side of the golden too, each value marked where it differs from that
    side's now, and how many fields differ from the golden. The template words it."""
    fa, fb = _recorded(a.environment), _recorded(b.environment)
    ga, gb = (_recorded(golden.get(a.name, {})), _recorded(golden.get(b.name, {}))) if golden is not None else ({}, {})
    rows = []
    for name in dict.fromkeys([*fa, *fb, *ga, *gb]):
        row = {"field": name, "a": _shown(fa, name), "b": _shown(fb, name), "differs": _differs(fa, fb, name)}
        if golden is not None:
            row |= {"golden_a": _shown(ga, name), "golden_b": _shown(gb, name),
                    "drifted_a": _differs(ga, fa, name), "drifted_b": _differs(gb, fb, name)}
            row["drifted"] = row["drifted_a"] or row["drifted_b"]
        row["classes"] = " ".join(c for c in ("differs", "drifted") if row.get(c))
        rows.append(row)
    return {"rows": rows, "differing": sum(row["differs"] for row in rows), "golden": golden is not None,
            "drifted": sum(row.get("drifted", False) for row in rows)}


def case_view(comparison: CaseComparison, golden: Mapping[str, dict] | None = None) -> dict:
    first = comparison.first_divergent
    sides = []
    for label, side in (("A", comparison.a), ("B", comparison.b)):
        sides.append({"label": label, "name": side.name, "framework": side.framework, "impl": side.impl,
                      "mode": side.mode, "provenance": side.provenance,
                      "versions": side.versions,
                      "nondeterministic": [nondeterministic_text(side.name, name, distinct)
                                           for name, distinct in side.nondeterministic.items()]})
    reference = comparison.reference
    arbiter = {"text": reference_text(comparison), "provenance": reference.provenance if reference else None}
    return {
        "arbiter": arbiter,
        "name": comparison.case_name, "status": comparison.status, "label": status_label(comparison.status),
        "status_class": STATUS_CLASSES[comparison.status], "summary": summary_text(comparison),
        "verdict": verdict_text(comparison),
        "first_divergent": first.name if first else None, "sides": sides,
        "fingerprint": fingerprint_view(comparison.a, comparison.b, golden),
        "inputs": {name: d.to_json() for name, d in comparison.inputs.items()},
        "tensors": [_tensor_view(result, first.name if first else None) for result in comparison.tensors],
        "bitwise_count": sum(result.pair.bitwise for result in comparison.tensors),
    }


def write_case_report(comparison: CaseComparison, path: str | Path, golden: Mapping[str, dict] | None = None) -> Path:
    """The case's report; `golden`: the fingerprints of the golden a gate checked it against (side -> fingerprint)."""
    html = _env.get_template("case.html.j2").render(case=case_view(comparison, golden))
    return write_text_atomic(path, html)


def safe_file_stem(name: str) -> str:
    """A file name stem from a case name: A-Z a-z 0-9 . _ - kept, anything else `_`; no leading or trailing
    dots or underscores (no hidden files, never `..`); shortened beyond MAX_FILE_STEM characters."""
    return shortened(safe_name(name).strip("._"), name, MAX_FILE_STEM) or "case"


def report_file_names(case_names: list[str], reserved: tuple[str, ...] = ("index",)) -> list[str]:
    """One safe, distinct (also ignoring case) `<stem>.html` per case; `reserved` stems are left free."""
    used, names = {r.lower() for r in reserved}, []
    for case_name in case_names:
        stem = base = safe_file_stem(case_name)
        n = 2
        while stem.lower() in used:
            stem, n = f"{base}-{n}", n + 1
        used.add(stem.lower())
        names.append(f"{stem}.html")
    return names


def write_index(entries: list[tuple[CaseComparison, Path]], path: str | Path) -> Path:
    # Links are relative file links to the reports beside the index, url-quoted: never a scheme.
    rows = [{"name": c.case_name, "status": c.status, "label": status_label(c.status),
             "status_class": STATUS_CLASSES[c.status], "reason": unavailable_text(c), "href": quote(p.name, safe=""),
             "tensors": len(c.tensors),
             "bitwise": sum(result.pair.bitwise for result in c.tensors),
             "first_divergent": c.first_divergent.name if c.first_divergent else None} for c, p in entries]
    title = index_title([c.status for c, _ in entries])
    return write_text_atomic(path, _env.get_template("index.html.j2").render(cases=rows, title=title))


def write_reports(comparisons: list[CaseComparison], target: str | Path,
                  goldens: Mapping[str, Mapping[str, dict]] | None = None) -> Path:
    """One report per case; with several, `target` is a folder holding them and index.html (returned). `goldens`:
    a gate's, per case name the fingerprints its golden recorded (a column in its fingerprint table)."""
    target, goldens = Path(target), goldens or {}
    if len(comparisons) == 1 and target.suffix == ".html":
        return write_case_report(comparisons[0], target, goldens.get(comparisons[0].case_name))
    folder = target if target.suffix != ".html" else target.parent
    reserved = ("index",) if target.suffix != ".html" else (target.stem,)
    names = report_file_names([c.case_name for c in comparisons], reserved)
    entries = [(c, write_case_report(c, folder / name, goldens.get(c.case_name))) for c, name in zip(comparisons, names)]
    if len(entries) == 1 and target.suffix != ".html":
        return entries[0][1]
    return write_index(entries, target if target.suffix == ".html" else folder / "index.html")


MAX_DETAILS = 100  # tensor detail sections per step: a divergence early in a model makes every later tensor differ


def _model(step: StepComparison) -> list[dict]:
    """A's selected modules as a tree (parent -> children), each marked where its tensors differ; the
    module of the first divergent tensor marked apart."""
    differing = {view.module for view in step.records if not view.bitwise}
    divergent = step.divergence.module if step.divergence else None
    origins = {origin.module for origin in step.origins.values() if origin.origin}
    nodes: dict[str, dict] = {}
    for m in step.modules:
        classes = [c for c, on in (("differs", m.name in differing), ("divergent", m.name == divergent)) if on]
        nodes[m.name] = {"name": m.name, "type": m.type, "children": [], "divergent": m.name == divergent,
                         "origin": m.name in origins, "classes": " ".join(classes)}
    roots: list[dict] = []
    for module in step.modules:
        parent = nodes.get(module.parent) if module.parent else None
        (parent["children"] if parent is not None else roots).append(nodes[module.name])
    return roots


def _step_view(index: int, step: StepComparison) -> dict:
    first = step.divergence.name if step.divergence else None
    rows: list[dict] = []
    details: list[dict] = []
    for view in step.records:
        for position, result in enumerate(view.tensors):
            tensor = _tensor_view(result, first)
            tensor["anchor"] = f"s{index}-t{len(rows)}"
            tensor["detail"] = not result.pair.bitwise and len(details) < MAX_DETAILS
            if tensor["detail"]:
                details.append(tensor)
            origin = step.origins.get(result.name)
            rows.append({"tensor": tensor, "first": position == 0, "module": view.module, "call": call_text(view.call),
                         "phase": phase_text(view.phase), "slot": slot_text(result.name, view.module),
                         "origin": {"label": origin_label_text(origin),
                                    "text": origin_text(result.name, origin)} if origin and origin.origin else None})
    differing = sum(not result.pair.bitwise for result in step.comparison.tensors)
    return {"name": step.label, "anchor": f"s{index}", "summary": step_summary_text(step), "status": step.status,
            "label": status_label(step.status), "status_class": STATUS_CLASSES[step.status], "rows": rows,
            "origins": origins_text(step),
            "details": details,
            "details_left_out": details_left_out_text(differing - len(details)) if differing > len(details) else None}


def _strip(trajectory: Trajectory, steps: list[StepComparison]) -> dict | None:
    """The trajectory as a strip: one cell per step, coloured by its kind, titled with both losses, linking
    the step's section (of its first divergent rank, where it has ranks); None for a single step."""
    if len(trajectory.steps) < 2:
        return None
    anchors = {id(step): f"s{index}" for index, step in enumerate(steps)}
    cells = [{"index": summary.index, "kind": summary.kind, "title": step_title_text(summary, trajectory),
              "anchor": anchors[id(next((s for s in summary.steps if s.divergence), summary.steps[0]))]}
             for summary in trajectory.steps]
    return {"text": trajectory_text(trajectory), "cells": cells,
            "legend": [{"kind": kind, "label": KIND_LABELS[kind]} for kind in KINDS]}


def tree_view(tree: TreeComparison) -> dict:
    steps = [_step_view(index, step) for index, step in enumerate(tree.steps)]
    divergence = tree.divergence
    first = None
    if divergence is not None:
        index = next(i for i, step in enumerate(tree.steps) if step.divergence is divergence)
        anchor = next(row["tensor"]["anchor"] for row in steps[index]["rows"] if row["tensor"]["name"] == divergence.name)
        first = {"text": divergence_text(divergence), "anchor": anchor}
    shown = next((step for step in tree.steps if step.divergence is divergence), tree.steps[0] if tree.steps else None)
    return {
        "title": tree_title(tree), "status": tree.status, "label": status_label(tree.status),
        "status_class": STATUS_CLASSES[tree.status], "verdict": tree_verdict_text(tree),
        "first_divergent": first, "divergence_text": divergence_text(None, tree.uncompared),
        "sides": [tree_side_text("A", tree.a), tree_side_text("B", tree.b)], "map": map_text(tree.map),
        "model": _model(shown) if shown else [], "model_step": shown.label if shown else "",
        "columns": TREE_COLUMNS, "steps": steps, "strip": _strip(trajectory_of(tree.steps), tree.steps),
    }


def write_tree_report(tree: TreeComparison, target: str | Path) -> Path:
    """One page for two capture trees: `target` itself when it ends in .html, else a file in that folder."""
    target = Path(target)
    path = target if target.suffix == ".html" else target / f"{safe_file_stem(tree_title(tree))}.html"
    return write_text_atomic(path, _env.get_template("tree.html.j2").render(tree=tree_view(tree)))
