"""Two capture trees as a trajectory (harness.compare.trajectory through harness.compare.tree, and the terminal,
JSON and HTML reports): a small torch model trained a few steps with AdamW, captured in digest mode with its
optimizer step and loss (`capture(..., optimizer=)`, `cap.loss`), where side B departs from side A at one step
(another learning rate from step k on, a parameter 1 ULP off, another batch)."""

import json
import shutil

import jsonschema
import numpy as np
import pytest
from test_capture_compare import write_tree

from harness.capture import capture
from harness.cli import main
from harness.compare.trajectory import trajectory_of
from harness.compare.tree import compare_trees
from harness.reports.json_schema import SCHEMA_PATH
from harness.store.tree_format import MANIFEST_FILE, param_tensor, rank_folder, step_folder, train_tensor

pytestmark = pytest.mark.xdist_group("in_process_frameworks")

STEPS = 5
LOSS = train_tensor("loss", 0)


def train(torch, path, side, steps=STEPS, lr_from=None, nudge_at=None, batch_at=None):
    """AdamW on a two-layer MLP, captured; B's departures: lr doubled from step `lr_from` on, fc2.weight[0, 0]
    1 ULP up before step `nudge_at`, another batch at step `batch_at`. Returns the tree and each step's loss."""
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("fc1", torch.nn.Linear(8, 16))
    model.add_module("act", torch.nn.Tanh())
    model.add_module("fc2", torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 8, generator=data), torch.randn(4, 4, generator=data)) for _ in range(steps + 1)]
    losses = []
    with capture(model, path, mode="digest", side=side, optimizer=optimizer) as cap:
        for step in range(steps):
            if step == nudge_at:
                with torch.no_grad():
                    model.fc2.weight.view(torch.int32)[0, 0] += 1
            if step == lr_from:
                for group in optimizer.param_groups:
                    group["lr"] = 2e-2
            x, y = batches[steps if step == batch_at else step]
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            cap.loss(loss)
            optimizer.step()  # ends the captured step
            optimizer.zero_grad()
            losses.append(loss.item())
    return path, losses


@pytest.fixture(scope="module")
def lr_trees(torch, tmp_path_factory):
    """B doubles the learning rate from step 2 on."""
    root = tmp_path_factory.mktemp("lr")
    (a, losses), (b, _) = train(torch, root / "a", "torch-a"), train(torch, root / "b", "torch-b", lr_from=2)
    return a, b, losses


def kinds(trajectory):
    return [step.kind for step in trajectory.steps]


def test_another_learning_rate_diverges_in_the_optimizer_step_and_later_steps_inherit_it(lr_trees):
    a, b, losses = lr_trees
    result = compare_trees(a, b)
    trajectory = trajectory_of(result.steps)
    assert kinds(trajectory) == ["equal", "equal", "diverges", "inherits", "inherits"]
    assert [step.inherits_from for step in trajectory.steps] == [None, None, None, 2, 2]
    assert trajectory.first_divergent.index == 2 and result.divergence is trajectory.steps[2].divergence
    assert [step.differing == 0 for step in trajectory.steps] == [True, True, False, False, False]
    assert all(step.compared > 0 for step in trajectory.steps)
    # step 2: everything up to the update is equal; the first divergent tensor is the optimizer step's first
    # differing one in record order, and AdamW's moments do not read the learning rate
    (step,) = trajectory.steps[2].steps
    results = [(view.phase, r) for view in step.records for r in view.tensors]
    assert all(r.pair.bitwise for phase, r in results if phase != "optimizer")
    first = next(r.name for phase, r in results if phase == "optimizer" and not r.pair.bitwise)
    assert (step.divergence.name, step.divergence.phase) == (first, "optimizer")
    assert all(r.pair.bitwise for _, r in results if ":exp_avg" in r.name)
    # step 3 starts from other parameters: its first divergent tensor in execution order is the first
    # parameter, although the table lists the forward records first
    (step,) = trajectory.steps[3].steps
    assert (step.divergence.name, step.divergence.phase, step.divergence.module) == ("fc1:param.weight", "params", "fc1")
    assert step.records[0].phase == "forward" and not step.records[0].bitwise
    # the losses: the value each side recorded, exactly, and its digest; equal until the step after the change
    assert [step.loss_a.value for step in trajectory.steps] == [np.float32(loss) for loss in losses]
    assert all(step.loss_a.tensor == LOSS and step.loss_a.digest.md5 for step in trajectory.steps)
    assert [step.loss_a.digest == step.loss_b.digest for step in trajectory.steps] == [True, True, True, False, False]


