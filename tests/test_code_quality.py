"""The code passes its own lint and type settings (pyproject.toml): ruff over everything, mypy over harness/."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_passes():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "harness", "scripts", "tests"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_mypy_passes(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy")],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
