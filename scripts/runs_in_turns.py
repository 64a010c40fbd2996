"""What the scripts that run themselves again, a process per run, share: bench_capture.py (--runs, --baseline) and
check_fast_digest.py (--turns, --baseline), and gpu_checks.py, which reads their figures. Imports nothing but the
standard library: gpu_checks runs without torch."""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path


def on_checkout(argv: list[str], dropped: tuple[str, ...], root: Path) -> tuple[list[str], dict[str, str]]:
    """`argv` without the options `dropped` and their values (taken out by argparse's own matching: any spelling),
    and this process's environment with the checkout `root` first on PYTHONPATH (its harness imported, not this
    one's)."""
    picker = argparse.ArgumentParser(add_help=False)
    for option in dropped:
        picker.add_argument(option)
    rest = picker.parse_known_args(argv)[1]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root.resolve()),
                                                                             os.environ.get("PYTHONPATH")])))
    return rest, environment


def is_checkout(path: Path) -> bool:
    """Whether `path` holds a checkout of xfalign (its harness package)."""
    return (path / "harness" / "__init__.py").is_file()


def turn_medians(turns: list[dict], way: str) -> list[float]:
    """Each turn's median host us per tensor of `way` (check_fast_digest.py's figures), turns without it left out."""
    return [statistics.median(turn[way]["host"]) for turn in turns if way in turn]


def median_range(values: list[float], digits: int = 2) -> str:
    """A ratio's median over runs or turns and their range, as every script prints it: x1.12 (1.10-1.20)."""
    return f"x{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"
