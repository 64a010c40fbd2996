"""replay(..., exact=True): the replayed module of each side run in float64 on A's captured inputs, and which
side's output is closer to exact (harness.capture.replay_exact). Real megatron-core, torch and Paddle, the MLP
demo's models (examples/mlp_alignment); every tree in a temporary folder."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.xdist_group("in_process_frameworks")

DEMO = Path(__file__).resolve().parent.parent / "examples" / "mlp_alignment"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo's modules: run_demo, its map, and A's capture (Megatron bf16, eager bias SwiGLU)."""
    sys.path.insert(0, str(DEMO))
    import run_demo

    from harness.capture.mapping import load_map

    return run_demo, load_map(DEMO / "map.yaml"), run_demo.capture_megatron(tmp_path_factory.mktemp("exact") / "a", eager=True)


def _paddle_mlp(demo, variant: str):
    """The demo's Paddle MLP (`variant`) with A's captured weights, through the map."""
    run_demo, tensor_map, tree_a = demo
    import paddle_mlp

    weights = run_demo.paddle_weights_from(tree_a, tensor_map)
    model = paddle_mlp.build_paddle_mlp(*weights["gate_proj.weight"].shape, variant)
    paddle_mlp.load_parameters(model, weights)
    return model


def _mlp_float64(arrays: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """MLPBlock in numpy float64: fc1 (weight rows gate then up) + bias, silu(gate) * up, fc2 + bias."""
    wide = {name: np.asarray(array).astype(np.float64) for name, array in arrays.items()}
    y = x.astype(np.float64) @ wide["mlp.linear_fc1:param.weight"].T + wide["mlp.linear_fc1:param.bias"]
    gate, up = np.split(y, 2, axis=-1)
    hidden = gate / (1 + np.exp(-gate)) * up
    return hidden @ wide["mlp.linear_fc2:param.weight"].T + wide["mlp.linear_fc2:param.bias"]


def test_float64_replay_equals_an_independent_float64_computation(demo):
    """(root) replayed in float64: A's float64 copy gives numpy's float64 MLP of A's captured input and parameters
    (to float64 rounding), B's agrees with it, and each side's error is the one measured against numpy's value.
    The user's modules keep their dtype and bits."""
    run_demo, tensor_map, tree_a = demo
    import paddle_mlp

    from harness.capture.replay import replay
    from harness.compare.exact import error_to_exact

    model_b = _paddle_mlp(demo, "fused_bias_swiglu")

    arrays = run_demo.a_arrays(tree_a)
    expected = _mlp_float64(arrays, arrays["(root)#0:input.0"])
    b_before = paddle_mlp.parameters_numpy(model_b)
    with run_demo.megatron_model(tree_a) as model_a:
        import megatron_mlp

        a_before = megatron_mlp.parameters_numpy(model_a)
        result = replay(model_b, tree_a, "(root)", tensor_map, exact=True, model_a=model_a)
        a_after = megatron_mlp.parameters_numpy(model_a)
    exact = result.exact
    assert exact is not None and exact.reference == "A" and exact.not_run == {} and exact.notes == []
    (output,) = exact.outputs
    assert output.name == "(root)#0:output.0" and output.pair is result.outputs[0]
    got = exact.values["(root)#0:output.0"]
    assert got.dtype == np.float64 and got.shape == expected.shape
    # two float64 computations of sums over 64 and 128 terms: far below bf16's 2**-8, at float64's level
    assert np.max(np.abs(got - expected)) <= 1e-13 * np.max(np.abs(expected))
    independent = error_to_exact(arrays["(root)#0:output.0"], expected)
    assert output.exact.a.max_ulp == independent.max_ulp
    assert output.exact.a.normwise_u == pytest.approx(independent.normwise_u, rel=1e-9)
    # B's float64 copy computes in fp32 inside (paddle_mlp casts to fp32): far within 1/16 of bf16's u
    assert output.agree and output.spread_u < 1e-3
    for before, after in ((a_before, a_after), (b_before, paddle_mlp.parameters_numpy(model_b))):
        assert {n: (v.dtype, v.tobytes()) for n, v in before.items()} == {n: (v.dtype, v.tobytes()) for n, v in after.items()}


def test_bias_on_one_side_only_shows_as_different_functions(demo):
    """linear_fc1 against the per_op variant's gate_proj/up_proj, which add their bias (Megatron's hands it on):
    the float64 copies compute different functions, said so, and A is closer to A's function."""
    run_demo, tensor_map, tree_a = demo
    from harness.capture.replay import replay
    from harness.reports.text import exact_replay_lines

    per_op = _paddle_mlp(demo, "per_op")
    with run_demo.megatron_model(tree_a) as model_a:  # A's module itself, not its model: taken as it is
        result = replay(run_demo.modules_of(per_op, "mlp.linear_fc1", tensor_map), tree_a, "mlp.linear_fc1", tensor_map,
                        exact=True, model_a=model_a.mlp.linear_fc1)
    assert result.exact.reference == "A" and result.exact.notes == []  # A's captured parameters found and loaded
    (output,) = result.exact.outputs
    assert output.closer == "A" and output.agree is False and output.spread_u > 1
    assert "different functions" in exact_replay_lines(result.exact)[1]


class _RoundsHidden:
    """The Paddle MLP in fp32 (layer_fp32, so no rounding of its own) that rounds silu(gate) * up to bf16
    before down_proj: one deliberate early rounding."""

    @staticmethod
    def build(hidden: int, ffn: int):
        import paddle
        import paddle.nn.functional as F
        import paddle_mlp

        class RoundsHidden(paddle_mlp.PaddleMLP):
            def forward(self, x):
                hidden = F.silu(self.gate_proj(x)) * self.up_proj(x)
                return self.down_proj(hidden.cast(paddle.bfloat16).cast(x.dtype))

        paddle.set_device("cpu")
        return RoundsHidden(hidden, ffn, "float32", "layer_fp32")


@pytest.mark.parametrize("seed", [0, 7])
def test_a_side_made_less_accurate_is_farther_from_exact(tmp_path, seed):
    """fp32 Megatron (A) against a Paddle fp32 MLP that rounds its hidden activation to bf16. B's output carries
    that bf16 rounding (bf16's u is 2**16 fp32 u's) through down_proj, A's only fp32 roundings (sums of 64 and 128
    terms, about 1u normwise), so B is farther by normwise error by thousands, and in most elements (on
    2026-12-01, AMD EPYC 2-core AVX2, torch 2.13.0+cpu, megatron-core 0.16.1, paddle 3.3.1, over seeds 0-19:
    A 0.87-1.25u, B 4,400-8,200u, ratio 5,000-6,800; B closer in at most 1 of 2,048 elements): the bound
    1000x holds with room. B's float64 copy keeps its cast to bf16, so the copies disagree: A's float64
    output is the exact one."""
    sys.path.insert(0, str(DEMO))
    import megatron_mlp as M
    import paddle_mlp
    import run_demo
    import torch

    from harness.capture import capture
    from harness.capture.mapping import load_map
    from harness.capture.replay import replay
    from harness.reports.text import exact_replay_lines

    tensor_map = load_map(DEMO / "map.yaml")
    with M.megatron_group("cpu"):
        model_a = M.build_megatron_mlp(dtype=torch.float32, seed=seed)
        with capture(model_a, tmp_path / "a", side="megatron-fp32") as cap:
            M.megatron_step(model_a, M.demo_inputs(seed=seed + 1, dtype=torch.float32), eager=True)
            cap.step()
        weights = run_demo.paddle_weights_from(tmp_path / "a", tensor_map)
        model_b = _RoundsHidden.build(M.HIDDEN, M.FFN)
        paddle_mlp.load_parameters(model_b, weights)
        result = replay(model_b, tmp_path / "a", "(root)", tensor_map, exact=True, model_a=model_a)
    (output,) = result.exact.outputs
    a, b = output.exact.a, output.exact.b
    assert result.exact.reference == "A" and output.closer == "A"
    assert b.normwise_u > 1000 * a.normwise_u  # bf16 rounding (u_bf16 = 2**16 u_fp32) against fp32 roundings
    assert output.exact.closeness.a_closer > output.exact.closeness.b_closer
    assert output.agree is False  # B's float64 copy rounds to bf16 too
    assert "A is closer" in exact_replay_lines(result.exact)[1]


class _LogLoss:
    """A module whose Paddle side has no float64 kernel on the CPU: Paddle's `log_loss` (float32 only), and the
    same formula in torch: -y log(p + eps) - (1 - y) log(1 - p + eps), p = sigmoid(x @ w)."""

    EPS = 1e-4

    @staticmethod
    def torch_module(weight: np.ndarray):
        import torch

        class LogLoss(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.from_numpy(weight.copy()))

            def forward(self, x, y):
                p = torch.sigmoid(x @ self.weight)
                return -y * torch.log(p + _LogLoss.EPS) - (1 - y) * torch.log(1 - p + _LogLoss.EPS)

        return LogLoss()

    @staticmethod
    def paddle_module(weight: np.ndarray):
        import paddle
        import paddle.nn.functional as F

        class LogLoss(paddle.nn.Layer):
            def __init__(self):
                super().__init__()
                self.weight = self.create_parameter(list(weight.shape), dtype="float32")
                self.weight.set_value(paddle.to_tensor(weight))

            def forward(self, x, y):
                return F.log_loss(F.sigmoid(paddle.matmul(x, self.weight)), y, epsilon=_LogLoss.EPS)

        return LogLoss()


def test_a_float64_copy_that_cannot_run_is_na_with_the_reason(tmp_path):
    """Paddle's log_loss has no float64 CPU kernel: B's float64 copy is N/A, said why. Without A's module too,
    every output is N/A; with it, A's float64 output is exact and both sides are measured against it."""
    import torch

    from harness.capture import capture
    from harness.capture.replay import replay
    from harness.reports.text import exact_replay_lines

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((16, 1)) * 0.5).astype(np.float32)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    y = (rng.random((8, 1)) < 0.5).astype(np.float32)
    model_a, model_b = _LogLoss.torch_module(weight), _LogLoss.paddle_module(weight)
    with capture(model_a, tmp_path / "a") as cap:
        model_a(torch.from_numpy(x), torch.from_numpy(y)).sum().backward()
        cap.step()

    alone = replay(model_b, tmp_path / "a", "(root)", exact=True)
    assert alone.verdict in ("inherited", "differs")  # the fp32 replay itself runs
    exact = alone.exact
    assert exact.reference is None and set(exact.not_run) == {"A", "B"}
    assert "model_a" in exact.not_run["A"] and "log_loss" in exact.not_run["B"] and "float64" in exact.not_run["B"]
    assert all(output.exact.missing and output.closer is None for output in exact.outputs)
    (line,) = exact_replay_lines(exact)
    assert line.startswith("float64 replay of (root): n/a (side A: ") and "log_loss" in line

    with_a = replay(model_b, tmp_path / "a", "(root)", exact=True, model_a=model_a).exact
    assert with_a.reference == "A" and list(with_a.not_run) == ["B"]
    (output,) = with_a.outputs
    assert output.exact.a is not None and output.exact.b is not None and output.closer is not None
    assert output.spread is None and output.spread_missing == "side B's float64 copy did not run"
    lines = exact_replay_lines(with_a)
    assert "side B's float64 copy n/a" in lines[0] and "float64 copies not compared" in lines[1]
    assert model_a.weight.dtype == torch.float32 and str(model_b.weight.dtype) == "paddle.float32"


@pytest.mark.slow
def test_demo_prints_which_side_is_closer(tmp_path, capsys):
    """run_demo.py replays in float64 too: against eager Megatron, the fused variant's (root) output (one
    rounding of the bias SwiGLU against one per op) is the closer one (README's table)."""
    sys.path.insert(0, str(DEMO))
    import run_demo

    assert run_demo.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    eager_fused = out[out.index("megatron eager vs paddle fused_bias_swiglu"):]
    assert "float64 replay of (root) on (root): exact = side A's module in float64" in eager_fused
    assert "B is closer (normwise); float64 copies agree" in eager_fused
