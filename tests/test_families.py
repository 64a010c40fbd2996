"""Op families as plug-ins: class-creation checks, families named by entry point, module:Class or
file.py:Class, axis-permutation layouts, inputs without gradients, generated integer inputs."""


import numpy as np
import pytest

from harness.case import CaseError
from harness.inputs import generate_inputs
from harness.load import load_case
from harness.ops import OpFamily, family_for, framework_impls, known_families
from harness.ops.family import Implementations, variant
from harness.runner import run_case

# A family in a file beside the case: out = x * y + position, where x is [S, B, H] and position (0..S-1)
# runs along axis 0. Paddle is handed x, grad_out and out as [H, S, B] (a permutation that is not its own
# inverse); its results come back to [S, B, H]. y takes no gradient (no_grad).
FAMILY_FILE = '''
from harness.case import Strict
from harness.ops.family import Implementations, OpFamily, variant


class Options(Strict):
    pass


class Scaled(OpFamily):
    name = "scaled"
    options_model = Options
    signature = ("x", "y", "position")
    working_inputs = ("x", "y", "grad_out")
    no_grad = ("y",)
    variants = {"megatron": ("megatron",), "paddle": ("rotated",)}
    implementations = {"megatron": "scaled.py:ScaledTorch", "paddle": "scaled.py:ScaledPaddle"}
    layouts = {"paddle": {"x": (2, 0, 1), "y": (2, 0, 1), "grad_out": (2, 0, 1), "out": (2, 0, 1)}}

    def validate_inputs(self, case):
        pass


class ScaledTorch(Implementations, family=Scaled, framework="megatron"):
    @variant(provenance="test: torch")
    def megatron(x, y, position, options):
        return x * y + position[:, None, None].to(x.dtype)


class ScaledPaddle(Implementations, family=Scaled, framework="paddle"):
    @variant(provenance="test: paddle")
    def rotated(x, y, position, options):
        assert list(x.shape) == [4, 6, 3], x.shape  # [H, S, B]
        return x * y + position[None, :, None].cast(x.dtype)
'''

CASE = """\
op: scaled.py:Scaled
inputs:
  x: {shape: [6, 3, 4], dtype: float32}
  y: {shape: [6, 3, 4], dtype: float32}
  position: {shape: [6], dtype: int64, dist: arange}
  grad_out: {shape: [6, 3, 4], dtype: float32}
sides:
  torch: {framework: megatron}
  paddle: {framework: paddle, impl: rotated}
expect:
  all: bitwise
"""


@pytest.fixture
def scaled_case(tmp_path, write_case):
    (tmp_path / "scaled.py").write_text(FAMILY_FILE)
    return lambda text=CASE: load_case(write_case(text))


@pytest.mark.xdist_group("in_process_frameworks")  # shares that test process's Megatron worker
def test_family_from_a_file_with_a_permuted_layout_matches_bitwise(scaled_case):
    case = scaled_case()
    family = family_for(case.op, case.source)
    assert family.tensor_names(case) == ["out", "grad.x"]  # y: no_grad; position: integer
    run = run_case(case)
    torch_side, paddle_side = run.dumps["torch"], run.dumps["paddle"]
    assert set(torch_side.tensors) == set(paddle_side.tensors) == {"out", "grad.x"}
    for name in ("out", "grad.x"):
        assert paddle_side.tensors[name].shape == (6, 3, 4)
        assert paddle_side.tensors[name].tobytes() == torch_side.tensors[name].tobytes()
    assert paddle_side.meta["inputs"] == torch_side.meta["inputs"]  # digests in the case's layout
    x = generate_inputs(case)["x"]
    assert not np.array_equal(torch_side.tensors["out"], x)
    assert run.comparison.status == "pass"


def test_input_marked_grad_false_takes_no_gradient(scaled_case):
    case = scaled_case(CASE.replace("x: {shape: [6, 3, 4], dtype: float32}",
                                    "x: {shape: [6, 3, 4], dtype: float32, grad: false}"))
    assert family_for(case.op, case.source).tensor_names(case) == ["out"]


def test_integer_inputs_are_generated():
    from harness.case import InputSpec
    from harness.inputs import generate_input

    stub = type("C", (), {"op": "swiglu", "source": "", "seed": 1})()
    ids = generate_input("ids", InputSpec(shape=[3, 1000], dtype="int32", dist="randint", low=-2, high=5), stub)
    assert ids.dtype == np.int32 and ids.min() == -2 and ids.max() == 4
    again = generate_input("ids", InputSpec(shape=[3, 1000], dtype="int32", dist="randint", low=-2, high=5), stub)
    assert np.array_equal(ids, again)
    pos = generate_input("pos", InputSpec(shape=[2, 7], dtype="int64", dist="arange"), stub)
    assert pos.dtype == np.int64 and pos.tolist() == [list(range(7))] * 2


@pytest.mark.parametrize("spec, words", [
    ("{shape: [4], dtype: float32, dist: randint, low: 0, high: 4}", "dist randint makes integers"),
    ("{shape: [4], dtype: int64, dist: randint, low: 0.5, high: 4}", "randint takes integers low < high"),
    ("{shape: [4], dtype: int64, dist: randint, low: 4, high: 4}", "randint takes integers low < high"),
])
def test_bad_integer_inputs_are_refused(scaled_case, spec, words):
    with pytest.raises(CaseError) as info:
        scaled_case(CASE.replace("{shape: [6], dtype: int64, dist: arange}", spec))
    assert ":5: inputs.position: " in str(info.value) and words in str(info.value)


