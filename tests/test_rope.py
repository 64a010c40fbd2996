"""RoPE family: real megatron-core apply_rotary_pos_emb against an independent fp64 rotation, the Paddle
variants' measured relationship to it, and the [s, b, h, d] <-> [b, s, h, d] layout round trip."""

import itertools
import json

import ml_dtypes
import numpy as np
import pytest

from harness.inputs import generate_inputs
from harness.load import load_cases
from harness.ops import NotAvailable, family_for
from harness.ops.rope import BSHD_TO_PADDLE, rotary_freqs

# torch, paddle and megatron-core are imported when the first test here runs, not when pytest collects the module:
# a test process (pytest-xdist) that runs none of these tests never imports them. The group keeps this module's
# tests, and the other in-process framework tests, in one test process.
pytestmark = pytest.mark.xdist_group("in_process_frameworks")
torch = paddle = RopeMegatron = RopePaddle = None


@pytest.fixture(scope="module", autouse=True)
def _frameworks():
    global torch, paddle, RopeMegatron, RopePaddle
    torch = pytest.importorskip("torch")
    paddle = pytest.importorskip("paddle")
    RopeMegatron = pytest.importorskip("harness.ops.rope.megatron").RopeMegatron
    RopePaddle = pytest.importorskip("harness.ops.rope.paddle").RopePaddle


BF16 = ml_dtypes.bfloat16
U_BF16 = 2.0 ** -8  # unit roundoff of bf16 (8 significant bits)


def options(interleaved=False, mscale=1.0, fusion=False):
    return {"rotary_interleaved": interleaved, "mscale": mscale, "rotary_base": 10000, "position_offset": 0,
            "apply_rope_fusion": fusion}


def to_torch(array, requires_grad=False):
    tensor = torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16) if array.dtype == BF16 \
        else torch.from_numpy(array.copy())
    return tensor.requires_grad_(requires_grad)


def from_torch(tensor):
    tensor = tensor.detach().contiguous()
    return tensor.view(torch.int16).numpy().view(BF16) if tensor.dtype == torch.bfloat16 else tensor.numpy()


def to_paddle(array, requires_grad=False):
    tensor = paddle.to_tensor(array.view(np.uint16) if array.dtype == BF16 else array)
    tensor.stop_gradient = not requires_grad
    return tensor


def from_paddle(tensor):
    array = tensor.detach().numpy()
    return array.view(BF16) if tensor.dtype == paddle.bfloat16 else array


def inputs(seed, s=64, b=2, h=3, d=32, rot_dim=None, interleaved=False, freqs_dtype=np.float32, dtype=BF16, offset=0):
    rng = np.random.default_rng(seed)
    t = rng.normal(size=(s, b, h, d)).astype(dtype)
    grad = rng.normal(size=(s, b, h, d)).astype(dtype)
    freqs = rotary_freqs(s, rot_dim or d, interleaved, offset=offset).astype(freqs_dtype)
    return t, freqs, grad


def run_megatron(t, freqs, grad, opts):
    tt = to_torch(t, True)
    out = RopeMegatron.megatron(tt, to_torch(freqs), opts)
    out.backward(to_torch(grad))
    return from_torch(out), from_torch(tt.grad)


def run_paddle(variant, t, freqs, grad, opts):
    """The variant on Paddle's [b, s, h, d]; out and grad.t permuted back to Megatron's [s, b, h, d]."""
    perm = BSHD_TO_PADDLE
    pt = to_paddle(np.ascontiguousarray(t.transpose(perm)), True)
    out = getattr(RopePaddle, variant)(pt, to_paddle(np.ascontiguousarray(freqs.transpose(perm))), opts)
    paddle.autograd.backward([out], [to_paddle(np.ascontiguousarray(grad.transpose(perm)))])
    inverse = tuple(np.argsort(perm))
    return from_paddle(out).transpose(inverse), from_paddle(pt.grad).transpose(inverse)


def bits(array):
    return array.view(np.uint16 if array.dtype == BF16 else np.uint32)


def rotation64(x, freqs, interleaved, mscale):
    """out = x * cos + rotate_half(x) * sin over the first rot_dim channels, in fp64 (numpy only)."""
    rot_dim = freqs.shape[-1]
    x = x.astype(np.float64)
    xr, xp = x[..., :rot_dim], x[..., rot_dim:]
    angles = freqs.astype(np.float64)
    cos, sin = np.cos(angles) * mscale, np.sin(angles) * mscale
    if interleaved:
        rotated = np.stack([-xr[..., 1::2], xr[..., 0::2]], axis=-1).reshape(xr.shape)
    else:
        half = rot_dim // 2
        rotated = np.concatenate([-xr[..., half:], xr[..., :half]], axis=-1)
    magnitude = np.abs(xr * cos) + np.abs(rotated * sin)  # |each term|, for the rounding bounds
    return np.concatenate([xr * cos + rotated * sin, xp], axis=-1), _widen(magnitude, x.shape[-1])


