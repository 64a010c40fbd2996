"""Compare every dump under one folder with the dump at the same relative path under another, e.g.
Megatron dumps made on a GPU machine against Paddle dumps made on a CPU machine.

    python3 scripts/compare_dump_trees.py dumps/gpu dumps/cpu results/

Writes results/<name>.json and results/html/<name>.html per pair (names made file-safe) and prints each
comparison; exit 1 if any pair's expectations do not hold.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from harness.cli import main as xfalign


def main(first: str, second: str, results: str) -> int:
    status = 0
    for meta in sorted(Path(first).rglob("meta.json")):
        relative = meta.parent.relative_to(first)
        other = Path(second) / relative
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", str(relative)).strip("_")
        code = xfalign(["compare", str(meta.parent), str(other), "--json", f"{results}/{name}.json",
                        "--html", f"{results}/html/{name}.html"])
        status = max(status, code)
    return status


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
