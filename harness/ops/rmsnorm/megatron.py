"""Megatron side of the RMSNorm family.

What megatron-core 0.16.1 builds for an RMSNorm:
- without Transformer Engine (the local spec, any machine): `LocalSpecProvider().layer_norm(rms_norm=True)`
  is `megatron.core.transformer.torch_norm.WrappedTorchNorm`, which returns a plain `torch.nn.RMSNorm`
  (eager; Megatron does not wrap it in jit_fuser). It asserts `not config.layernorm_zero_centered_gamma`.
  `fusions/fused_layer_norm.FusedLayerNorm` (apex) is LayerNorm only.
- with Transformer Engine (the default GPU spec): `extensions.transformer_engine.TENorm` ->
  `te.pytorch.RMSNorm(zero_centered_gamma=config.layernorm_zero_centered_gamma)`, a CUDA kernel.

On CPU, torch 2.13's `torch.rms_norm` (aten/src/ATen/native/layer_norm.cpp, `rms_norm_symint` ->
`_fused_rms_norm`, whose CPU path is the composite) upcasts x to fp32, computes
`rsqrt(pow(x, 2).mean(-1, keepdim=True) + eps)`, `x * rsqrt`, `* weight` (the bf16 weight promoted to
fp32), and rounds ONCE (`type_as(x)`). Its backward is autograd through those fp32 ops (MulBackward,
RsqrtBackward `-0.5 * grad * r**3`, MeanBackward `/ N`, PowBackward `grad * 2x`); grad.weight is an fp32
sum over the rows, rounded once.
"""

from __future__ import annotations

import torch

from harness.ops.family import Implementations, NotAvailable, reference, variant
from harness.ops.rmsnorm import RmsNormFamily


def _config(hidden: int, dtype: torch.dtype, options: dict):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=1, hidden_size=hidden, num_attention_heads=1, normalization="RMSNorm",
        layernorm_epsilon=options["eps"], layernorm_zero_centered_gamma=options["zero_centered_gamma"],
        params_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16)


def megatron_norm_class():
    """The norm class megatron-core's local (no Transformer Engine) spec builds for RMSNorm."""
    from megatron.core.models.backends import LocalSpecProvider

    return LocalSpecProvider().layer_norm(rms_norm=True)


def megatron(x, weight, options):
    """megatron-core's RMSNorm as a TransformerLayer builds it without Transformer Engine:
    build_module(WrappedTorchNorm, config, hidden_size, eps=config.layernorm_epsilon), cast to the
    params dtype as Float16Module does (module.bfloat16()), the case's weight loaded into it."""
    from megatron.core.transformer.spec_utils import build_module

    config = _config(x.shape[-1], weight.dtype, options)
    try:
        norm = build_module(megatron_norm_class(), config=config, hidden_size=config.hidden_size,
                            eps=config.layernorm_epsilon)
    except AssertionError as error:  # WrappedTorchNorm: zero_centered_gamma not supported
        raise NotAvailable(
            f"megatron-core's CPU RMSNorm (WrappedTorchNorm -> torch.nn.RMSNorm) refuses this config: {error}; "
            "Megatron's zero-centered RMSNorm is TENorm (Transformer Engine): use impl te_reference") from None
    norm = norm.to(device=x.device, dtype=weight.dtype)
    # the harness's weight tensor in place of the module's parameter, so its gradient is the captured one
    return torch.func.functional_call(norm, {"weight": weight}, (x,))


