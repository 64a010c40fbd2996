"""Capture inside real models (harness.capture.api): torch modules, a megatron-core ColumnParallelLinear and
a Paddle layer; record order, call counts, gradients against hand-computed values, the three modes, hooks
removed, the tree on disk and its reader."""

import json

import numpy as np
import pytest
import yaml

from harness.capture import capture
from harness.capture.api import CaptureError
from harness.store.digest import Digest
from harness.store.dump import DumpTargetError
from harness.store.tree import TreeError, read_tree
from harness.store.tree_format import TensorName

# torch, paddle and megatron-core are imported by the first test that needs them, not at collection (see
# tests/test_rmsnorm.py); the group keeps the in-process framework tests in one test process.
pytestmark = pytest.mark.xdist_group("in_process_frameworks")


def integers(rng, shape, low=-3, high=4):
    """Small integers as float32: every product and sum below is exact, so hand-computed == autograd."""
    return rng.integers(low, high, size=shape).astype(np.float32)


def torch_model(torch, rng):
    """inner (a Linear) called twice per forward, then head (a Linear): weights of small integers."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(3, 3)
            self.head = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.head(self.inner(self.inner(x)))

    model = Model()
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.from_numpy(integers(rng, tuple(param.shape), -1, 2)))
    return model


def records(dump):
    return [(r["module"], r["call"], r["phase"]) for r in dump.meta["capture"]["records"]]


def test_torch_full_records_in_execution_order_with_call_counts_and_exact_gradients(torch, tmp_path):
    rng = np.random.default_rng(0)
    model = torch_model(torch, rng)
    w_inner, b_inner = model.inner.weight.detach().numpy().copy(), model.inner.bias.detach().numpy().copy()
    w_head, b_head = model.head.weight.detach().numpy().copy(), model.head.bias.detach().numpy().copy()
    x, g = integers(rng, (4, 3)), integers(rng, (4, 2))
    with capture(model, tmp_path / "tree", mode="full") as cap:
        for _ in range(2):
            out = model(torch.from_numpy(x).requires_grad_())
            out.backward(torch.from_numpy(g))
            cap.step()
            with torch.no_grad():  # SGD, lr 1, after step(): step 1 starts from the updated weights
                for param in model.parameters():
                    param -= param.grad
                    param.grad = None

    tree = read_tree(tmp_path / "tree")
    assert tree.steps == ["step-00000", "step-00001"] and tree.ranks == {}
    assert tree.manifest.side == "megatron" and tree.manifest.root == "Model" and tree.manifest.rank is None
    step = tree.step(0)
    assert records(step) == [
        ("inner", None, "params"), ("head", None, "params"),
        ("inner", 0, "forward"), ("inner", 1, "forward"), ("head", 0, "forward"), ("(root)", 0, "forward"),
        # head's output is the model's: its hooks fire in the order they were added (head's first)
        ("head", 0, "backward"), ("(root)", 0, "backward"), ("inner", 1, "backward"), ("inner", 0, "backward"),
        ("inner", None, "grads"), ("head", None, "grads")]
    assert step.order == [n for r in step.meta["capture"]["records"] for n in r["tensors"]]
    assert [m["name"] for m in step.meta["capture"]["modules"]] == ["(root)", "inner", "head"]
    assert step.meta["capture"]["modules"][1]["parent"] == "(root)"
    # forward, by hand: h0 = x W^T + b, h1 = h0 W^T + b, out = h1 Wh^T + bh
    t = step.tensors
    h0 = x @ w_inner.T + b_inner
    h1 = h0 @ w_inner.T + b_inner
    assert np.array_equal(t["inner#0:input.0"], x) and np.array_equal(t["inner#0:output.0"], h0)
    assert np.array_equal(t["inner#1:input.0"], h0) and np.array_equal(t["head#0:output.0"], h1 @ w_head.T + b_head)
    # backward, by hand
    g1 = g @ w_head
    g0 = g1 @ w_inner
    assert np.array_equal(t["(root)#0:grad_output.0"], g) and np.array_equal(t["head#0:grad_output.0"], g)
    assert np.array_equal(t["inner#1:grad_output.0"], g1) and np.array_equal(t["inner#0:grad_output.0"], g0)
    assert np.array_equal(t["head:grad.weight"], g.T @ h1) and np.array_equal(t["head:grad.bias"], g.sum(0))
    assert np.array_equal(t["inner:grad.weight"], g1.T @ h0 + g0.T @ x)
    assert np.array_equal(t["inner:grad.bias"], g1.sum(0) + g0.sum(0))
    # parameters at the start of each step
    assert np.array_equal(t["inner:param.weight"], w_inner)
    assert np.array_equal(tree.step(1).tensors["inner:param.weight"], w_inner - (g1.T @ h0 + g0.T @ x))
    assert step.stats["inner:grad.bias"]["max"] == float((g1.sum(0) + g0.sum(0)).max())
    assert step.meta["framework"] == "megatron" and step.meta["impl"] == "Model" and step.meta["environment"]["torch"]


def test_parameters_are_recorded_as_the_forward_pass_read_them_and_a_change_in_it_is_noted(torch, tmp_path):
    """Parameters are recorded as the forward pass ends (the device busy with the work it queued), not as the step
    begins: the values it read, a module's it never called too. One it changed in place is recorded as it ended,
    and the step's notes name it."""

    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used = torch.nn.Linear(2, 2)
            self.unused = torch.nn.Linear(2, 1)
            self.calls = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            with torch.no_grad():
                self.calls.add_(1)  # an in-place change of a parameter by the forward pass
            return self.used(x) * 2

    model = Counting()
    unused = model.unused.weight.detach().clone()
    with capture(model, tmp_path / "tree", mode="full") as cap:
        for _ in range(2):
            model(torch.ones(3, 2)).sum().backward()
            cap.step()
    tree = read_tree(tmp_path / "tree")
    for index in range(2):
        step = tree.step(index)
        assert records(step)[:3] == [("(root)", None, "params"), ("used", None, "params"), ("unused", None, "params")]
        assert step.tensors["(root):param.calls"].tolist() == [index + 1.0]  # as the forward pass ended
        assert np.array_equal(step.tensors["unused:param.weight"], unused.numpy())
        assert "parameters changed in place since the step began, recorded as the forward pass ended: (root):param.calls" in \
            step.meta["notes"]["capture"]
        assert "used:param" not in step.meta["notes"]["capture"]


