"""Faults in the Python capture API and in replay (issue 19), with real torch and Paddle modules in this process:
a full disk under a capture that replaces an earlier tree, side names that are not safe file names, a path
made absolute before the training code changes directory, a capture entered twice or two captures of one
folder (in this process and across processes), fp8 and sparse tensors, bad selections, and replay: every
parameter under the replayed module loaded, B's own put back (also when B's module raises), and xfalign's
own errors for a parameter of another shape or dtype."""

from __future__ import annotations

import copy
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_faults_storage import tiny_disk  # noqa: F401 - a fixture: a 64 KiB tmpfs

from harness.capture import capture
from harness.capture.api import CaptureError, CaptureWriteError
from harness.capture.replay import ReplayError, replay
from harness.store.dump import DumpTargetError
from harness.store.tree import read_tree
from harness.store.tree_format import ROOT

from conftest import ROOT as REPO

# torch and paddle are imported by the first test that needs them (conftest's fixtures); the group keeps the
# in-process framework tests in one test process (tests/test_capture.py).
pytestmark = pytest.mark.xdist_group("in_process_frameworks")


def two_linears(torch, seed: int = 0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))


def one_step(torch, model, path, rows: int = 3, **options):
    """A capture of one training step of `model` on `rows` rows of ones; its tree."""
    with capture(model, path, **options) as cap:
        model(torch.ones(rows, 4)).sum().backward()
        cap.step()
    model.zero_grad()
    return read_tree(path)


