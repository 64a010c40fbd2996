"""Comparing two capture trees (harness.compare.tree): the per-record view in execution order, the first
divergent tensor, digest-only captures, missing steps, the CLI's exit codes, the reports, the gate on trees.
Trees are built here from numpy arrays (Dump.write + capture.json): no framework is imported."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness import __version__
from harness.capture.mapping import load_map
from harness.case import ExpectSpec
from harness.cli import main
from harness.compare.expectations import MaxUlp
from harness.compare.findings import Missing
from harness.compare.pairs import DigestPair
from harness.compare.tree import compare_trees
from harness.reports.text import divergence_text, finding_text, tree_verdict_text
from harness.store.digest import Digest
from harness.store.dump import Dump
from harness.store.tree_format import (
    MANIFEST_FILE,
    CaptureInfo,
    CaptureManifest,
    ModuleInfo,
    Record,
    TensorName,
    call_tensor,
    param_tensor,
    rank_folder,
    step_folder,
)

# A two-layer MLP, as a capture records it: parameters at the start, forward of fc1, fc2 and the root,
# backward in reverse, gradients at the end.
MODULES = [ModuleInfo(name="(root)", type="MLP"), ModuleInfo(name="fc1", type="Linear", parent="(root)"),
           ModuleInfo(name="fc2", type="Linear", parent="(root)")]


def _step_tensors(seed: int) -> tuple[list[Record], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 8), dtype=np.float32)
    w1 = rng.standard_normal((16, 8), dtype=np.float32)
    w2 = rng.standard_normal((8, 16), dtype=np.float32)
    h = x @ w1.T
    y = h @ w2.T
    g = np.ones_like(y)
    tensors = {param_tensor("fc1", "param", "weight"): w1, param_tensor("fc2", "param", "weight"): w2,
               call_tensor("fc1", 0, "input", 0): x, call_tensor("fc1", 0, "output", 0): h,
               call_tensor("fc2", 0, "input", 0): h, call_tensor("fc2", 0, "output", 0): y,
               call_tensor("(root)", 0, "input", 0): x, call_tensor("(root)", 0, "output", 0): y,
               call_tensor("(root)", 0, "grad_output", 0): g, call_tensor("fc2", 0, "grad_output", 0): g,
               call_tensor("fc1", 0, "grad_output", 0): g @ w2,
               param_tensor("fc2", "grad", "weight"): g.T @ h, param_tensor("fc1", "grad", "weight"): (g @ w2).T @ x}
    names = list(tensors)
    records = [Record(module="fc1", phase="params", tensors=names[0:1]),
               Record(module="fc2", phase="params", tensors=names[1:2]),
               Record(module="fc1", call=0, phase="forward", tensors=names[2:4]),
               Record(module="fc2", call=0, phase="forward", tensors=names[4:6]),
               Record(module="(root)", call=0, phase="forward", tensors=names[6:8]),
               Record(module="(root)", call=0, phase="backward", tensors=names[8:9]),
               Record(module="fc2", call=0, phase="backward", tensors=names[9:10]),
               Record(module="fc1", call=0, phase="backward", tensors=names[10:11]),
               Record(module="fc2", phase="grads", tensors=names[11:12]),
               Record(module="fc1", phase="grads", tensors=names[12:13])]
    return records, tensors


def write_tree(path: Path, side: str, steps: int = 2, mode: str = "full", change=None) -> Path:
    """A capture tree of `steps` steps; `change(step, tensors)` edits a step's tensors before writing."""
    names = []
    for step in range(steps):
        records, tensors = _step_tensors(step)
        if change:
            change(step, tensors)
        info = CaptureInfo(step=step, mode=mode, root="MLP", modules=MODULES, records=records)
        meta = {"case": {}, "case_name": "capture", "side": side, "framework": side, "impl": "MLP",
                "provenance": f"test tree ({side})", "environment": {"device": "cpu"}, "inputs": {},
                "capture": info.model_dump(mode="json")}
        order = list(tensors)
        if mode == "digest":
            digests = {name: Digest.of(array) for name, array in tensors.items()}
            unstored = {name: d.to_json(xxh3=True) | {"stats": {"min": float(tensors[name].min()), "max": 0.0,
                                                                "mean": 0.0, "norm": float(np.linalg.norm(tensors[name])),
                                                                "nan": 0, "inf": 0}}
                        for name, d in digests.items()}
            dump = Dump(meta, {}, unstored=unstored, order=order)
        else:
            dump = Dump(meta, tensors, order=order)
        dump.write(path / step_folder(step))
        names.append(step_folder(step))
    manifest = CaptureManifest(format="xfalign-capture/1", xfalign=__version__, side=side, framework=side, mode=mode,
                               root="MLP", steps=names)
    (path / MANIFEST_FILE).write_text(manifest.model_dump_json(indent=1))
    return path


