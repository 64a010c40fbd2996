"""Paddle side of the RMSNorm family.

Paddle 3.3.1 on CPU has no RMSNorm kernel that can stand in for Megatron's:
- `paddle.nn.functional.rms_norm` runs the phi kernel `rms_norm`, registered for GPU only (CPU:
  "The kernel `rms_norm` is not registered").
- `paddle.incubate.nn.functional.fused_rms_norm` runs `fused_rms_norm_quant`, whose one CPU kernel
  (paddle/phi/kernels/fusion/cpu/fused_rms_norm_quant_avx_kernel.cc, RmsNormAvxKernel) is float32
  only, forward only (no `fused_rms_norm_quant_grad` on CPU) and written with AVX-512 intrinsics
  without a CPU check: on an AVX2-only CPU it dies with SIGILL.
Those variants therefore check first and report NotAvailable instead of calling the kernel.

fp32_island and per_op_rounding are written from the ops Paddle does have on CPU in fp32 (pow, mean,
add, sqrt, divide, multiply) plus casts; rounding to the working dtype is an explicit cast.
"""

from __future__ import annotations

import paddle

from harness.ops.family import Implementations, NotAvailable, variant
from harness.ops.rmsnorm import RmsNormFamily

FP32 = paddle.float32


def _gamma32(weight, options):
    w = weight.cast(FP32)
    return w + 1.0 if options["zero_centered_gamma"] else w


def _rsqrt(v):
    """1 / sqrt(v) for fp32 v, each step correctly rounded: torch's CPU rsqrt is exactly that
    (measured: bitwise equal to numpy's float32 1/sqrt). Paddle 3.3.1's CPU fp32 sqrt and rsqrt are not
    correctly rounded (fast vector approximations: 38% of 1M random values differ from numpy's sqrt), so
    the square root runs in fp64 and rounds to fp32 (exact: fp64 has > 2*24+2 bits); fp32 division is
    correctly rounded in Paddle."""
    return 1.0 / paddle.sqrt(v.cast(paddle.float64)).cast(v.dtype)


def _inverse_rms(x32, eps):
    """rsqrt(pow(x, 2).mean(-1) + eps) in fp32, torch's order."""
    return _rsqrt(paddle.pow(x32, 2).mean(axis=-1, keepdim=True) + eps)


def fp32_island(x, weight, options):
    """torch's CPU rms_norm op for op in fp32 from the working-dtype inputs: pow(x, 2).mean(-1) + eps,
    1/sqrt, x * r, * weight (fp32, + 1 when zero-centred), ONE rounding at the end. Backward: Paddle's
    autograd through the same fp32 ops, each gradient rounded once by the cast's backward."""
    x32 = x.cast(FP32)
    return (x32 * _inverse_rms(x32, options["eps"]) * _gamma32(weight, options)).cast(x.dtype)


def per_op_rounding(x, weight, options):
    """A naive RMSNorm in the working dtype, as eager torch runs `x * torch.rsqrt(x.pow(2).mean(-1,
    keepdim=True) + eps) * w` on bf16 tensors: every op's result is rounded to the working dtype
    (the mean accumulates in fp32 and rounds once, as torch's bf16 mean does). Autograd goes through
    the casts, so each backward op rounds too."""
    dtype = x.dtype

    def op(fn, *tensors):
        return fn(*(t.cast(FP32) for t in tensors)).cast(dtype)

    squared = op(lambda t: paddle.pow(t, 2), x)
    mean = op(lambda t: t.mean(axis=-1, keepdim=True), squared)
    inverse = op(lambda t: _rsqrt(t + options["eps"]), mean)
    normed = op(paddle.multiply, x, inverse)
    gamma = op(lambda w: w + 1.0, weight) if options["zero_centered_gamma"] else weight
    return op(paddle.multiply, normed, gamma)


def _kernel_unavailable(kernel: str, x) -> str | None:
    """Why a phi kernel (forward and grad) cannot run here for x's dtype, or None."""
    place = x.place
    device = "cpu" if place.is_cpu_place() else "gpu"
    kernels = paddle.base.core._get_all_register_op_kernels("phi")  # type: ignore[attr-defined]
    dtype = {paddle.float32: "float", paddle.bfloat16: "bfloat16", paddle.float16: "float16"}.get(x.dtype, str(x.dtype))

    def registered(name):
        return [k for k in kernels.get(name, []) if f"place[Place({device}" in k]

    forward, backward = registered(kernel), registered(f"{kernel}_grad")
    if not forward:
        return f"Paddle {paddle.__version__} has no {device} kernel `{kernel}`"
    if not any(f"data_type[{dtype}]" in k for k in forward):
        types = ", ".join(k.split("data_type[")[1].split("]")[0] for k in forward)
        return f"Paddle {paddle.__version__}'s {device} kernel `{kernel}` takes {types}, not {dtype}"
    if not backward:
        return f"Paddle {paddle.__version__} has a {device} forward kernel `{kernel}` but no `{kernel}_grad`"
    return None


def rms_norm_kernel(x, weight, options):
    """paddle.nn.functional.rms_norm (phi kernel `rms_norm`; GPU only in 3.3.1)."""
    if options["zero_centered_gamma"]:
        raise NotAvailable("paddle.nn.functional.rms_norm has no zero-centred gamma")
    reason = _kernel_unavailable("rms_norm", x)
    if reason:
        raise NotAvailable(f"paddle.nn.functional.rms_norm: {reason}")
    out, _ = paddle.nn.functional.rms_norm(x, [x.shape[-1]], weight, options["eps"])
    return out


def fused_rms_norm(x, weight, options):
    """paddle.incubate.nn.functional.fused_rms_norm (phi kernel `fused_rms_norm_quant`)."""
    if options["zero_centered_gamma"]:
        raise NotAvailable("paddle.incubate.nn.functional.fused_rms_norm has no zero-centred gamma")
    reason = _kernel_unavailable("fused_rms_norm_quant", x)
    if x.place.is_cpu_place() and not paddle.base.core.supports_avx512f():
        sigill = ("its CPU kernel RmsNormAvxKernel uses AVX-512 instructions and this CPU has none "
                  "(calling it kills the process with SIGILL)")
        reason = f"{reason}; {sigill}" if reason else sigill
    if reason:
        raise NotAvailable(f"paddle.incubate.nn.functional.fused_rms_norm: {reason}")
    from paddle.incubate.nn.functional import fused_rms_norm as fused

    return fused(x, weight, None, options["eps"], x.ndim - 1)[0]


FP32_PROVENANCE = "xfalign Paddle variant: torch's CPU rms_norm order in fp32, one rounding (harness/ops/rmsnorm/paddle.py)"
PER_OP_PROVENANCE = "xfalign Paddle variant: rounds after each op (harness/ops/rmsnorm/paddle.py)"
KERNEL_PROVENANCE = "Paddle: paddle.nn.functional.rms_norm (phi kernel rms_norm)"
FUSED_PROVENANCE = "Paddle: paddle.incubate.nn.functional.fused_rms_norm (phi kernel fused_rms_norm_quant)"


class RmsNormPaddle(Implementations, family=RmsNormFamily, framework="paddle"):
    fp32_island = variant(FP32_PROVENANCE)(fp32_island)
    per_op_rounding = variant(PER_OP_PROVENANCE)(per_op_rounding)
    rms_norm_kernel = variant(KERNEL_PROVENANCE, source=lambda options: paddle.nn.functional.rms_norm)(rms_norm_kernel)
    fused_rms_norm = variant(FUSED_PROVENANCE, source=lambda options: paddle.incubate.nn.functional.fused_rms_norm)(fused_rms_norm)
