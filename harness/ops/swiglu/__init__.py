"""SwiGLU family: plain, bias, weighted (per-token scale), clamped, and clamped quick-GEGLU.

Signature of every implementation, built-in or user (`module:function`, `file.py:function`):

    fn(x, bias, probs, options) -> out

x is [N, 2H] or [S, B, 2H]; bias is [2H] or None; probs is [N, 1] (N = tokens) or None; options is a
dict with `activation` ("swiglu" | "quick_geglu"), `clamp` (float or None) and `linear_offset`.
The harness runs backward with `grad_out` and captures out, grad.x, grad.bias, grad.probs.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import model_validator

from harness.case import Case
from harness.ops.family import OpFamily
from harness.schema import FieldProblem, Strict


class SwigluOptions(Strict):
    activation: Literal["swiglu", "quick_geglu"] = "swiglu"
    bias: bool = False
    weighted: bool = False
    clamp: float | None = None  # L > 0 clamps (gate max=L, linear to [-L, L]); null is off
    linear_offset: float = 0.0  # quick-GEGLU only: quick_gelu(y1) * (y2 + offset)

    @model_validator(mode="after")
    def _combination(self) -> SwigluOptions:
        if self.clamp is not None and self.clamp <= 0:
            raise FieldProblem(("options", "clamp"), "clamp must be > 0 or null (off)")
        if self.activation == "swiglu":
            if self.bias and (self.weighted or self.clamp is not None):
                raise FieldProblem(("options", "bias"), "Megatron's weighted and clamped SwiGLU take no bias")
            if self.linear_offset:
                raise FieldProblem(("options", "linear_offset"), "linear_offset is for quick_geglu only")
        elif not self.weighted:
            raise FieldProblem(("options", "weighted"), "megatron-core's quick-GEGLU is the weighted one: set weighted: true")
        return self


class SwigluFamily(OpFamily):
    name = "swiglu"
    options_model = SwigluOptions
    variants = {"megatron": ("megatron",), "paddle": ("fp32_island", "per_op_rounding", "fleet_cpu_fallback")}
    implementations = {"megatron": "harness.ops.swiglu.megatron:SwigluMegatron",
                       "paddle": "harness.ops.swiglu.paddle:SwigluPaddle"}
    reference = {"megatron": "harness.ops.swiglu.megatron:swiglu_reference"}
    signature = ("x", "bias", "probs")
    working_inputs = ("x", "bias", "grad_out")

    def tensor_axes(self, case: Case) -> dict[str, list[str]]:
        return {"out": ["token", "hidden"], "grad.x": ["token", "gate | linear half"], "grad.probs": ["token", "-"]}

    def forward_inputs(self, case: Case) -> list[str]:
        options = self.options(case)
        return ["x"] + (["bias"] if options.bias else []) + (["probs"] if options.weighted else [])

    def validate_inputs(self, case: Case) -> None:
        x = case.inputs["x"]
        if len(x.shape) not in (2, 3) or x.shape[-1] % 2:
            raise FieldProblem(("inputs", "x", "shape"), "x must be 2-D or 3-D with an even last dimension")
        hidden, tokens = x.shape[-1] // 2, math.prod(x.shape[:-1])
        expected = {"bias": [2 * hidden], "probs": [tokens, 1], "grad_out": x.shape[:-1] + [hidden]}
        self.require(case, expected, dtype_of="x", same_dtype=("bias", "grad_out"))
        if self.options(case).activation != "swiglu":
            for side_name, side in case.sides.items():
                if side.impl == "fleet_cpu_fallback":
                    raise FieldProblem(("sides", side_name, "impl"), "fleet_cpu_fallback is a SwiGLU variant, not quick-GEGLU")

