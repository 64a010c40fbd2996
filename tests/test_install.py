"""An installed xfalign (`pip install .`, not editable) runs a case from any directory: the numerics profiles and
templates it reads at run time are package data, not files of the checkout."""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CASE = """\
op: swiglu
seed: 5
inputs:
  x: {shape: [8, 32], dtype: bfloat16}
  grad_out: {shape: [8, 16], dtype: bfloat16}
sides:
  megatron: {framework: megatron, mode: eager}
  paddle: {framework: paddle, impl: fp32_island}
expect:
  all: report
"""


@pytest.mark.slow  # builds a wheel, makes a venv, starts both frameworks (~30 s)
def test_non_editable_install_runs_a_case_from_another_directory(tmp_path):
    # Built from a copy of the sources: building in the checkout would write build/ and *.egg-info there.
    source = tmp_path / "source"
    source.mkdir()
    shutil.copytree(ROOT / "harness", source / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(source)], check=True, capture_output=True)

    # A fresh venv that holds the wheel, and finds the frameworks (not xfalign) in this venv's site-packages.
    target = tmp_path / "venv"
    venv.create(target, with_pip=True)
    python = target / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *wheels.glob("*.whl")],
                   check=True, capture_output=True)
    own_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
    # a path line in a .pth file adds the folder without running its .pth files (so not the editable finder)
    (Path(own_site) / "frameworks.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "case.yaml").write_text(textwrap.dedent(CASE))
    where = subprocess.run([python, "-c", "import harness; print(harness.__file__)"], cwd=work, check=True,
                           capture_output=True, text=True).stdout.strip()
    assert where.startswith(own_site), where  # the installed copy, not the checkout
    assert (Path(own_site) / "harness" / "reports" / "report.schema.json").is_file()  # the published JSON Schema
    done = subprocess.run([target / "bin" / "xfalign", "run", "case.yaml", "--json", "result.json"], cwd=work,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (work / "result.json").is_file() and (work / "reports" / "case.html").is_file()
    assert "portable-avx2" in (work / "result.json").read_text()