def test_digest_mode_stores_nothing_and_its_md5s_are_those_of_the_full_tensors(torch, tmp_path):
    rng = np.random.default_rng(1)
    model = torch_model(torch, rng)
    x = integers(rng, (5, 3))
    for mode in ("full", "digest"):
        with capture(model, tmp_path / mode, mode=mode):
            model(torch.from_numpy(x).requires_grad_()).sum().backward()
        model.zero_grad()
    full, digest = read_tree(tmp_path / "full").step(0), read_tree(tmp_path / "digest").step(0)
    assert len(digest.tensors) == 0 and list(digest.unstored) == digest.order == full.order
    for name, array in full.tensors.items():
        assert digest.unstored[name]["md5"] == Digest.of(array).md5 == full.digests[name].md5
        assert digest.digests[name] == full.digests[name]
        stats = digest.unstored[name]["stats"]
        values = array.astype(np.float64)
        assert stats == full.stats[name]
        assert (stats["min"], stats["max"], stats["nan"], stats["inf"]) == (values.min(), values.max(), 0, 0)
        assert stats["norm"] == pytest.approx(np.linalg.norm(values)) and stats["mean"] == pytest.approx(values.mean())
    assert read_tree(tmp_path / "digest").manifest.mode == "digest"


def test_fast_digests_of_a_cpu_capture_are_numpys_of_the_full_tensors(torch, tmp_path):
    """hash="fast" on the CPU: every tensor's fast64 (the parameters and gradients taken together, the rest one
    by one) is numpy's of the full capture's bytes; the interpreter's switch interval is left as it is (only a GPU
    capture lowers it)."""
    import sys

    from harness.store.fast_hash import fast64

    rng = np.random.default_rng(2)
    model = torch_model(torch, rng)
    x = integers(rng, (5, 3))
    interval = sys.getswitchinterval()
    for mode, hash_ in (("full", "md5"), ("digest", "fast")):
        with capture(model, tmp_path / mode, mode=mode, hash=hash_):
            assert sys.getswitchinterval() == interval
            model(torch.from_numpy(x).requires_grad_()).sum().backward()
        model.zero_grad()
    full, fast = read_tree(tmp_path / "full").step(0), read_tree(tmp_path / "digest").step(0)
    assert fast.order == full.order and any(":param." in n for n in fast.order) and any(":grad." in n for n in fast.order)
    assert {name: fast.unstored[name]["fast64"] for name in fast.order} == \
        {name: fast64(np.asarray(full.tensors[name])) for name in full.order}