def _widen(magnitude, width):
    """Term magnitudes over all channels (0 where channels pass through unrotated)."""
    return np.pad(magnitude, [(0, 0)] * (magnitude.ndim - 1) + [(0, width - magnitude.shape[-1])])


def rotation64_backward(g, freqs, interleaved, mscale):
    """d out / d t applied to g: g * cos + rotate_half^T(g * sin); rotate_half^T(y) = -rotate_half(y)."""
    rot_dim = freqs.shape[-1]
    g = g.astype(np.float64)
    gr, gp = g[..., :rot_dim], g[..., rot_dim:]
    angles = freqs.astype(np.float64)
    cos, sin = np.cos(angles) * mscale, np.sin(angles) * mscale
    gs = gr * sin
    if interleaved:
        back = np.stack([gs[..., 1::2], -gs[..., 0::2]], axis=-1).reshape(gs.shape)
    else:
        half = rot_dim // 2
        back = np.concatenate([gs[..., half:], -gs[..., :half]], axis=-1)
    return np.concatenate([gr * cos + back, gp], axis=-1), _widen(np.abs(gr * cos) + np.abs(back), g.shape[-1])


SETTINGS = list(itertools.product([False, True], [np.float32, BF16], [None, 16], [1.0, 1.3688879454113936]))


def _id(setting):
    interleaved, freqs_dtype, rot_dim, mscale = setting
    return (f"{'interleaved' if interleaved else 'halves'}-{np.dtype(freqs_dtype).name}-"
            f"rot{rot_dim or 'full'}-mscale{mscale:.2f}")


@pytest.mark.parametrize("setting", SETTINGS, ids=[_id(s) for s in SETTINGS])
def test_megatron_is_the_rotation_within_its_roundings(setting):
    """Megatron's bf16 result vs the exact fp64 rotation of the same bf16 t and angles. Eager Megatron
    rounds cos/sin (to the angles' dtype, then to bf16), both products and the sum: each term carries at
    most 3 roundings (u = 2^-8), the sum one more; the pass-through channels are untouched."""
    interleaved, freqs_dtype, rot_dim, mscale = setting
    t, freqs, grad = inputs(1, rot_dim=rot_dim, interleaved=interleaved, freqs_dtype=freqs_dtype)
    out, grad_t = run_megatron(t, freqs, grad, options(interleaved, mscale))
    for got, (ref, magnitude) in ((out, rotation64(t, freqs, interleaved, mscale)),
                                  (grad_t, rotation64_backward(grad, freqs, interleaved, mscale))):
        error = np.abs(got.astype(np.float64) - ref)
        bound = 3.05 * U_BF16 * magnitude + U_BF16 * np.abs(ref)
        assert (error <= bound).all(), f"max error / bound {np.max(error / bound):.3f}"
        assert error.max() > 0  # bf16 arithmetic, not an fp64 result
    # channels past rot_dim pass through bit for bit (values and gradients)
    assert np.array_equal(bits(out[..., freqs.shape[-1]:]), bits(t[..., freqs.shape[-1]:]))
    assert np.array_equal(bits(grad_t[..., freqs.shape[-1]:]), bits(grad[..., freqs.shape[-1]:]))


@pytest.mark.parametrize("setting", SETTINGS, ids=[_id(s) for s in SETTINGS])
def test_per_op_rounding_is_bitwise_megatron_and_fp32_island_is_one_rounding(setting):
    """Measured on this CPU: per_op_rounding (Paddle on [b, s, h, d], compared in [s, b, h, d]) equals
    Megatron bit for bit in out and grad.t; fp32_island differs, and is the fp64 rotation rounded once
    (error <= u |ref| plus fp32 noise): it is the more accurate one, not Megatron's."""
    interleaved, freqs_dtype, rot_dim, mscale = setting
    t, freqs, grad = inputs(2, rot_dim=rot_dim, interleaved=interleaved, freqs_dtype=freqs_dtype)
    opts = options(interleaved, mscale)
    megatron = run_megatron(t, freqs, grad, opts)
    per_op = run_paddle("per_op_rounding", t, freqs, grad, opts)
    island = run_paddle("fp32_island", t, freqs, grad, opts)
    for m, p in zip(megatron, per_op):
        assert np.array_equal(bits(m), bits(p))
    assert any(not np.array_equal(bits(m), bits(i)) for m, i in zip(megatron, island))
    for got, (ref, magnitude) in ((island[0], rotation64(t, freqs, interleaved, mscale)),
                                  (island[1], rotation64_backward(grad, freqs, interleaved, mscale))):
        error = np.abs(got.astype(np.float64) - ref)
        assert (error <= U_BF16 * np.abs(ref) + 2.0 ** -20 * magnitude).all()