def one_ulp_in_weight(step, tensors):
    """One element of fc2's weight 1 ULP up, at step 1 only (the forward values are left as computed)."""
    if step == 1:
        weight = tensors[param_tensor("fc2", "param", "weight")].copy()
        weight.view(np.uint32)[3, 5] += 1
        tensors[param_tensor("fc2", "param", "weight")] = weight


@pytest.fixture
def trees(tmp_path):
    return write_tree(tmp_path / "a", "megatron"), write_tree(tmp_path / "b", "paddle", change=one_ulp_in_weight)


def test_one_ulp_in_one_weight_element_is_the_first_divergence(trees):
    result = compare_trees(*trees)
    assert result.status == "fail"
    assert [step.status for step in result.steps] == ["pass", "fail"]
    divergence = result.divergence
    assert divergence.step == "step-00001" and divergence.name == "fc2:param.weight"
    assert (divergence.module, divergence.module_type, divergence.phase) == ("fc2", "Linear", "params")
    assert divergence.tensor.pair.values.stats.max_ulp == 1 and divergence.tensor.pair.values.stats.differing == 1
    # the table: forward records, then backward, then parameters and gradients
    phases = [view.phase for view in result.steps[1].records]
    assert phases == ["forward"] * 3 + ["backward"] * 3 + ["params", "params", "grads", "grads"]


def test_digest_only_trees_are_compared_by_digest(tmp_path):
    a = write_tree(tmp_path / "a", "megatron", mode="digest")
    b = write_tree(tmp_path / "b", "paddle", mode="digest", change=one_ulp_in_weight)
    result = compare_trees(a, b)
    divergence = result.divergence
    assert divergence.name == "fc2:param.weight" and isinstance(divergence.tensor.pair, DigestPair)
    assert [f.kind for f in divergence.tensor.failures] == ["digest"]
    assert "recorded digests only" in finding_text(divergence.tensor.failures[0])
    assert sum(not r.pair.bitwise for step in result.steps for r in step.comparison.tensors) == 1
    assert result.refetch() == {"megatron": ["fc2"], "paddle": ["fc2"]}
    # a tolerance cannot be checked without values: a failing "needs full tensors" finding, never a pass
    tolerant = compare_trees(a, b, expect=ExpectSpec(all=MaxUlp(max_ulp=4)))
    failures = tolerant.divergence.tensor.failures
    assert failures[0].kind == "needs-values" and "needs full tensors" in finding_text(failures[0])
    assert tolerant.status == "fail"
    # a stored side against a digest-only side: the stored side's digest decides
    mixed = compare_trees(write_tree(tmp_path / "full", "megatron"), a)
    assert mixed.status == "pass"
    assert all(isinstance(r.pair, DigestPair) for r in mixed.steps[0].comparison.tensors)
    assert mixed.steps[0].comparison.tensors[0].pair.digests_only == ("B",)


def test_a_step_missing_on_one_side_fails(tmp_path):
    a = write_tree(tmp_path / "a", "megatron", steps=2)
    b = write_tree(tmp_path / "b", "paddle", steps=1)
    result = compare_trees(a, b)
    assert [step.label for step in result.steps] == ["step-00000"]
    assert [(f.kind, f.tensor, f.data) for f in result.findings] == [("missing", "step-00001", Missing(side="B"))]
    assert result.status == "fail" and result.divergence is None
    assert "step-00001: missing on side B" in tree_verdict_text(result)