def test_stats_count_nan_and_inf_and_skip_them():
    from harness.store.stats import tensor_stats

    stats = tensor_stats(np.array([1.0, np.nan, -np.inf, 3.0, np.inf], dtype=np.float32))
    assert stats == {"min": 1.0, "max": 3.0, "mean": 2.0, "norm": pytest.approx(10 ** 0.5), "nan": 1, "inf": 2}
    assert tensor_stats(np.array([np.nan], dtype=np.float32))["min"] is None


def test_refetch_keeps_the_listed_modules_in_full_and_the_rest_as_digests(torch, tmp_path):
    model = torch_model(torch, np.random.default_rng(2))
    listed = tmp_path / "refetch.yaml"
    listed.write_text(yaml.safe_dump({"megatron": ["head"], "paddle": ["lm_head"]}))  # compare --refetch's form
    for name, refetch in (("list", ["hea?"]), ("file", listed)):
        with capture(model, tmp_path / name, mode="digests-then-full", refetch=refetch):
            model(torch.ones(2, 3)).sum().backward()
        step = read_tree(tmp_path / name).step(0)
        assert sorted(step.tensors) == sorted(n for n in step.order if TensorName.parse(n).module == "head")
        assert "inner#0:output.0" in step.unstored and "head:grad.weight" in step.tensors
    with pytest.raises(CaptureError, match="not of 'other'"):
        capture(model, tmp_path / "x", mode="digests-then-full", refetch=listed, side="other")
    with pytest.raises(CaptureError, match="needs mode"):
        capture(model, tmp_path / "x", mode="digest", refetch=["head"])


def test_selection_by_glob_and_type_and_keyword_inputs(torch, tmp_path):
    model = torch_model(torch, np.random.default_rng(3))
    with capture(model, tmp_path / "glob", modules=["head"]):
        model(torch.ones(2, 3))
    step = read_tree(tmp_path / "glob").step(0)
    assert records(step) == [("head", None, "params"), ("head", 0, "forward")]
    assert step.meta["capture"]["modules"] == [{"name": "head", "type": "Linear", "parent": None}]
    # by type only; a parent selected without its children takes their parameters
    with capture(model, tmp_path / "type", modules=[], types=["Sequential", torch.nn.Linear]):
        model(torch.ones(2, 3))
    assert {m for m, _, _ in records(read_tree(tmp_path / "type").step(0))} == {"inner", "head"}
    with capture(model, tmp_path / "root", modules=["(root)"]):
        model(torch.ones(2, 3))
    assert read_tree(tmp_path / "root").step(0).order[:2] == ["(root):param.inner.weight", "(root):param.inner.bias"]

    class Keywords(torch.nn.Module):
        def forward(self, x, *, scale, pair=()):
            return x * scale, None, (x + pair[0],)  # None entries: not tensors, not numbered

    module = Keywords()
    with capture(module, tmp_path / "kw"):
        module(torch.ones(2), scale=torch.full((2,), 2.0), pair=[torch.ones(2)])
    assert read_tree(tmp_path / "kw").step(0).order == ["(root)#0:input.0", "(root)#0:input.scale",
                                                        "(root)#0:input.pair.0", "(root)#0:output.0", "(root)#0:output.1"]
    # a dtype no dump holds (uint8) is left out, and said so in the step's notes
    with capture(module, tmp_path / "uint8"):
        module(torch.ones(2, dtype=torch.uint8), scale=torch.full((2,), 2.0), pair=[torch.ones(2)])
    step = read_tree(tmp_path / "uint8").step(0)
    assert "(root)#0:input.0" not in step.order and "(root)#0:input.0 (uint8)" in step.meta["notes"]["capture"]


