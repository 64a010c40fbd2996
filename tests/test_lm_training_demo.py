"""The training demo (examples/lm_training): a megatron-core language model and its Paddle counterparts trained
with AdamW, both captured with their optimizer steps and compared as trajectories, at a reduced size (128 tokens,
3 steps); and the Paddle ops that give torch's CPU bits (torch_exact.py), each against torch itself. The full
demo (1024 tokens, 10 steps) is @slow."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.machine import cpu_isa, cpu_model

pytest.importorskip("paddle", reason="the demo's Paddle side needs paddle")
pytestmark = pytest.mark.xdist_group("in_process_frameworks")

# torch_exact.py reproduces the kernels torch's CPU build runs on an AVX2 CPU (MKL's sgemm blocking and VML,
# Sleef's FMA build, the compiler's FMA contractions). Checked on AMD EPYC CPUs with AVX2 only and with AVX-512 (torch's
# CPU capability AVX512; MKL_VERBOSE names no AVX-512 path of MKL there: the same bits, 2026-12-02); an Intel CPU with
# AVX-512, where MKL may take its AVX-512 kernels, is not checked
avx2_kernels = pytest.mark.skipif(cpu_isa() != "avx2" and not (cpu_model() or "").startswith("AMD"),
                                  reason=f"the reproduced kernels are checked on AVX2 CPUs and AMD's; this CPU: {cpu_model()} {cpu_isa()}")

DEMO = Path(__file__).resolve().parent.parent / "examples" / "lm_training"
sys.path.insert(0, str(DEMO))


def _sizes():
    from lm_setup import Sizes

    return Sizes(seq=32, batch=4, steps=3)


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """Megatron's run captured as fast digests, and the matched Paddle variants' runs captured in full, from the
    same starting weights."""
    import run_lm_demo

    out = tmp_path_factory.mktemp("lm")
    start, log = run_lm_demo.train_megatron(out / "megatron", _sizes())
    for variant in ("matched_all", "matched_layers"):
        run_lm_demo.train_paddle(out / f"paddle-{variant}", variant, start, _sizes())
    return out, start, log


def _trajectory(out: Path, variant: str):
    import run_lm_demo

    from harness.capture.mapping import load_map
    from harness.compare.trajectory import trajectory_of
    from harness.compare.tree import compare_trees

    result = compare_trees(out / "megatron", out / f"paddle-{variant}", load_map(run_lm_demo.MAPS[variant]))
    return result, trajectory_of(result.steps)


def test_megatron_side_trains(trees):
    _, _, log = trees
    assert len(log) == 3 and all(math.isfinite(step["loss"]) for step in log)
    assert log[0]["lr"] == 0.0 and log[1]["lr"] > 0  # megatron-core's scheduler: warmup from 0
    assert log[0]["grad_norm"] > 1.0  # the clip acts in the first steps (init std 0.05)


@avx2_kernels
def test_matched_all_follows_megatron_bitwise_every_step(trees):
    """Layers, AdamW and clip in torch's and Megatron's bits: every tensor of every step bitwise equal, the
    optimizer's states, the updated weights and the grad norm Megatron reports included; nothing left out."""
    out, _, _ = trees
    result, trajectory = _trajectory(out, "matched_all")
    assert [step.kind for step in trajectory.steps] == ["equal"] * 3
    for step in result.steps:
        assert not step.left_out
        names = {r.name for r in step.comparison.tensors}
        assert {"embedding.word_embeddings:exp_avg.weight", "decoder.layers.1.mlp.linear_fc1:exp_avg_sq.weight",
                "output_layer:updated.weight", "(train):grad_norm.reported", "(train):loss.0",
                "decoder.layers.0.mlp.linear_fc1#0:output.0"} <= names
        assert step.loss_a.digest == step.loss_b.digest
    assert all(s.compared == trajectory.steps[0].compared > 90 for s in trajectory.steps)