def test_a_parameter_one_ulp_off_diverges_at_that_parameter_first(torch, tmp_path):
    a, _ = train(torch, tmp_path / "a", "torch-a", steps=3)
    b, _ = train(torch, tmp_path / "b", "torch-b", steps=3, nudge_at=1)
    result = compare_trees(a, b)
    trajectory = trajectory_of(result.steps)
    assert kinds(trajectory) == ["equal", "diverges", "inherits"]
    assert [step.inherits_from for step in trajectory.steps] == [None, None, 1]
    divergence = result.divergence
    assert (divergence.step, divergence.name, divergence.phase) == ("step-00001", "fc2:param.weight", "params")
    # fc1's forward comes before fc2's parameter in the step, and is equal: execution order puts the parameter,
    # which differs, first all the same
    views = {(view.module, view.phase): view for view in trajectory.steps[1].steps[0].records}
    assert views["fc1", "forward"].bitwise


def test_another_batch_is_input_differs_and_the_steps_after_it_inherit(torch, tmp_path):
    a, _ = train(torch, tmp_path / "a", "torch-a", steps=3)
    b, _ = train(torch, tmp_path / "b", "torch-b", steps=3, batch_at=1)
    trajectory = trajectory_of(compare_trees(a, b).steps)
    assert kinds(trajectory) == ["equal", "input-differs", "inherits"]
    assert [step.inherits_from for step in trajectory.steps] == [None, None, 1]
    assert trajectory.first_divergent.index == 1
    assert trajectory.steps[1].divergence.phase == "forward"


def edit_digest(tree, step, name):
    """Side B's record of one digest-only tensor made to differ (its MD5's last digit changed)."""
    path = tree / step_folder(step) / "meta.json"
    meta = json.loads(path.read_text())
    entry = next(entry for entry in meta["tensors"] if entry["name"] == name)
    entry["md5"] = entry["md5"][:-1] + ("0" if entry["md5"][-1] != "0" else "1")
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize("edits, expected", [
    # a step whose starting state is equal again diverges anew
    ({1: "fc2#0:output.0", 3: "fc1#0:output.0"}, (["equal", "diverges", "equal", "diverges", "equal"], [None] * 5)),
    # optimizer state left different by step 1: step 2 starts from it, with equal parameters
    ({1: "fc1:exp_avg.weight", 2: "fc2:exp_avg_sq.bias"}, (["equal", "diverges", "inherits", "equal", "equal"],
                                                           [None, None, 1, None, None])),
])
def test_the_starting_state_decides_between_diverges_and_inherits(lr_trees, tmp_path, edits, expected):
    a, _, _ = lr_trees
    b = shutil.copytree(a, tmp_path / "b")
    for step, name in edits.items():
        edit_digest(b, step, name)
    trajectory = trajectory_of(compare_trees(a, b).steps)
    assert (kinds(trajectory), [step.inherits_from for step in trajectory.steps]) == expected
    assert trajectory.steps[1].divergence.name == edits[1]


