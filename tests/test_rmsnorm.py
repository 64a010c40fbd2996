"""RMSNorm family: megatron-core's CPU norm and the Transformer Engine reference against an independent fp64
computation, the Paddle variants' measured relationship to them, and the kernels that cannot run here."""

import json

import ml_dtypes
import numpy as np
import pytest

from harness.load import load_cases
from harness.ops import NotAvailable, family_for

from conftest import run_pinned

# torch, paddle and megatron-core are imported when the first test here runs, not when pytest collects the module:
# a test process (pytest-xdist) that runs none of these tests never imports them. The group keeps this module's
# tests, and the other in-process framework tests, in one test process.
pytestmark = pytest.mark.xdist_group("in_process_frameworks")
torch = paddle = rms_megatron = RmsNormMegatron = RmsNormPaddle = _rsqrt = None


def own_process(test):
    """A test that computes in a pinned process of its own (conftest.run_pinned): it needs no framework here."""
    test.own_process = True
    return test


@pytest.fixture(autouse=True)
def _frameworks(request):
    """Imports the frameworks into this process (once; skipped without them), except for an `own_process` test."""
    global torch, paddle, rms_megatron, RmsNormMegatron, RmsNormPaddle, _rsqrt
    if getattr(request.function, "own_process", False) or rms_megatron is not None:
        return
    torch = pytest.importorskip("torch")
    paddle = pytest.importorskip("paddle")
    rms_megatron = pytest.importorskip("harness.ops.rmsnorm.megatron")
    RmsNormMegatron = rms_megatron.RmsNormMegatron
    rms_paddle = pytest.importorskip("harness.ops.rmsnorm.paddle")
    RmsNormPaddle, _rsqrt = rms_paddle.RmsNormPaddle, rms_paddle._rsqrt


BF16 = ml_dtypes.bfloat16
UNIT = {BF16: 2.0 ** -8, np.float32: 2.0 ** -23}  # one ULP relative to the value, at worst


def options(eps=1e-5, zero_centered_gamma=False):
    return {"eps": eps, "zero_centered_gamma": zero_centered_gamma}


def inputs(seed, shape=(64, 256), dtype=BF16, weight_mean=1.0, weight_std=0.25):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=shape) * 2.0).astype(dtype)
    weight = (weight_mean + rng.normal(size=shape[-1]) * weight_std).astype(dtype)
    grad = rng.normal(size=shape).astype(dtype)
    return x, weight, grad


def to_torch(array):
    tensor = torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16) if array.dtype == BF16 \
        else torch.from_numpy(array.copy())
    return tensor.requires_grad_(True)


def from_torch(tensor):
    tensor = tensor.detach().contiguous()
    return tensor.view(torch.int16).numpy().view(BF16) if tensor.dtype == torch.bfloat16 else tensor.numpy()


def to_paddle(array):
    tensor = paddle.to_tensor(array.view(np.uint16) if array.dtype == BF16 else array)
    tensor.stop_gradient = False
    return tensor


def from_paddle(tensor):
    array = tensor.detach().numpy()
    return array.view(BF16) if tensor.dtype == paddle.bfloat16 else array


def run_torch(fn, x, weight, grad, opts):
    xt, wt = to_torch(x), to_torch(weight)
    out = fn(xt, wt, opts)
    out.backward(to_torch(grad).detach())
    return from_torch(out), from_torch(xt.grad), from_torch(wt.grad)


def run_paddle(fn, x, weight, grad, opts):
    xp, wp = to_paddle(x), to_paddle(weight)
    out = fn(xp, wp, opts)
    out.backward(to_paddle(grad))
    return from_paddle(out), from_paddle(xp.grad), from_paddle(wp.grad)


