"""Float64 references of the rope and moe_combine families and of the user family example (cases/user/bias_gelu.py):
for every option, forward and gradients are float64 and agree with an independent numpy float64 formula; end to
end, the reference arbitrates every float tensor; a user family without a reference is N/A with its reason."""

import itertools
import re
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

from harness.inputs import generate_inputs
from harness.load import load_cases
from harness.ops import family_for, reference_impl
from harness.runner import run_case

# torch and megatron-core are imported when the first test here runs (see tests/test_rope.py)
pytestmark = pytest.mark.xdist_group("in_process_frameworks")
ROOT = Path(__file__).resolve().parent.parent
AGREE = 1e-12  # normwise relative: float64 evaluation-order differences only


def agree(got, want) -> bool:
    """||got - want||_2 <= AGREE ||want||_2 (so an all-zero want needs got all zero: top-1 softmax's gradient)."""
    return bool(np.linalg.norm((got - want).ravel()) <= AGREE * np.linalg.norm(want.ravel()))


def run_reference(case, differentiable: tuple[str, ...], torch):
    """The family's reference in this process, as the worker runs it: every float input (and grad_out) widened
    exactly to float64; forward, backward from grad_out, then out, extra outputs and input gradients."""
    family = family_for(case.op, case.source)
    arrays = generate_inputs(case)
    wide = {name: a.astype(np.float64) if a.dtype.kind == "f" or a.dtype.name == "bfloat16" else a
            for name, a in arrays.items()}
    tensors = {name: torch.from_numpy(a.copy()).requires_grad_(name in differentiable) for name, a in wide.items()}
    result = reference_impl(case.op, "megatron", case.source).fn(
        *(tensors.get(name) for name in family.signature), family.options(case).model_dump())
    outputs = result if isinstance(result, dict) else {"out": result}
    outputs["out"].backward(tensors["grad_out"])
    got = {name: value.detach().numpy() for name, value in outputs.items()}
    got |= {f"grad.{name}": tensors[name].grad.numpy() for name in differentiable}
    for name, value in got.items():
        assert value.dtype == (np.bool_ if name == "routing.map" else np.float64), (name, value.dtype)  # no downcast
    return wide, got


def case_of(write_case, text: str, **replacements):
    for old, new in replacements.items():
        text = text.replace(old, new)
    [case] = load_cases(write_case(text))
    return case


# -- rope -----------------------------------------------------------------------------------------------------

ROPE = """\
op: rope
vars: {s: 11, b: 2, heads: 3, d: 14}
options: {rotary_interleaved: INTERLEAVED, mscale: MSCALE, apply_rope_fusion: FUSION, rotary_base: 500000, position_offset: 100}
seed: 3
inputs:
  t: {shape: [s, b, heads, d], dtype: bfloat16, special_values: [0.0, 1024.0, -1024.0], special_fraction: 0.1}
  freqs: {shape: [s, 1, 1, ROT], dtype: FREQS}
  grad_out: {shape: [s, b, heads, d], dtype: bfloat16, special_values: [0.0, 1024.0, -1024.0], special_fraction: 0.1}
sides:
  megatron: {framework: megatron}
  paddle: {framework: paddle, impl: per_op_rounding}
expect:
  all: report
"""


