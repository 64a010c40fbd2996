"""Digests of a tree of dumps (meta.json files) against the goldens of one environment class.

    python3 scripts/check_dumps_against_goldens.py DUMPS baselines/cpu-avx2

Prints one line per dump: equal, or which tensors differ. Exit 1 when any differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.store.golden import Golden


def main(dumps: Path, baseline: Path) -> int:
    differing = 0
    for meta_file in sorted(dumps.rglob("meta.json")):
        meta = json.loads(meta_file.read_text())
        golden = Golden.read(baseline, meta["case_name"])
        if golden is None:
            print(f"{meta['case_name']} ({meta['side']}): no golden")
            continue
        recorded = golden.tensors.get(meta["side"], {})
        changed = [t["name"] for t in meta.get("tensors", []) if recorded.get(t["name"]) is None
                   or recorded[t["name"]].md5 != t["md5"]]
        differing += bool(changed)
        verdict = "differs: " + ", ".join(changed) if changed else f"equal ({len(meta.get('tensors', []))} tensors)"
        print(f"{meta['case_name']} ({meta['side']}, {meta['environment'].get('cpu_isa')}): {verdict}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
