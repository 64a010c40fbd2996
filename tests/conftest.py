import functools
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

# Hypothesis keeps its example database (and patches of failing examples) in a temporary folder, not the checkout.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "xfalign-hypothesis")
# numba caches the CPU digest's compiled kernels (harness.store.cpu_kernels) beside the package by default: the tests'
# go to a temporary folder (read when numba is first imported; subprocesses inherit it)
os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(tempfile.gettempdir()) / "xfalign-numba-cache"))

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


# -- the GPU -------------------------------------------------------------------------------------------------


@functools.cache
def cuda_missing() -> str | None:
    """Why this process cannot use CUDA (None: torch sees a GPU). Asked when the first `gpu` test is set up, not
    at collection: only the test process that runs gpu tests imports torch."""
    try:
        import torch
    except ImportError:
        return "needs a CUDA GPU: torch is not installed"
    if not torch.cuda.is_available():
        hidden = " (CUDA_VISIBLE_DEVICES is empty)" if os.environ.get("CUDA_VISIBLE_DEVICES") == "" else ""
        return f"needs a CUDA GPU: torch {torch.__version__} sees none{hidden}"
    return None


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None and (reason := cuda_missing()):
        pytest.skip(reason)


@pytest.fixture
def hidden_gpu(monkeypatch):
    """A machine without a GPU, on any machine: CUDA_VISIBLE_DEVICES="" for this test, and a worker pool of its own
    (made the default) whose workers start with it. The session's workers may have seen the GPU already (a
    framework reads the variable once, when it first looks for devices), so they cannot stand in for such a machine."""
    from harness.runner import WorkerPool

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with WorkerPool(jobs=2) as pool, pool.as_default():
        yield pool


# -- the CPU -------------------------------------------------------------------------------------------------

# What a test that computes in its own process does before its framework is imported: the numerics profile's
# variables (ATEN_CPU_CAPABILITY, MKL_CBWR, threads) and, after the import, its switches, applied by the framework
# adapter as a worker applies them. They are read when the framework loads, so this runs in a fresh process.
_PINNED_PRELUDE = """\
import sys
sys.path.insert(0, {root!r})
from harness.frameworks import adapter_for
from harness.numerics import load_profile
_profile = load_profile({profile!r})
_adapter = adapter_for({framework!r})
_adapter.before_import(_profile, None)
_adapter.apply_profile(_profile)
del _profile, _adapter
"""

PORTABLE_ISAS = ("avx2", "avx512", "avx512-bf16", "amx")  # harness.machine.cpu_isa values portable-avx2 runs on


def run_pinned(code: str, *args: str, framework: str = "megatron", profile: str = "portable-avx2",
               timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `code` (sys.argv[1:] = args) in a fresh Python process under the numerics profile, as the framework's
    worker would be: so that a test's own computation gives the profile's bits on any CPU the profile covers.
    Skips where this CPU is not one of them (portable-avx2 pins AVX2 code paths)."""
    from harness.machine import cpu_isa
    from harness.numerics import load_profile

    if load_profile(profile).environment_class == "cpu-avx2" and cpu_isa() not in PORTABLE_ISAS:
        pytest.skip(f"the {profile} profile needs an x86-64 CPU with AVX2; this one's widest is {cpu_isa()}")
    source = _PINNED_PRELUDE.format(root=str(ROOT), profile=profile, framework=framework) + textwrap.dedent(code)
    done = subprocess.run([sys.executable, "-c", source, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert done.returncode == 0, done.stderr[-4000:]
    return done
