"""Real runs: real megatron-core on torch and real paddle, each in its own worker process."""

import hashlib
import json

import pytest

from harness.cli import main
from harness.reports.json_report import FORMAT
from harness.store.dump import Dump

from conftest import CASE

# One test process runs these: they share its Megatron worker (and test_dump_... imports torch here).
pytestmark = pytest.mark.xdist_group("in_process_frameworks")


def run_json(args, tmp_path):
    out = tmp_path / "result.json"
    code = main(args + ["--json", str(out), "--html", str(tmp_path / "html")])
    report = json.loads(out.read_text())
    assert report["format"] == FORMAT
    return code, report["cases"][0]


def test_weighted_swiglu_both_sides(write_case, tmp_path, capsys):
    path = write_case(CASE.replace("all: bitwise", "all: report\n  tensors: {out: {max_ulp: 1}}"))
    code, result = run_json(["run", str(path), "--dump", str(tmp_path / "dumps")], tmp_path)
    assert code == 0
    assert [t["name"] for t in result["tensors"]] == ["out", "grad.x", "grad.probs"]
    assert result["sides"]["a"]["provenance"].startswith("megatron-core: megatron.core.fusions.fused_bias_swiglu.weighted_bias_swiglu_impl")
    assert result["sides"]["a"]["environment"]["megatron_core"] == "0.16.1"
    assert result["sides"]["b"]["environment"]["paddle"] == "3.3.1"
    grad_probs = result["tensors"][2]
    assert grad_probs["a"]["dtype"] == "float32" and grad_probs["a"]["shape"] == [64, 1]
    # both sides consumed the same input bits, and each recorded them
    megatron, paddle = Dump.read(tmp_path / "dumps" / "megatron"), Dump.read(tmp_path / "dumps" / "paddle")
    assert megatron.meta["inputs"] == paddle.meta["inputs"] and set(megatron.meta["inputs"]) == {"x", "probs", "grad_out"}
    printed = capsys.readouterr().out
    assert "PASS" in printed and f"HTML report: {tmp_path / 'html' / 'case.html'}" in printed
    assert "weighted_bias_swiglu_impl" in (tmp_path / "html" / "case.html").read_text()


def test_dump_is_plain_safetensors_with_md5_of_torch_bytes(write_case, tmp_path):
    import torch  # here, not at module level: each test process would import torch to collect this file
    from safetensors.torch import load_file

    path = write_case(CASE.replace("all: bitwise", "all: report"))
    assert main(["run", str(path), "--side", "megatron", "--dump", str(tmp_path / "m")]) == 0
    tensors = load_file(tmp_path / "m" / "tensors.safetensors")
    assert tensors["out"].dtype == torch.bfloat16 and tensors["grad.probs"].dtype == torch.float32
    meta = json.loads((tmp_path / "m" / "meta.json").read_text())
    for entry in meta["tensors"]:
        t = tensors[entry["name"]]
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        assert entry["md5"] == hashlib.md5(raw).hexdigest()
        assert entry["shape"] == list(t.shape)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left behind


def test_bitwise_expectation_fails_and_names_the_tensor(write_case, tmp_path, capsys):
    # grad.probs is a 256-term fp32 sum: Paddle and compiled torch sum in different orders.
    path = write_case(CASE)
    code, result = run_json(["run", str(path)], tmp_path)
    assert code == 1 and not result["passed"]
    failing = [t for t in result["tensors"] if not t["holds"]]
    assert "grad.probs" in [t["name"] for t in failing]
    stats = failing[-1]["stats"]
    assert stats["differing"] > 0 and stats["max_ulp"] >= 1
    assert sum(stats["ulp_histogram"].values()) == stats["elements"]
    out = capsys.readouterr().out
    assert "FAIL" in out and "grad.probs: expected bitwise, but" in out