def test_hooks_are_removed_on_exit_and_an_interrupted_step_writes_nothing(torch, tmp_path):
    model = torch_model(torch, np.random.default_rng(4))
    with pytest.raises(RuntimeError, match="boom"):
        with capture(model, tmp_path / "tree", mode="digest") as cap:
            model(torch.ones(2, 3)).sum().backward()
            cap.step()
            out = model(torch.ones(2, 3, requires_grad=True))
            raise RuntimeError("boom")
    assert out._backward_hooks in (None, {}) or len(out._backward_hooks) == 0
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    tree = read_tree(tmp_path / "tree")
    assert tree.steps == ["step-00000"] and sorted(p.name for p in tree.path.iterdir()) == ["capture.json", "step-00000"]
    out.sum().backward()  # the grad hooks are gone: nothing recorded, nothing raised


def test_steps_are_written_by_a_writer_thread_whose_errors_reach_the_training(torch, tmp_path, monkeypatch):
    from harness.store.dump import Dump

    model = torch_model(torch, np.random.default_rng(5))
    with capture(model, tmp_path / "tree", mode="digest") as cap:
        model(torch.ones(2, 3)).sum().backward()
        folder = cap.step()
        cap.flush()  # step() returned before the write; flush() waits for it
        assert folder == tmp_path / "tree" / "step-00000" and read_tree(tmp_path / "tree").steps == ["step-00000"]
    written = []
    original = Dump.write

    def failing_write(self, directory, **options):
        written.append(directory.name)
        if len(written) == 1:
            raise OSError(28, "No space left on device")
        return original(self, directory, **options)

    monkeypatch.setattr(Dump, "write", failing_write)
    with capture(model, tmp_path / "full") as cap:
        model(torch.ones(2, 3)).sum().backward()
        cap.step()  # the write fails on the writer thread: the training goes on ...
        model.zero_grad()
        model(torch.ones(2, 3)).sum().backward()
        with pytest.raises(OSError, match="No space"):
            cap.step()  # ... and the next step() raises it, having written nothing more
        assert written == ["step-00000"]
    written.clear()
    with pytest.raises(RuntimeError, match="boom") as raised:
        with capture(model, tmp_path / "again") as cap:
            model(torch.ones(2, 3)).sum().backward()
            cap.step()
            raise RuntimeError("boom")
    assert raised.value.__notes__ == ["xfalign capture: writing step 0 also failed: [Errno 28] No space left on device"]
    with pytest.raises(OSError, match="No space"):  # the block's end raises a last write's error
        with capture(model, tmp_path / "last") as cap:
            model(torch.ones(2, 3)).sum().backward()
            written.clear()


