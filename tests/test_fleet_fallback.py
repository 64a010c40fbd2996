"""fleet_cpu_fallback reproduces PaddleFleet's fused_swiglu_scale XPU/CPU fallback (PR #1078) forward and
hand-written backward. Checked here, with real Paddle, against an independent numpy/ml_dtypes evaluation
of the real code's formulas in its order and dtypes. The transcendental parts (fp32 sigmoid, silu,
swiglu) come from Paddle's fp32 kernels, which is what both the real code (on the fp32 copy where
there is no CPU bf16 kernel) and the variant run; everything else (each bf16 rounding, the fp32
arithmetic, the masks, the sum, the shapes) is numpy.
"""

import importlib

import ml_dtypes
import numpy as np
import pytest

# Paddle is imported when the first test here runs, not when pytest collects the module: a test process
# (pytest-xdist) that runs none of these tests never imports it. The group keeps the in-process framework tests
# in one test process.
pytestmark = pytest.mark.xdist_group("in_process_frameworks")
paddle = F = swiglu_paddle = SwigluPaddle = fleet_cpu_fallback = None

BF16, F32 = ml_dtypes.bfloat16, np.float32
L = 2.0


@pytest.fixture(scope="module", autouse=True)
def _paddle():
    global paddle, F, swiglu_paddle, SwigluPaddle, fleet_cpu_fallback
    paddle = importlib.import_module("paddle")
    F = importlib.import_module("paddle.nn.functional")
    swiglu_paddle = importlib.import_module("harness.ops.swiglu.paddle")
    SwigluPaddle, fleet_cpu_fallback = swiglu_paddle.SwigluPaddle, swiglu_paddle.fleet_cpu_fallback


@pytest.fixture(autouse=True)
def _cpu(_paddle):
    paddle.set_device("cpu")


