"""Capture trees of several ranks (tensor parallel): the map's `shard:` declarations, each step put together
in the canonical layout before it is compared (harness.store.ranks.assemble_step), replicas checked bitwise,
and trees whose ranks do not make one capture refused at read time. Trees are built from numpy arrays."""

import json
import re

import numpy as np
import pytest
from test_capture_compare import write_tree

from harness.capture.mapping import MapError, load_map
from harness.cli import main
from harness.compare.findings import ReplicasDiffer
from harness.compare.tree import compare_trees
from harness.sharding import Sharding
from harness.store.tree import TreeError, read_tree
from harness.store.tree_format import MANIFEST_FILE, call_tensor, param_tensor, rank_folder

# the test MLP (fc1 [16, 8] -> fc2 [8, 16]) as a gated column-parallel fc1 and a row-parallel fc2 split it
SPLIT = {param_tensor("fc1", role, "weight"): Sharding(0, 2) for role in ("param", "grad")} | {
    call_tensor("fc1", 0, role, 0): Sharding(1, 2) for role in ("output", "grad_output")} | {
    call_tensor("fc2", 0, "input", 0): Sharding(1)} | {
    param_tensor("fc2", role, "weight"): Sharding(1) for role in ("param", "grad")}

MAP = """\
format: xfalign-map/1
tensors:
  - a: "fc1:{role:param|grad}.weight"
    b: "fc1:{role}.weight"
    shard: {b: {axis: 0, group: tp, interleave: 2}}
  - a: "fc1#{c}:{role:output|grad_output}.0"
    b: "fc1#{c}:{role}.0"
    shard: {b: {axis: 1, interleave: 2}}
  - a: "fc2#{c}:input.0"
    b: "fc2#{c}:input.0"
    shard: {b: {axis: 1}}
  - a: "fc2:{role:param|grad}.weight"
    b: "fc2:{role}.weight"
    shard: {b: {axis: 1}}
"""


def write_ranks(path, world=2, mode="full", change=None, worlds=None):
    """A tree of `world` ranks, each holding its piece (SPLIT) of the test MLP's tensors; the rest replicated."""
    for rank in range(world):
        def piece(step, tensors, rank=rank):
            for name, sharding in SPLIT.items():
                tensors[name] = sharding.shard(tensors[name], rank, world)
            if change:
                change(rank, tensors)
        tree = write_tree(path / rank_folder(rank), "b", steps=1, mode=mode, change=piece)
        manifest = json.loads((tree / MANIFEST_FILE).read_text())
        manifest |= {"rank": rank, "world_size": (worlds or {}).get(rank, world)}
        (tree / MANIFEST_FILE).write_text(json.dumps(manifest))
    return path


@pytest.fixture
def shard_map(tmp_path):
    (tmp_path / "map.yaml").write_text(MAP)
    return load_map(tmp_path / "map.yaml")


def test_sharded_tree_is_assembled_to_the_canonical_layout(tmp_path, shard_map):
    a = write_tree(tmp_path / "a", "a", steps=1)
    b = write_ranks(tmp_path / "b")
    assert shard_map.sharding("b", "fc1:grad.weight") == Sharding(0, 2) and shard_map.sharding("a", "fc1:grad.weight") is None
    result = compare_trees(a, b, shard_map)
    assert [step.label for step in result.steps] == ["step-00000"] and result.b.ranks == [0, 1]
    assert result.status == "pass", [(r.name, r.findings) for s in result.steps for r in s.comparison.tensors if not r.holds]
    assert len(result.steps[0].comparison.tensors) == 13
    assert main(["compare", str(a), str(b), "--map", str(tmp_path / "map.yaml")]) == 0
    both = tmp_path / "both.yaml"  # ranks on both sides: each assembled as its own shards say
    both.write_text(re.sub(r"shard: \{b: (\{[^}]*\})\}", r"shard: {a: \1, b: \1}", MAP))
    assert main(["compare", str(b), str(b), "--map", str(both)]) == 0
    assert main(["compare", str(b), str(b), "--map", str(tmp_path / "map.yaml")]) == 1  # A's pieces: unequal replicas