def test_b_names_and_layouts_through_a_map(tmp_path):
    """B names its modules lin1/lin2 and keeps weights as [in, out]: the map puts them in A's terms."""
    renamed = {"fc1": "lin1", "fc2": "lin2"}

    def paddle_like(step, tensors):
        for name in list(tensors):
            parsed = TensorName.parse(name)
            array = tensors.pop(name)
            new = name.replace(parsed.module, renamed.get(parsed.module, parsed.module), 1)
            tensors[new] = array.T.copy() if parsed.role in ("param", "grad") else array

    b = write_tree(tmp_path / "b", "paddle", change=paddle_like)
    for step in (0, 1):  # the records name B's modules
        meta_path = b / step_folder(step) / "meta.json"
        meta = json.loads(meta_path.read_text())
        text = json.dumps(meta["capture"]).replace('"fc1', '"lin1').replace('"fc2', '"lin2')
        meta["capture"] = json.loads(text)
        meta_path.write_text(json.dumps(meta))
    map_path = tmp_path / "map.yaml"
    map_path.write_text("format: xfalign-map/1\ndefaults: {params: {transpose: true}}\n"
                        "modules:\n  - {a: fc1, b: lin1}\n  - {a: fc2, b: lin2}\n")
    a = write_tree(tmp_path / "a", "megatron")
    assert compare_trees(a, b).status == "fail"  # the names differ without the map
    assert main(["compare", str(a), str(b), "--map", str(map_path), "--html", str(tmp_path / "r.html")]) == 0


def test_digests_a_map_must_transpose_are_not_compared_and_not_the_divergence(tmp_path):
    """B keeps weights as [in, out] and recorded digests only: the map cannot transpose a digest, so those
    tensors are reported as not compared (failing, with the reason), never as the first divergence."""

    def transposed(step, tensors):
        for name in list(tensors):
            if TensorName.parse(name).role in ("param", "grad"):
                tensors[name] = tensors[name].T.copy()

    a = write_tree(tmp_path / "a", "megatron")
    b = write_tree(tmp_path / "b", "paddle", mode="digest", change=transposed)
    map_path = tmp_path / "map.yaml"
    map_path.write_text("format: xfalign-map/1\ndefaults: {params: {transpose: true}}\n"
                        "modules:\n  - {a: fc1, b: fc1}\n  - {a: fc2, b: fc2}\n")
    result = compare_trees(a, b, load_map(map_path), map_path=str(map_path))
    assert result.status == "fail" and result.divergence is None
    assert result.uncompared == 8  # 2 weights and 2 gradients, in each of 2 steps
    compared = [r for step in result.steps for r in step.comparison.tensors if r.name not in step.left_out]
    assert compared and all(r.pair.bitwise for r in compared)
    assert divergence_text(result.divergence, result.uncompared).startswith("no divergence among the tensors compared; 8 ")


@pytest.fixture
def report(trees, tmp_path, capsys):
    a, b = trees
    paths = {"json": tmp_path / "r.json", "html": tmp_path / "r.html", "refetch": tmp_path / "refetch.yaml"}
    code = main(["compare", str(a), str(b), *(x for key, path in paths.items() for x in (f"--{key}", str(path)))])
    return code, capsys.readouterr().out, paths


def test_compare_cli_terminal_json_html_refetch(report):
    code, out, paths = report
    assert code == 1
    assert "first divergent tensor: fc2:param.weight in step-00001, module fc2 (Linear), params (start)" in out
    assert "param.weight <- first divergent" in out
    data = json.loads(paths["json"].read_text())
    assert data["format"] == "xfalign-report/2" and [c["case"] for c in data["cases"]] == ["step-00000", "step-00001"]
    tree = data["tree"]
    assert tree["status"] == "fail" and tree["first_divergent"]["tensor"] == "fc2:param.weight"
    assert tree["first_divergent"]["module"] == "fc2" and tree["first_divergent"]["module_type"] == "Linear"
    records = tree["steps"][1]["records"]
    assert [r["phase"] for r in records][:4] == ["forward"] * 3 + ["backward"]
    assert [r["module"] for r in records if not r["bitwise"]] == ["fc2"]
    tensor = next(t for t in data["cases"][1]["tensors"] if t["name"] == "fc2:param.weight")
    assert tensor["stats"]["max_ulp"] == 1 and tensor["stats"]["differing"] == 1
    html = paths["html"].read_text()
    assert re.search(r'<li class="differs divergent" data-module="fc2">', html)  # the model tree, marked
    assert 'data-module="fc1"' in html and 'data-module="(root)"' in html
    anchor = re.search(r'<a href="#([^"]+)" id="first-divergent">', html)[1]
    assert f'<section class="tensor first-divergent" id="{anchor}">' in html  # the existing detail section
    assert "Worst elements" in html
    assert yaml.safe_load(paths["refetch"].read_text()) == {"megatron": ["fc2"], "paddle": ["fc2"]}


