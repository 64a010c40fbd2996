"""A map's `roles:` (harness.capture.mapping): torch's optimizer-state words paired with Paddle's, on trees
captured with `capture(..., optimizer=opt)` from a torch model (fc1: Linear [2*ffn, in] = gate rows then up
rows, fc2: Linear [out, in]) and a Paddle one (gate, up, down: Linear [in, out]), trained two steps with
AdamW on the same one-hot inputs. Weights, inputs and upstream gradients are small dyadic numbers, so the
forward, the loss and the gradients are exact on both sides: the optimizer step is the first to differ (Paddle
computes 1 - beta in float32, torch in float64 then rounds to float32)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.capture import capture
from harness.capture.mapping import MapError, load_map
from harness.capture.suggest import STATE_PAIRS, STATES_ALONE, suggest_map
from harness.compare.tree import compare_trees
from harness.store.tree import read_tree
from harness.store.tree_format import STATE_ROLES

pytestmark = pytest.mark.xdist_group("in_process_frameworks")

IN, FFN, OUT, STEPS = 4, 3, 5, 2

ROLES = """\
roles:
  - {a: exp_avg, b: moment1}
  - {a: exp_avg_sq, b: moment2}
  - {a: step}
  - {b: beta1_pow_acc}
  - {b: beta2_pow_acc}
"""

MAP = """\
format: xfalign-map/1
sides: {a: megatron, b: paddle}
""" + ROLES + """\
defaults:
  params: {transpose: true}
modules:
  - {a: "(root)", b: "(root)"}
  - {a: fc2, b: down}
  - {a: fc1, b: [gate, up]}
tensors:
  - a: "fc1:{role:param|grad|grad_clipped|updated|exp_avg|exp_avg_sq}.{p}"
    b: {gate: "gate:{role}.{p}", up: "up:{role}.{p}"}
    transpose: true
    split: {axis: 0}
  - a: "fc1#{c}:{role:output|grad_output}.0"
    b: {gate: "gate#{c}:{role}.0", up: "up#{c}:{role}.0"}
    split: {axis: 1}
  - a: "fc1#{c}:input.0"
    b: "gate#{c}:input.0"
ignore:
  b: ["up#*:input.0"]
