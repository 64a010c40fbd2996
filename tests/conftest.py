import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

# Hypothesis keeps its example database (and patches of failing examples) in a temporary folder, not the checkout.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "xfalign-hypothesis")

ROOT = Path(__file__).resolve().parent.parent

SMALL_WEIGHTED = """\
op: swiglu
options: {weighted: true}
seed: 3
inputs:
  x: {shape: [16, 64], dtype: bfloat16, std: 2.0}
  probs: {shape: [16, 1], dtype: float32, dist: uniform}
  grad_out: {shape: [16, 32], dtype: bfloat16}
sides:
  megatron: {framework: megatron, mode: compile}
  paddle: {framework: paddle, impl: fp32_island}
expect:
  all: bitwise
"""


# A size where sums differ between frameworks (grad.probs sums 256 terms).
CASE = SMALL_WEIGHTED.replace("[16, 64]", "[64, 512]").replace("[16, 1]", "[64, 1]").replace("[16, 32]", "[64, 256]")
REPORT_ONLY = CASE.replace("all: bitwise", "all: report")


@pytest.fixture(scope="session", autouse=True)
def workers():
    """One pool of long-lived workers (one per framework and numerics profile) for the whole session: every
    in-process `run_case()` and `main(["run" | "gate", ...])` uses it, so each framework is imported once.
    Tests that need a worker of their own (a fresh process in a given folder) pass `pool=` explicitly."""
    from harness.runner import WorkerPool

    with WorkerPool() as pool, pool.as_default():
        yield pool


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path, monkeypatch):
    """Commands write reports/ relative to the working directory: keep them out of the checkout."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def torch():
    """torch, imported by the first test that asks for it (not at collection: each test process would import it)."""
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def paddle():
    return pytest.importorskip("paddle")


@pytest.fixture
def write_case(tmp_path):
    def write(text: str, name: str = "case.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write

pytest_plugins = ["pytester"]