def test_compare_cli_exit_codes(tmp_path, trees, capsys):
    a, b = trees
    html = ["--html", str(tmp_path / "r.html")]
    assert main(["compare", str(a), str(a), *html]) == 0
    dump = a / step_folder(0)
    assert main(["compare", str(a), str(dump), *html]) == 2  # a tree and a dump
    assert "is a capture tree but" in capsys.readouterr().err
    assert main(["compare", str(dump), str(dump), "--map", str(tmp_path / "m.yaml"), *html]) == 2
    # two step dumps compared as plain dumps: as before, held to their case's expectations (none: report)
    assert main(["compare", str(dump), str(b / step_folder(1)), *html]) == 0
    (tmp_path / "bad.yaml").write_text("format: xfalign-map/1\nmodules: 3\n")
    assert main(["compare", str(a), str(b), "--map", str(tmp_path / "bad.yaml"), *html]) == 2
    assert "bad.yaml:2" in capsys.readouterr().err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / MANIFEST_FILE).write_text("{}")
    assert main(["compare", str(broken), str(a), *html]) == 2


def test_gate_on_a_tree(tmp_path, capsys):
    a = write_tree(tmp_path / "a", "megatron", mode="digest")
    baseline = tmp_path / "baseline"
    gate = ["gate", "--tree", str(a), "--baseline", str(baseline)]
    assert main(gate) == 1  # no golden: written, fails once
    out = capsys.readouterr().out
    assert "no golden yet: wrote" in out and sorted(p.name for p in baseline.iterdir()) == [
        "megatron.step-00000.golden.yaml", "megatron.step-00001.golden.yaml"]
    assert main(gate) == 0
    drifted = write_tree(tmp_path / "drifted", "megatron", mode="digest", change=one_ulp_in_weight)
    gate[2] = str(drifted)
    assert main(gate) == 1
    out = capsys.readouterr().out
    assert "GATE PASS megatron.step-00000" in out
    assert "first drifting tensor: megatron/fc2:param.weight (module fc2)" in out
    assert main([*gate, "--update"]) == 0
    assert "updated: megatron/fc2:param.weight" in capsys.readouterr().out
    assert main(gate) == 0
    assert main(["gate", "--tree", str(a), "case.yaml", "--baseline", str(baseline)]) == 2


def test_map_suggest_cli(trees, tmp_path, capsys):
    a, b = trees
    assert main(["map", "suggest", str(a), str(b)]) == 0
    assert "format: xfalign-map/1" in capsys.readouterr().out
    out = tmp_path / "suggested.yaml"
    assert main(["map", "suggest", str(a), str(b), "-o", str(out)]) == 0
    # the map pairs a with b, in that order (its sides: are checked against the trees); b differs by 1 ULP
    assert main(["compare", str(a), str(b), "--map", str(out), "--html", str(tmp_path / "r.html")]) == 1
    assert main(["map", "suggest", str(a), str(tmp_path / "absent")]) == 2


def test_ranks_are_compared_rank_by_rank(tmp_path):
    """Two trees of the same ranks and a map with no shard: rank by rank (tests/test_capture_ranks.py: assembled)."""
    for side in ("a", "b"):
        for rank in (0, 1):
            tree = write_tree(tmp_path / side / rank_folder(rank), side, steps=1)
            manifest = json.loads((tree / MANIFEST_FILE).read_text()) | {"rank": rank, "world_size": 2}
            (tree / MANIFEST_FILE).write_text(json.dumps(manifest))
    result = compare_trees(tmp_path / "a", tmp_path / "b")
    assert [step.label for step in result.steps] == ["rank-00000/step-00000", "rank-00001/step-00000"]
    assert result.a.ranks == [0, 1] and result.status == "pass"