def test_terminal_json_and_html_show_the_trajectory(lr_trees, tmp_path, capsys):
    a, b, _ = lr_trees
    paths = {"json": tmp_path / "r.json", "html": tmp_path / "r.html"}
    assert main(["compare", str(a), str(b), *(x for key, path in paths.items() for x in (f"--{key}", str(path)))]) == 1
    out = capsys.readouterr().out
    assert "first divergent step: step-00002 (diverges) of 5" in out
    assert "2 steps (step-00003 .. step-00004) only inherit it" in out
    assert out.count("inherits step-00002") == 2 and out.count("fc1:param.weight (params (start))") == 2
    # the tensor table of the first divergent step only (its title), after the per-step table
    assert "step-00002: " in out and "step-00000: " not in out and "step-00003: " not in out
    assert out.index("loss A") < out.index("step-00002: ")
    assert "--steps all" in out

    data = json.loads(paths["json"].read_text())
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    assert [e.message[:200] for e in validator.iter_errors(data)] == []
    trajectory = data["tree"]["trajectory"]
    assert trajectory["first_divergent_step"] == 2
    assert [s["kind"] for s in trajectory["steps"]] == ["equal", "equal", "diverges", "inherits", "inherits"]
    assert [s["inherits_from"] for s in trajectory["steps"]] == [None, None, None, 2, 2]
    step = trajectory["steps"][3]
    assert step["first_divergent"]["tensor"] == "fc1:param.weight" and step["cases"] == ["step-00003"]
    assert step["loss"]["a"]["tensor"] == LOSS and step["loss"]["a"]["digest"]["md5"] != step["loss"]["b"]["digest"]["md5"]

    html = paths["html"].read_text()
    assert 'id="trajectory"' in html
    cells = [line for line in html.split("<a ") if line.startswith('class="cell k-')]
    assert [cell.split('"')[1] for cell in cells] == ["cell k-equal"] * 2 + ["cell k-diverges"] + ["cell k-inherits"] * 2
    assert all(f'href="#s{i}"' in cell and "loss A " in cell and " | B " in cell for i, cell in enumerate(cells))
    assert 'id="s4"' in html  # every step's section is still there to link to

    assert main(["compare", str(a), str(b), "--steps", "all", "--html", str(paths["html"])]) == 1
    out = capsys.readouterr().out
    assert all(f"{step_folder(step)}: " in out for step in range(STEPS)) and "--steps all" not in out


def test_a_single_step_has_no_trajectory_table(torch, tmp_path, capsys):
    (a, _), (b, _) = train(torch, tmp_path / "a", "torch-a", steps=1), train(torch, tmp_path / "b", "torch-b", steps=1)
    assert main(["compare", str(a), str(b), "--html", str(tmp_path / "r.html")]) == 0
    out = capsys.readouterr().out
    assert "step-00000: " in out and "first divergent step" not in out and "--steps" not in out
    assert 'id="trajectory"' not in (tmp_path / "r.html").read_text()
    assert main(["compare", str(a / step_folder(0)), str(b / step_folder(0)), "--steps", "all"]) == 2
    assert "--steps goes with two capture trees" in capsys.readouterr().err


def test_the_ranks_of_a_step_are_one_step_of_the_trajectory(tmp_path):
    """Two trees of two ranks compared rank by rank: rank 1 differs at step 0, rank 0 at step 1. The trajectory
    has two steps, each of both ranks; the first divergence is step 0's (rank 1), not rank 0's first."""
    def ranks(path, differs):
        for rank in (0, 1):
            def change(step, tensors, rank=rank):
                if differs and step == 1 - rank:  # B: rank 1 at step 0, rank 0 at step 1
                    weight = tensors[param_tensor("fc2", "param", "weight")].copy()
                    weight.view(np.uint32)[0, 0] += 1
                    tensors[param_tensor("fc2", "param", "weight")] = weight
            tree = write_tree(path / rank_folder(rank), "b" if differs else "a", steps=2, change=change)
            manifest = json.loads((tree / MANIFEST_FILE).read_text()) | {"rank": rank, "world_size": 2}
            (tree / MANIFEST_FILE).write_text(json.dumps(manifest))
        return path

    result = compare_trees(ranks(tmp_path / "a", False), ranks(tmp_path / "b", True))
    assert [step.label for step in result.steps][:2] == ["rank-00000/step-00000", "rank-00000/step-00001"]
    trajectory = trajectory_of(result.steps)
    assert [(s.label, [m.label for m in s.steps]) for s in trajectory.steps] == [
        ("step-00000", ["rank-00000/step-00000", "rank-00001/step-00000"]),
        ("step-00001", ["rank-00000/step-00001", "rank-00001/step-00001"])]
    assert kinds(trajectory) == ["diverges", "inherits"]
    assert result.divergence.step == "rank-00001/step-00000" and result.divergence.name == "fc2:param.weight"
    assert trajectory.steps[0].compared == 2 * len(result.steps[0].comparison.tensors)