@avx2_kernels
def test_matched_layers_first_diverges_at_the_clip_of_step_0(trees):
    """Forward, backward and gradients bitwise (the same layers); Paddle's ClipGradByGlobalNorm scales by
    clip / max(norm, clip) with its own norm where Megatron takes clip / (norm + 1e-6): the first tensor to
    differ is the first gradient the optimizer consumed, in step 0's optimizer phase."""
    out, _, _ = trees
    result, trajectory = _trajectory(out, "matched_layers")
    first = trajectory.first_divergent
    assert first.index == 0 and first.kind == "diverges"
    assert (first.divergence.name, first.divergence.phase) == ("embedding.word_embeddings:grad_clipped.weight", "optimizer")
    step0 = result.steps[0]
    assert all(result.pair.bitwise for view in step0.records if view.phase != "optimizer" for result in view.tensors)
    assert step0.loss_a.digest == step0.loss_b.digest
    moment = next(r for r in step0.comparison.tensors if r.name == "embedding.word_embeddings:exp_avg.weight")
    assert not moment.pair.bitwise


def test_released_layers_first_diverge_in_the_first_norm(trees):
    """PaddleFormers' own layers: the embedding's output is bitwise (a gather), the first RMSNorm's output is
    not (Paddle's mean and rsqrt are not torch's)."""
    import paddle_lm
    import run_lm_demo

    try:
        paddle_lm.paddleformers_config(_sizes())
    except ImportError as error:
        pytest.skip(str(error))
    out, start, _ = trees
    run_lm_demo.train_paddle(out / "paddle-released", "released", start, _sizes())
    result, trajectory = _trajectory(out, "released")
    first = trajectory.first_divergent
    assert first.index == 0
    assert (first.divergence.name, first.divergence.phase) == ("decoder.layers.0.pre_mlp_layernorm#0:output.0", "forward")
    results = {r.name: r.pair for r in result.steps[0].comparison.tensors}
    assert results["embedding.word_embeddings#0:output.0"].bitwise
    assert results["decoder.layers.0.mlp.linear_fc1:param.weight"].bitwise  # the weights went in bit for bit


def test_bf16_paddle_side_is_not_available():
    """Megatron trains in bf16 on CPU; Paddle 3.3.1 has no CPU bf16 matmul or adamw kernel."""
    import run_lm_demo

    lines = run_lm_demo.bf16_report(_sizes())
    losses = [float(x) for x in lines[0].split("losses ")[1].split()]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert "N/A" in lines[1] and "kernel `matmul` is not registered" in lines[1]
    assert "N/A" in lines[2] and "kernel `adamw` is not registered" in lines[2]


# --- torch_exact against torch ------------------------------------------------------------------------------------

def _bits(array) -> np.ndarray:
    return np.asarray(array, dtype=np.float32).view(np.uint32)


def _differ(a, b) -> int:
    return int(np.count_nonzero(_bits(a) != _bits(b)))


@avx2_kernels
@pytest.mark.parametrize("m, k, n", [(96, 64, 80), (64, 200, 32), (32, 300, 16), (16, 1000, 24)])
def test_mm_is_torch_matmul(m, k, n):
    """One FMA chain per K block (one block to 192, two halves to 384, blocks of 192 beyond): MKL's sgemm here."""
    import paddle
    import torch
    import torch_exact as T

    rng = np.random.default_rng(k)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    mine = T.mm(paddle.to_tensor(a), paddle.to_tensor(b)).numpy()
    assert _differ(mine, torch.from_numpy(a) @ torch.from_numpy(b)) == 0
    assert _differ(paddle.matmul(paddle.to_tensor(a), paddle.to_tensor(b)).numpy(), torch.from_numpy(a) @ torch.from_numpy(b)) > 0


