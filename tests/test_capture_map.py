"""The name/layout map (harness.capture.mapping) and `map suggest` (harness.capture.suggest), on dumps shaped
like the demo: a megatron-core MLP (linear_fc1 [2*ffn, h] = gate rows then up rows, torch [out, in],
activations [s, b, h]) against a PaddleFormers-style LLaMA MLP (gate_proj, up_proj, down_proj in [in, out],
activations [b, s, h]). No framework: numpy arrays and harness.store.dump.Dump."""

from __future__ import annotations

import json
import textwrap

import ml_dtypes
import numpy as np
import pytest

from harness import __version__
from harness.capture.mapping import MapApplyError, MapError, MappedDump, TensorMap, load_map
from harness.capture.suggest import suggest_map
from harness.store.digest import Digest
from harness.store.dump import Dump
from harness.store.tree import read_tree
from harness.store.tree_format import MANIFEST_FILE, CaptureInfo, CaptureManifest, ModuleInfo, Record, step_folder

S, B, H, FFN, LAYERS = 3, 2, 4, 5, 2
BF16 = ml_dtypes.bfloat16

DEMO_MAP = """\
format: xfalign-map/1
sides: {a: megatron, b: paddle}
defaults:
  calls: {permute: [1, 0, 2]}          # A [s, b, h] = B [b, s, h]
  params: {transpose: true}            # torch [out, in] = paddle [in, out]
modules:
  - {a: "(root)", b: "(root)"}
  - {a: "decoder.layers.{i}.mlp", b: "layers.{i}.mlp"}
  - {a: "decoder.layers.{i}.mlp.linear_fc2", b: "layers.{i}.mlp.down_proj"}
  - a: "decoder.layers.{i}.mlp.linear_fc1"
    b: ["layers.{i}.mlp.gate_proj", "layers.{i}.mlp.up_proj"]
tensors:
  - a: "decoder.layers.{i}.mlp.linear_fc1:{role:param|grad}.{p}"    # [2*ffn, h]: gate rows, then up rows
    b: {gate: "layers.{i}.mlp.gate_proj:{role}.{p}", up: "layers.{i}.mlp.up_proj:{role}.{p}"}
    transpose: true
    split: {axis: 0}
  - a: "decoder.layers.{i}.mlp.linear_fc1#{c}:{role:output|grad_output}.0"    # [s, b, 2*ffn]
    b: {gate: "layers.{i}.mlp.gate_proj#{c}:{role}.0", up: "layers.{i}.mlp.up_proj#{c}:{role}.0"}
    permute: [1, 0, 2]
    split: {axis: -1, sizes: [5, 5]}
  - a: "decoder.layers.{i}.mlp.linear_fc1#{c}:input.0"
    b: "layers.{i}.mlp.gate_proj#{c}:input.0"
    permute: [1, 0, 2]
ignore:
  b: ["layers.{i}.mlp.up_proj#{c}:input.0"]     # the same input as gate_proj's
"""