def test_a_replica_that_differs_between_ranks_is_a_finding(tmp_path, shard_map):
    def bump(rank, tensors):
        if rank == 1:
            tensors[call_tensor("(root)", 0, "output", 0)] = tensors[call_tensor("(root)", 0, "output", 0)] + 1
    result = compare_trees(write_tree(tmp_path / "a", "a", steps=1), write_ranks(tmp_path / "b", change=bump), shard_map)
    found = [(r.name, f.data) for r in result.steps[0].comparison.tensors for f in r.findings if isinstance(f.data, ReplicasDiffer)]
    assert found == [(call_tensor("(root)", 0, "output", 0), ReplicasDiffer(side="b", ranks=[1], world=2))]
    assert result.status == "fail"


def test_without_a_shard_split_tensors_are_unequal_replicas(tmp_path):
    result = compare_trees(write_tree(tmp_path / "a", "a", steps=1), write_ranks(tmp_path / "b"))
    differ = {r.name for r in result.steps[0].comparison.tensors for f in r.findings if isinstance(f.data, ReplicasDiffer)}
    assert differ == set(SPLIT) and result.status == "fail"


def test_digest_only_split_tensors_are_left_out_with_the_reason(tmp_path, shard_map):
    a = write_tree(tmp_path / "a", "a", steps=1)
    result = compare_trees(a, write_ranks(tmp_path / "b", mode="digest"), shard_map)
    step = result.steps[0]
    assert set(step.left_out) == set(SPLIT)
    assert "digest-only on rank 0: assembling it needs the full pieces" in step.left_out["fc1:grad.weight"]
    results = {r.name: r for r in step.comparison.tensors}
    assert results[call_tensor("(root)", 0, "output", 0)].pair.bitwise  # a replica: its digests compared
    assert result.divergence is None and result.uncompared == len(SPLIT)


