"""What needs a CUDA GPU (`pytest.mark.gpu`; skipped with the reason where torch sees none: conftest.cuda_missing,
asked when the first of them is set up, not at collection): the fused Triton digest kernel on the device against
numpy's fast64, a CUDA case's Megatron side run three times in its worker, and a capture of a megatron-core MLP
on the GPU.

    python3 -m pytest -q -m gpu -n 0            # on the GPU machine (scripts/check_fast_digest.py: more, timed)
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from harness.capture import capture
from harness.cli import main
from harness.dtypes import dtype_name
from harness.store.fast_hash import BLOCK, PendingDigest, fast64, stats_mismatches
from harness.store.stats import tensor_stats
from harness.store.tree import read_tree

# In-process torch: the test process that imports it for the other framework tests runs these too.
pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("in_process_frameworks")]

ROOT = Path(__file__).resolve().parent.parent


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    normal = rng.standard_normal
    special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, 3.4e38, -2.5, np.nan], np.float32)
    with np.errstate(over="ignore"):  # 3.4e38 -> fp16 is inf
        return {
            "bf16 [7, 13]": normal((7, 13)).astype(ml_dtypes.bfloat16),
            "bf16 [4096, 1031] (> 1 block, odd)": normal((4096, 1031)).astype(ml_dtypes.bfloat16),
            "bf16 [2*BLOCK+1] (odd bytes)": normal(2 * BLOCK + 1).astype(ml_dtypes.bfloat16),
            "bf16 NaN/Inf spread over blocks": np.where(rng.random(4 * BLOCK + 1) < 0.001,
                                                        rng.choice([np.nan, np.inf, -np.inf], 4 * BLOCK + 1),
                                                        normal(4 * BLOCK + 1)).astype(ml_dtypes.bfloat16),
            "bf16 NaN/Inf/-0/subnormal": special.astype(ml_dtypes.bfloat16),
            "bf16 [1]": np.array([-3.5], ml_dtypes.bfloat16),
            "fp32 [BLOCK*2+3]": normal(BLOCK * 2 + 3).astype(np.float32),
            "fp32 [2048, 4096] (128 blocks)": normal((2048, 4096)).astype(np.float32),
            "fp32 NaN/Inf/-0/subnormal": special,
            "fp32 all NaN": np.full(5, np.nan, np.float32),
            "fp32 all Inf": np.full(7, np.inf, np.float32),
            "fp32 [0, 3] (empty)": np.zeros((0, 3), np.float32),
            "fp16 [3, 65537] (odd bytes)": normal((3, 65537)).astype(np.float16),
            "fp16 [8*BLOCK+3] (odd bytes)": normal(8 * BLOCK + 3).astype(np.float16),
            "fp16 NaN/Inf/-0": special.astype(np.float16),
            "fp16 [] (scalar)": np.array(1.5, np.float16),
            "fp64 [3, BLOCK+1] (6 blocks)": normal((3, BLOCK + 1)),
            "fp64 NaN/Inf/-0": special.astype(np.float64),
            "int32 [3, 5, 11]": rng.integers(-2**31, 2**31 - 1, size=(3, 5, 11), dtype=np.int32),
            "int32 [4*BLOCK+5] with extremes": np.concatenate([rng.integers(-2**31, 2**31 - 1, 4 * BLOCK - 2, np.int32),
                                                               np.array([-2**31, 2**31 - 1, 0, -1, 1, -2**30, 7], np.int32)]),
            "int64 [99999]": rng.integers(-2**63, 2**63 - 1, size=99999, dtype=np.int64),
            "int64 extremes": np.array([-2**63, 2**63 - 1, 0, -1, 1, -2**62, 2**62 + 12345, -7], np.int64),
            "int64 [] (scalar)": np.array(-3, np.int64),
            "bool [77] (odd bytes)": rng.random(77) > 0.5,
            "bool [4*BLOCK+3]": rng.random(4 * BLOCK + 3) > 0.5,
        }


def device_cases(torch) -> list[tuple[str, object, np.ndarray]]:
    """(label, CUDA tensor, numpy array of its bytes): the arrays, views at 1 to 3 bytes off a 4-byte boundary
    on the device, and a transposed (not contiguous) one."""
    from harness.frameworks.torch import TorchAdapter

    adapter = TorchAdapter()
    cases = [(label, adapter.to_tensor(array, "cuda", False), array) for label, array in arrays().items()]
    rng = np.random.default_rng(1)
    bf16 = rng.standard_normal(41).astype(ml_dtypes.bfloat16)
    cases.append(("bf16 [40] view at byte offset 2", adapter.to_tensor(bf16, "cuda", False)[1:], bf16[1:]))
    flags = rng.random(4 * BLOCK + 9) > 0.5
    for offset in (1, 2, 3):
        cases.append((f"bool view at byte offset {offset} (odd bytes)", adapter.to_tensor(flags, "cuda", False)[offset:],
                      flags[offset:]))
    fp16 = rng.standard_normal(4 * BLOCK + 3).astype(np.float16)
    cases.append(("fp16 view at byte offset 2", adapter.to_tensor(fp16, "cuda", False)[1:], fp16[1:]))
    matrix = rng.standard_normal((33, 65)).astype(np.float32)
    cases.append(("fp32 [65, 33] transposed", adapter.to_tensor(matrix, "cuda", False).t(), matrix.T))
    assert all(tensor.is_cuda for _, tensor, _ in cases)
    return cases


# The kernel's settings (harness.frameworks.triton_digest): the defaults; small tiles over a capped grid of
# programs whose partial rows the last program combines in passes of 4.
SETTINGS = {"default": {}, "many programs": {"ROWS": 2, "WARPS": 1, "SINGLE_PROGRAM_TILES": 1, "MAX_PROGRAMS": 9,
                                             "REDUCE_ROWS": 4}}


@pytest.mark.parametrize("setting", SETTINGS)
def test_fused_digest_kernel_equals_numpy_fast64_on_the_device(torch, setting, monkeypatch):
    from harness.frameworks import triton_digest

    if not triton_digest.importable():
        pytest.skip("triton cannot be imported: the fused digest kernel is a Triton kernel")
    for name, value in SETTINGS[setting].items():
        monkeypatch.setattr(triton_digest, name, value)
    cases = device_cases(torch)
    handles = [triton_digest.fused_device_digest(tensor) for _, tensor, _ in cases]
    torch.cuda.synchronize()
    wrong = []
    for (label, _, array), handle in zip(cases, handles, strict=True):
        assert handle.is_cuda and handle.dtype == torch.float64, label
        work = PendingDigest(dtype_name(array.dtype), tuple(array.shape), array.nbytes, handle)
        work.settle(handle.cpu().numpy())
        entry = work.result()
        with np.errstate(over="ignore", invalid="ignore"):  # numpy's stats meet inf - inf
            expected, stats = fast64(np.asarray(array)), tensor_stats(np.ascontiguousarray(array))
        if entry["fast64"] != expected:
            wrong.append(f"{label}: fast64 {entry['fast64']}, numpy {expected}")
        # a mean's sum may cancel (int64 extremes: 2**63 - 1 and -2**63): its error is relative to the largest value
        for key in stats_mismatches(entry["stats"], stats, entry["dtype"]):
            wrong.append(f"{label}: {key} {entry['stats'][key]}, numpy {stats[key]}")
    assert not wrong, f"{torch.cuda.get_device_name()}, settings {setting}:\n" + "\n".join(wrong)


# Two built-in GPU cases: a compiled SwiGLU (one case) and ColumnParallelLinear in an nccl group (3 sweep points).
GPU_CASES = {"swiglu_plain": 1, "linear": 3}


@pytest.mark.parametrize("name", GPU_CASES)
def test_cuda_case_megatron_side_gives_one_digest_set_over_three_runs(name, tmp_path, capsys):
    path, dump = ROOT / "cases" / "gpu" / f"{name}.yaml", tmp_path / "dump"
    code = main(["run", str(path), "--side", "megatron", "--dump", str(dump), "--repeat", "3"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    metas = sorted(dump.rglob("meta.json"))
    assert len(metas) == GPU_CASES[name], metas
    for meta_path in metas:
        meta = json.loads(meta_path.read_text())
        point = meta["case_name"]
        assert "unavailable" not in meta, (point, meta.get("unavailable"))
        assert meta["environment"]["environment_class"].startswith("cuda-"), (point, meta["environment"])
        names = [entry["name"] for entry in meta["tensors"]]
        assert names and sorted(meta["repeats"]) == sorted(names), point
        for tensor, md5s in meta["repeats"].items():
            assert len(md5s) == 3 and None not in md5s, (point, tensor, md5s)
            assert len(set(md5s)) == 1, f"{point}: {tensor} gave {len(set(md5s))} digests in 3 runs"


def test_megatron_mlp_capture_on_cuda_records_every_tensor(torch, tmp_path):
    """A megatron-core MLP (ColumnParallelLinear -> bias SwiGLU, eager -> RowParallelLinear, bf16, TP=1 in a
    one-process nccl group) captured on the GPU over one step, in full and in digest mode with the fast hash:
    every tensor of every record is in the tree (stored in full; a fast64 computed on the device in digest
    mode), and each fast64 is numpy's of the full capture's bytes (the same step again)."""
    pytest.importorskip("megatron.core")
    import torch.nn.functional as F
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from megatron.core.transformer.transformer_config import TransformerConfig

    from harness.frameworks.megatron_group import one_process_group

    with one_process_group("cuda"), torch.compiler.set_stance("force_eager"):
        tensor_parallel.random.model_parallel_cuda_manual_seed(0)
        config = TransformerConfig(num_layers=1, hidden_size=256, ffn_hidden_size=512, num_attention_heads=4,
                                   gated_linear_unit=True, activation_func=F.silu, add_bias_linear=True,
                                   bias_activation_fusion=True, bf16=True, params_dtype=torch.bfloat16,
                                   use_cpu_initialization=True, hidden_dropout=0.0, gradient_accumulation_fusion=False)
        model = MLP(config, MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)).cuda()
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(64, 2, 256, generator=generator).to("cuda", torch.bfloat16)
        grad = torch.randn(64, 2, 256, generator=generator).to("cuda", torch.bfloat16)
        for folder, mode, hash_ in (("full", "full", "md5"), ("fast", "digest", "fast")):
            model.zero_grad(set_to_none=True)
            with capture(model, tmp_path / folder, mode=mode, hash=hash_, provenance="tests/test_gpu.py") as cap:
                output, bias = model(x.clone().requires_grad_())
                (output if bias is None else output + bias).backward(grad)
                cap.step()

    full, fast = read_tree(tmp_path / "full").step(0), read_tree(tmp_path / "fast").step(0)
    for step in (full, fast):
        records = step.meta["capture"]["records"]
        names = [name for record in records for name in record["tensors"]]
        assert step.order == names and len(set(names)) == len(names)
        assert {m["name"] for m in step.meta["capture"]["modules"]} == {"(root)", "linear_fc1", "linear_fc2"}
        phases = {(r["module"], r["phase"]) for r in records}
        assert phases >= {(module, phase) for module in ("(root)", "linear_fc1", "linear_fc2") for phase in ("forward", "backward")}
        assert phases >= {(module, phase) for module in ("linear_fc1", "linear_fc2") for phase in ("params", "grads")}
        assert "capture" not in step.meta.get("notes", {}), step.meta["notes"]  # no tensor left out
        assert set(step.digests) == set(names)
    assert full.order == fast.order
    assert set(full.tensors) == set(full.order) and not fast.tensors  # full: every tensor's bytes; digest: none
    assert len(full.order) >= 20, full.order
    input_bits = full.tensors["(root)#0:input.0"].view(np.uint16)
    assert np.array_equal(input_bits, x.cpu().view(torch.int16).numpy().view(np.uint16))
    differ = [name for name in full.order if fast.unstored[name]["fast64"] != fast64(np.asarray(full.tensors[name]))]
    assert not differ, f"{len(differ)} of {len(full.order)} fast64s differ from numpy's of the full capture: {differ}"


def test_capture_of_a_gpu_model_lowers_the_switch_interval_while_entered(torch, tmp_path):
    """While a capture of a CUDA model is entered, the interpreter switches threads at least every
    SWITCH_INTERVAL (the training thread launches the digests); the interval before is back once the last of two
    nested captures has ended, and after a capture that failed."""
    import sys

    from harness.capture import api

    before = sys.getswitchinterval()
    model = torch.nn.Linear(8, 8).cuda()
    with capture(model, tmp_path / "a", mode="digest", hash="fast"):
        assert sys.getswitchinterval() == min(api.SWITCH_INTERVAL, before)
        with capture(torch.nn.Linear(8, 8).cuda(), tmp_path / "b", mode="digest", hash="fast"):
            pass
        assert sys.getswitchinterval() == min(api.SWITCH_INTERVAL, before)
    assert sys.getswitchinterval() == before
    with pytest.raises(RuntimeError, match="stop"), capture(model, tmp_path / "c", mode="digest", hash="fast"):
        raise RuntimeError("stop")
    assert sys.getswitchinterval() == before