def fp64_reference(x, weight, grad, opts):
    """RMSNorm and its gradients in fp64, written from the formula (no framework)."""
    x, grad = x.astype(np.float64), grad.astype(np.float64)
    gamma = weight.astype(np.float64) + (1.0 if opts["zero_centered_gamma"] else 0.0)
    n = x.shape[-1]
    r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + opts["eps"])
    x_hat = x * r
    dy = grad * gamma
    dx = r * (dy - x_hat * (dy * x_hat).sum(-1, keepdims=True) / n)
    dw = (grad * x_hat).reshape(-1, n).sum(0)
    # scales for the fp32 rounding error of each gradient's sums (terms before cancellation)
    dx_scale = r * (np.abs(dy) + np.abs(x_hat) * (np.abs(dy * x_hat)).sum(-1, keepdims=True) / n)
    dw_scale = np.abs(grad * x_hat).reshape(-1, n).sum(0)
    return (x_hat * gamma, dx, dw), (np.abs(x_hat * gamma), dx_scale, dw_scale)


def assert_close_to_fp64(got, reference, scales, dtype):
    """Each result is the fp64 value rounded once to the working dtype (<= 1 ULP), plus fp32 arithmetic error
    (<= 1e-5 of the magnitude of the terms that were summed)."""
    for name, a, ref, scale in zip(("out", "grad.x", "grad.weight"), got, reference, scales):
        error = np.abs(a.astype(np.float64) - ref)
        bound = UNIT[dtype] * np.abs(ref) + 1e-5 * scale + 1e-30
        assert (error <= bound).all(), f"{name}: worst error {(error / bound).max():.3g} x the bound"


# -- the Megatron side --------------------------------------------------------------------------------------


def test_megatron_builds_wrapped_torch_norm_and_is_torch_rms_norm_bit_for_bit():
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    assert rms_megatron.megatron_norm_class() is WrappedTorchNorm
    x, weight, grad = inputs(1)
    got = run_torch(RmsNormMegatron.megatron, x, weight, grad, options())
    plain = run_torch(lambda xt, wt, o: torch.nn.functional.rms_norm(xt, [xt.shape[-1]], wt, o["eps"]),
                      x, weight, grad, options())
    for a, b in zip(got, plain):
        assert a.dtype == BF16 and np.array_equal(a.view(np.uint16), b.view(np.uint16))


@pytest.mark.parametrize("dtype, shape, eps", [(BF16, (64, 256), 1e-5), (BF16, (8, 4, 384), 1e-6),
                                               (np.float32, (32, 512), 1e-5)])
def test_megatron_matches_fp64(dtype, shape, eps):
    x, weight, grad = inputs(2, shape, dtype)
    reference, scales = fp64_reference(x, weight, grad, options(eps))
    assert_close_to_fp64(run_torch(RmsNormMegatron.megatron, x, weight, grad, options(eps)), reference, scales, dtype)


@pytest.mark.parametrize("zero_centered_gamma", [False, True])
def test_te_reference_matches_fp64(zero_centered_gamma):
    x, weight, grad = inputs(3, (4, 8, 256), weight_mean=0.0 if zero_centered_gamma else 1.0, weight_std=0.1)
    opts = options(1e-6, zero_centered_gamma)
    reference, scales = fp64_reference(x, weight, grad, opts)
    assert_close_to_fp64(run_torch(RmsNormMegatron.te_reference, x, weight, grad, opts), reference, scales, BF16)


def test_te_reference_out_is_wrapped_torch_norm_out():
    """Same fp32 formula forward (x * rs * gamma, one rounding): bitwise at a power-of-two hidden size."""
    x, weight, grad = inputs(4)
    te = run_torch(RmsNormMegatron.te_reference, x, weight, grad, options())
    megatron = run_torch(RmsNormMegatron.megatron, x, weight, grad, options())
    assert np.array_equal(te[0].view(np.uint16), megatron[0].view(np.uint16))


def test_megatron_cpu_norm_refuses_zero_centered_gamma_as_not_available():
    x, weight, _ = inputs(5, (4, 64))
    with pytest.raises(NotAvailable, match="zero_centered_gamma not supported.*use impl te_reference"):
        RmsNormMegatron.megatron(to_torch(x), to_torch(weight), options(zero_centered_gamma=True))


# -- the Paddle side ----------------------------------------------------------------------------------------


def ulp(a, b):
    ia, ib = (v.view(np.int16 if v.itemsize == 2 else np.int32).astype(np.int64) for v in (a, b))
    mask = 0x7FFF if a.itemsize == 2 else 0x7FFFFFFF
    ia, ib = (np.where(v < 0, -(v & mask), v) for v in (ia, ib))
    return np.abs(ia - ib)