"""


def dyadic(rng, shape):
    return (rng.integers(-8, 8, size=shape) / 8).astype(np.float32)


@pytest.fixture(scope="module")
def trees(torch, paddle, tmp_path_factory):
    """(tree A: torch, tree B: Paddle, tree B checked live against A through MAP), each captured with its
    AdamW over STEPS steps."""
    rng = np.random.default_rng(7)
    gate, up, down = dyadic(rng, (IN, FFN)), dyadic(rng, (IN, FFN)), dyadic(rng, (IN, OUT))
    biases = [dyadic(rng, (n,)) for n in (FFN, FFN, OUT)]
    inputs = [np.eye(IN, dtype=np.float32)[[k % IN]] for k in range(STEPS)]
    upstream = [dyadic(rng, (1, 2 * FFN + OUT)) for _ in range(STEPS)]

    class TorchModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(IN, 2 * FFN), torch.nn.Linear(IN, OUT)
            with torch.no_grad():
                self.fc1.weight.copy_(torch.from_numpy(np.concatenate([gate.T, up.T])))
                self.fc1.bias.copy_(torch.from_numpy(np.concatenate(biases[:2])))
                self.fc2.weight.copy_(torch.from_numpy(np.ascontiguousarray(down.T)))
                self.fc2.bias.copy_(torch.from_numpy(biases[2]))

        def forward(self, x):
            return torch.cat([self.fc1(x), self.fc2(x)], -1)

    class PaddleModel(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.gate, self.up, self.down = paddle.nn.Linear(IN, FFN), paddle.nn.Linear(IN, FFN), paddle.nn.Linear(IN, OUT)
            for layer, weight, bias in zip((self.gate, self.up, self.down), (gate, up, down), biases):
                layer.weight.set_value(weight)
                layer.bias.set_value(bias)

        def forward(self, x):
            return paddle.concat([self.gate(x), self.up(x), self.down(x)], -1)

    def train(model, optimizer, path, to_tensor, clear_grad, **live):
        with capture(model, path, optimizer=optimizer, **live) as cap:
            for x, r in zip(inputs, upstream):
                loss = (model(to_tensor(x)) * to_tensor(r)).sum()
                loss.backward()
                cap.loss(loss)
                optimizer.step()
                clear_grad()

    root = tmp_path_factory.mktemp("roles")
    model_a = TorchModel()
    opt_a = torch.optim.AdamW(model_a.parameters(), lr=1e-3, weight_decay=0.01)
    train(model_a, opt_a, root / "torch", torch.from_numpy, opt_a.zero_grad)
    (root / "map.yaml").write_text(MAP)
    for name, live in (("paddle", {}), ("live", {"reference": root / "torch", "map": root / "map.yaml"})):
        model_b = PaddleModel()
        opt_b = paddle.optimizer.AdamW(learning_rate=1e-3, weight_decay=0.01, parameters=model_b.parameters())
        train(model_b, opt_b, root / name, paddle.to_tensor, opt_b.clear_grad, **live)
    return read_tree(root / "torch"), read_tree(root / "paddle"), read_tree(root / "live")


@pytest.fixture
def roles_map(tmp_path):
    path = tmp_path / "map.yaml"
    path.write_text(MAP)
    return load_map(path)


def test_compare_pairs_exp_avg_with_moment1_and_ignores_step_and_beta_pows(trees, roles_map):
    tree_a, tree_b, _ = trees
    comparison = compare_trees(tree_a, tree_b, roles_map)
    assert len(comparison.steps) == STEPS
    first = comparison.steps[0]
    results = {result.name: result for result in first.comparison.tensors}
    # everything before the optimizer step is exact on both sides ...
    assert all(result.pair.bitwise for name, result in results.items() if ":grad." in name or ":grad_clipped." in name)
    # ... so the first divergence is the first optimizer state, paired across the frameworks through roles:
    assert (first.divergence.name, first.divergence.phase) == ("fc1:exp_avg.weight", "optimizer")
    assert first.sources["fc1:exp_avg.weight"] == ["gate:moment1.weight", "up:moment1.weight"]
    assert first.sources["fc2:exp_avg_sq.weight"] == ["down:moment2.weight"]
    for step in comparison.steps:
        names = {result.name for result in step.comparison.tensors}
        assert not [name for name in names if ":step." in name or "_pow_acc." in name]  # ignored, not one-sided
        for state in ("exp_avg", "exp_avg_sq"):
            for name in (f"fc1:{state}.weight", f"fc2:{state}.weight", f"fc2:{state}.bias"):
                result = next(r for r in step.comparison.tensors if r.name == name)
                assert result.pair.b is not None and not result.pair.bitwise, name  # both sides, compared, differ
    # the moments were made in torch's layout: they differ from torch's by the rounding of 1 - beta only
    mapped = roles_map.to_a(tree_b.step(0))
    dump_a = tree_a.step(0)
    for name in ("fc1:exp_avg.weight", "fc2:exp_avg.weight", "fc2:exp_avg_sq.weight"):
        np.testing.assert_allclose(mapped.tensors[name], dump_a.tensors[name], rtol=2e-5, atol=0)
    assert mapped.tensors["fc2:exp_avg.weight"].tobytes() == np.ascontiguousarray(
        tree_b.step(0).tensors["down:moment1.weight"].T).tobytes()
    assert {"down:beta1_pow_acc.weight", "gate:beta2_pow_acc.bias"} <= set(mapped.ignored)
    assert not [name for name in mapped.unmapped if "moment" in name] and not mapped.left_out


def test_to_b_moves_optimizer_states_in_the_params_layout(trees, roles_map):
    tree_a, tree_b, _ = trees
    dump_a, dump_b = tree_a.step(1), tree_b.step(1)
    arrays = {name: np.asarray(dump_a.tensors[name]) for name in dump_a.names if name.startswith("fc")}
    made = roles_map.to_b(arrays)
    exp_avg = arrays["fc1:exp_avg.weight"]
    assert made["gate:moment1.weight"].tobytes() == np.ascontiguousarray(exp_avg[:FFN].T).tobytes()
    assert made["up:moment1.weight"].tobytes() == np.ascontiguousarray(exp_avg[FFN:].T).tobytes()
    assert made["down:moment2.weight"].tobytes() == np.ascontiguousarray(arrays["fc2:exp_avg_sq.weight"].T).tobytes()
    states_b = {name for name in dump_b.names if ":moment" in name}
    assert states_b <= set(made) and not [name for name in made if ":step." in name or ":exp_avg" in name]
    for name in states_b:
        assert made[name].shape == dump_b.tensors[name].shape, name


def test_live_check_pairs_moment1_with_the_references_exp_avg(trees):
    """B checked against A while it runs: the map's roles make A's names of B's states, as in compare."""
    tree_a, _, tree_live = trees
    live = tree_live.step(0).meta["capture"]["live"]
    assert live["differing"][0] == "gate:moment1.weight"  # B's first differing tensor in its record order
    assert not [name for name in live["not_checkable"] if "moment" in name or "_pow_acc." in name]
    assert tree_live.manifest.diverged.step == 0 and tree_live.manifest.diverged.tensor == "gate:moment1.weight"