def test_sides_run_separately_then_compare(write_case, tmp_path):
    path = write_case(CASE.replace("all: bitwise", "all: report"))
    assert main(["run", str(path), "--side", "megatron", "--dump", str(tmp_path / "a")]) == 0
    assert main(["run", str(path), "--side", "paddle", "--dump", str(tmp_path / "b")]) == 0
    code, separate = run_json(["compare", str(tmp_path / "a"), str(tmp_path / "b")], tmp_path)
    assert code == 0
    _, together = run_json(["run", str(path)], tmp_path)
    strip = lambda r: [(t["name"], t["a"], t["b"], t["stats"]) for t in r["tensors"]]  # noqa: E731
    assert strip(separate) == strip(together)

    other = write_case(CASE.replace("seed: 3", "seed: 4").replace("all: bitwise", "all: report"), "other.yaml")
    assert main(["run", str(other), "--side", "paddle", "--dump", str(tmp_path / "c")]) == 0
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "c")]) == 2  # different inputs: refused


def test_megatron_mode_is_applied(write_case, tmp_path):
    """Compiled and eager Megatron differ (one rounding vs one per op): the mode reaches the worker."""
    path = write_case(CASE.replace(
        "  megatron: {framework: megatron, mode: compile}\n  paddle: {framework: paddle, impl: fp32_island}",
        "  compiled: {framework: megatron, mode: compile}\n  eager: {framework: megatron, mode: eager}",
    ).replace("all: bitwise", "all: report"))
    code, result = run_json(["run", str(path)], tmp_path)
    assert code == 0
    assert result["sides"]["b"]["environment"]["compile_stance"] == "force_eager"
    assert result["sides"]["a"]["environment"]["compile_stance"] == "default"
    assert not result["tensors"][0]["bitwise"]


def test_user_function_from_file_matches_builtin(write_case, tmp_path):
    (tmp_path / "mine.py").write_text(
        "import paddle\n"
        "import paddle.nn.functional as F\n"
        "def swiglu(x, bias, probs, options):\n"
        "    gate, linear = paddle.chunk(x.cast('float32'), 2, axis=-1)\n"
        "    return (F.silu(gate) * linear * probs).cast(x.dtype)\n"
    )
    path = write_case(CASE.replace(
        "  megatron: {framework: megatron, mode: compile}\n  paddle: {framework: paddle, impl: fp32_island}",
        "  builtin: {framework: paddle, impl: fp32_island}\n  mine: {framework: paddle, impl: 'mine.py:swiglu'}",
    ))
    code, result = run_json(["run", str(path)], tmp_path)
    assert code == 0, result
    assert all(t["bitwise"] for t in result["tensors"])
    assert result["sides"]["b"]["provenance"].startswith(f"user function {tmp_path / 'mine.py'}:swiglu (sha256 ")


def test_crashing_side_exits_3_with_its_error(write_case, tmp_path, capsys):
    (tmp_path / "bad.py").write_text("def swiglu(x, bias, probs, options):\n    raise RuntimeError('kaboom 42')\n")
    path = write_case(CASE.replace("impl: fp32_island", "impl: 'bad.py:swiglu'"))
    assert main(["run", str(path)]) == 3
    assert "kaboom 42" in capsys.readouterr().out


@pytest.mark.slow  # a Megatron worker of its own (~5 s); Paddle's N/A: test_bad_inputs (fast)
def test_cuda_side_on_a_machine_without_gpu_is_not_available(write_case, tmp_path, capsys, hidden_gpu):
    """The GPU hidden (conftest.hidden_gpu: a pool of its own whose workers start without one), on any machine."""
    path = write_case(CASE.replace("{framework: megatron, mode: compile}", "{framework: megatron, mode: compile, device: cuda}"))
    assert main(["run", str(path), "--side", "megatron", "--dump", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "N/A" in out and "case asks for cuda but torch sees no GPU" in out


def test_version_from_one_place_and_python_dash_m(tmp_path):
    import importlib.metadata
    import subprocess
    import sys

    from harness import __version__

    assert importlib.metadata.version("xfalign") == __version__
    done = subprocess.run([sys.executable, "-m", "harness", "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == f"xfalign {__version__}"
