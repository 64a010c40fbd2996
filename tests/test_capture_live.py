"""capture(..., reference=TREE): each step checked against a reference tree while it runs; only the first
step that differs is kept in full; on_divergence="stop" ends the training there; through a map, a tensor
whose layout differs is checked from its held copy."""

import json

import numpy as np
import pytest
from scripts_loader import load_script

from harness.capture import capture
from harness.capture.api import CaptureDiverged, CaptureError
from harness.store.dump import Dump
from harness.store.tree import read_tree

pytestmark = pytest.mark.xdist_group("in_process_frameworks")

STEPS = 20  # scripts/live_check_disk.py's (checked when it is loaded)


def _script():
    """scripts/live_check_disk.py, whose training these tests capture (smaller); loaded by the first test that
    needs it (it imports torch)."""
    module = load_script("live_check_disk")
    assert module.STEPS == STEPS
    return module


def train(torch, path, change_at=None, mode="digest", **live):
    """An MLP 32-64-8 trained STEPS steps with AdamW on fixed batches of 16 rows; from step `change_at` on,
    another learning rate (`torch`: the fixture, which skips where torch is missing)."""
    _script().train(path, change_at, mode, widths=(32, 64, 8), rows=16, **live)


def size(path):
    return _script().size(path)


def live_of(path, step):
    return json.loads((path / f"step-{step:05d}" / "meta.json").read_text())["capture"]["live"]


def test_a_rerun_that_matches_keeps_digests_only(torch, tmp_path):
    train(torch, tmp_path / "a")
    train(torch, tmp_path / "b", reference=tmp_path / "a")
    tree = read_tree(tmp_path / "b")
    assert tree.manifest.reference == str(tmp_path / "a") and tree.manifest.diverged is None
    for step in range(STEPS):
        live = live_of(tmp_path / "b", step)
        names = Dump.read(tree.step_path(step)).names
        assert live["differing"] == [] and live["not_checkable"] == [] and not live["full"]
        assert live["checked"] == len(names) and live["reference"] == f"step-{step:05d}"
    assert size(tmp_path / "b") <= size(tmp_path / "a") * 1.05  # digests only, as A


@pytest.mark.parametrize("k", [0, 7])
def test_the_first_divergent_step_is_kept_in_full_and_named(torch, tmp_path, k):
    train(torch, tmp_path / "a")
    train(torch, tmp_path / "full", mode="full")
    train(torch, tmp_path / "b", change_at=k, reference=tmp_path / "a")
    tree = read_tree(tmp_path / "b")
    # the learning rate is the first thing the step used that differs
    assert tree.manifest.diverged.model_dump() == {"step": k, "tensor": "(train):lr.0"}
    for step in range(STEPS):
        live, dump = live_of(tmp_path / "b", step), Dump.read(tree.step_path(step))
        assert bool(live["differing"]) == (step >= k)
        assert live["full"] == (step == k)
        stored = set(dump.tensors)
        assert stored == (set(dump.names) if step == k else {n for n in dump.names if n.startswith("(train)")})
    full_step = size(tmp_path / "full" / f"step-{k:05d}")
    assert size(tmp_path / "b") <= size(tmp_path / "a") + full_step * 1.1  # one step's tensors plus digests
    # the step kept in full holds what a full capture of it holds, bit for bit (both run the same changed step
    # only when k == 0: the full run keeps the reference's learning rate)
    if k == 0:
        return
    kept, reference = Dump.read(tree.step_path(k)).tensors, Dump.read(read_tree(tmp_path / "full").step_path(k)).tensors
    for name in reference:
        if not name.startswith("(train)") and ":updated." not in name and ":exp_avg" not in name:
            np.testing.assert_array_equal(kept[name], reference[name], err_msg=name)


def test_stop_ends_the_training_at_the_divergent_step(torch, tmp_path):
    train(torch, tmp_path / "a")
    with pytest.raises(CaptureDiverged, match=r"step 3 differs from the reference .* first at \(train\):lr\.0"):
        train(torch, tmp_path / "b", change_at=3, reference=tmp_path / "a", on_divergence="stop")
    tree = read_tree(tmp_path / "b")
    assert tree.steps == [f"step-{step:05d}" for step in range(4)]
    assert live_of(tmp_path / "b", 3)["full"]


def test_steps_beyond_the_reference_are_not_checked_and_bad_options_are_refused(torch, tmp_path):
    train(torch, tmp_path / "a")
    tree_a = read_tree(tmp_path / "a")
    short = tmp_path / "short"
    short.mkdir()
    (short / "capture.json").write_text(json.dumps({**json.loads((tmp_path / "a" / "capture.json").read_text()),
                                                    "steps": tree_a.steps[:2]}))
    for step in tree_a.steps[:2]:
        (tmp_path / "a" / step).rename(short / step)
    train(torch, tmp_path / "b", reference=short)
    assert live_of(tmp_path / "b", 1)["checked"] > 0
    meta = json.loads((tmp_path / "b" / "step-00002" / "meta.json").read_text())
    assert meta["capture"]["live"] is None and "has no step 2" in meta["notes"]["live"]
    with pytest.raises(CaptureError, match="on_divergence='later'"):
        train(torch, tmp_path / "c", reference=short, on_divergence="later")
    with pytest.raises(CaptureError, match="give reference= too"):
        train(torch, tmp_path / "c", map="map.yaml")


MAP = """\
format: xfalign-map/1
sides: {a: megatron, b: paddle}
modules:
  - {a: "(root)", b: "(root)"}
  - {a: "0", b: "0"}
tensors:
  - a: "0:{role:param|grad|grad_clipped|updated}.weight"
    b: "0:{role}.weight"
    transpose: true
"""


def test_through_a_map_a_transposed_weight_is_checked_from_its_held_copy(torch, paddle, tmp_path):
    """torch A, Paddle B with A's weights: the start parameters (transposed by the map) match bit for bit."""
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(8, 4))
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    with capture(a, tmp_path / "a", mode="digest") as cap:
        a(torch.from_numpy(x)).sum().backward()
        cap.step()
    b = paddle.nn.Sequential(paddle.nn.Linear(8, 4))
    b[0].weight.set_value(a[0].weight.detach().numpy().T.copy())
    b[0].bias.set_value(a[0].bias.detach().numpy().copy())
    (tmp_path / "map.yaml").write_text(MAP)
    with capture(b, tmp_path / "b", mode="digest", reference=tmp_path / "a", map=tmp_path / "map.yaml") as cap:
        b(paddle.to_tensor(x)).sum().backward()
        cap.step()
    live = live_of(tmp_path / "b", 0)
    assert "0:param.weight" not in live["differing"] + live["not_checkable"]  # transposed, then hashed: equal
    assert "0:param.bias" not in live["differing"] + live["not_checkable"]
    assert live["checked"] >= 4
