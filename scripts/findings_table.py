"""The findings tables of docs/findings.md, made from a run's JSON, so that every figure there comes from one run:

    xfalign run cases/*.yaml --json reports/findings.json
    python scripts/findings_table.py reports/findings.json > findings.md

One row per case point: the two sides, then per tensor "bitwise" or what differs (elements, max ULP, the
elements that differ only in the sign of zero, max abs), a shape or dtype mismatch, or why a side is N/A;
then "closer to exact": per differing float tensor, each side's max ULP to the correctly rounded float64
result and normwise error (in units of u), and which side is closer (by normwise error; "tie" where equal).
"""

from __future__ import annotations

import json
import sys


def side_label(side: dict) -> str:
    return f"{side['name']} ({side['mode']})" if side.get("mode") else side["impl"]


def tensor_text(tensor: dict) -> str:
    name, a, b = tensor["name"], tensor["a"], tensor["b"]
    if tensor["bitwise"]:
        return f"{name} bitwise"
    if a is None or b is None:
        return f"{name} on one side only"
    if a["shape"] != b["shape"] or a["dtype"] != b["dtype"]:
        return f"{name}: **{a['dtype']} {a['shape']} vs {b['dtype']} {b['shape']}**"
    stats = tensor.get("stats") or {}
    if not stats.get("elements"):
        return f"{name}: digests differ"
    text = f"{name} {stats['differing']:,}/{stats['elements']:,} differ"
    if "max_ulp" in stats:  # float values
        text += f", max {stats['max_ulp']:,} ULP"
        if stats.get("signed_zero_only"):
            text += f" ({stats['signed_zero_only']:,} only in the sign of zero)"
        text += f", max abs {stats['max_abs']:.3g}"
    return text


def closer_text(tensor: dict) -> str | None:
    """'name: A 1 ULP/0.43u, B 3 ULP/9.3u -> A' for a differing float tensor the reference measured, else None."""
    exact = tensor.get("to_exact") or {}
    a, b = exact.get("a"), exact.get("b")
    if tensor["bitwise"] or not a or not b:
        return None
    closer = "A" if a["normwise"] < b["normwise"] else "B" if b["normwise"] < a["normwise"] else "tie"

    def side(error: dict) -> str:
        normwise = f"{error['normwise']:.2g} abs" if error["normwise_absolute"] else f"{error['normwise_u']:.2g}u"
        return f"{error['max_ulp']:,} ULP/{normwise}"

    return f"{tensor['name']}: A {side(a)}, B {side(b)} → {closer}"


def rows(result: dict) -> list[str]:
    lines = ["| case point | A vs B | result | closer to exact |", "|---|---|---|---|"]
    for case in result["cases"]:
        sides = case["sides"]
        pair = f"{side_label(sides['a'])} vs {side_label(sides['b'])}"
        if case.get("unavailable"):
            reasons = "; ".join(f"{side}: {reason}" for side, reason in case["unavailable"].items())
            lines.append(f"| `{case['case']}` | {pair} | N/A: {reasons} | |")
            continue
        exact = [text for text in map(closer_text, case["tensors"]) if text]
        if not exact:
            exact = ["n/a: " + case["reference_missing"]] if case.get("reference_missing") else ["all bitwise"]
        lines.append(f"| `{case['case']}` | {pair} | {'; '.join(tensor_text(t) for t in case['tensors'])} | {'; '.join(exact)} |")
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: findings_table.py RUN.json")
    with open(sys.argv[1]) as handle:
        print("\n".join(rows(json.load(handle))))