def test_ignored_is_per_side_and_patterns_read_a_words(roles_map):
    assert roles_map.ignored("a", "fc1:step.weight") and not roles_map.ignored("b", "fc1:step.weight")
    assert roles_map.ignored("b", "gate:beta1_pow_acc.bias") and not roles_map.ignored("a", "gate:beta1_pow_acc.bias")
    assert not roles_map.ignored("b", "gate:moment1.weight") and not roles_map.is_identity
    assert roles_map.sharding("b", "gate:moment1.weight") is None


def test_suggest_writes_the_roles_section_for_torch_and_paddle_trees(trees, tmp_path):
    tree_a, tree_b, _ = trees
    text = suggest_map(tree_a, tree_b)
    section = text[text.index("roles:"):text.index("modules:")]
    assert section == ("roles:\n"
                       "  - {a: exp_avg, b: moment1}\n"
                       "  - {a: exp_avg_sq, b: moment2}\n"
                       "  - {a: step}  # torch's step count t; no Paddle tensor holds it: ignored\n"
                       "  - {b: beta1_pow_acc}  # Paddle's beta1^(t+1); no torch tensor holds it: ignored\n"
                       "  - {b: beta2_pow_acc}  # Paddle's beta2^(t+1); no torch tensor holds it: ignored\n"), text
    assert '"fc1:{role:param|grad|grad_clipped|updated|exp_avg|exp_avg_sq}.{p}"' in text
    path = tmp_path / "suggested.yaml"
    path.write_text(text)
    comparison = compare_trees(tree_a, tree_b, load_map(path))  # check_trees passes; the same pairs as by hand
    first = comparison.steps[0]
    assert (first.divergence.name, first.divergence.phase) == ("fc1:exp_avg.weight", "optimizer")
    assert not [r.name for r in first.comparison.tensors if r.pair.b is None or r.pair.a is None]
    # the other way round, Paddle's words are A's; a torch-vs-torch pair has nothing to rename
    reverse = suggest_map(tree_b, tree_a)
    assert "  - {a: moment1, b: exp_avg}\n" in reverse and "  - {a: beta1_pow_acc}" in reverse and "  - {b: step}" in reverse
    assert "roles:" not in suggest_map(tree_a, tree_a)


def test_suggest_pairs_cover_every_state_role():
    words = [word for pair in STATE_PAIRS for word in pair] + [word for alone in STATES_ALONE for word in alone]
    assert sorted(words) == sorted(STATE_ROLES)


@pytest.mark.parametrize("extra, where", [
    ("  - {a: max_exp_avg_sq, b: moment2_max}\n", r"map.yaml:9: roles.5.a: no tensor of tree A \(.*torch\) has the role "
                                                  r"'max_exp_avg_sq': correct it, or remove the entry$"),
    ("  - {a: main_param}\n", r"map.yaml:9: roles.5.a: no tensor of tree A .* has the role 'main_param'"),
])
def test_check_trees_refuses_role_words_the_trees_lack(trees, tmp_path, extra, where):
    path = tmp_path / "map.yaml"
    path.write_text(MAP.replace(ROLES, ROLES + extra))
    with pytest.raises(MapError, match=where):
        compare_trees(*trees[:2], load_map(path))


def test_check_trees_says_b_patterns_are_in_a_words(trees, tmp_path):
    path = tmp_path / "map.yaml"
    path.write_text(MAP.replace("tensors:\n", 'tensors:\n  - {a: "fc2:exp_avg.bias", b: "down:moment1.bias"}\n'))
    with pytest.raises(MapError, match=r"map.yaml:16: tensors.0.b: 'down:moment1.bias' matches no tensor of tree B "
                                       r"\(.*\) in A's role words \(roles: renames moment1, moment2 first\)"):
        compare_trees(*trees[:2], load_map(path))