@pytest.fixture
def synced(monkeypatch) -> list[tuple[str, str]]:
    """Every os.fsync from now on, as (the calling thread's name, the path synced); each still done."""
    import os
    import threading

    found: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        found.append((threading.current_thread().name, os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return found


def test_steps_are_fsynced_when_the_block_ends_not_one_by_one(torch, tmp_path, synced):
    model = torch_model(torch, np.random.default_rng(6))
    with capture(model, tmp_path / "tree", mode="digest") as cap:
        for _ in range(2):
            model(torch.ones(2, 3)).sum().backward()
            cap.step()
            model.zero_grad()
        cap.flush()
        assert read_tree(tmp_path / "tree").steps == ["step-00000", "step-00001"]
        assert not [path for thread, path in synced if "writer" in thread]  # written, not yet fsynced
    after = {path for _, path in synced}
    tree = tmp_path / "tree"
    expected = {str(tree), str(tree / "capture.json")} | {str(path) for step in ("step-00000", "step-00001")
                                                            for path in [tree / step, *(tree / step).iterdir()]}
    assert expected <= after


def test_a_step_made_durable_as_it_goes_is_not_fsynced_again_when_the_block_ends(torch, tmp_path, synced):
    """TreeWriter.sync_step (the writer process calls it on a thread of its own after each step): the block's end
    fsyncs what is left, the manifest and the folders, not that step again."""
    import threading

    model = torch_model(torch, np.random.default_rng(6))
    tree = tmp_path / "tree"
    with capture(model, tree, mode="digest", writer="thread") as cap:
        for _ in range(2):
            model(torch.ones(2, 3)).sum().backward()
            cap.step()
            model.zero_grad()
        cap.flush()
        syncer = threading.Thread(target=cap._tree.sync_step, args=("step-00000",), name="syncer")
        syncer.start()
        syncer.join()
    first = {str(path) for path in [tree / "step-00000", *(tree / "step-00000").iterdir()]}
    second = {str(path) for path in [tree / "step-00001", *(tree / "step-00001").iterdir()]}
    assert {path for thread, path in synced if thread == "syncer"} == first
    assert [path for thread, path in synced if path in first and thread != "syncer"] == []
    assert second | {str(tree), str(tree / "capture.json")} <= {path for thread, path in synced if thread != "syncer"}


def test_tree_layout_reader_errors_and_targets(torch, tmp_path):
    model = torch_model(torch, np.random.default_rng(5))
    with capture(model, tmp_path / "tree", mode="digest"):
        model(torch.ones(1, 3))
    manifest = json.loads((tmp_path / "tree" / "capture.json").read_text())
    assert manifest["format"] == "xfalign-capture/1" and manifest["steps"] == ["step-00000"]
    assert sorted(p.name for p in (tmp_path / "tree" / "step-00000").iterdir()) == ["meta.json", "tensors.safetensors"]
    # capturing again replaces the tree of the same side
    with capture(model, tmp_path / "tree", mode="full"):
        model(torch.ones(1, 3))
    assert read_tree(tmp_path / "tree").manifest.mode == "full"
    with pytest.raises(DumpTargetError, match="side 'megatron'"):
        capture(model, tmp_path / "tree", side="paddle").__enter__()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(DumpTargetError, match="not a capture tree"):
        capture(model, tmp_path / "other").__enter__()
    with pytest.raises(TreeError, match=f"{tmp_path / 'other'}: not a capture tree"):
        read_tree(tmp_path / "other")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "capture.json").write_text('{"format": "xfalign-capture/1"}')
    with pytest.raises(TreeError, match="capture.json: xfalign: Field required"):
        read_tree(tmp_path / "bad")
    with pytest.raises(TreeError, match="no step 3"):
        read_tree(tmp_path / "tree").step(3)
    with pytest.raises(CaptureError, match="not a module of any known framework"):
        capture(object(), tmp_path / "x")
    with pytest.raises(CaptureError, match="unknown mode"):
        capture(model, tmp_path / "x", mode="everything")


def test_megatron_column_parallel_linear_tuple_output_and_distributed_meta(torch, tmp_path):
    pytest.importorskip("megatron.core")
    from megatron.core import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear

    from harness.frameworks.megatron_group import one_process_group

    rng = np.random.default_rng(6)
    with one_process_group("cpu"):
        config = ModelParallelConfig(use_cpu_initialization=True, params_dtype=torch.float32,
                                     gradient_accumulation_fusion=False)
        layer = ColumnParallelLinear(3, 4, config=config, init_method=torch.nn.init.zeros_, bias=True)
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(integers(rng, (4, 3))))
            layer.bias.copy_(torch.from_numpy(integers(rng, (4,))))
        x, g = integers(rng, (2, 1, 3)), integers(rng, (2, 1, 4))  # [s, b, h]
        with capture(layer, tmp_path / "tree") as cap:
            out, bias = layer(torch.from_numpy(x).requires_grad_())
            assert bias is None  # (output, None): one tensor leaf
            out.backward(torch.from_numpy(g))
            cap.step()
    step = read_tree(tmp_path / "tree").step(0)
    assert step.meta["capture"]["rank"] == 0 and step.meta["capture"]["world_size"] == 1
    assert records(step) == [("(root)", None, "params"), ("(root)", 0, "forward"), ("(root)", 0, "backward"),
                             ("(root)", None, "grads")]
    weight = layer.weight.detach().numpy()
    assert np.array_equal(step.tensors["(root)#0:output.0"], x @ weight.T + layer.bias.detach().numpy())
    assert np.array_equal(step.tensors["(root):grad.weight"], g.reshape(2, 4).T @ x.reshape(2, 3))
    assert np.array_equal(step.tensors["(root):grad.bias"], g.reshape(2, 4).sum(0))
    assert step.meta["impl"] == "ColumnParallelLinear"