RSQRT_ARGUMENTS = (np.random.default_rng(6).random(1 << 16) * 50 + 1e-3).astype(np.float32)
RSQRT_TWICE_ROUNDED = (np.float32(1.0) / np.sqrt(RSQRT_ARGUMENTS)).astype(np.float32)  # fp32 sqrt, then fp32 1/x


@own_process
def test_torch_cpu_rsqrt_is_one_over_sqrt_rounded_twice_under_the_profile(tmp_path):
    """torch's CPU rsqrt, as the torch side computes it (the default profile, portable-avx2: MKL in its compatible
    mode, AVX2 kernels, one thread), is 1/sqrt correctly rounded twice, on any CPU with AVX2. Unpinned it is not
    portable: on an Intel CPU with AVX-512 it gave other bits (torch's rsqrt goes through MKL's vector math where
    torch has MKL). So it runs in a process of its own, pinned before torch is imported; Paddle is not needed."""
    arguments, result = tmp_path / "v.npy", tmp_path / "rsqrt.npy"
    np.save(arguments, RSQRT_ARGUMENTS)
    done = run_pinned("""
        import numpy as np
        import torch
        np.save(sys.argv[2], torch.rsqrt(torch.from_numpy(np.load(sys.argv[1]))).numpy())
        print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())
    """, str(arguments), str(result))
    assert done.stdout.split() == ["AVX2", "1"]  # the profile's pins took effect
    found = np.load(result)
    assert np.array_equal(found, RSQRT_TWICE_ROUNDED), f"{int((found != RSQRT_TWICE_ROUNDED).sum())} of {found.size} differ"


def test_rsqrt_helper_is_torch_cpu_rsqrt_bit_for_bit():
    """The Paddle variants' rsqrt gives the bits of torch's CPU rsqrt (previous test): Paddle's fp32 sqrt is not
    correctly rounded, so the helper takes the square root in fp64 (elementwise IEEE operations: the same bits
    on any CPU)."""
    assert np.array_equal(_rsqrt(paddle.to_tensor(RSQRT_ARGUMENTS)).numpy(), RSQRT_TWICE_ROUNDED)


def test_fp32_island_is_torch_given_torchs_mean():
    """The forward residue of fp32_island is the fp32 mean of x^2 alone (torch's cascade sum vs Paddle's)."""
    x, weight, grad = inputs(7, (128, 1024))
    megatron_out = run_torch(RmsNormMegatron.megatron, x, weight, grad, options())[0]
    mean = torch.pow(to_torch(x).detach().float(), 2).mean(-1, keepdim=True).numpy()
    x32 = to_paddle(x).cast("float32")
    out = (x32 * _rsqrt(paddle.to_tensor(mean) + 1e-5) * to_paddle(weight).cast("float32")).cast("bfloat16")
    assert np.array_equal(from_paddle(out).view(np.uint16), megatron_out.view(np.uint16))


def test_fp32_island_within_measured_ulps_of_megatron_and_per_op_rounding_is_not_megatron():
    x, weight, grad = inputs(8, (128, 1024))
    megatron = run_torch(RmsNormMegatron.megatron, x, weight, grad, options())
    island = run_paddle(RmsNormPaddle.fp32_island, x, weight, grad, options())
    per_op = run_paddle(RmsNormPaddle.per_op_rounding, x, weight, grad, options())
    assert all(t.dtype == BF16 for t in island + per_op)
    assert ulp(island[0], megatron[0]).max() <= 1
    assert ulp(island[2], megatron[2]).max() <= 1
    assert (ulp(per_op[0], megatron[0]) > 0).mean() > 0.1  # rounding after every op is not torch's rms_norm
    reference, scales = fp64_reference(x, weight, grad, options())
    assert_close_to_fp64(island, reference, scales, BF16)  # the island is an RMSNorm within rounding