class TERMSNormReference(torch.autograd.Function):
    """Transformer Engine's RMSNorm kernels (transformer_engine/common/normalization/rmsnorm/
    rmsnorm_fwd_kernels.cuh, rmsnorm_bwd_kernels.cuh), op for op in fp32 (compute_t = float):
    forward  rs = rsqrt(sum(x*x) * (1/N) + eps); y = rs * x; g = gamma (+ 1 if zero_centered_gamma);
             z = g * y, rounded once to the output dtype.
    backward y = rs * x; dy = g * dz; mdyy = sum(dy * y) * (1/N); dx = rs * (dy - mdyy * y) rounded once;
             dgamma = sum over rows of dz * y (fp32), rounded once to gamma's dtype.
    The sums run in torch's reduction order here, not the kernel's warp/CTA order."""

    @staticmethod
    def forward(ctx, x, weight, eps, zero_centered_gamma, compute=torch.float32):
        x32 = x.to(compute)
        rn = 1.0 / x.shape[-1]
        rs = torch.rsqrt((x32 * x32).sum(-1, keepdim=True) * rn + eps)
        gamma = weight.to(compute) + 1.0 if zero_centered_gamma else weight.to(compute)
        ctx.save_for_backward(x, weight, rs)
        ctx.zero_centered_gamma, ctx.compute = zero_centered_gamma, compute
        return (gamma * (rs * x32)).to(x.dtype)

    @staticmethod
    def backward(ctx, dz):
        x, weight, rs = ctx.saved_tensors
        x32, dz32 = x.to(ctx.compute), dz.to(ctx.compute)
        rn = 1.0 / x.shape[-1]
        gamma = weight.to(ctx.compute) + 1.0 if ctx.zero_centered_gamma else weight.to(ctx.compute)
        y = rs * x32
        dy = gamma * dz32
        mdyy = (dy * y).sum(-1, keepdim=True) * rn
        dx = rs * (dy - mdyy * y)
        dgamma = (dz32 * y).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dgamma.to(weight.dtype), None, None, None


def te_reference(x, weight, options, compute=torch.float32):
    """`compute`: the kernels' compute_t (fp32); the float64 reference passes float64."""
    return TERMSNormReference.apply(x, weight, options["eps"], options["zero_centered_gamma"], compute)


MEGATRON_PROVENANCE = ("megatron-core: megatron.core.transformer.torch_norm.WrappedTorchNorm (what "
                       "megatron.core.models.backends.LocalSpecProvider builds for RMSNorm without Transformer "
                       "Engine) -> torch.nn.RMSNorm, eager")
TE_PROVENANCE = ("xfalign torch reference (harness/ops/rmsnorm/megatron.py) of Transformer Engine's RMSNorm "
                 "kernels, which megatron-core's TENorm (megatron.core.extensions.transformer_engine.TENorm) "
                 "builds; fp32 formula of rmsnorm_fwd_kernels.cuh/rmsnorm_bwd_kernels.cuh, torch's reduction "
                 "order; Transformer Engine is not installed here")


class RmsNormMegatron(Implementations, family=RmsNormFamily, framework="megatron"):
    megatron = variant(MEGATRON_PROVENANCE, source=lambda options: megatron_norm_class())(megatron)
    te_reference = variant(TE_PROVENANCE)(te_reference)


def _reference_provenance(options: dict) -> str:
    if options["zero_centered_gamma"]:
        return ("float64 reference: xfalign's own float64 formula of Transformer Engine's RMSNorm (what megatron-core's "
                "TENorm builds; the CPU norm megatron.core.transformer.torch_norm.WrappedTorchNorm refuses zero-centred "
                "gamma): TERMSNormReference (harness/ops/rmsnorm/megatron.py) with compute_t = float64 instead of fp32, "
                "gamma = weight + 1, and TE's hand-written backward dx = rs * (dy - mean(dy * y) * y), dgamma = "
                "sum(dz * y)")
    return ("float64 reference: megatron-core: megatron.core.transformer.torch_norm.WrappedTorchNorm (built by "
            "megatron.core.models.backends.LocalSpecProvider, params_dtype=float64) -> torch.nn.RMSNorm on float64 "
            "tensors, eager, autograd backward; torch's rms_norm computes float64 input in float64 (it widens only "
            "to its opmath type, double for double)")


@reference(provenance=_reference_provenance, source=lambda options: TERMSNormReference if options["zero_centered_gamma"]
           else megatron_norm_class())
def rmsnorm_reference(x, weight, options):
    """Megatron's own CPU norm on float64 tensors; with zero-centred gamma (which only TENorm has) the TE formula
    with float64 compute. The two agree in exact arithmetic (TE's backward is the analytic one)."""
    if options["zero_centered_gamma"]:
        return te_reference(x, weight, options, compute=torch.float64)
    return megatron(x, weight, options)