def rope_numpy(t, freqs, g, interleaved: bool, mscale: float):
    """Each channel pair (p, q) of the rotated part: out_p = t_p cos_p - t_q sin_p, out_q = t_q cos_q + t_p sin_q
    (cos, sin of the angle of that channel, times mscale); grad.t is the transpose applied to g."""
    rot = freqs.shape[-1]
    p, q = (np.arange(0, rot, 2), np.arange(1, rot, 2)) if interleaved else (np.arange(rot // 2), np.arange(rot // 2, rot))
    cos, sin = mscale * np.cos(freqs), mscale * np.sin(freqs)
    out, grad = t.copy(), g.copy()
    out[..., p] = t[..., p] * cos[..., p] - t[..., q] * sin[..., p]
    out[..., q] = t[..., q] * cos[..., q] + t[..., p] * sin[..., q]
    grad[..., p] = g[..., p] * cos[..., p] + g[..., q] * sin[..., q]
    grad[..., q] = g[..., q] * cos[..., q] - g[..., p] * sin[..., p]
    return out, grad


ROPE_OPTIONS = list(itertools.product([False, True], [1.0, 1.3688879454113936], [14, 8], [False, True],
                                      ["float32", "bfloat16"]))


@pytest.mark.parametrize("interleaved,mscale,rot,fusion,freqs_dtype", ROPE_OPTIONS,
                         ids=["-".join(map(str, o)) for o in ROPE_OPTIONS])
def test_rope_reference_is_the_float64_rotation(write_case, torch, interleaved, mscale, rot, fusion, freqs_dtype):
    case = case_of(write_case, ROPE, INTERLEAVED=str(interleaved).lower(), MSCALE=repr(mscale), ROT=str(rot),
                   FUSION=str(fusion).lower(), FREQS=freqs_dtype)
    inputs, got = run_reference(case, ("t",), torch)
    out, grad = rope_numpy(inputs["t"], inputs["freqs"], inputs["grad_out"], interleaved, mscale)
    assert agree(got["out"], out) and agree(got["grad.t"], grad)
    assert np.array_equal(got["out"][..., rot:], inputs["t"][..., rot:])  # pass-through channels untouched


# -- moe_combine -------------------------------------------------------------------------------------------------

MOE = """\
op: moe_combine
vars: {tokens: 13, experts: 7, hidden: 10}
options: {topk: TOPK, apply_probs: PROBS, deterministic: DETERMINISTIC, empty_experts: 1}
seed: 4
inputs:
  routing_map: {shape: [tokens, experts], dtype: bool}
  expert_out: {shape: [tokens * topk, hidden], dtype: bfloat16, special_values: [0.0, 1024.0, -1024.0], special_fraction: 0.1}
  probs: {shape: [tokens, experts], dtype: PDTYPE, dist: uniform}
  grad_out: {shape: [tokens, hidden], dtype: bfloat16, special_values: [0.0, 1024.0, -1024.0], special_fraction: 0.1}
sides:
  megatron: {framework: megatron}
  paddle: {framework: paddle, impl: fp32_accumulate}
expect:
  all: report
"""

ROUTER = """\
op: moe_combine
vars: {tokens: 13, experts: 7, hidden: 10}
options: {topk: TOPK, routing: router}
seed: 5
inputs:
  logits: {shape: [tokens, experts], dtype: LDTYPE, std: 2.0}
  expert_out: {shape: [tokens * topk, hidden], dtype: bfloat16}
  grad_out: {shape: [tokens, hidden], dtype: bfloat16}
sides:
  megatron: {framework: megatron}
  paddle: {framework: paddle, impl: fp32_accumulate}
expect:
  all: report
"""


def expert_major_rows(routing_map):
    """(token, expert) of each row of expert_out: experts ascending, tokens ascending within an expert."""
    return [(n, e) for e in range(routing_map.shape[1]) for n in range(routing_map.shape[0]) if routing_map[n, e]]


def combine_numpy(x, probs, routing_map, g):
    """out[n] = sum over n's rows r of x[r] * probs[n, e]; grad.expert_out[r] = g[n] probs[n, e];
    grad.probs[n, e] = g[n] . x[r] (0 where e is not n's expert). probs None: a scale of 1, no grad.probs."""
    out, grad_x = np.zeros_like(g), np.zeros_like(x)
    grad_p = np.zeros(routing_map.shape)
    for r, (n, e) in enumerate(expert_major_rows(routing_map)):
        scale = 1.0 if probs is None else probs[n, e]
        out[n] += x[r] * scale
        grad_x[r] = g[n] * scale
        grad_p[n, e] = g[n] @ x[r]
    return out, grad_x, grad_p


MOE_OPTIONS = list(itertools.product([1, 3], [True, False], [False, True], ["float32", "bfloat16"]))


@pytest.mark.parametrize("topk,apply_probs,deterministic,probs_dtype", MOE_OPTIONS,
                         ids=["-".join(map(str, o)) for o in MOE_OPTIONS])
def test_moe_combine_reference_is_the_float64_weighted_sum(write_case, torch, topk, apply_probs, deterministic,
                                                            probs_dtype):
    text = MOE if apply_probs else MOE.replace("  probs: {shape: [tokens, experts], dtype: PDTYPE, dist: uniform}\n", "")
    case = case_of(write_case, text, TOPK=str(topk), PROBS=str(apply_probs).lower(),
                   DETERMINISTIC=str(deterministic).lower(), PDTYPE=probs_dtype)
    differentiable = ("expert_out", "probs") if apply_probs else ("expert_out",)
    inputs, got = run_reference(case, differentiable, torch)
    out, grad_x, grad_p = combine_numpy(inputs["expert_out"], inputs.get("probs"), inputs["routing_map"],
                                        inputs["grad_out"])
    assert agree(got["out"], out) and agree(got["grad.expert_out"], grad_x)
    if apply_probs:
        assert agree(got["grad.probs"], grad_p)
    assert torch.are_deterministic_algorithms_enabled() is False  # the option's setting does not leak


@pytest.mark.parametrize("topk,logits_dtype", list(itertools.product([1, 3], ["float32", "bfloat16"])))
def test_moe_combine_router_reference_is_the_float64_top_k_softmax(write_case, torch, topk, logits_dtype):
    case = case_of(write_case, ROUTER, TOPK=str(topk), LDTYPE=logits_dtype)
    inputs, got = run_reference(case, ("expert_out", "logits"), torch)
    logits, g, x = inputs["logits"], inputs["grad_out"], inputs["expert_out"]
    chosen = np.argsort(-logits, axis=1, kind="stable")[:, :topk]
    routing_map = np.zeros(logits.shape, dtype=bool)
    np.put_along_axis(routing_map, chosen, True, axis=1)
    top = np.take_along_axis(logits, chosen, axis=1)
    weights = np.exp(top - top.max(axis=1, keepdims=True))
    probs = np.zeros(logits.shape)
    np.put_along_axis(probs, chosen, weights / weights.sum(axis=1, keepdims=True), axis=1)
    out, grad_x, grad_p = combine_numpy(x, probs, routing_map, g)
    # softmax's Jacobian on the chosen logits: d l_e = p_e (d p_e - sum_j p_j d p_j)
    grad_logits = probs * (grad_p - (probs * grad_p).sum(axis=1, keepdims=True)) * routing_map
    assert np.array_equal(got["routing.map"], routing_map)
    assert agree(got["routing.probs"], probs) and agree(got["out"], out)
    assert agree(got["grad.expert_out"], grad_x) and agree(got["grad.logits"], grad_logits)


def test_torch_top_k_breaks_ties_alike_in_every_dtype(torch):
    """The router reference picks experts by torch.topk of the widened logits: equal logits (likely in bf16) must
    be chosen as the side's topk of the original dtype chooses them, or the reference routes other tokens."""
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        logits = torch.randint(-2, 2, (64, 7), generator=g).float()
        want = torch.topk(logits.double(), 3, dim=1)[1]
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            assert torch.equal(torch.topk(logits.to(dtype), 3, dim=1)[1], want)


# -- the user family example (cases/user/bias_gelu.py) -------------------------------------------------------------


@pytest.fixture
def user_family(tmp_path):
    """The example's family files beside a case in tmp_path (the op names its file relative to the case)."""
    shutil.copytree(ROOT / "cases" / "user", tmp_path / "user", ignore=shutil.ignore_patterns("__pycache__"))
    text = (ROOT / "cases" / "user_family_bias_gelu.yaml").read_text()
    return re.sub(r"vars: \{tokens: \d+, hidden: \d+\}", "vars: {tokens: 9, hidden: 12}", text, count=1)


def test_bias_gelu_reference_is_megatrons_formula_in_float64(write_case, torch, user_family):
    case = load_cases(write_case(user_family))[0]
    assert case.inputs["x"].shape == [9, 12]
    inputs, got = run_reference(case, ("x", "bias"), torch)
    y = inputs["x"] + inputs["bias"]
    tanh = np.tanh(0.79788456 * y * (1 + 0.044715 * y * y))
    out = y * 0.5 * (1.0 + tanh)
    # Megatron's hand-written derivative (bias_gelu_back), its constant 0.1070322243 included
    ff = 0.5 * y * ((1 - tanh * tanh) * (0.79788456 + 0.1070322243 * y * y)) + 0.5 * (1 + tanh)
    grad = ff * inputs["grad_out"]
    assert agree(got["out"], out) and agree(got["grad.x"], grad)
    assert agree(got["grad.bias"], grad.sum(axis=0))


# -- end to end ----------------------------------------------------------------------------------------------------


def assert_arbitrated(run, not_float=()):
    comparison = run.comparison
    assert comparison.reference is not None and comparison.reference_missing is None
    assert "float64 reference" in comparison.reference.provenance
    for result in comparison.tensors:
        exact = result.pair.exact
        if result.name in not_float:
            assert exact.missing == "not-float"  # worded by reports.text.reason_text
            continue
        assert exact.missing is None and exact.a is not None and exact.b is not None, result.name
        assert exact.a.elements == exact.a.finite > 0 and exact.closeness is not None, result.name


def test_end_to_end_the_reference_arbitrates_every_float_tensor(write_case, user_family):
    rope = case_of(write_case, ROPE, INTERLEAVED="true", MSCALE="1.25", ROT="8", FUSION="false", FREQS="bfloat16")
    run = run_case(rope)
    assert_arbitrated(run)
    assert [r.name for r in run.comparison.tensors] == ["out", "grad.t"]
    # per_op_rounding is Megatron's eager formula op for op: both sides equally far from exact
    assert all(r.pair.exact.a.max_ulp == r.pair.exact.b.max_ulp for r in run.comparison.tensors)
    router = case_of(write_case, ROUTER, TOPK="3", LDTYPE="float32")
    assert_arbitrated(run_case(router), not_float=("routing.map",))
    gelu = load_cases(write_case(user_family, "gelu.yaml"))[0]
    run = run_case(gelu)
    assert_arbitrated(run)
    assert "bias_gelu_impl" in run.comparison.reference.provenance


NO_REFERENCE_FAMILY = '''
from harness.case import Strict
from harness.ops.family import Implementations, OpFamily, variant


class Options(Strict):
    pass


class Doubled(OpFamily):
    name = "doubled"
    options_model = Options
    signature = ("x",)
    working_inputs = ("x", "grad_out")
    variants = {"megatron": ("megatron",), "paddle": ("paddle",)}
    implementations = {"megatron": "doubled.py:DoubledTorch", "paddle": "doubled.py:DoubledPaddle"}
    no_reference = "doubling is exact in every dtype: nothing to arbitrate"

    def validate_inputs(self, case):
        pass


class DoubledTorch(Implementations, family=Doubled, framework="megatron"):
    @variant(provenance="test: torch")
    def megatron(x, options):
        return x * 2


class DoubledPaddle(Implementations, family=Doubled, framework="paddle"):
    @variant(provenance="test: paddle")
    def paddle(x, options):
        return x * 2
'''


def test_a_user_family_without_a_reference_is_not_arbitrated_and_says_why(write_case, tmp_path):
    (tmp_path / "doubled.py").write_text(textwrap.dedent(NO_REFERENCE_FAMILY))
    [case] = load_cases(write_case("""\
        op: doubled.py:Doubled
        inputs:
          x: {shape: [5, 3], dtype: bfloat16}
          grad_out: {shape: [5, 3], dtype: bfloat16}
        sides:
          megatron: {framework: megatron}
          paddle: {framework: paddle, impl: paddle}
        expect:
          all: bitwise
        """))
    comparison = run_case(case).comparison
    reason = "doubling is exact in every dtype: nothing to arbitrate"
    assert family_for(case.op, case.source).no_reference == reason
    assert comparison.reference is None and comparison.reference_missing == reason
    assert comparison.passed
    assert all(result.pair.exact.missing == reason for result in comparison.tensors)