def test_zero_centered_gamma_adds_one_to_the_weight_on_every_variant():
    x, weight, grad = inputs(9, (16, 128), weight_mean=0.0, weight_std=0.1)
    shifted = (weight.astype(np.float32) + 1.0).astype(np.float32)  # exact in fp32
    x32, grad32 = x.astype(np.float32), grad.astype(np.float32)
    plain = run_torch(RmsNormMegatron.te_reference, x32, shifted, grad32, options())
    te = run_torch(RmsNormMegatron.te_reference, x32, weight.astype(np.float32), grad32,
                   options(zero_centered_gamma=True))
    assert np.array_equal(te[0], plain[0]) and np.array_equal(te[1], plain[1])
    island = run_paddle(RmsNormPaddle.fp32_island, x, weight, grad, options(zero_centered_gamma=True))
    reference, scales = fp64_reference(x, weight, grad, options(zero_centered_gamma=True))
    assert_close_to_fp64(island, reference, scales, BF16)


@pytest.mark.parametrize("variant", ["rms_norm_kernel", "fused_rms_norm"])
@pytest.mark.parametrize("dtype", [BF16, np.float32])
def test_paddle_kernels_are_not_available_on_cpu_and_never_crash(variant, dtype):
    """Both are NotAvailable on any CPU: rms_norm has no CPU kernel; fused_rms_norm's CPU kernel is fp32
    forward only (and AVX-512 only: on a CPU without AVX-512 calling it would SIGILL)."""
    x, weight, _ = inputs(10, (4, 64), dtype)
    with pytest.raises(NotAvailable, match=r"paddle\.(nn|incubate\.nn)\.functional\.(rms_norm|fused_rms_norm)"):
        getattr(RmsNormPaddle, variant)(to_paddle(x), to_paddle(weight), options())


# -- the family ---------------------------------------------------------------------------------------------


def test_family_declares_what_the_implementations_define():
    family = family_for("rmsnorm")
    assert set(RmsNormPaddle.impls()) == set(family.variants["paddle"])
    assert set(RmsNormMegatron.impls()) == set(family.variants["megatron"])
    provenance = RmsNormMegatron.impls()["megatron"].provenance_for(options())
    assert "WrappedTorchNorm" in provenance and "megatron-core 0.16.1" in provenance
    assert "Transformer Engine is not installed" in RmsNormMegatron.impls()["te_reference"].provenance_for(options())


CASE = """\
op: rmsnorm
vars: {tokens: 16, hidden: 64}
seed: 1
inputs:
  x: {shape: [tokens, hidden], dtype: bfloat16}
  weight: {shape: [hidden], dtype: bfloat16}
  grad_out: {shape: [tokens, hidden], dtype: bfloat16}
sides:
  megatron: {framework: megatron}
  paddle: {framework: paddle, impl: fp32_island}
expect:
  all: report
"""


@pytest.mark.parametrize("old, new, message", [
    ("weight: {shape: [hidden]", "weight: {shape: [32]", "inputs.weight.shape: weight must have shape [64], got [32]"),
    ("grad_out: {shape: [tokens, hidden], dtype: bfloat16}", "grad_out: {shape: [tokens, hidden], dtype: float32}",
     "inputs.grad_out.dtype: grad_out must have x's dtype bfloat16"),
    ("seed: 1", "seed: 1\noptions: {eps: -1.0}", "options.eps: Input should be greater than or equal to 0"),
    ("seed: 1", "seed: 1\noptions: {zero_centred: true}", "options.zero_centred: Extra inputs are not permitted"),
    ("x: {shape: [tokens, hidden]", "x: {shape: [hidden]", "inputs.x.shape: x is [tokens, hidden] or [s, b, hidden]"),
])
def test_bad_cases_rejected_at_load(tmp_path, old, new, message):
    path = tmp_path / "case.yaml"
    path.write_text(CASE.replace(old, new))
    with pytest.raises(Exception) as error:
        load_cases(path)
    assert message in str(error.value)


def test_run_end_to_end_with_a_not_available_side(tmp_path, monkeypatch, capsys):
    from harness.cli import main

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "case.yaml"
    path.write_text(CASE + "sweep:\n  sides.paddle.impl: [fp32_island, rms_norm_kernel]\n")
    report = tmp_path / "r.json"
    assert main(["run", str(path), "--json", str(report)]) == 0
    cases = json.loads(report.read_text())["cases"]
    assert len(cases) == 2
    assert "no cpu kernel `rms_norm`" in capsys.readouterr().out