@avx2_kernels
def test_sums_exp_and_vml_are_torchs():
    import paddle
    import torch
    import torch_exact as T

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 200)) * rng.uniform(0.01, 10, (64, 200))).astype(np.float32)
    t = torch.from_numpy(x)
    assert _differ(T.inner_sum(paddle.to_tensor(x)).numpy(), t.sum(-1, keepdim=True)) == 0
    assert _differ(T.full_sum(paddle.to_tensor(x[:5])).numpy(), t[:5].sum()) == 0
    assert _differ(T.outer_sum(paddle.to_tensor(x[:, :64])).numpy(), t[:, :64].sum(0)) == 0
    y = rng.uniform(-30, 10, 1 << 14).astype(np.float32)
    assert _differ(T.silu(paddle.to_tensor(y)).numpy(), torch.nn.functional.silu(torch.from_numpy(y))) == 0
    assert _differ(T.vml_exp(paddle.to_tensor(y)).numpy(), torch.exp(torch.from_numpy(y))) == 0
    positive = np.abs(y) + np.float32(1e-3)
    assert _differ(T.vml_log(paddle.to_tensor(positive)).numpy(), torch.log(torch.from_numpy(positive))) == 0
    assert _differ(T.vml_sqrt(paddle.to_tensor(positive)).numpy(), torch.sqrt(torch.from_numpy(positive))) == 0
    # torch.exp and torch.sqrt are MKL's, not Sleef's nor correctly rounded: the difference the VML calls remove
    assert _differ(T.exp(paddle.to_tensor(y)).numpy(), torch.exp(torch.from_numpy(y))) > 0
    assert _differ(T.sqrt(paddle.to_tensor(positive)).numpy(), torch.sqrt(torch.from_numpy(positive))) > 0


@avx2_kernels
@pytest.mark.parametrize("size", [8, 9, 11, 12, 15, 64, 8192])
def test_norm2_is_torch_norm(size):
    """Vectorized lanes, then the scalar tail: its first 4 elements multiply then add, the rest are FMAs."""
    import paddle
    import torch
    import torch_exact as T

    rng = np.random.default_rng(size)
    bad = 0
    for _ in range(50 if size < 100 else 3):
        x = (rng.standard_normal(size) * rng.uniform(1e-4, 1)).astype(np.float32)
        bad += _differ(T.norm2(paddle.to_tensor(x)).numpy(), torch.norm(torch.from_numpy(x)))
    assert bad == 0


@avx2_kernels
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_step_is_torch_adamw(weight_decay):
    import paddle
    import torch
    import torch_exact as T

    rng = np.random.default_rng(1)
    start = (rng.standard_normal((64, 48)) * 0.02).astype(np.float32)
    param = torch.nn.Parameter(torch.from_numpy(start.copy()))
    optimizer = torch.optim.AdamW([param], lr=1e-2, weight_decay=weight_decay)
    mine, m, v = paddle.to_tensor(start), paddle.zeros([64, 48]), paddle.zeros([64, 48])
    for step, lr in enumerate([0.0, 5e-3, 1e-2, 9e-3], 1):
        grad = (rng.standard_normal((64, 48)) * 1e-3).astype(np.float32)
        optimizer.param_groups[0]["lr"] = lr
        param.grad = torch.from_numpy(grad.copy())
        optimizer.step()
        mine, m, v = T.adamw_step(mine, paddle.to_tensor(grad), m, v, step, lr, 0.9, 0.999, 1e-8, weight_decay)
        state = optimizer.state[param]
        assert _differ(mine.numpy(), param.detach()) == 0
        assert _differ(m.numpy(), state["exp_avg"]) == _differ(v.numpy(), state["exp_avg_sq"]) == 0


@pytest.mark.slow
@avx2_kernels
def test_demo_script_runs(tmp_path, capsys):
    """The full demo: 1024 tokens, 10 steps, every variant (about 4 minutes on 2 cores, 450 MB of trees): the
    README's table."""
    import run_lm_demo

    assert run_lm_demo.main(["--out", str(tmp_path), "--no-bf16"]) == 0
    assert "PASS megatron vs paddle-matched_all: 10 steps compared, 10 pass" in capsys.readouterr().out
    _, trajectory = _trajectory(tmp_path, "matched_all")
    assert [step.kind for step in trajectory.steps] == ["equal"] * 10
    _, trajectory = _trajectory(tmp_path, "matched_layers")
    first = trajectory.first_divergent
    assert (first.index, first.divergence.name) == (0, "embedding.word_embeddings:grad_clipped.weight")
    assert [step.loss_a.digest == step.loss_b.digest for step in trajectory.steps] == [True, True] + [False] * 8
    _, trajectory = _trajectory(tmp_path, "released")
    first = trajectory.first_divergent
    assert (first.index, first.divergence.name) == (0, "decoder.layers.0.pre_mlp_layernorm#0:output.0")
