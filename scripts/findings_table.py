"""The README's findings tables, made from a run's JSON, so that every figure there comes from one run:

    xfalign run cases/*.yaml --json reports/findings.json
    python scripts/findings_table.py reports/findings.json > findings.md

One row per case point: the two sides, then per tensor "bitwise" or what differs (elements, max ULP, the
elements that differ only in the sign of zero, max abs), a shape or dtype mismatch, or why a side is N/A.
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


def rows(result: dict) -> list[str]:
    lines = ["| case point | A vs B | result |", "|---|---|---|"]
    for case in result["cases"]:
        sides = case["sides"]
        pair = f"{side_label(sides['a'])} vs {side_label(sides['b'])}"
        if case.get("unavailable"):
            reasons = "; ".join(f"{side}: {reason}" for side, reason in case["unavailable"].items())
            lines.append(f"| `{case['case']}` | {pair} | N/A: {reasons} |")
            continue
        lines.append(f"| `{case['case']}` | {pair} | {'; '.join(tensor_text(t) for t in case['tensors'])} |")
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: findings_table.py RUN.json")
    with open(sys.argv[1]) as handle:
        print("\n".join(rows(json.load(handle))))
