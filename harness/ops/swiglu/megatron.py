"""Megatron side of the SwiGLU family: real megatron-core, plus our reference of the clamped SwiGLU
that no megatron-core release has (Megatron-LM dev branch, formula in the project's numerics notes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.fusions.fused_bias_geglu import weighted_bias_quick_geglu_impl
from megatron.core.fusions.fused_bias_swiglu import (
    bias_swiglu_impl,
    weighted_bias_swiglu_impl,
)
from megatron.core.jit import (
    jit_fuser,  # torch.compile, as Megatron binds it (eager under TORCHDYNAMO_DISABLE)
)

from harness.ops.family import Implementations, reference, variant
from harness.ops.swiglu import SwigluFamily


def _wide(t: torch.Tensor) -> torch.Tensor:
    """fp32 as the dev branch computes, except a float64 tensor (the float64 reference) stays float64."""
    return t if t.dtype == torch.float64 else t.float()


@jit_fuser
def clamped_swiglu(y: torch.Tensor, limit: float) -> torch.Tensor:
    y1, y2 = torch.chunk(_wide(y), 2, -1)
    return (F.silu(y1.clamp(max=limit)) * y2.clamp(-limit, limit)).to(y.dtype)


@jit_fuser
def weighted_clamped_swiglu(y: torch.Tensor, weights: torch.Tensor, limit: float) -> torch.Tensor:
    return (clamped_swiglu(y, limit) * weights).to(y.dtype)


@jit_fuser
def clamped_swiglu_back(g: torch.Tensor, y: torch.Tensor, limit: float) -> torch.Tensor:
    y1, y2 = torch.chunk(_wide(y), 2, -1)
    g = _wide(g)
    y1c, y2c = y1.clamp(max=limit), y2.clamp(-limit, limit)
    sig = torch.sigmoid(y1c)
    gate_grad = g * sig * (1 + y1c * (1 - sig)) * y2c * (y1 <= limit).to(g.dtype)
    linear_grad = g * F.silu(y1c) * ((y2 >= -limit) & (y2 <= limit)).to(g.dtype)
    return torch.cat((gate_grad, linear_grad), -1).to(y.dtype)


@jit_fuser
def weighted_clamped_swiglu_back(g: torch.Tensor, y: torch.Tensor, weights: torch.Tensor, limit: float):
    input_grad = clamped_swiglu_back(g * weights, y, limit)
    weights_grad = torch.sum(clamped_swiglu(y, limit) * g.to(weights.dtype), dim=-1, keepdim=True)
    return input_grad, weights_grad.to(weights.dtype)


class ClampedSwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, weights, limit):
        ctx.save_for_backward(y, weights)
        ctx.limit = limit
        if weights is None:
            return clamped_swiglu(y, limit)
        return weighted_clamped_swiglu(y, weights, limit)

    @staticmethod
    def backward(ctx, grad_output):
        y, weights = ctx.saved_tensors
        if weights is None:
            return clamped_swiglu_back(grad_output, y, ctx.limit), None, None
        input_grad, weights_grad = weighted_clamped_swiglu_back(grad_output, y, weights, ctx.limit)
        return input_grad, weights_grad, None


def clamped_swiglu_impl(x: torch.Tensor, weights: torch.Tensor | None, limit: float) -> torch.Tensor:
    shape = x.shape
    out = ClampedSwiGLUFunction.apply(x.view(-1, shape[-1]), weights, limit)
    return out.view(*shape[:-1], -1)


def _provenance(options: dict) -> str:
    if options["activation"] == "quick_geglu":
        return "megatron-core: megatron.core.fusions.fused_bias_geglu.weighted_bias_quick_geglu_impl"
    if options["clamp"] is not None:
        return ("xfalign torch reference (harness/ops/swiglu/megatron.py) of the clamped SwiGLU of the "
                "Megatron-LM dev branch, compiled with megatron.core.jit.jit_fuser; not in any megatron-core release")
    if options["weighted"]:
        return "megatron-core: megatron.core.fusions.fused_bias_swiglu.weighted_bias_swiglu_impl"
    return "megatron-core: megatron.core.fusions.fused_bias_swiglu.bias_swiglu_impl"


class SwigluMegatron(Implementations, family=SwigluFamily, framework="megatron"):
    @variant(provenance=_provenance)
    @staticmethod
    def megatron(x, bias, probs, options):
        if options["activation"] == "quick_geglu":
            return weighted_bias_quick_geglu_impl(x, bias, probs, False, options["linear_offset"], options["clamp"])
        if options["clamp"] is not None:
            return clamped_swiglu_impl(x, probs, options["clamp"])
        if probs is not None:
            return weighted_bias_swiglu_impl(x, None, probs)
        return bias_swiglu_impl(x, bias)


@reference(provenance=lambda options: f"float64 reference: {_provenance(options)}, run eagerly on float64 tensors")
def swiglu_reference(x, bias, probs, options):
    return SwigluMegatron.megatron(x, bias, probs, options)