def test_paddle_layer_called_twice_in_digest_mode(paddle, tmp_path):
    rng = np.random.default_rng(7)

    class Model(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.proj = paddle.nn.Linear(3, 3)  # weight [in, out]

        def forward(self, x):
            return self.proj(self.proj(x))

    model = Model()
    w, b = integers(rng, (3, 3), -1, 2), integers(rng, (3,))
    model.proj.weight.set_value(w)
    model.proj.bias.set_value(b)
    x, g = integers(rng, (2, 3)), integers(rng, (2, 3))
    with capture(model, tmp_path / "full") as cap:
        inputs = paddle.to_tensor(x, stop_gradient=False)
        paddle.autograd.backward([model(inputs)], [paddle.to_tensor(g)])
        cap.step()
    model.clear_gradients()
    with capture(model, tmp_path / "digest", mode="digest"):
        paddle.autograd.backward([model(paddle.to_tensor(x, stop_gradient=False))], [paddle.to_tensor(g)])
    for layer in (model, model.proj):
        assert not layer._forward_pre_hooks and not layer._forward_post_hooks
    full, digest = read_tree(tmp_path / "full"), read_tree(tmp_path / "digest")
    assert full.manifest.side == full.manifest.framework == "paddle"
    step = full.step(0)
    assert records(step) == [("proj", None, "params"), ("proj", 0, "forward"), ("proj", 1, "forward"),
                             ("(root)", 0, "forward"), ("proj", 1, "backward"), ("(root)", 0, "backward"),
                             ("proj", 0, "backward"), ("proj", None, "grads")]
    h0 = x @ w + b
    g0 = g @ w.T
    assert np.array_equal(step.tensors["proj#1:input.0"], h0)
    assert np.array_equal(step.tensors["proj#0:grad_output.0"], g0)
    assert np.array_equal(step.tensors["proj:grad.weight"], h0.T @ g + x.T @ g0)
    assert digest.step(0).digests == step.digests and not digest.step(0).tensors


RANK_SCRIPT = """
import sys, torch
from harness.capture import capture
rank, store, tree = int(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
model = torch.nn.Linear(2, 2)
with capture(model, tree, mode="digest") as cap:
    model(torch.full((1, 2), float(rank))).sum().backward()
torch.distributed.destroy_process_group()
"""


@pytest.mark.slow
def test_two_ranks_write_one_tree_each(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    workers = [subprocess.Popen([sys.executable, str(script), str(rank), str(tmp_path / "store"), str(tmp_path / "tree")])
               for rank in range(2)]
    assert [worker.wait(timeout=120) for worker in workers] == [0, 0]
    tree = read_tree(tmp_path / "tree")
    assert sorted(p.name for p in (tmp_path / "tree").iterdir()) == ["rank-00000", "rank-00001"]
    assert sorted(tree.ranks) == [0, 1] and tree.manifest.world_size == 2
    for rank, rank_tree in tree.ranks.items():
        info = rank_tree.step(0).meta["capture"]
        assert (info["rank"], info["world_size"]) == (rank, 2)
    inputs = [r.step(0).unstored["(root)#0:input.0"]["md5"] for r in tree.ranks.values()]
    assert inputs[0] != inputs[1]


@pytest.mark.parametrize("defer", [0, 1, None])
def test_hooks_fast_digests_deferred_or_not_are_numpys_and_taken_together(torch, tmp_path, monkeypatch, defer):
    """From the second step on, the hooks' fast digests are left to one batch with the parameters' and the gradients',
    digested as the step ends (DEFER_BYTES; 1: a batch digested at every tensor; 0: each at its hook): every digest
    is numpy's of the full capture's bytes either way, and deferred, no tensor is digested on its own."""
    from harness.capture import api
    from harness.frameworks.torch import TorchAdapter
    from harness.store.fast_hash import fast64

    if defer is not None:
        monkeypatch.setattr(api, "DEFER_BYTES", defer)
    lists: list[int] = []  # the lists digested together; the tensors digested alone, not as part of a list
    alone: list[int] = []
    together, one = TorchAdapter.device_digests, TorchAdapter.device_digest

    def listed(self, tensors):
        lists.append(len(tensors))
        monkeypatch.setattr(TorchAdapter, "device_digest", one)  # a tensor the list's call takes one by one
        try:
            return together(self, tensors)
        finally:
            monkeypatch.setattr(TorchAdapter, "device_digest", single)

    def single(self, tensor):
        alone.append(1)
        return one(self, tensor)

    monkeypatch.setattr(TorchAdapter, "device_digests", listed)
    monkeypatch.setattr(TorchAdapter, "device_digest", single)
    rng = np.random.default_rng(3)
    model = torch_model(torch, rng)
    x = integers(rng, (5, 3))
    for mode, hash_ in (("full", "md5"), ("digest", "fast")):
        with capture(model, tmp_path / mode, mode=mode, hash=hash_) as cap:
            for _ in range(2):
                lists.clear(), alone.clear()  # the second step's are checked (the first digests at the hooks)
                model(torch.from_numpy(x).requires_grad_()).sum().backward()
                cap.step()
                model.zero_grad()
    for index in range(2):
        full, fast = read_tree(tmp_path / "full").step(index), read_tree(tmp_path / "digest").step(index)
        assert fast.order == full.order
        assert {name: fast.unstored[name]["fast64"] for name in fast.order} == \
            {name: fast64(np.asarray(full.tensors[name])) for name in full.order}
    if defer is None:  # the step's tensors in one list: the forward pass's, the parameters, the backward pass's, the gradients
        assert len(lists) == 1 and not alone
    elif defer == 0:
        assert len(lists) == 2 and alone


def test_parameters_changed_after_the_forward_pass_are_named_where_their_digest_is_deferred(torch, tmp_path, monkeypatch):
    """The parameters are recorded as the forward pass ends and, with fast digests, digested with the step's last
    list: one changed in place between the two (by its version) is digested as it is then, and the step's notes
    name it; where digests are not deferred (XFALIGN_DEFER_BYTES=0), as the forward pass read it."""
    from harness.capture import api
    from harness.store.fast_hash import fast64

    rng = np.random.default_rng(5)
    model = torch_model(torch, rng)
    x = torch.from_numpy(integers(rng, (4, 3)))
    name = "head:param.bias"
    for defer in (api.DEFER_BYTES, 0):
        monkeypatch.setattr(api, "DEFER_BYTES", defer)
        with capture(model, tmp_path / str(defer), mode="digest", hash="fast") as cap:
            for _ in range(2):
                before = model.head.bias.detach().numpy().copy()
                loss = model(x).sum()
                with torch.no_grad():
                    model.head.bias.add_(1.0)  # after the forward pass, before the step's end
                loss.backward()
                cap.step()
                model.zero_grad()
        step = read_tree(tmp_path / str(defer)).step(1)
        notes = step.meta.get("notes", {}).get("capture") or ""
        if defer:
            assert step.unstored[name]["fast64"] == fast64(model.head.bias.detach().numpy())
            assert "changed in place after their hook" in notes and name in notes
        else:
            assert step.unstored[name]["fast64"] == fast64(before) and name not in notes


def test_an_output_whose_storage_is_swapped_after_the_forward_pass_is_not_read_swapped(torch, tmp_path):
    """megatron-core's pipeline schedule swaps a stage's output for a 1-element tensor once sent (`out.data = ...`,
    which bumps no version counter): a digest left to the step's end sees the swap by the tensor's address and
    records the output as its hook saw it from the next step on, the step that swapped it first named in its notes."""
    from harness.store.fast_hash import fast64

    rng = np.random.default_rng(6)
    model = torch_model(torch, rng)
    x = torch.from_numpy(integers(rng, (4, 3)))
    for mode, hash_ in (("full", "md5"), ("digest", "fast")):
        with capture(model, tmp_path / mode, mode=mode, hash=hash_) as cap:
            for step in range(3):
                out = model(x)
                out.sum().backward()
                if step:  # from the second step on: after the first step learned which tensors change
                    out.data = torch.zeros(1)
                cap.step()
                model.zero_grad()
    full, fast = read_tree(tmp_path / "full"), read_tree(tmp_path / "digest")
    name = next(n for n in fast.step(1).order if n.startswith("(root)#") and ":output." in n)
    assert name in (fast.step(1).meta.get("notes", {}).get("capture") or "")
    assert fast.step(1).unstored[name]["shape"] == [1]  # read as it was then: named, not silently wrong
    assert fast.step(2).unstored[name]["fast64"] == fast64(np.asarray(full.step(2).tensors[name]))
    assert fast.step(2).unstored[name]["shape"] == [4, 2]


def test_hooks_tensors_changed_in_place_after_their_hook_are_digested_at_it(torch, tmp_path):
    """A module's output changed in place by its caller after the hook (megatron-core's cross entropy does so to
    the logits), which a deferred digest would read changed: the first step digests every hook's tensor at its hook
    and learns which change, digested at their hooks from then on. One that first changes in a later step is
    recorded as it is when its batch is digested, the step's notes name it, and it is digested at its hook after."""
    from harness.store.fast_hash import fast64

    class Parent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first = torch.nn.Linear(3, 3)
            self.later = torch.nn.Linear(3, 3)
            self.calls = 0

        def forward(self, x):
            y = self.first(x)
            y.mul_(2)  # every step, after the hook
            z = self.later(y)
            if self.calls:  # from the second step on
                z.mul_(3)
            self.calls += 1
            return z

    rng = np.random.default_rng(4)
    x = torch.from_numpy(integers(rng, (4, 3)))
    torch.manual_seed(0)
    model = Parent()
    for mode, hash_ in (("full", "md5"), ("digest", "fast")):
        model.calls = 0
        with capture(model, tmp_path / mode, mode=mode, hash=hash_) as cap:
            for _ in range(3):
                model(x).sum().backward()
                cap.step()
                model.zero_grad()
    full, fast = read_tree(tmp_path / "full"), read_tree(tmp_path / "digest")

    def digests(index: int, module: str) -> tuple[str, int, int]:
        name = next(n for n in fast.step(index).order if n.startswith(module + "#") and ":output." in n)
        return name, fast.step(index).unstored[name]["fast64"], fast64(np.asarray(full.step(index).tensors[name]))

    def notes(index: int) -> str:
        return fast.step(index).meta.get("notes", {}).get("capture") or ""

    for index in range(3):  # changed every step: as the hook saw it, from the first step on
        name, got, expected = digests(index, "first")
        assert got == expected and name not in notes(index)
    name, got, expected = digests(1, "later")  # changed from the second step on: then read changed, and noted
    assert got == fast64(np.asarray(full.step(1).tensors[name]) * 3) != expected
    assert "changed in place after their hook" in notes(1) and name in notes(1)
    name, got, expected = digests(2, "later")
    assert got == expected and "after their hook" not in notes(2)
    assert digests(0, "later")[1] == digests(0, "later")[2]