def make_inputs(rows, hidden, seed, probs_dtype=F32, dtype=BF16):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, 2 * hidden)) * 3.0).astype(dtype)
    # exact clamp boundaries and values past them, in both halves
    flat = x.reshape(-1)
    where = rng.choice(flat.size, size=flat.size // 8, replace=False)
    flat[where] = rng.choice(np.array([L, -L, 2 * L, -2 * L], dtype=np.float64), size=where.size).astype(dtype)
    probs = rng.uniform(0.0, 1.0, (rows, 1)).astype(probs_dtype)
    grad_out = rng.standard_normal((rows, hidden)).astype(dtype)
    return x, probs, grad_out


def to_paddle(array, requires_grad=False):
    t = paddle.to_tensor(array.view(np.uint16)) if array.dtype == BF16 else paddle.to_tensor(array)
    t.stop_gradient = not requires_grad
    return t


def to_numpy(t):
    a = t.detach().numpy()
    return a.view(BF16) if t.dtype == paddle.bfloat16 else a


def paddle_fp32(fn, a):
    """The fp32 transcendental as Paddle computes it (the one thing not re-derived in numpy)."""
    return fn(paddle.to_tensor(np.ascontiguousarray(a, dtype=F32))).numpy()


def run_variant(x, probs, grad_out, clamp):
    xt, pt = to_paddle(x, True), to_paddle(probs, True)
    out = fleet_cpu_fallback(xt, None, pt, {"activation": "swiglu", "clamp": clamp, "linear_offset": 0.0})
    paddle.autograd.backward([out], [to_paddle(grad_out)])
    return to_numpy(out), to_numpy(xt.grad), to_numpy(pt.grad)


def mul(a, b, dtype):
    """One multiply in dtype: for bf16 the exact product (fits in fp32) rounded to nearest even."""
    return (a.astype(F32) * b.astype(F32)).astype(dtype)


def sum_fp32(a, keepdims):
    """Left-to-right fp32 sum over the last axis (for 2 terms every order gives the same bits)."""
    acc = np.zeros(a.shape[:-1], F32)
    for j in range(a.shape[-1]):
        acc = (acc + a[..., j]).astype(F32)
    return acc[..., None] if keepdims else acc


def reference_plain(x, probs, grad_out):
    """Non-clamped branch of the real fused_swiglu_scale_forward/backward: every op in x's dtype."""
    h, dt = x.shape[-1] // 2, x.dtype
    out = mul(paddle_fp32(F.swiglu, x.astype(F32)).astype(dt), probs.astype(dt), dt)
    gate, val = x[:, :h], x[:, h:]
    sig = paddle_fp32(F.sigmoid, gate.astype(F32)).astype(dt)        # F.sigmoid(gate).cast(x.dtype)
    silu = mul(gate, sig, dt)                                         # gate * sig
    swiglu_val = mul(silu, val, dt)                                   # silu * val
    d_u = mul(grad_out, probs.astype(dt), dt)                         # out_grad * scale.cast(x.dtype)
    d_val = mul(d_u, silu, dt)
    one_minus_sig = (F32(1.0) - sig.astype(F32)).astype(dt)           # 1.0 - sig
    bracket = (F32(1.0) + mul(gate, one_minus_sig, dt).astype(F32)).astype(dt)  # 1.0 + gate * (...)
    d_gate = mul(mul(mul(d_u, val, dt), sig, dt), bracket, dt)       # d_u * val * sig * (...)
    d_x = np.concatenate([d_gate, d_val], axis=-1)
    d_scale = sum_fp32(grad_out.astype(F32) * swiglu_val.astype(F32), keepdims=False).astype(probs.dtype)
    return out, d_x, d_scale


def reference_clamped(x, probs, grad_out, clamp):
    """Clamped branch (clamp > 0): fp32 from x, masks in out_grad's dtype, d_scale from bf16 SwiGLU."""
    h = x.shape[-1] // 2
    x32 = x.astype(F32)
    gate_raw, val_raw = x32[:, :h], x32[:, h:]
    gate = np.minimum(gate_raw, F32(clamp))
    val = np.clip(val_raw, F32(-clamp), F32(clamp))
    out = (paddle_fp32(F.silu, gate) * val).astype(x.dtype)
    out = mul(out, probs.astype(x.dtype), x.dtype)
    g_mask = (gate_raw <= clamp).astype(grad_out.dtype).astype(F32)
    v_mask = ((val_raw <= clamp) & (val_raw >= -clamp)).astype(grad_out.dtype).astype(F32)
    sig = paddle_fp32(F.sigmoid, gate)
    silu = gate * sig
    swiglu_val = silu * val
    d_u = grad_out.astype(F32) * probs.astype(F32)
    d_val = (d_u * silu) * v_mask
    d_gate = (((d_u * sig) * (F32(1.0) + gate * (F32(1.0) - sig))) * val) * g_mask
    d_x = np.concatenate([d_gate, d_val], axis=-1).astype(x.dtype)
    d_scale = sum_fp32(swiglu_val.astype(x.dtype).astype(F32) * grad_out.astype(F32), keepdims=True)
    return out, d_x, d_scale


def assert_bitwise(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    width = {BF16: np.uint16, F32: np.uint32}[actual.dtype.type]
    assert np.array_equal(actual.view(width), expected.view(width)), (
        f"{np.count_nonzero(actual.view(width) != expected.view(width))} elements differ")


SHAPES_DTYPES = [(64, 2, BF16), (32, 64, BF16), (64, 2, F32), (32, 64, F32)]


@pytest.mark.parametrize("rows,hidden,dtype", SHAPES_DTYPES)
def test_non_clamped_forward_and_backward_match_the_real_formulas(rows, hidden, dtype):
    x, probs, grad_out = make_inputs(rows, hidden, seed=rows + hidden, dtype=dtype)
    out, grad_x, grad_probs = run_variant(x, probs, grad_out, clamp=None)
    ref_out, ref_dx, ref_dscale = reference_plain(x, probs, grad_out)
    assert_bitwise(out, ref_out)
    assert_bitwise(grad_x, ref_dx)
    if hidden == 2:  # one add per row: no summation order to disagree on
        assert_bitwise(grad_probs, ref_dscale)
    else:
        assert grad_probs.shape == ref_dscale.shape and grad_probs.dtype == ref_dscale.dtype
        np.testing.assert_allclose(grad_probs, ref_dscale, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows,hidden,dtype", SHAPES_DTYPES)
def test_clamped_forward_and_backward_match_the_real_formulas(rows, hidden, dtype):
    # fp32 x keeps d_x in fp32, where the order of the fp32 products is visible bit for bit
    x, probs, grad_out = make_inputs(rows, hidden, seed=7 * rows + hidden, dtype=dtype)
    out, grad_x, grad_probs = run_variant(x, probs, grad_out, clamp=L)
    ref_out, ref_dx, ref_dscale = reference_clamped(x, probs, grad_out, L)
    assert_bitwise(out, ref_out)
    assert_bitwise(grad_x, ref_dx)
    # the masked gradients keep the sign of the zero they are multiplied into
    assert np.signbit(grad_x.astype(F32)[ref_dx.astype(F32) == 0]).any()
    if hidden == 2:
        assert_bitwise(grad_probs, ref_dscale)
    else:
        assert grad_probs.shape == ref_dscale.shape and grad_probs.dtype == ref_dscale.dtype
        np.testing.assert_allclose(grad_probs, ref_dscale, rtol=1e-5, atol=1e-6)


def test_the_backward_is_the_hand_written_one_not_autograd():
    # autograd through the same forward would round differently (e.g. no bf16 silu in d_val)
    x, probs, grad_out = make_inputs(32, 64, seed=1)
    xt, pt = to_paddle(x, True), to_paddle(probs, True)
    h = x.shape[-1] // 2
    x32 = xt.cast("float32")
    out = (F.silu(x32[:, :h]) * x32[:, h:]).cast("bfloat16") * pt.cast("bfloat16")
    paddle.autograd.backward([out], [to_paddle(grad_out)])
    _, grad_x, _ = run_variant(x, probs, grad_out, clamp=None)
    assert not np.array_equal(grad_x.view(np.uint16), to_numpy(xt.grad).view(np.uint16))


def test_d_scale_shape_and_dtype_are_the_real_codes():
    x, probs, grad_out = make_inputs(16, 8, seed=3)
    # non-clamped: paddle.sum(..., axis=-1) without keepdim -> [N]; Paddle keeps that shape for probs.grad
    _, _, plain = run_variant(x, probs, grad_out, clamp=None)
    assert plain.shape == (16,) and plain.dtype == F32
    # clamped: keepdim=True -> [N, 1]
    _, _, clamped = run_variant(x, probs, grad_out, clamp=L)
    assert clamped.shape == (16, 1) and clamped.dtype == F32
    # .cast(scale.dtype): bf16 probs get a bf16 d_scale
    bf16_probs = probs.astype(BF16)
    for clamp, shape in ((None, (16,)), (L, (16, 1))):
        _, _, g = run_variant(x, bf16_probs, grad_out, clamp=clamp)
        assert g.dtype == BF16 and g.shape == shape


@pytest.mark.parametrize("clamp", [None, 0.0, -1.0])
def test_only_a_positive_clamp_selects_the_clamped_code(clamp):
    x, probs, grad_out = make_inputs(64, 2, seed=5)
    out, grad_x, grad_probs = run_variant(x, probs, grad_out, clamp=clamp)
    ref_out, ref_dx, ref_dscale = reference_plain(x, probs, grad_out)
    assert_bitwise(out, ref_out)
    assert_bitwise(grad_x, ref_dx)
    assert_bitwise(grad_probs, ref_dscale)
    assert not swiglu_paddle._fleet_clamp_on(clamp)
    assert "non-clamped branch" in SwigluPaddle.impls()["fleet_cpu_fallback"].provenance_for({"clamp": clamp})


def test_provenance_names_the_real_file_and_the_branch():
    text = SwigluPaddle.impls()["fleet_cpu_fallback"].provenance_for({"clamp": L})
    assert "src/paddlefleet/fusions/fused_swiglu_scale.py" in text and "PR #1078" in text
    assert "25ab366f005711732135624227bcc6f1f125207a" in text
    assert "clamped branch (clamp_value=2.0 > 0)" in text


def test_refuses_what_fused_swiglu_scale_does_not_take():
    x, probs, _ = make_inputs(4, 2, seed=0)
    options = {"activation": "swiglu", "clamp": None, "linear_offset": 0.0}
    with pytest.raises(ValueError, match="probs"):
        fleet_cpu_fallback(to_paddle(x), None, None, options)
    with pytest.raises(ValueError, match="SwiGLU only"):
        fleet_cpu_fallback(to_paddle(x), None, to_paddle(probs), options | {"activation": "quick_geglu"})