@pytest.mark.parametrize("edit, message", [
    ("missing", "a capture of world size 2 lacks rank-00001 (rank folders with a capture.json: rank-00000)"),
    ("worlds", "its ranks disagree on the world size (rank-00000: 2, rank-00001: 3): not one capture"),
])
def test_a_tree_whose_ranks_are_not_one_capture_is_refused(tmp_path, capsys, edit, message):
    b = write_ranks(tmp_path / "b", worlds={1: 3} if edit == "worlds" else None)
    if edit == "missing":
        (b / rank_folder(1) / MANIFEST_FILE).unlink()
    with pytest.raises(TreeError, match="^" + str(b).replace("\\", "\\\\") + ": " + message.replace("(", r"\(").replace(")", r"\)")):
        read_tree(b)
    assert main(["compare", str(write_tree(tmp_path / "a", "a", steps=1)), str(b)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.parametrize("shard, field, message", [
    ("{b: {axis: 0, group: dp}}", "tensors.0.shard.b.group", "only tensor- and expert-parallel groups"),
    ("{b: {axis: 0, interleave: 0}}", "tensors.0.shard.b.interleave", "greater than 0"),
    ("{c: {axis: 0}}", "tensors.0.shard.c", "'a' or 'b'"),
    ("{a: {interleave: 2}}", "tensors.0.shard.a", "give one of axis (split), reduce: sum"),
    ("{b: {axis: 0, reduce: sum}}", "tensors.0.shard.b", "not axis and reduce"),
    ("{b: {reduce: max}}", "tensors.0.shard.b.reduce", "'sum'"),
    ("{b: {local: e}}", "tensors.0.shard.b", "local and per_rank go together"),
    ("{b: {reduce: sum, ragged: true}}", "tensors.0.shard.b", "give axis"),
    ("{b: {axis: 0, ragged: true, interleave: 2}}", "tensors.0.shard.b", "one block per rank"),
])
def test_bad_shard_declarations_name_file_line_and_field(tmp_path, shard, field, message):
    path = tmp_path / "map.yaml"
    path.write_text(f'format: xfalign-map/1\ntensors:\n  - a: "fc1:param.weight"\n    b: "fc1:param.weight"\n'
                    f'    shard: {shard}\n')
    with pytest.raises(MapError) as error:
        load_map(path)
    assert str(error.value).startswith(f"{path}:5: {field}: ") and message in str(error.value), str(error.value)


def test_assembled_tensors_are_the_canonical_bytes(tmp_path, shard_map):
    from harness.store.ranks import assemble_step

    tree = read_tree(write_ranks(tmp_path / "b"))
    whole = read_tree(write_tree(tmp_path / "a", "a", steps=1)).step(0)
    step = assemble_step([tree.ranks[r].step(0) for r in (0, 1)], lambda name: shard_map.sharding("b", name))
    for name in whole.names:
        assert np.asarray(step.tensors[name]).tobytes() == np.asarray(whole.tensors[name]).tobytes(), name
    assert step.meta["world"] == 2 and step.meta["replicas_differ"] == {}


EP_MAP = """\
format: xfalign-map/1
tensors:
  - a: "router:grad.weight"
    b: "router:grad.weight"
    shard: {b: {reduce: sum, group: ep}}
  - a: "experts#{c}:input.0"
    b: "experts#{c}:input.0"
    shard: {b: {axis: 0, ragged: true, group: ep}}
  - a: "experts.local_experts.{e}.fc:{role}.weight"
    b: "experts.local_experts.{e}.fc:{role}.weight"
    shard: {b: {local: e, per_rank: 2, group: ep}}
"""


def test_expert_parallel_pieces_are_renamed_summed_and_joined(tmp_path):
    """EP=2, 4 experts: rank r's local expert l is expert 2r + l; the router's gradient is each rank's
    partial sum; the experts' tokens are as many as each rank received, joined in rank order."""
    from harness.store.dump import Dump
    from harness.store.ranks import assemble_step

    (tmp_path / "map.yaml").write_text(EP_MAP)
    tensor_map = load_map(tmp_path / "map.yaml")
    rng = np.random.default_rng(0)
    dumps = []
    for rank, tokens in ((0, 3), (1, 5)):
        tensors = {f"experts.local_experts.{local}.fc:param.weight": np.full((2, 2), 2 * rank + local, np.float32)
                   for local in range(2)}
        tensors |= {"router:grad.weight": rng.standard_normal((4, 2)).astype(np.float32),
                    "experts#0:input.0": np.full((tokens, 2), rank, np.float32)}
        dumps.append(Dump({"rank": rank, "world": 2}, tensors, order=list(tensors)))
    step = assemble_step(dumps, lambda name: tensor_map.sharding("b", name))
    assert [name for name in step.names if "local_experts" in name] == [
        f"experts.local_experts.{e}.fc:param.weight" for e in (0, 2, 1, 3)]
    for expert in range(4):
        assert (step.tensors[f"experts.local_experts.{expert}.fc:param.weight"] == expert).all()
    assert step.tensors["router:grad.weight"].tobytes() == (
        dumps[0].tensors["router:grad.weight"] + dumps[1].tensors["router:grad.weight"]).tobytes()
    assert step.tensors["experts#0:input.0"][:, 0].tolist() == [0] * 3 + [1] * 5
    assert step.meta["replicas_differ"] == {} and step.left_out == {}
    # a partial sum some rank holds digest-only cannot be added up: left out, with the reason
    digest_only = Dump(dumps[1].meta, {k: v for k, v in dumps[1].tensors.items() if k != "router:grad.weight"},
                       unstored={"router:grad.weight": {"dtype": "float32", "shape": [4, 2]}}, order=dumps[1].order)
    step = assemble_step([dumps[0], digest_only], lambda name: tensor_map.sharding("b", name))
    assert "partial sum" in step.left_out["router:grad.weight"]


def test_a_local_expert_capture_that_holds_no_number_is_refused(tmp_path):
    from harness.capture.mapping import MapApplyError

    (tmp_path / "map.yaml").write_text(EP_MAP.replace("experts.local_experts.{e}.fc", "experts.{e}.fc"))
    tensor_map = load_map(tmp_path / "map.yaml")
    assert tensor_map.sharding("b", "experts.3.fc:param.weight").rename(1) == "experts.5.fc:param.weight"
    with pytest.raises(MapApplyError, match="shard.local"):
        tensor_map.sharding("b", "experts.gate.fc:param.weight")