def test_layout_round_trip_is_bit_exact():
    """[s, b, h, d] -> Paddle's [b, s, h, d] -> back: the permutation and its inverse lose no bit, and the
    Paddle side really computes on [b, s, h, d] (a per-position rotation would be wrong on unpermuted t)."""
    t, freqs, grad = inputs(3, s=8, b=4, h=2, d=16)
    perm = BSHD_TO_PADDLE
    inverse = tuple(np.argsort(perm))
    assert np.array_equal(bits(from_paddle(to_paddle(np.ascontiguousarray(t.transpose(perm)))).transpose(inverse)), bits(t))
    out, grad_t = run_paddle("per_op_rounding", t, freqs, grad, options())
    assert out.shape == grad_t.shape == t.shape == (8, 4, 2, 16)
    megatron = run_megatron(t, freqs, grad, options())
    assert np.array_equal(bits(out), bits(megatron[0])) and np.array_equal(bits(grad_t), bits(megatron[1]))


def test_freqs_are_megatron_rotary_embedding_angles():
    """The family's angles equal RotaryEmbedding.get_freqs_non_repeated bit for bit on this CPU, laid out as
    RotaryEmbedding.get_emb lays them (halves concatenated, or each angle twice when interleaved)."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import (
        RotaryEmbedding,
    )

    for dim, base, s, offset in [(128, 10000, 512, 0), (64, 500000, 256, 4000)]:
        emb = RotaryEmbedding(kv_channels=dim, rotary_percent=1.0, rotary_base=base, use_cpu_initialization=True)
        reference = emb.get_freqs_non_repeated(s, offset).numpy()
        halves = rotary_freqs(s, dim, False, base, offset)[:, 0, 0]
        interleaved = rotary_freqs(s, dim, True, base, offset)[:, 0, 0]
        assert np.array_equal(bits(halves), bits(np.concatenate([reference, reference], axis=-1)))
        assert np.array_equal(bits(interleaved), bits(np.repeat(reference, 2, axis=-1)))


def test_not_available_paths_are_results():
    t, freqs, grad = inputs(4, s=4, b=1, h=1, d=8)
    with pytest.raises(NotAvailable, match="fused_rotary_position_embedding"):
        run_paddle("fused_rope", t, freqs, grad, options())
    with pytest.raises(NotAvailable, match="Transformer Engine"):
        run_megatron(t, freqs, grad, options(fusion=True))


def test_family_generates_freqs_in_the_case_dtype(write_case):
    path = write_case(CASE.replace("dtype: float32}", "dtype: bfloat16}"))
    case = load_cases(path)[0]
    arrays = generate_inputs(case)
    assert arrays["freqs"].dtype == BF16 and arrays["freqs"].shape == (16, 1, 1, 8)
    assert np.array_equal(bits(arrays["freqs"]), bits(rotary_freqs(16, 8, True).astype(BF16)))
    assert family_for("rope").grad_inputs(case) == ["t"]  # freqs takes no gradient


CASE = """\
op: rope
vars: {s: 16, b: 3, heads: 2, d: 12}
options: {rotary_interleaved: true}
seed: 7
inputs:
  t: {shape: [s, b, heads, d], dtype: bfloat16}
  freqs: {shape: [s, 1, 1, 8], dtype: float32}
  grad_out: {shape: [s, b, heads, d], dtype: bfloat16}
sides:
  megatron: {framework: megatron}
  paddle: {framework: paddle, impl: per_op_rounding}
expect:
  all: bitwise
"""


def test_end_to_end_per_op_rounding_is_bitwise(write_case, tmp_path):
    """Through `xfalign run` (worker processes, layout adapter, inverse permutation of out and grad.t)."""
    from harness.cli import main

    path = write_case(CASE)
    out = tmp_path / "r.json"
    assert main(["run", str(path), "--json", str(out), "--html", str(tmp_path / "html")]) == 0
    result = json.loads(out.read_text())["cases"][0]
    assert result["passed"]
    assert [t["name"] for t in result["tensors"]] == ["out", "grad.t"]  # freqs: no gradient
    for tensor in result["tensors"]:
        assert tensor["bitwise"] and tensor["stats"]["elements"] == 16 * 3 * 2 * 12
        assert "[s, b, h, d]" in tensor["note"]
    assert "apply_rotary_pos_emb" in result["sides"]["a"]["provenance"]