def test_layout_rank_must_match(scaled_case):
    with pytest.raises(CaseError) as info:
        scaled_case(CASE.replace("x: {shape: [6, 3, 4]", "x: {shape: [6, 12]"))
    assert "inputs.x.shape: x is 3-D for this op" in str(info.value)


def test_builtins_are_entry_points_and_module_class_names_work():
    assert {"swiglu", "moe_combine", "linear"} <= set(known_families())
    assert type(family_for("harness.ops.linear:LinearFamily")) is type(family_for("linear"))
    assert set(framework_impls("linear", "paddle")) == {"matmul_add", "functional_linear", "fused_linear", "tp_sharded"}


def test_entry_point_from_an_installed_distribution(tmp_path, monkeypatch):
    import sys

    import harness.plugins

    (tmp_path / "scaled.py").write_text(FAMILY_FILE.replace('"scaled.py:', '"scaled:'))
    info = tmp_path / "scaled_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: scaled-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[xfalign.ops]\nscaled = scaled:Scaled\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    harness.plugins.entry_points.cache_clear()
    try:
        assert "scaled" in known_families()
        assert family_for("scaled").name == "scaled"
    finally:
        harness.plugins.entry_points.cache_clear()
        sys.modules.pop("scaled", None)


def test_unknown_family_is_one_line(write_case):
    from conftest import SMALL_WEIGHTED

    path = write_case(SMALL_WEIGHTED.replace("op: swiglu", "op: nope.py:Fam"))
    with pytest.raises(CaseError) as info:
        load_case(path)
    assert str(info.value).startswith(f"{path}:1: op: cannot load op family 'nope.py:Fam'")


def test_class_creation_checks():
    class Good(OpFamily):
        name, options_model, signature, working_inputs = "g", dict, ("x",), ("x",)
        variants = {"paddle": ("a", "b")}
        implementations = {"paddle": "m:C"}

        def validate_inputs(self, case):
            pass

    with pytest.raises(TypeError, match="declares variants \\['a', 'b'\\], implemented \\['a'\\]"):
        class Missing(Implementations, family=Good, framework="paddle"):
            @variant(provenance="p")
            def a(x, options):
                return x

    with pytest.raises(TypeError, match="does not set signature"):
        class NoSignature(OpFamily):
            name, options_model, working_inputs, variants, implementations = "n", dict, (), {}, {}

    with pytest.raises(TypeError, match="variants name frameworks"):
        class Mismatch(OpFamily):
            name, options_model, signature, working_inputs = "m", dict, (), ()
            variants, implementations = {"paddle": ()}, {"megatron": "m:C"}

    with pytest.raises(TypeError, match="not an axis permutation"):
        class BadLayout(OpFamily):
            name, options_model, signature, working_inputs = "b", dict, (), ()
            variants = implementations = {}
            layouts = {"paddle": {"x": (0, 0, 1)}}


def test_variants_are_staticmethods_in_either_source_form():
    """A variant is a staticmethod: called through the class or an instance it is the plain function, and
    impls() hands that function on. @staticmethod beneath @variant (how harness/ops writes them, so mypy
    checks their bodies) and the bare form users write register alike; @variant inside @staticmethod does
    not, and the error says which variant is unmarked."""
    class Fam(OpFamily):
        name, options_model, signature, working_inputs = "f", dict, ("x",), ("x",)
        variants = {"paddle": ("bare", "static")}
        implementations = {"paddle": "m:C"}

        def validate_inputs(self, case):
            pass

    def source(options):
        return len

    class Both(Implementations, family=Fam, framework="paddle"):
        @variant(provenance="bare one")
        def bare(x, options):
            return x + options["add"]

        @variant(provenance=lambda options: f"static one, add={options['add']}", source=source)
        @staticmethod
        def static(x, options):
            return x * options["add"]

    for name in ("bare", "static"):
        assert isinstance(vars(Both)[name], staticmethod)
    assert Both.bare(2, {"add": 3}) == 5 and Both().bare(2, {"add": 3}) == 5
    assert Both.static(2, {"add": 3}) == 6 and Both().static(2, {"add": 3}) == 6
    impls = Both.impls()
    assert sorted(impls) == ["bare", "static"]
    assert impls["bare"].fn is Both.bare and impls["static"].fn is Both.static
    assert impls["bare"].fn(1, {"add": 1}) == 2
    assert impls["static"].provenance_for({"add": 4}).startswith("static one, add=4")
    assert impls["static"].source is source and impls["bare"].provenance == "bare one"

    with pytest.raises(TypeError, match=r"implemented \['bare'\] \(static not marked @variant"):
        class Inverted(Implementations, family=Fam, framework="paddle"):
            @variant(provenance="p")
            def bare(x, options):
                return x

            @staticmethod
            @variant(provenance="p")
            def static(x, options):
                return x

    with pytest.raises(TypeError, match="must decorate a function"):
        variant(provenance="p")("not a function")


def test_a_source_checkout_never_installed_knows_the_builtins(monkeypatch):
    """harness on PYTHONPATH without xfalign's distribution metadata (its entry points missing, as on a machine where
    nothing is installed): the built-ins come from pyproject.toml, every one of them; none without that fallback."""
    import importlib.metadata

    import harness.plugins

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    harness.plugins.entry_points.cache_clear()
    try:
        assert {"swiglu", "moe_combine", "linear", "vocab_parallel_cross_entropy", "rmsnorm", "rope"} <= set(known_families())
        assert type(family_for("linear")).__name__ == "LinearFamily"
        assert set(harness.plugins.entry_points("xfalign.frameworks")) == {"megatron", "paddle"}
    finally:
        harness.plugins.entry_points.cache_clear()
