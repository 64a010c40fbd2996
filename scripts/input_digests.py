"""The digest of every input of every built-in case (cases/*.yaml, cases/gpu/*.yaml, every sweep point).

    python3 scripts/input_digests.py                                   # print them
    python3 scripts/input_digests.py --write tests/data/input_digests.json
    python3 scripts/input_digests.py --check tests/data/input_digests.json

One line per input, "FILE:CASE:INPUT": dtype, shape and the MD5 of its bytes, sorted, so that a change reads
well in a diff. --check prints every input that differs from (or is missing in, or is new to) the file, and
exits 1 if any does. Needs only what input generation needs (numpy, ml_dtypes, safetensors, pydantic, pyyaml,
...): no framework is imported.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.inputs import generate_inputs
from harness.load import load_cases
from harness.store.digest import Digest

ROOT = Path(__file__).resolve().parent.parent


def case_files(root: Path = ROOT) -> list[Path]:
    return sorted(root.glob("cases/*.yaml")) + sorted(root.glob("cases/gpu/*.yaml"))


def input_digests(files: list[Path], root: Path = ROOT) -> dict[str, dict]:
    """{"cases/x.yaml:case:input": {"dtype", "shape", "md5"}} of every input of every case in `files`."""
    digests = {}
    for path in files:
        for case in load_cases(path):
            for name, array in generate_inputs(case).items():
                key = f"{path.resolve().relative_to(root).as_posix()}:{case.name}:{name}"
                digests[key] = Digest.of(array, xxh3=False).to_json()
    return dict(sorted(digests.items()))


def dumps(digests: dict[str, dict]) -> str:
    """JSON with one line per input."""
    lines = [f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in sorted(digests.items())]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def differences(expected: dict[str, dict], actual: dict[str, dict]) -> list[str]:
    """One line per input that differs, is missing or is new."""
    lines = []
    for key in sorted(expected.keys() | actual.keys()):
        if key not in actual:
            lines.append(f"{key}: missing (recorded {expected[key]})")
        elif key not in expected:
            lines.append(f"{key}: new (not recorded): {actual[key]}")
        elif expected[key] != actual[key]:
            lines.append(f"{key}: recorded {expected[key]}, now {actual[key]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", type=Path, metavar="FILE", help="write the digests to FILE")
    action.add_argument("--check", type=Path, metavar="FILE", help="compare with FILE; exit 1 on any difference")
    args = parser.parse_args(argv)
    digests = input_digests(case_files())
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(dumps(digests))
        print(f"{args.write}: {len(digests)} inputs")
    elif args.check:
        different = differences(json.loads(args.check.read_text()), digests)
        for line in different:
            print(line)
        print(f"{len(different)} of {len(digests)} inputs differ from {args.check}")
        return 1 if different else 0
    else:
        sys.stdout.write(dumps(digests))
    return 0


if __name__ == "__main__":
    sys.exit(main())
