"""Faults in dump folders, capture trees and maps (issue 19): a dump folder that also holds the user's files,
step names in capture.json that leave the tree, an invalid `case.expect` in a dump's meta.json, and maps that
do not fit the trees they pair (an entry that matches nothing, an empty map, sides of other trees, trees with
no name in common). Dumps and trees are written from numpy arrays; only the `--dump` test runs a side (a
Paddle user function, on the session's workers), to show that none runs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from storage_writers import make_dump
from test_faults_storage import cli, one_error_line
from test_faults_storage import tree as files

from harness import __version__
from harness.capture.mapping import MapError, load_map
from harness.capture.suggest import suggest_map
from harness.case import ExpectSpec
from harness.compare.case import compare_dumps
from harness.compare.tree import compare_trees
from harness.errors import UsageError
from harness.store.dump import Dump, DumpError, DumpTargetError, check_dump_target
from harness.store.tree import TreeError, read_tree
from harness.store.tree_format import MANIFEST_FILE, CaptureInfo, CaptureManifest, ModuleInfo, Record, step_folder

from conftest import SMALL_WEIGHTED


def error_line(done: subprocess.CompletedProcess) -> str:
    """The one line of an exit-2 error, without its prefix."""
    assert done.returncode == 2, done
    return one_error_line(done).removeprefix("xfalign: error: ")


# --- dump folders --------------------------------------------------------------------------------------

def test_a_dump_beside_the_users_files_is_never_replaced(tmp_path):
    folder = tmp_path / "sl5"
    make_dump(1, side="paddle").write(folder)
    (folder / "NOTES.txt").write_text("what I found")
    (folder / "sub").mkdir()
    (folder / "sub" / "plot.png").write_bytes(b"\x89PNG")
    before = files(tmp_path)
    with pytest.raises(DumpTargetError) as error:
        check_dump_target(folder, "paddle", label="--dump")
    assert str(error.value) == (f"--dump {folder}: holds 'NOTES.txt', 'sub' besides an xfalign dump; refusing to "
                                "replace it (move them out, or give another folder)")
    with pytest.raises(DumpTargetError, match="holds 'NOTES.txt', 'sub' besides an xfalign dump"):
        make_dump(2, side="paddle").write(folder)  # Dump.write itself refuses too
    assert files(tmp_path) == before


def test_a_file_that_appears_while_a_dump_is_written_is_not_deleted(tmp_path, monkeypatch):
    """The target is checked again right before the swap: writing a large dump takes a while."""
    folder = tmp_path / "d"
    make_dump(1).write(folder)
    save = __import__("harness.store.dump", fromlist=["save_file"]).save_file

    def save_and_a_user_writes(tensors, path):
        save(tensors, path)
        (folder / "NOTES.txt").write_text("written meanwhile")

    monkeypatch.setattr("harness.store.dump.save_file", save_and_a_user_writes)
    with pytest.raises(DumpTargetError, match="holds 'NOTES.txt' besides an xfalign dump"):
        make_dump(2).write(folder)
    assert (folder / "NOTES.txt").read_text() == "written meanwhile"
    assert Dump.read(folder).meta["environment"]["seed"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no staging folder left


USER_SIDES = "  ref: {framework: paddle, impl: fp32_island}\n  user: {framework: paddle, impl: 'f.py:swiglu'}\n"
SIDES = "  megatron: {framework: megatron, mode: compile}\n  paddle: {framework: paddle, impl: fp32_island}\n"
USER_CASE = SMALL_WEIGHTED.replace(SIDES, USER_SIDES).replace("all: bitwise", "all: report").replace("[16, ", "[2, ")
assert "user:" in USER_CASE


def test_run_refuses_a_dump_folder_holding_the_users_files_before_any_side_runs(tmp_path, capsys):
    (tmp_path / "case.yaml").write_text(USER_CASE)
    (tmp_path / "f.py").write_text("from pathlib import Path\n"
                                   "def swiglu(x, bias, probs, options):\n"
                                   "    Path(__file__).with_name('ran').write_text('')\n"
                                   "    raise RuntimeError('this side must not run')\n")
    folder = tmp_path / "out" / "sl5"
    make_dump(1, side="user").write(folder)
    (folder / "NOTES.txt").write_text("what I found")
    (folder / "sub").mkdir()
    before = files(tmp_path / "out")
    done = cli(capsys, "run", "case.yaml", "--side", "user", "--dump", "out/sl5")
    assert error_line(done) == ("--dump out/sl5: holds 'NOTES.txt', 'sub' besides an xfalign dump; refusing to replace "
                                "it (move them out, or give another folder)")
    assert not (tmp_path / "ran").exists() and files(tmp_path / "out") == before


# --- capture trees: step names -------------------------------------------------------------------------

def write_tree(path: Path, side: str, modules: list[str], steps: list[str] | None = None, framework: str | None = None) -> Path:
    """A capture tree of one step: per module, its weight and one call's output (the k-th module's values are
    the same in every tree); `steps`: what capture.json lists (default: the step written)."""
    framework = framework or side
    rng = np.random.default_rng(0)
    tensors: dict[str, np.ndarray] = {}
    records = []
    for module in modules:
        weight, output = f"{module}:param.weight", f"{module}#0:output.0"
        tensors[weight], tensors[output] = rng.standard_normal((3, 2), dtype=np.float32), rng.standard_normal(2, dtype=np.float32)
        records += [Record(module=module, phase="params", tensors=[weight]),
                    Record(module=module, call=0, phase="forward", tensors=[output])]
    info = CaptureInfo(step=0, mode="full", root="Model", modules=[ModuleInfo(name=m, type="Linear") for m in modules],
                       records=records)
    meta = {"case": {}, "case_name": "capture", "side": side, "framework": framework, "impl": "Model", "provenance": "test",
            "environment": {}, "inputs": {}, "capture": info.model_dump(mode="json")}
    Dump(meta, tensors).write(path / step_folder(0))
    manifest = CaptureManifest(format="xfalign-capture/1", xfalign=__version__, side=side, framework=framework, mode="full",
                               root="Model", steps=steps or [step_folder(0)])
    (path / MANIFEST_FILE).write_text(manifest.model_dump_json(indent=1))
    return path


@pytest.mark.parametrize("step", ["../../dumps/base/paddle", "/etc", "step-00000/..", ".", "a\u202eb", "x\ny"])
def test_a_step_name_that_is_not_a_folder_of_the_tree_is_refused(tmp_path, step):
    tree = write_tree(tmp_path / "t", "paddle", ["fc1"], steps=[step_folder(0), step])
    with pytest.raises(TreeError) as error:
        read_tree(tree)
    message = str(error.value)
    assert message.startswith(f"{tree / MANIFEST_FILE}: steps.1: {ascii(step)} is not a step folder of the tree")
    assert "\n" not in message and "\u202e" not in message and error.value.exit_code == 2


def test_compare_and_gate_never_read_a_step_outside_the_tree(tmp_path, capsys):
    """The issue's try: a step named ../../dumps/base/paddle, a dump outside the tree, read by `compare` and
    by `gate --tree --update` (which wrote its golden and exited 0)."""
    make_dump(1, side="paddle").write(tmp_path / "dumps" / "base" / "paddle")
    sneaky = write_tree(tmp_path / "trees" / "sneaky", "paddle", ["fc1"], steps=["../../dumps/base/paddle"])
    honest = write_tree(tmp_path / "honest", "paddle", ["fc1"])
    expected = f"{sneaky / MANIFEST_FILE}: steps.0: '../../dumps/base/paddle' is not a step folder of the tree"
    html = ("--html", tmp_path / "r.html")
    for args in (("compare", sneaky, honest, *html), ("compare", honest, sneaky, *html),
                 ("gate", "--tree", sneaky, "--baseline", tmp_path / "base", "--update")):
        assert error_line(cli(capsys, *args)).startswith(expected)
    assert not (tmp_path / "base").exists() and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("side", ["a\u202eb", "../x", "a/b"])
def test_a_side_name_that_is_not_safe_is_refused_when_a_tree_is_read(tmp_path, side):
    """A tree written before capture checked its side names, or edited: the name would print raw."""
    tree = write_tree(tmp_path / "t", "paddle", ["fc1"])
    manifest = tree / MANIFEST_FILE
    manifest.write_text(manifest.read_text().replace('"side": "paddle"', f'"side": {json.dumps(side)}'))
    with pytest.raises(TreeError) as error:
        read_tree(tree)
    assert str(error.value).startswith(f"{manifest}: side: {ascii(side)} is not a side name")
    assert "\u202e" not in str(error.value)


def test_a_step_listed_twice_is_refused(tmp_path):
    tree = write_tree(tmp_path / "t", "paddle", ["fc1"], steps=[step_folder(0), step_folder(0)])
    with pytest.raises(TreeError, match=r"capture.json: steps.1: 'step-00000' is listed twice"):
        read_tree(tree)


# --- a dump's recorded expectations --------------------------------------------------------------------

@pytest.mark.parametrize("side", ["a", "b"])
@pytest.mark.parametrize("expect, field", [
    ({"all": "bitwse"}, "case.expect.all: an expectation is bitwise, report"),
    ({"all": {"max_ulp": -3}}, "case.expect.all.max_ulp: Input should be greater than or equal to 0"),
    ({"tensors": {"out": 7}}, "case.expect.tensors.out: an expectation is bitwise"),
    ({"al": "bitwise"}, "case.expect.al: Extra inputs are not permitted"),
    ("bitwise", "case.expect: Input should be a valid dictionary"),
])
def test_an_invalid_recorded_expectation_is_one_error_naming_the_dumps_meta(tmp_path, capsys, side, expect, field):
    dumps = {name: make_dump(1, side=name).write(tmp_path / name) for name in ("a", "b")}
    meta_path = dumps[side] / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["case"]["expect"] = expect
    meta_path.write_text(json.dumps(meta))
    done = cli(capsys, "compare", dumps["a"], dumps["b"], "--html", tmp_path / "r.html")
    assert error_line(done).startswith(f"{dumps[side]}: meta.json: {field}")
    # the store reads the case as data; the comparison, which holds the tensors to it, checks it
    read = {name: Dump.read(path) for name, path in dumps.items()}
    with pytest.raises(DumpError, match=f"^{dumps[side]}: meta.json: case.expect"):
        compare_dumps(read["a"], read["b"], ExpectSpec())


# --- maps ----------------------------------------------------------------------------------------------

@pytest.fixture
def renamed(tmp_path):
    """Tree A names its modules fc1, fc2; tree B (the same values) lin1, lin2."""
    return write_tree(tmp_path / "a", "megatron", ["fc1", "fc2"]), write_tree(tmp_path / "b", "paddle", ["lin1", "lin2"])


def map_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "map.yaml"
    path.write_text(text)
    return path


GOOD = "format: xfalign-map/1\nsides: {a: megatron, b: paddle}\nmodules:\n  - {a: fc1, b: lin1}\n  - {a: fc2, b: lin2}\n"


def test_a_map_that_fits_its_trees_pairs_them(renamed, tmp_path, capsys):
    done = cli(capsys, "compare", *renamed, "--map", map_file(tmp_path, GOOD), "--html", tmp_path / "r.html")
    assert done.returncode == 0, done
    a = write_tree(tmp_path / "tp2", "mcore-tp2", ["fc1", "fc2"], framework="megatron")  # sides name a side or its framework
    assert compare_trees(a, renamed[1], load_map(map_file(tmp_path, GOOD))).passed


@pytest.mark.parametrize("text, where", [
    (GOOD.replace("b: lin2", "b: lin_2"), ":5: modules.1.b: 'lin_2' matches no module of tree B"),
    (GOOD.replace("a: fc2", "a: fc_2"), ":5: modules.1.a: 'fc_2' matches no module of tree A"),
    (GOOD.replace("b: lin2}", "b: [lin2, lin3]}"), ":5: modules.1.b.1: 'lin3' matches no module of tree B"),
    (GOOD + "tensors:\n  - a: 'fc1:param.{p}'\n    b: 'lin1:parm.{p}'\n",
     ":8: tensors.0.b: 'lin1:parm.{p}' matches no tensor of tree B"),
    (GOOD + "tensors:\n  - a: 'fc1:param.weight'\n    b: {x: 'lin1:param.weight', y: 'lin9:param.weight'}\n"
            "    split: {axis: 0}\n", ":8: tensors.0.b.y: 'lin9:param.weight' matches no tensor of tree B"),
    (GOOD + "ignore:\n  b: ['lin1#*:output.0', 'lin1#*:inptu.0']\n", ":7: ignore.b.1: 'lin1#*:inptu.0' matches no tensor"),
    (GOOD.replace("a: megatron", "a: paddle"), ":2: sides.a: the map is for side 'paddle', but tree A"),
    (GOOD.replace("b: paddle", "b: megatron"), ":2: sides.b: the map is for side 'megatron', but tree B"),
])
def test_a_map_that_does_not_fit_the_trees_is_one_line_with_file_line_field(renamed, tmp_path, capsys, text, where):
    path = map_file(tmp_path, text)
    with pytest.raises(MapError) as error:
        compare_trees(*renamed, load_map(path), map_path=path)
    assert str(error.value).startswith(f"{path}{where}") and "\n" not in str(error.value)
    done = cli(capsys, "compare", *renamed, "--map", path, "--html", tmp_path / "r.html")
    assert error_line(done).startswith(f"{path}{where}") and not (tmp_path / "r.html").exists()


def test_trees_given_in_the_other_order_than_the_maps_sides_are_refused(renamed, tmp_path, capsys):
    done = cli(capsys, "compare", *reversed(renamed), "--map", map_file(tmp_path, GOOD), "--html", tmp_path / "r.html")
    assert "sides.a: the map is for side 'megatron', but tree A" in error_line(done)
    assert "give the trees in the map's order" in error_line(done)


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "format: xfalign-map/1\n",
                                  "format: xfalign-map/1\nsides: {a: megatron, b: paddle}\nmodules: []\ntensors: []\n"])
def test_an_empty_map_is_refused(renamed, tmp_path, capsys, text):
    path = map_file(tmp_path, text)
    with pytest.raises(MapError, match=r"^.*map.yaml:1: \(top level\): the map has no modules, tensors or ignore entries"):
        load_map(path)
    done = cli(capsys, "compare", *renamed, "--map", path, "--html", tmp_path / "r.html")
    assert "xfalign map suggest" in error_line(done)


def test_trees_with_no_name_in_common_get_the_way_to_a_map(renamed, tmp_path, capsys):
    a, b = renamed
    with pytest.raises(UsageError) as error:
        compare_trees(a, b)
    assert str(error.value) == (f"{a} and {b}: step-00000 shares no tensor name between the trees (A has "
                                f"fc1:param.weight, B lin1:param.weight): pair them with a map: xfalign map suggest "
                                f"{a} {b} -o map.yaml, check it, then compare with --map map.yaml")
    assert "xfalign map suggest" in error_line(cli(capsys, "compare", a, b, "--html", tmp_path / "r.html"))
    partly = write_tree(tmp_path / "partly", "paddle", ["fc1", "lin2"])
    assert compare_trees(a, partly).status == "fail"  # some names in common: compared, the others one-sided


def test_a_suggested_map_names_the_trees_sides_and_fits_them(tmp_path):
    a = write_tree(tmp_path / "a", "mcore-tp1", ["fc1", "fc2"])
    b = write_tree(tmp_path / "b", "paddle-fleet", ["lin1", "lin2"])
    text = suggest_map(read_tree(a), read_tree(b))
    assert 'sides: {a: "mcore-tp1", b: "paddle-fleet"}' in text
    assert compare_trees(a, b, load_map(map_file(tmp_path, text))).passed
    with pytest.raises(MapError, match="sides.a: the map is for side 'mcore-tp1'"):
        compare_trees(b, a, load_map(tmp_path / "map.yaml"))
    c = write_tree(tmp_path / "c", "other", [])
    with pytest.raises(MapError, match="no forward record of step 0 pairs"):
        suggest_map(read_tree(a), read_tree(c))