def _rng_array(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def demo_pair(dtype=np.float32, seed=0):
    """(A arrays, B arrays, A records, B records): B made from A by the true relations, so a right map
    makes A's names, shapes and bytes from B's exactly."""
    rng = np.random.default_rng(seed)
    a, b, rec_a, rec_b = {}, {}, [], []
    sbh = lambda x: np.ascontiguousarray(x.transpose(1, 0, 2))  # noqa: E731  [s, b, .] <-> [b, s, .]
    a["(root)#0:input.0"] = _rng_array(rng, (S, B, H), dtype)
    b["(root)#0:input.0"] = sbh(a["(root)#0:input.0"])
    for i in range(LAYERS):
        ma, mb = f"decoder.layers.{i}.mlp", f"layers.{i}.mlp"
        fc1, fc2 = f"{ma}.linear_fc1", f"{ma}.linear_fc2"
        gate, up, down = f"{mb}.gate_proj", f"{mb}.up_proj", f"{mb}.down_proj"
        for role in ("param", "grad"):
            w1, b1 = _rng_array(rng, (2 * FFN, H), dtype), _rng_array(rng, (2 * FFN,), dtype)
            w2, b2 = _rng_array(rng, (H, FFN), dtype), _rng_array(rng, (H,), dtype)
            a.update({f"{fc1}:{role}.weight": w1, f"{fc1}:{role}.bias": b1, f"{fc2}:{role}.weight": w2, f"{fc2}:{role}.bias": b2})
            b.update({f"{gate}:{role}.weight": np.ascontiguousarray(w1[:FFN].T), f"{gate}:{role}.bias": b1[:FFN],
                      f"{up}:{role}.weight": np.ascontiguousarray(w1[FFN:].T), f"{up}:{role}.bias": b1[FFN:],
                      f"{down}:{role}.weight": np.ascontiguousarray(w2.T), f"{down}:{role}.bias": b2})
        x = _rng_array(rng, (S, B, H), dtype)
        a[f"{ma}#0:input.0"] = a[f"{fc1}#0:input.0"] = x
        b[f"{mb}#0:input.0"] = b[f"{gate}#0:input.0"] = b[f"{up}#0:input.0"] = sbh(x)
        for role in ("output", "grad_output"):
            h1 = _rng_array(rng, (S, B, 2 * FFN), dtype)
            a[f"{fc1}#0:{role}.0"] = h1
            b[f"{gate}#0:{role}.0"], b[f"{up}#0:{role}.0"] = sbh(h1[..., :FFN]), sbh(h1[..., FFN:])
            for module_a, module_b, shape in ((fc2, down, (S, B, H)), (ma, mb, (S, B, H))):
                y = _rng_array(rng, shape, dtype)
                a[f"{module_a}#0:{role}.0"], b[f"{module_b}#0:{role}.0"] = y, sbh(y)
        h2 = _rng_array(rng, (S, B, FFN), dtype)
        a[f"{fc2}#0:input.0"], b[f"{down}#0:input.0"] = h2, sbh(h2)
        rec_a += [Record(module=fc1, call=0, phase="forward", tensors=[f"{fc1}#0:input.0", f"{fc1}#0:output.0"]),
                  Record(module=fc2, call=0, phase="forward", tensors=[f"{fc2}#0:input.0", f"{fc2}#0:output.0"]),
                  Record(module=ma, call=0, phase="forward", tensors=[f"{ma}#0:input.0", f"{ma}#0:output.0"])]
        rec_b += [Record(module=gate, call=0, phase="forward", tensors=[f"{gate}#0:input.0", f"{gate}#0:output.0"]),
                  Record(module=up, call=0, phase="forward", tensors=[f"{up}#0:input.0", f"{up}#0:output.0"]),
                  Record(module=down, call=0, phase="forward", tensors=[f"{down}#0:input.0", f"{down}#0:output.0"]),
                  Record(module=mb, call=0, phase="forward", tensors=[f"{mb}#0:input.0", f"{mb}#0:output.0"])]
    for role in ("output", "grad_output"):
        a[f"(root)#0:{role}.0"] = _rng_array(rng, (S, B, H), dtype)
        b[f"(root)#0:{role}.0"] = sbh(a[f"(root)#0:{role}.0"])
    rec_a.append(Record(module="(root)", call=0, phase="forward", tensors=["(root)#0:input.0", "(root)#0:output.0"]))
    rec_b.append(Record(module="(root)", call=0, phase="forward", tensors=["(root)#0:input.0", "(root)#0:output.0"]))
    return a, b, _with_params(rec_a, a), _with_params(rec_b, b)


def _with_params(forward: list[Record], arrays: dict) -> list[Record]:
    modules = list(dict.fromkeys(n.split(":")[0] for n in arrays if ":param." in n))
    params = [Record(module=m, phase="params", tensors=[n for n in arrays if n.startswith(f"{m}:param.")]) for m in modules]
    grads = [Record(module=m, phase="grads", tensors=[n for n in arrays if n.startswith(f"{m}:grad.")]) for m in modules]
    backward = [Record(module=r.module, call=r.call, phase="backward",
                       tensors=[t.replace(":output.", ":grad_output.") for t in r.tensors if ":output." in t])
                for r in reversed(forward)]
    return params + forward + backward + grads


def make_dump(side: str, arrays: dict, records: list[Record], unstored: tuple[str, ...] = ()) -> Dump:
    modules = [ModuleInfo(name=r.module, type="Module") for r in records if r.phase == "forward"]
    capture = CaptureInfo(step=0, mode="digest" if unstored else "full", root="Model", modules=modules, records=records)
    order = [name for record in records for name in record.tensors]
    assert sorted(order) == sorted(arrays), set(order) ^ set(arrays)
    meta = {"case": {}, "case_name": "capture", "side": side, "framework": side, "impl": "Model", "provenance": "test",
            "environment": {}, "inputs": {}, "capture": capture.model_dump(mode="json")}
    digest_only = {n: {**Digest.of(arrays[n]).to_json(xxh3=True), "stats": None} for n in unstored}
    return Dump(meta, {n: arrays[n] for n in order if n not in unstored}, unstored=digest_only, order=order)


def write_tree(path, dump: Dump):
    dump.write(path / step_folder(0))
    manifest = CaptureManifest(format="xfalign-capture/1", xfalign=__version__, side=dump.side, framework=dump.side,
                               mode="full", root="Model", steps=[step_folder(0)])
    (path / MANIFEST_FILE).write_text(json.dumps(manifest.model_dump(mode="json")))
    return read_tree(path)


@pytest.fixture
def demo_map(tmp_path):
    path = tmp_path / "map.yaml"
    path.write_text(DEMO_MAP)
    return load_map(path)


def assert_same(made: dict, expected: dict):
    assert sorted(made) == sorted(expected), set(made) ^ set(expected)
    for name, array in expected.items():
        assert made[name].shape == array.shape and made[name].dtype == array.dtype, name
        assert made[name].tobytes() == array.tobytes(), name


def test_to_a_makes_a_names_layouts_and_bytes_from_b(demo_map, tmp_path):
    a, b, rec_a, rec_b = demo_pair(BF16)
    dump_b = Dump.read(make_dump("paddle", b, rec_b).write(tmp_path / "b"), check_bytes=False)
    mapped = demo_map.to_a(dump_b)
    assert isinstance(mapped, MappedDump)
    assert_same(dict(mapped.tensors), a)
    assert mapped.unmapped == [] and mapped.left_out == {}
    assert mapped.ignored == [f"layers.{i}.mlp.up_proj#0:input.0" for i in range(LAYERS)]
    assert mapped.sources["decoder.layers.1.mlp.linear_fc1:param.weight"] == [
        "layers.1.mlp.gate_proj:param.weight", "layers.1.mlp.up_proj:param.weight"]
    digests = mapped.digests  # recorded under A's names, equal to the digests of A's bytes
    assert all(digests[name] == Digest.of(array) for name, array in a.items())
    assert sorted(mapped.order) == sorted(a)


def test_to_b_is_the_inverse(demo_map):
    a, b, _, _ = demo_pair()
    expected = {n: v for n, v in b.items() if not n.endswith("up_proj#0:input.0")}
    assert_same(demo_map.to_b(a), expected)


def test_digest_only_renamed_when_bytes_are_kept_else_left_out(demo_map):
    a, b, _, rec_b = demo_pair()
    # batch 1: swapping [b, s] keeps the bytes, so the digest carries over under A's name and shape
    one = {n: (v[:1] if v.ndim == 3 else v) for n, v in b.items()}
    unstored = ("layers.0.mlp.down_proj#0:output.0", "layers.0.mlp.down_proj:param.bias",
                "layers.0.mlp.down_proj:param.weight", "layers.0.mlp.gate_proj:param.weight")
    mapped = demo_map.to_a(make_dump("paddle", one, rec_b, unstored))
    out = "decoder.layers.0.mlp.linear_fc2#0:output.0"
    assert mapped.unstored[out]["shape"] == [S, 1, H]
    assert mapped.unstored[out]["md5"] == Digest.of(np.ascontiguousarray(one[unstored[0]].transpose(1, 0, 2))).md5
    assert "decoder.layers.0.mlp.linear_fc2:param.bias" in mapped.unstored  # 1-D: transpose keeps it
    assert "digest-only" in mapped.left_out["decoder.layers.0.mlp.linear_fc2:param.weight"]
    assert "joining parts needs full tensors" in mapped.left_out["decoder.layers.0.mlp.linear_fc1:param.weight"]
    assert "decoder.layers.0.mlp.linear_fc1:param.weight" not in mapped.digests


def test_identity_map_keeps_names_and_unmapped_tensors_keep_theirs(tmp_path):
    a, _, rec_a, _ = demo_pair()
    mapped = TensorMap().to_a(make_dump("megatron", a, rec_a))
    assert_same(dict(mapped.tensors), a)
    assert load_map(None).is_identity and len(mapped.unmapped) == len(a)
    path = tmp_path / "partial.yaml"
    path.write_text('modules:\n  - {a: "decoder.layers.{i}.mlp", b: "layers.{i}.mlp"}\n')
    _, b, _, rec_b = demo_pair()
    mapped = load_map(path).to_a(make_dump("paddle", b, rec_b))
    assert "decoder.layers.0.mlp#0:output.0" in mapped.tensors  # renamed, layout untouched
    assert "layers.0.mlp.gate_proj#0:output.0" in mapped.tensors and "layers.0.mlp.gate_proj#0:output.0" in mapped.unmapped


def test_module_pairs(demo_map):
    modules_a = ["decoder.layers.0.mlp.linear_fc1", "decoder.layers.0.mlp.linear_fc2", "decoder.layers.0.mlp", "(root)", "other"]
    assert demo_map.module_pairs(modules_a) == {
        "decoder.layers.0.mlp.linear_fc1": ["layers.0.mlp.gate_proj", "layers.0.mlp.up_proj"],
        "decoder.layers.0.mlp.linear_fc2": ["layers.0.mlp.down_proj"], "decoder.layers.0.mlp": ["layers.0.mlp"],
        "(root)": ["(root)"], "other": ["other"]}
    assert demo_map.module_pairs(["other"], modules_b=["x"]) == {"other": []}


EXPERTS_MAP = """\
tensors:
  - a: "moe.experts:{role:param|grad}.weight1"     # [E, h, ffn]
    b: "moe.local_experts.{e}.fc1:{role}.weight"   # [ffn, h] each
    transpose: true
    split: {axis: 0, stack: true}
  - a: "moe.experts#{c}:output.0"                  # [E*t, h]: the experts' outputs one after another
    b: "moe.local_experts.{e}.fc1#{c}:output.0"
    split: {axis: 0, count: 3}
  - a: "moe.router.{e}:param.w"                    # the other way: B holds one fused [E, h]
    b: "moe.gate:param.weight"
    split: {axis: 0, stack: true}
"""


def test_experts_concat_stack_and_split(tmp_path):
    path = tmp_path / "experts.yaml"
    path.write_text(EXPERTS_MAP)
    tensor_map = load_map(path)
    rng = np.random.default_rng(1)
    b = {f"moe.local_experts.{e}.fc1:param.weight": _rng_array(rng, (FFN, H)) for e in range(3)}
    b |= {f"moe.local_experts.{e}.fc1#0:output.0": _rng_array(rng, (2 + e, H)) for e in range(3)}
    b["moe.gate:param.weight"] = _rng_array(rng, (3, H))
    records = [Record(module="moe", phase="params", tensors=list(b))]
    mapped = tensor_map.to_a(make_dump("b", b, records))
    stacked = np.stack([b[f"moe.local_experts.{e}.fc1:param.weight"].T for e in range(3)])
    assert mapped.tensors["moe.experts:param.weight1"].tobytes() == stacked.tobytes()
    assert mapped.tensors["moe.experts#0:output.0"].shape == (9, H)
    assert mapped.tensors["moe.router.2:param.w"].tobytes() == b["moe.gate:param.weight"][2].tobytes()
    assert tensor_map.module_pairs(["moe.experts", "moe.router.1"], ["moe.local_experts.0.fc1", "moe.local_experts.1.fc1", "moe.gate"]) \
        == {"moe.experts": ["moe.local_experts.0.fc1", "moe.local_experts.1.fc1"], "moe.router.1": ["moe.gate"]}
    back = tensor_map.to_b({n: np.asarray(v) for n, v in mapped.tensors.items() if n != "moe.experts#0:output.0"})
    assert_same(back, {n: v for n, v in b.items() if "#" not in n})
    with pytest.raises(MapApplyError, match=r"experts.yaml:6 \(tensors\[1\]\): tensor moe.experts#0:output.0: axis 0 has 10"):
        tensor_map.to_b({"moe.experts#0:output.0": np.zeros((10, H), np.float32)})


def test_shape_error_names_the_tensor_and_the_entry(demo_map):
    _, b, _, rec_b = demo_pair()
    b["layers.1.mlp.up_proj#0:output.0"] = np.zeros((B, S, FFN + 1), np.float32)
    with pytest.raises(MapApplyError, match=r"map.yaml:17 \(tensors\[1\]\): tensor decoder.layers.1.mlp.linear_fc1#0:"
                                            r"output.0 \(from .*\): parts have sizes \[5, 6\]") as error:
        demo_map.to_a(make_dump("paddle", b, rec_b))
    assert error.value.exit_code == 2


@pytest.mark.parametrize("text, where", [
    ("tensors:\n  - a: x\n    b: y\n    permute: [0, 0]\n", r":4: tensors.0.permute: permute lists each axis"),
    ("tensors:\n  - a: x\n    b: [y, z]\n", r":2: tensors.0.split: several parts need split"),
    ("tensors:\n  - a: 'x.{i}'\n    b: 'y.{j}'\n", r":3: tensors.0.b: captures differ"),
    ("tensors:\n  - a: x\n    b: {p: 'y.{'}\n", r":3: tensors.0.b: unbalanced"),
    ("modules:\n  - a: x\n    b: y\n    calls: {permute: [1, 0], transpose: true}\n", r":4: modules.0.calls: give permute or"),
    ("modules:\n  - a: 'x:param.w'\n    b: y\n", r":2: modules.0.a: 'x:param.w': a module path has no"),
    ("modules:\n  - {a: x, b: [y, z], params: {transpose: true}}\n", r":2: modules.0.params: a layout needs a one-to-one"),
    ("tensors:\n  - a: x\n    b: y\n    splitt: {axis: 0}\n", r":4: tensors.0.splitt: Extra inputs"),
    ("format: xfalign-map/2\n", r":1: format: Input should be 'xfalign-map/1'"),
    ("modules: []\nmodules: []\n", r":2: modules: duplicate key"),
    ("tensors: [\n", r":2: \(yaml\)"),
    ("- a\n", r":1: \(top level\): a map is a mapping"),
    ("modules: [{a: x, b: y}]\nroles:\n  - {a: exp_avgs, b: moment1}\n", r":3: roles.0.a: 'exp_avgs' is not a role of a"),
    ("modules: [{a: x, b: y}]\nroles:\n  - {}\n", r":3: roles.0: give a, b or both"),
    ("roles:\n  - {a: exp_avg, b: moment1}\n  - {a: exp_avg_sq, b: moment1}\n", r":3: roles.1.b: 'moment1' is listed twice"),
    ("roles:\n  - {a: step}\n  - {a: step, b: beta1_pow_acc}\n", r":3: roles.1.a: 'step' is listed twice"),
    ("roles:\n  - {a: exp_avg, c: moment1}\n", r":2: roles.0.c: Extra inputs"),
])
def test_bad_map_is_one_line_with_file_line_field(tmp_path, text, where):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(MapError, match=where) as error:
        load_map(path)
    assert str(error.value).startswith(str(path)) and "\n" not in str(error.value) and error.value.exit_code == 2


def test_suggested_map_makes_a_names_and_shapes_from_b(tmp_path):
    a, b, rec_a, rec_b = demo_pair(BF16)
    tree_a = write_tree(tmp_path / "megatron", make_dump("megatron", a, rec_a))
    tree_b = write_tree(tmp_path / "paddle", make_dump("paddle", b, rec_b))
    text = suggest_map(tree_a, tree_b)
    path = tmp_path / "suggested.yaml"
    path.write_text(text)
    mapped = load_map(path).to_a(tree_b.step(0))
    assert {n: v.shape for n, v in mapped.tensors.items()} == {n: v.shape for n, v in a.items()}, text
    assert_same(dict(mapped.tensors), a)  # shapes alone would allow [up; gate]: the bytes say gate first
    assert "#" in text and "linear_fc1" in textwrap.dedent(text)


def test_suggest_checks_part_order_on_bytes_and_skips_an_activation_module(tmp_path):
    a, b, rec_a, rec_b = demo_pair(seed=2)
    forward = []
    for record in rec_b:  # B runs up_proj, then an activation module, then gate_proj
        if record.phase == "forward" and record.module.endswith("gate_proj"):
            gate = record
            continue
        forward.append(record)
        if record.phase == "forward" and record.module.endswith("up_proj"):
            act = record.module.replace("up_proj", "act_fn")
            b[f"{act}#0:input.0"] = b[f"{act}#0:output.0"] = b[gate.tensors[1]]
            forward += [Record(module=act, call=0, phase="forward", tensors=[f"{act}#0:input.0", f"{act}#0:output.0"]), gate]
    text = suggest_map(write_tree(tmp_path / "a", make_dump("megatron", a, rec_a)),
                       write_tree(tmp_path / "b", make_dump("paddle", b, forward)))
    assert "checked: the parameter bytes match in this order" in text and "B layers.0.mlp.act_fn#0: no A record" in text
    (tmp_path / "map.yaml").write_text(text)
    mapped = load_map(tmp_path / "map.yaml").to_a(make_dump("paddle", b, forward))
    assert mapped.unmapped == [f"layers.{i}.mlp.act_fn#0:{r}.0" for i in range(LAYERS) for r in ("input", "output")]
    assert_same({n: v for n, v in mapped.tensors.items() if n not in mapped.unmapped}, a)


def test_suggest_without_bytes_says_to_check_the_part_order(tmp_path):
    a, b, rec_a, rec_b = demo_pair()
    params = tuple(n for n in b if ":param." in n)
    text = suggest_map(write_tree(tmp_path / "a", make_dump("megatron", a, rec_a)),
                       write_tree(tmp_path / "b", make_dump("paddle", b, rec_b, unstored=params)))
    assert "in B's execution order: CHECK which part is which" in text
    (tmp_path / "map.yaml").write_text(text)
    assert load_map(tmp_path / "map.yaml").to_b(a).keys() == {n for n in b if not n.endswith("up_proj#0:input.0")}
