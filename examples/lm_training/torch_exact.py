"""Paddle ops that give torch 2.13's CPU float32 results bit for bit on this machine (x86-64, AVX2, MKL 2024.2):
the kernels megatron-core's model and torch's AdamW run, re-done in Paddle ops so that a Paddle model can follow
a Megatron run exactly. Each function names the torch kernel it reproduces and how it was checked
(tests/test_lm_training_demo.py checks them against torch on random data).

Building blocks Paddle has that are exact: float32 and float64 +, -, *, / (IEEE, correctly rounded), casts (round
to nearest even), comparisons, gathers; float64 holds any product of two float32 exactly. Paddle's own float32
sqrt, exp, log, matmul and reductions are not torch's (different algorithms or orders), so they are not used on
float32 data.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import paddle

F32, F64, I64 = paddle.float32, paddle.float64, paddle.int64


def f32(value: float) -> paddle.Tensor:
    """A Python float as a 0-d float32 tensor (rounded once, as a C++ float literal or torch's scalar operand is)."""
    return paddle.to_tensor(np.float32(value))


def _round_to_odd(s: paddle.Tensor, err: paddle.Tensor) -> paddle.Tensor:
    """The float64 value s (the rounded s + err, err its exact error) moved to the neighbour with an odd last
    bit when inexact: rounding that to float32 then gives the correctly rounded float32 of s + err (round to odd
    at 53 bits, then to nearest at 24 bits, is one correct rounding)."""
    bits = s.view(I64)
    even = paddle.bitwise_and(bits, paddle.ones_like(bits)) == 0
    move = (err != 0) & even
    up = (err > 0) == (s > 0)  # toward err: magnitude up when err has s's sign
    step = paddle.where(up, paddle.ones_like(bits), -paddle.ones_like(bits))
    return paddle.where(move, bits + step, bits).view(F64)


def fma(a: paddle.Tensor, b: paddle.Tensor, c: paddle.Tensor) -> paddle.Tensor:
    """float32 fused multiply-add a * b + c with one rounding (AVX2 vfmadd): the product is exact in float64,
    the sum's float64 error is recovered (TwoSum) and the sum rounded to odd before the float32 rounding."""
    p = a.cast(F64) * b.cast(F64)
    c64 = c.cast(F64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)
    return _round_to_odd(s, err).cast(F32)


# --- exp and log: Sleef 3.x xexpf / xlogf_u1 (sleefsimdsp.c), torch's Vectorized<float>::exp()/log() on AVX2 ----

_R_LN2 = f32(1.442695040888963407359924681001892137426645954152985934135449406931)
_L2U, _L2L = f32(-0.693145751953125), f32(-1.428606765330187045e-06)
_EXP_POLY = [f32(c) for c in (0.00139304355252534151077271, 0.00833336077630519866943359, 0.0416664853692054748535156,
                              0.166666671633720397949219, 0.5)]


def _pow2i(q: paddle.Tensor) -> paddle.Tensor:
    """2**q as float32 from its exponent bits (Sleef vpow2i_vf_vi2), q an int64 tensor in [-126, 127]."""
    return ((q + 127) * (1 << 23)).cast(paddle.int32).view(F32)


def exp(d: paddle.Tensor) -> paddle.Tensor:
    """torch.exp / Vectorized<float>::exp on AVX2 = Sleef_expf8_u10 (xexpf, FMA build): the range reduction by
    round(d / ln 2), a degree-6 polynomial in FMAs, scaling by 2**q in two exact multiplies."""
    q = paddle.round(d * _R_LN2)  # vrint: round half to even, like cvtps2dq
    s = fma(q, _L2U, d)
    s = fma(q, _L2L, s)
    u = paddle.full_like(d, np.float32(0.000198527617612853646278381))
    for c in _EXP_POLY:
        u = fma(u, s, c.expand_as(d))
    u = f32(1.0) + fma(s * s, u, s)
    qi = q.cast(I64)
    half = paddle.floor_divide(qi, paddle.full_like(qi, 2))  # q >> 1 (arithmetic shift: floor)
    u = u * _pow2i(half) * _pow2i(qi - half)
    u = paddle.where(d < -104, paddle.zeros_like(u), u)
    return paddle.where(d > 100, paddle.full_like(u, float("inf")), u)


# --- sums: torch's cascade_sum (aten/src/ATen/native/cpu/SumKernel.cpp), float32 accumulators -----------------------

def _multi_row_sum(rows: list[paddle.Tensor]) -> paddle.Tensor:
    """multi_row_sum: rows[i] (equal shapes, each an element-wise lane set) added in order into 4 levels of
    accumulators; every 2**level_power rows a level is carried into the next (a cascade)."""
    size = len(rows)
    ceil_log2 = 1 if size <= 2 else int(size - 1).bit_length()
    level_power = max(4, ceil_log2 // 4)
    step, mask = 1 << level_power, (1 << level_power) - 1
    zero = paddle.zeros_like(rows[0])
    acc = [zero] * 4
    i = 0
    while i + step <= size:
        for _ in range(step):
            acc[0] = acc[0] + rows[i]
            i += 1
        for j in range(1, 4):
            acc[j] = acc[j] + acc[j - 1]
            acc[j - 1] = zero
            if i & (mask << (j * level_power)):
                break
    while i < size:
        acc[0] = acc[0] + rows[i]
        i += 1
    for j in range(1, 4):
        acc[0] = acc[0] + acc[j]
    return acc[0]


def _row_sum(rows: list[paddle.Tensor]) -> paddle.Tensor:
    """row_sum with ilp_factor 4: the rows as (-1, 4) columns summed by multi_row_sum, the leftover rows added
    to column 0, then columns 1..3 added to column 0."""
    n = len(rows) // 4
    partial = [_multi_row_sum(rows[k:4 * n:4]) if n else paddle.zeros_like(rows[0]) for k in range(4)]
    for row in rows[4 * n:]:
        partial[0] = partial[0] + row
    for k in range(1, 4):
        partial[0] = partial[0] + partial[k]
    return partial[0]


def inner_sum(x: paddle.Tensor) -> paddle.Tensor:
    """x.sum(-1) of a contiguous float32 tensor whose last axis has >= 8 elements (vectorized_inner_sum): the
    row as vectors of 8 lanes summed by row_sum, then the scalar tail, then the 8 lanes in order; the output,
    filled with 0, accumulates it. Keeps the reduced axis as size 1."""
    n = x.shape[-1]
    vectors = n // 8
    lanes = [x[..., 8 * v:8 * v + 8] for v in range(vectors)]
    vec_acc = _row_sum(lanes)
    total = paddle.zeros_like(x[..., :1])
    for k in range(8 * vectors, n):
        total = total + x[..., k:k + 1]
    for k in range(8):
        total = total + vec_acc[..., k:k + 1]
    return paddle.zeros_like(total) + total


def full_sum(x: paddle.Tensor) -> paddle.Tensor:
    """x.sum() of a contiguous float32 tensor of < 32768 elements (one thread: TensorIterator's GRAIN_SIZE)."""
    return inner_sum(x.reshape([1, -1])).reshape([])


def outer_sum(x: paddle.Tensor) -> paddle.Tensor:
    """x.sum(0) of a contiguous float32 [rows, cols] tensor, cols a multiple of 32 (vectorized_outer_sum: 4
    vectors of 8 columns at a time, each column summed over the rows by multi_row_sum)."""
    if x.shape[1] % 32:
        raise ValueError(f"outer_sum needs a multiple of 32 columns, not {x.shape[1]}")
    return _multi_row_sum([x[i] for i in range(x.shape[0])])


# --- GEMM: torch.matmul / F.linear on float32 = MKL sgemm (BLAS_INFO=mkl), AVX2 code path --------------------------

_KC = 192  # measured: MKL 2024.2 sgemm on this AVX2 CPU splits the inner dimension K into blocks


def k_blocks(k: int) -> list[tuple[int, int]]:
    """MKL's K blocks (measured with torch 2.13 on this machine, for M, N from 64 to 1024): one block up to 192,
    two halves up to 384, else blocks of 192 and the remainder."""
    if k <= _KC:
        bounds = [0, k]
    elif k <= 2 * _KC:
        bounds = [0, (k + 1) // 2, k]
    else:
        bounds = list(range(0, k, _KC)) + [k]
    return list(zip(bounds[:-1], bounds[1:]))


def _fma_chain(a64: paddle.Tensor, b64: paddle.Tensor) -> paddle.Tensor:
    """sum_k a[:, k] * b[k, :] as one float32 FMA per k, in k order, from 0 (the micro-kernel's accumulator)."""
    acc = None
    for k in range(a64.shape[1]):
        p = a64[:, k:k + 1] * b64[k:k + 1, :]
        if acc is None:
            acc = p.cast(F32)
            continue
        c = acc.cast(F64)
        s = p + c
        bb = s - p
        err = (p - (s - bb)) + (c - bb)
        acc = _round_to_odd(s, err).cast(F32)
    return acc


def mm(a: paddle.Tensor, b: paddle.Tensor) -> paddle.Tensor:
    """a [M, K] @ b [K, N] in float32 as MKL's sgemm rounds it here: per K block an FMA chain over k, the blocks'
    results added in order (measured bitwise against torch.matmul for the demo's shapes)."""
    a64, b64 = a.cast(F64), b.cast(F64)
    out = None
    for k0, k1 in k_blocks(a.shape[1]):
        block = _fma_chain(a64[:, k0:k1], b64[k0:k1])
        out = block if out is None else out + block
    return out


# --- elementwise kernels ------------------------------------------------------------------------------------------

def sqrt(x: paddle.Tensor) -> paddle.Tensor:
    """A correctly rounded float32 sqrt: Vectorized<float>::sqrt (vsqrtps, inside torch's rsqrt) and std::sqrt.
    Paddle's float32 sqrt is not (a fast approximation, harness/ops/rmsnorm/paddle.py); float64 sqrt rounded to
    float32 is. torch.sqrt itself is MKL's vsSqrt: `vml_sqrt`."""
    return paddle.sqrt(x.cast(F64)).cast(F32)


class _Vml:
    """MKL's vector math (VML) functions, which torch.exp, torch.log and torch.sqrt call on float32 CPU tensors
    (torch links MKL 2024.2; VML's sqrt is not correctly rounded: 15% of random inputs differ from the correctly
    rounded root). Paddle 3.3.1 ships the same functions in paddle/libs/libmklml_intel.so and calls vsExp inside
    its own CPU kernels (phi::funcs::vec_exp: softmax, log_softmax), but no Paddle op returns exp(x), log(x) or
    sqrt(x) through them (paddle.exp/log/sqrt use Eigen's). They are called here directly, as a user-written Paddle
    kernel would: vsExp/vsLn/vsSqrt from Paddle's library give torch's bits (measured: 0 of 262,144 differ)."""

    _lib = None

    @classmethod
    def call(cls, name: str, x: paddle.Tensor) -> paddle.Tensor:
        if cls._lib is None:
            cls._lib = ctypes.CDLL(str(Path(paddle.__file__).parent / "libs" / "libmklml_intel.so"))
        values = np.ascontiguousarray(x.numpy(), dtype=np.float32)
        out = np.empty_like(values)
        getattr(cls._lib, name)(ctypes.c_int(values.size), values.ctypes.data_as(ctypes.c_void_p),
                                out.ctypes.data_as(ctypes.c_void_p))
        return paddle.to_tensor(out)


def vml_exp(x: paddle.Tensor) -> paddle.Tensor:
    """torch.exp on float32 (MKL vsExp)."""
    return _Vml.call("vsExp", x)


def vml_log(x: paddle.Tensor) -> paddle.Tensor:
    """torch.log on float32 (MKL vsLn)."""
    return _Vml.call("vsLn", x)


def vml_sqrt(x: paddle.Tensor) -> paddle.Tensor:
    """torch.sqrt on float32 (MKL vsSqrt)."""
    return _Vml.call("vsSqrt", x)


def silu(x: paddle.Tensor) -> paddle.Tensor:
    """torch's CPU silu kernel (aten/src/ATen/native/cpu/Activation.cpp): x / (1 + exp(-x)), exp being
    Vectorized<float>::exp (Sleef) in the vectorized loop; a tail of < 16 elements per row would take std::exp
    (the demo's rows have 64)."""
    return x / (f32(1.0) + exp(-x))


def silu_backward(grad: paddle.Tensor, x: paddle.Tensor) -> paddle.Tensor:
    """torch's silu_backward kernel: dy * sigmoid * (1 + x * (1 - sigmoid)), sigmoid = 1 / (1 + exp(-x)); the
    compiler contracts 1 + x * (...) into one FMA (measured: without it 20,459 of 262,144 differ, with it 0)."""
    one = f32(1.0)
    sigmoid = one / (one + exp(-x))
    return grad * sigmoid * fma(x, one - sigmoid, one.expand_as(x))


# --- the model's functions, forward and backward as torch's autograd runs them -------------------------------------

def rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
    """torch.rms_norm's composite CPU path (aten/src/ATen/native/layer_norm.cpp, what megatron-core's
    WrappedTorchNorm -> torch.nn.RMSNorm runs): r = rsqrt(pow(x, 2).mean(-1) + eps), t = x * r, out = t * w;
    mean = sum / n, rsqrt = 1 / sqrt. Returns (out, t, r) (t and r for the backward)."""
    mean = inner_sum(x * x) / f32(x.shape[-1])
    r = f32(1.0) / sqrt(mean + f32(eps))
    t = x * r
    return t * weight, t, r


def rms_norm_backward(grad: paddle.Tensor, x: paddle.Tensor, weight: paddle.Tensor, t: paddle.Tensor,
                      r: paddle.Tensor, rows: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
    """Autograd through the composite: MulBackward0 (grad.weight = sum over rows of grad * t, an outer sum over
    `rows` = (grad * t) as [tokens, hidden] in torch's token order), MulBackward0 (x * r: grad * r, and the sum
    over the row of grad * x for r), RsqrtBackward0 (-0.5 * grad * r**3, r**3 = r * r * r), MeanBackward1
    (/ n), PowBackward0 (grad * (2 * x)). Returns (grad through x * r, grad through pow, grad.weight): autograd
    adds the two x gradients (and the residual's) in the order the caller knows."""
    grad_weight = outer_sum(rows)
    grad_t = grad * weight
    through_mul = grad_t * r
    grad_r = inner_sum(grad_t * x)
    grad_mean = (f32(-0.5) * grad_r) * (r * r * r)
    through_pow = (grad_mean / f32(x.shape[-1])) * (f32(2.0) * x)
    return through_mul, through_pow, grad_weight


def vocab_cross_entropy(logits: paddle.Tensor, target: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
    """megatron.core.tensor_parallel.cross_entropy.VocabParallelCrossEntropy at TP=1 on float32 logits: logits
    - max, exp (torch.exp: MKL), sum over the vocabulary, loss = log(sum) - logit[target], softmax = exp / sum.
    Returns (loss, softmax)."""
    shifted = logits - logits.max(axis=-1, keepdim=True)
    predicted = paddle.take_along_axis(shifted, target.unsqueeze(-1), axis=-1).squeeze(-1)
    exp_logits = vml_exp(shifted)
    sum_exp = inner_sum(exp_logits)
    loss = vml_log(sum_exp.squeeze(-1)) - predicted
    return loss, exp_logits / sum_exp


def vocab_cross_entropy_backward(softmax: paddle.Tensor, target: paddle.Tensor, grad: paddle.Tensor) -> paddle.Tensor:
    """Its backward: softmax with 1 subtracted at the target, times the loss gradient."""
    at_target = paddle.take_along_axis(softmax, target.unsqueeze(-1), axis=-1) - f32(1.0)
    return paddle.put_along_axis(softmax, target.unsqueeze(-1), at_target, axis=-1) * grad.unsqueeze(-1)


def masked_mean(per_token: paddle.Tensor, loss_mask: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Megatron-LM's loss (pretrain_gpt.loss_func, schedules.forward_step_calc_loss): sum(losses * mask) over the
    tokens in [b, s] order, divided by the token count (an int). Returns (loss, its gradient per token)."""
    mask = loss_mask.reshape([-1])
    tokens = max(int(full_sum(mask).item()), 1)
    loss = full_sum(per_token.reshape([-1]) * mask) / f32(tokens)
    grad = (f32(1.0) / f32(tokens)) * loss_mask
    return loss, grad


def embedding_backward(grad: paddle.Tensor, ids: paddle.Tensor, vocab: int) -> paddle.Tensor:
    """embedding_dense_backward_cpu: zeros, then each token's gradient row added to its id's row in token order
    (grad [tokens, hidden], ids [tokens], both in the order of the ids tensor the model was given). Done here as
    rounds: round j adds every id's j-th occurrence (one addition per row per round, in order)."""
    ids_np = ids.numpy().reshape(-1)
    rank = np.zeros_like(ids_np)
    seen: dict[int, int] = {}
    for i, token in enumerate(ids_np.tolist()):
        rank[i] = seen.get(token, 0)
        seen[token] = rank[i] + 1
    out = paddle.zeros([vocab, grad.shape[-1]], dtype=F32)
    for j in range(int(rank.max()) + 1 if rank.size else 0):
        where = np.nonzero(rank == j)[0]
        rows = paddle.to_tensor(ids_np[where])
        out = paddle.scatter(out, rows, paddle.gather(out, rows) + paddle.gather(grad, paddle.to_tensor(where)))
    return out


def norm2(x: paddle.Tensor) -> paddle.Tensor:
    """torch.norm(x) (p=2 over every element) of a contiguous float32 tensor: norm_kernel's vectorized last-dim
    path (ReduceOpsKernel.cpp): 8 lanes accumulate x*x (multiply, then add) in order, the lanes are added 0..7,
    then the scalar tail (len % 8): as compiled, its first 4 elements (when there are 4) multiply then add and
    the rest are FMAs (measured on tails of 1..7), sqrt. Returns a 0-d tensor."""
    flat = x.reshape([-1])
    n = flat.shape[0] - flat.shape[0] % 8
    acc = paddle.zeros([8], dtype=F32)
    lanes = flat[:n].reshape([-1, 8])
    for i in range(lanes.shape[0]):
        acc = acc + lanes[i] * lanes[i]
    total = acc[0]
    for k in range(1, 8):
        total = total + acc[k]
    tail = flat.shape[0] - n
    for k in range(n, flat.shape[0]):
        total = total + flat[k] * flat[k] if tail >= 4 and k < n + 4 else fma(flat[k], flat[k], total)
    return sqrt(total)


def adamw_step(param: paddle.Tensor, grad: paddle.Tensor, exp_avg: paddle.Tensor, exp_avg_sq: paddle.Tensor, step: int,
               lr: float, beta1: float, beta2: float, eps: float, weight_decay: float
               ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
    """torch.optim.adam._single_tensor_adam with decoupled weight decay (AdamW; what torch runs for CPU tensors:
    no foreach, no fused), `step` counted from 1. Scalars are Python floats (float64) and become float32 operands:
        param.mul_(1 - lr * wd); exp_avg.lerp_(grad, 1 - beta1)  [vectorized lerp: fma(w, grad - m, m)];
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)  [v + (value * g) * g, the last
        multiply-add contracted into an FMA]; bias corrections in float64;
        param.addcdiv_(exp_avg, (exp_avg_sq.sqrt() / sqrt(bc2)).add_(eps), value=-lr / bc1)  [torch.sqrt is
        MKL's vsSqrt; p + value * m / d].
    Returns the new (param, exp_avg, exp_avg_sq)."""
    if weight_decay != 0:
        param = param * f32(1 - lr * weight_decay)
    weight = f32(1 - beta1)
    exp_avg = fma(weight.expand_as(grad), grad - exp_avg, exp_avg)
    exp_avg_sq = fma(f32(1 - beta2) * grad, grad, exp_avg_sq * f32(beta2))
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    step_size = lr / bias_correction1
    denom = vml_sqrt(exp_avg_sq) / f32(bias_correction2**0.5) + f32(eps)
    param = param + f32(-step_size) * exp_avg / denom
    return param, exp_avg, exp_avg_sq
