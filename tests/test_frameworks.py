"""Framework adapters: registered by entry point, importable without their framework, bit-exact tensors."""

import ast
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from harness.case import CaseError
from harness.frameworks import adapter_for, known_frameworks
from harness.load import load_case

from conftest import ROOT, SMALL_WEIGHTED

# The adapters import their framework into this process: with the other in-process framework tests, in one
# pytest-xdist process.
pytestmark = pytest.mark.xdist_group("in_process_frameworks")


def special_values(dtype) -> np.ndarray:
    """Signed zeros, infinities, subnormals and NaNs with distinct payloads, as raw bits."""
    if np.dtype(dtype) == np.bool_:
        return np.array([True, False, True], dtype=bool)
    if np.dtype(dtype).kind == "i":
        info = np.iinfo(dtype)
        return np.array([0, -1, 1, info.min, info.max], dtype=dtype)
    bits = {2: np.uint16, 4: np.uint32}[np.dtype(dtype).itemsize]
    exponent = {ml_dtypes.bfloat16: 0x7F80, np.float16: 0x7C00, np.float32: 0x7F800000}[dtype]
    sign = 1 << (8 * np.dtype(dtype).itemsize - 1)
    raw = [0, sign, exponent, sign | exponent, 1, sign | 1, exponent | 1, exponent | 3, sign | exponent | 5,
           exponent | (exponent >> 1 & ~exponent)]  # zeros, infs, subnormals, NaN payloads (signalling, quiet)
    values = np.array(raw, dtype=bits).view(dtype)
    return np.concatenate([values, np.random.default_rng(0).normal(size=50).astype(dtype)])


@pytest.mark.parametrize("framework", ["megatron", "paddle"])
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32, np.int64, np.bool_])
def test_tensors_round_trip_bit_exactly(framework, dtype):
    adapter = adapter_for(framework)
    adapter.use_device("cpu")
    array = special_values(dtype).reshape(-1, 1)
    floating = np.dtype(dtype).kind == "f" or dtype is ml_dtypes.bfloat16
    tensor = adapter.to_tensor(array, "cpu", requires_grad=floating)
    assert isinstance(tensor, adapter.tensor_type()) and adapter.tracks_grad(tensor) == floating
    back = adapter.to_numpy(tensor)
    assert back.dtype == array.dtype and back.shape == array.shape and back.tobytes() == array.tobytes()


def test_registry_and_modes():
    assert {"megatron", "paddle"} <= set(known_frameworks())
    torch_side, paddle_side = adapter_for("megatron"), adapter_for("paddle")
    assert torch_side.modes == ("compile", "eager") and torch_side.default_mode == "compile"
    assert torch_side.default_impl == "megatron" and paddle_side.default_impl is None and paddle_side.modes == ()


def test_adapters_case_loading_profiles_and_reports_import_no_framework():
    script = ("import sys\nfrom harness.frameworks import adapter_for, known_frameworks\n"
              "from harness.load import load_cases\n"
              "import harness.fingerprint, harness.numerics, harness.reports.html\n"
              "for name in known_frameworks(): adapter_for(name).modes\n"
              "load_cases('cases/linear.yaml')\n"
              "loaded = [m for m in ('torch', 'paddle', 'megatron') if m in sys.modules]\n"
              "assert not loaded, loaded\n")
    from conftest import ROOT
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("old, new, field, words", [
    ("{framework: paddle, impl: fp32_island}", "{framework: jax, impl: fp32_island}", "sides.paddle.framework",
     "unknown framework 'jax'; known: "),
    ("{framework: paddle, impl: fp32_island}", "{framework: paddle, impl: fp32_island, mode: eager}", "sides.paddle.mode",
     "paddle execution modes: none (leave mode out), got 'eager'"),
    ("{framework: paddle, impl: fp32_island}", "{framework: paddle, impl: fp32_island, backward: 'b.py:f'}",
     "sides.paddle.backward", "a backward goes with a user forward"),
])
def test_side_fields_are_checked_against_the_adapter(write_case, old, new, field, words):
    path = write_case(SMALL_WEIGHTED.replace(old, new))
    with pytest.raises(CaseError) as info:
        load_case(path)
    assert str(info.value).startswith(f"{path}:10: {field}: ") and words in str(info.value), info.value


def test_torch_custom_function_runs_the_hand_written_backward():
    import torch

    adapter = adapter_for("megatron")

    def forward(x, y, options):
        return {"out": x * y, "twice": x + x}

    def backward(grad_out, grad_twice, x, y, options):
        return grad_out * y * options["k"] + 2 * grad_twice, None

    fn = adapter.custom_function(forward, backward)
    x, y = torch.randn(4, requires_grad=True), torch.randn(4)
    outputs = fn(x, y, {"k": 3.0})
    assert set(outputs) == {"out", "twice"} and adapter.tracks_grad(outputs["out"])
    adapter.backward([outputs["out"], outputs["twice"]], [torch.ones(4), torch.zeros(4)])
    assert torch.equal(adapter.grad_of(x), y * 3.0)


def test_versions_are_fingerprint_fields_and_shown_from_them():
    from harness.numerics import load_profile

    profile = load_profile(None)
    paddle, megatron = adapter_for("paddle"), adapter_for("megatron")
    fields = paddle.fingerprint("cpu", profile)
    assert "version_line" not in fields and paddle.version_line(fields).startswith("paddle 3.")
    fields = megatron.fingerprint("cpu", profile)
    line = megatron.version_line(fields)
    assert "version_line" not in fields and line.startswith("torch 2.") and ", megatron-core 0." in line


def test_profile_sections_are_the_adapters_pins():
    from harness.numerics import NumericsProfile

    for framework in known_frameworks():
        adapter = adapter_for(framework)
        if adapter.profile_section:
            assert NumericsProfile.model_fields[adapter.profile_section].annotation is adapter.pins


def test_recorded_variables_are_the_adapters_and_the_libraries(monkeypatch):
    from harness.fingerprint import numeric_env

    for name in ("FLAGS_use_b", "FLAGS_use_a", "ATEN_CPU_CAPABILITY", "MKL_CBWR", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.setenv(name, "1")
    recorded = numeric_env()
    assert {"FLAGS_use_a", "FLAGS_use_b", "ATEN_CPU_CAPABILITY", "MKL_CBWR"} <= set(recorded)
    assert recorded.index("FLAGS_use_a") < recorded.index("FLAGS_use_b") and "TORCHINDUCTOR_CACHE_DIR" not in recorded


GENERIC = [path for path in sorted((ROOT / "harness").rglob("*.py"))
           if path.relative_to(ROOT / "harness").parts[0] != "frameworks"
           and not (path.parts[-3] == "ops" and path.name == "__init__.py")  # a family lists its implementations
           and not (path.parts[-3] == "ops" and path.name in ("megatron.py", "paddle.py"))]


@pytest.mark.parametrize("path", GENERIC, ids=lambda p: str(p.relative_to(ROOT / "harness")))
def test_no_framework_names_in_code_outside_the_adapters(path):
    """Identifiers, imports and strings that are not prose (no blank in them): docstrings and messages may say
    which framework an idea comes from; code asks the adapters (harness.frameworks)."""
    tree = ast.parse(path.read_text())
    words = [node.value for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and not re.search(r"\s", node.value)]
    words += [node.id for node in ast.walk(tree) if isinstance(node, ast.Name)]
    words += [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)]
    words += [node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    words += [alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
              for alias in node.names] + [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    found = [w for w in words if re.search(r"megatron|paddle|torch|triton|inductor|dynamo|FLAGS_|ATEN_", w, re.I)]
    assert not found