def files(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` (hidden ones too), with a file's bytes."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


# --- the earlier tree is kept until the new first step is complete --------------------------------------------


def test_full_disk_keeps_the_earlier_tree_and_names_the_step(torch, tiny_disk):  # noqa: F811
    model = two_linears(torch)
    one_step(torch, model, tiny_disk / "tree")
    before = files(tiny_disk)
    with pytest.raises(CaptureWriteError) as raised:  # 16,000 rows of 4 floats: more than the whole disk
        one_step(torch, model, tiny_disk / "tree", rows=16_000)
    message = str(raised.value)
    assert message.startswith(f"capture: cannot write step 0 (step-00000) of {tiny_disk / 'tree'}: No space left on device")
    assert message.endswith("; the earlier capture there is kept") and "Safetensor" not in message
    assert isinstance(raised.value, OSError)  # what a training script caught before
    assert files(tiny_disk) == before  # the earlier tree, and no staging folder left
    assert read_tree(tiny_disk / "tree").step(0).digests


def test_full_disk_when_the_capture_starts_names_the_manifest(torch, tiny_disk):  # noqa: F811
    from test_faults_storage import fill

    fill(tiny_disk)
    with pytest.raises(CaptureWriteError, match=f"^capture: cannot write to {tiny_disk / 'tree'}: No space left on device$"):
        one_step(torch, two_linears(torch), tiny_disk / "tree")


def test_a_capture_that_writes_no_step_keeps_the_earlier_tree(torch, tmp_path):
    model = two_linears(torch)
    one_step(torch, model, tmp_path / "tree")
    before = files(tmp_path)
    with capture(model, tmp_path / "tree"):
        pass  # nothing ran
    with pytest.raises(RuntimeError, match="boom"):
        with capture(model, tmp_path / "tree"):
            raise RuntimeError("boom")  # the training failed before its first step
    assert files(tmp_path) == before
    stale = tmp_path / ".tree.k1ll3d.tmp"  # the staging folder of a capture killed before its first step was complete
    stale.mkdir()
    (stale / "capture.json").write_text("{}")
    one_step(torch, model, tmp_path / "tree", mode="digest")  # a complete first step replaces the tree
    assert read_tree(tmp_path / "tree").manifest.mode == "digest" and sorted(p.name for p in tmp_path.iterdir()) == ["tree"]


def test_a_tree_holding_the_users_files_is_not_replaced(torch, tmp_path):
    model = two_linears(torch)
    one_step(torch, model, tmp_path / "tree")
    (tmp_path / "tree" / "NOTES.txt").write_text("mine")
    (tmp_path / "tree" / "step-00000.bak").mkdir()
    before = files(tmp_path)
    with pytest.raises(DumpTargetError, match=r"holds files xfalign did not write \(NOTES.txt, step-00000.bak\)"):
        one_step(torch, model, tmp_path / "tree")
    assert files(tmp_path) == before


def test_the_path_is_made_absolute_when_the_capture_is_made(torch, tmp_path, monkeypatch):
    model = two_linears(torch)
    for folder in ("elsewhere", "later"):
        (tmp_path / folder).mkdir()
    cap = capture(model, "out/tree")  # relative to tmp_path (conftest's working directory)
    monkeypatch.chdir(tmp_path / "elsewhere")
    with cap:
        model(torch.ones(1, 4))
        monkeypatch.chdir(tmp_path / "later")  # the training code moves on; the writer thread writes after this
        cap.step()
    assert read_tree(tmp_path / "out" / "tree").steps == ["step-00000"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "later", "out"]
    assert [list((tmp_path / folder).iterdir()) for folder in ("elsewhere", "later")] == [[], []]


# --- side names and selections ---------------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["../../escape", "a/b", "x" * 300, "paddle\u202egnp", "..", "", 7])
def test_side_names_must_be_safe_single_names(torch, tmp_path, side):
    with pytest.raises(CaptureError) as raised:
        capture(two_linears(torch), tmp_path / "tree", side=side)
    message = str(raised.value)
    assert message.startswith("capture: side=") and "is not a safe side name: letters, digits" in message
    assert message.isprintable() and len(message) < 300  # the override escaped, a long name cut
    assert list(tmp_path.iterdir()) == []
    assert read_tree(one_step(torch, two_linears(torch), tmp_path / "ok", side="paddle-bf16").path).manifest.side == "paddle-bf16"


@pytest.mark.parametrize("options, message", [
    ({"modules": [1, 2]}, "capture: modules: 1 is not a module glob (text such as 'decoder.layers.*.mlp' or '(root)')"),
    ({"modules": 5}, "capture: modules=5 is not a module glob (text such as 'decoder.layers.*.mlp' or '(root)'), "
                     "nor a list of them"),
    ({"types": [42]}, "capture: types: 42 is not a class or a class name (such as 'Linear')"),
])
def test_bad_selections_are_xfaligns_errors_naming_the_parameter(torch, tmp_path, options, message):
    with pytest.raises(CaptureError) as raised:
        capture(two_linears(torch), tmp_path / "tree", **options)
    assert str(raised.value) == message


def test_one_text_is_one_glob_and_one_class_name(torch, tmp_path):
    model = two_linears(torch)
    tree = one_step(torch, model, tmp_path / "glob", modules="1")
    assert [m["name"] for m in tree.step(0).meta["capture"]["modules"]] == ["1"]
    tree = one_step(torch, model, tmp_path / "type", modules=None, types="Linear")
    assert [m["name"] for m in tree.step(0).meta["capture"]["modules"]] == ["0", "1"]


# --- one capture per folder, each entered once ----------------------------------------------------------------


def calls(tree) -> list[tuple[str, int | None, str]]:
    return [(r["module"], r["call"], r["phase"]) for r in tree.step(0).meta["capture"]["records"]]


def test_a_capture_entered_twice_is_refused_torch(torch, tmp_path):
    model = two_linears(torch)
    cap = capture(model, tmp_path / "tree", modules=["0"])
    with cap:
        with pytest.raises(CaptureError, match=f"^capture {tmp_path / 'tree'}: this capture is active already"):
            cap.__enter__()
        model(torch.ones(1, 4))
    assert calls(read_tree(tmp_path / "tree")) == [("0", None, "params"), ("0", 0, "forward")]
    with cap:  # once its block has ended, it can be entered again: a new capture of the path
        model(torch.ones(1, 4))
    assert read_tree(tmp_path / "tree").steps == ["step-00000"]


def test_a_capture_entered_twice_is_refused_paddle(paddle, tmp_path):
    layer = paddle.nn.Linear(4, 2)
    cap = capture(layer, tmp_path / "tree")
    with cap:
        with pytest.raises(CaptureError, match="this capture is active already"):
            cap.__enter__()
        layer(paddle.ones([1, 4]))
        layer(paddle.ones([1, 4]))
    assert [c for c in calls(read_tree(tmp_path / "tree")) if c[2] == "forward"] == [("(root)", 0, "forward"),
                                                                                   ("(root)", 1, "forward")]


def test_two_captures_of_one_folder_in_this_process_are_refused(torch, tmp_path):
    first, second = two_linears(torch), two_linears(torch, seed=1)
    with capture(first, tmp_path / "tree"):
        for path in (tmp_path / "tree", tmp_path / "x" / ".." / "tree"):
            with pytest.raises(CaptureError, match="another capture of this process is writing there"):
                with capture(second, path):
                    pass
        first(torch.ones(1, 4))
    assert read_tree(tmp_path / "tree").step(0).meta["capture"]["records"]  # the first capture's step
    one_step(torch, second, tmp_path / "tree")  # free again


HOLDER = """
import sys, time, torch
from pathlib import Path
from harness.capture import capture
with capture(torch.nn.Linear(2, 2), sys.argv[1]):
    Path(sys.argv[2]).write_text("capturing")
    time.sleep(120)
"""


def test_a_folder_another_process_captures_into_is_refused(torch, tmp_path):
    script, marker = tmp_path / "holder.py", tmp_path / "marker"
    script.write_text(HOLDER)
    holder = subprocess.Popen([sys.executable, str(script), str(tmp_path / "tree"), str(marker)], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert holder.poll() is None and time.monotonic() < deadline, "the holder did not start capturing"
            time.sleep(0.1)
        with pytest.raises(CaptureError, match=f"^capture {tmp_path / 'tree'}: another process is capturing into it"):
            one_step(torch, torch.nn.Linear(4, 2), tmp_path / "tree")
    finally:
        holder.kill()
        holder.wait()
    assert read_tree(tmp_path / "tree").manifest.framework == "megatron"  # the holder's (empty) tree, and the lock went with it
    one_step(torch, two_linears(torch), tmp_path / "tree")


# --- dtypes and layouts no dump holds --------------------------------------------------------------------------


def test_fp8_and_sparse_outputs_are_left_out_with_a_note_torch(torch, tmp_path):
    class Mixed(torch.nn.Module):
        def forward(self, x):
            return x.to(torch.float8_e4m3fn), x.to_sparse(), x.to_sparse_csr(), x * 2

    model = Mixed()
    for options in ({"mode": "full"}, {"mode": "digest"}, {"mode": "digest", "hash": "fast"}):
        folder = tmp_path / "-".join(options.values())
        with pytest.warns(UserWarning, match=r"step 0: not recorded .*\(root\)#0:output.0 \(float8_e4m3fn\)"):
            with capture(model, folder, **options):
                outputs = model(torch.ones(2, 3))  # the training step goes on, and the user is told
        assert outputs[3].sum().item() == 12
        step = read_tree(folder).step(0)
        assert step.names == ["(root)#0:input.0", "(root)#0:output.3"], options
        assert step.meta["notes"]["capture"] == (
            "not recorded (a dtype or layout xfalign dumps do not hold): (root)#0:output.0 (float8_e4m3fn), "
            "(root)#0:output.1 (sparse_coo), (root)#0:output.2 (sparse_csr)")


def test_fp8_and_sparse_outputs_are_left_out_with_a_note_paddle(paddle, tmp_path):
    class Mixed(paddle.nn.Layer):
        def forward(self, x):
            return x.cast(paddle.float8_e4m3fn), x.to_sparse_coo(2), x * 2

    layer = Mixed()
    with capture(layer, tmp_path / "tree"):
        layer(paddle.ones([2, 3]))  # Paddle's .numpy() of the sparse one would end the process
    step = read_tree(tmp_path / "tree").step(0)
    assert step.names == ["(root)#0:input.0", "(root)#0:output.2"]  # not the fp8 one's bits as int8 values
    assert step.meta["notes"]["capture"].endswith("(root)#0:output.0 (float8_e4m3fn), (root)#0:output.1 (sparse)")


# --- replay ----------------------------------------------------------------------------------------------------


def parameters(model) -> dict[str, np.ndarray]:
    return {name: param.detach().numpy().copy() for name, param in model.named_parameters()}


def assert_same(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> None:
    assert {n: (a.dtype, a.tobytes()) for n, a in before.items()} == {n: (a.dtype, a.tobytes()) for n, a in after.items()}


def test_replay_loads_every_parameter_under_the_module_and_puts_bs_back(torch, tmp_path):
    model_a = two_linears(torch)
    tree = one_step(torch, model_a, tmp_path / "a")
    model_b = copy.deepcopy(model_a)
    with torch.no_grad():
        model_b[0].weight += 1  # a sub-module's weight, off by one
    before = parameters(model_b)
    result = replay(model_b, tree, ROOT)
    assert result.verdict == "inherited" and result.params_loaded and result.not_loaded == []
    assert_same(before, parameters(model_b))


def test_replay_says_which_parameters_a_does_not_give(torch, tmp_path):
    model_a = two_linears(torch)
    tree = one_step(torch, model_a, tmp_path / "a", modules=["(root)"])  # every parameter named after (root)
    model_b = copy.deepcopy(model_a)
    model_b.register_parameter("scale", torch.nn.Parameter(torch.ones(())))  # B's only (and unused)
    with torch.no_grad():
        model_b[1].bias -= 1
    result = replay(model_b, tree, ROOT)
    assert result.verdict == "inherited" and result.not_loaded == ["scale"] and not result.params_loaded


def test_replay_puts_bs_parameters_back_when_bs_module_raises(torch, tmp_path):
    class Fails(torch.nn.Linear):
        def forward(self, x):
            raise RuntimeError("boom in B's forward")

    model_a = torch.nn.Linear(4, 2)
    tree = one_step(torch, model_a, tmp_path / "a")
    model_b = Fails(4, 2)
    before = parameters(model_b)
    with pytest.raises(ReplayError, match=r"^replay of \(root\): B's \(root\) raised RuntimeError: boom in B's forward "
                                          r"when given A's inputs \(\(root\)#0:input.0 \[3, 4\]\); check that the map"):
        replay(model_b, tree, ROOT)
    assert_same(before, parameters(model_b))


def test_replay_parameter_of_another_shape_or_dtype_is_an_xfaligns_error(torch, tmp_path):
    class Transposed(torch.nn.Module):  # weight [in, out], as Paddle keeps it: the map needs a transpose
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4, 2))
            self.bias = torch.nn.Parameter(torch.zeros(2))

        def forward(self, x):
            return x @ self.weight + self.bias

    tree = one_step(torch, torch.nn.Linear(4, 2), tmp_path / "a")
    model_b = Transposed()
    before = parameters(model_b)
    with pytest.raises(ReplayError, match=r"^replay of \(root\): B's parameter weight is \[4, 2\], A's value for it is "
                                          r"\[2, 4\]: add or fix the map's entry for it"):
        replay(model_b, tree, ROOT)
    half = torch.nn.Linear(4, 2).half()
    with pytest.raises(ReplayError, match=r"^replay of \(root\): B's parameter weight is float16, A's value for it "
                                          r"float32, which float16 does not hold exactly"):
        replay(half, tree, ROOT)
    assert_same(before, parameters(model_b))
