"""Column-parallel linear at TP=1: out = x @ W^T + b.

Signature of every implementation, built-in or user:

    fn(x, weight, bias, options) -> out

x is [M, in] or [S, B, in]; weight is [out, in] on the Megatron side and [in, out] on the Paddle side
(the layout adapter hands both the same bits; grad.weight is compared in torch's [out, in] layout);
bias is [out] or None. options: bias, gradient_accumulation_fusion.
"""

from __future__ import annotations

from pydantic import ValidationError

from harness.case import Case, FieldProblem, Strict
from harness.ops.family import OpFamily


class LinearOptions(Strict):
    bias: bool = True
    gradient_accumulation_fusion: bool = False  # needs apex: reported as not available without it


class LinearFamily(OpFamily):
    name = "linear"
    paddle_variants = ("matmul_add", "functional_linear", "fused_linear")
    megatron_variants = ("megatron",)
    upstream = {"out": "grad_out"}
    signature = ("x", "weight", "bias")
    working_inputs = ("x", "weight", "bias", "grad_out")
    transposed = {"paddle": ("weight",)}

    def options(self, case: Case) -> LinearOptions:
        try:
            return LinearOptions(**case.options)
        except ValidationError as error:
            first = error.errors()[0]
            raise FieldProblem(("options",) + tuple(first["loc"]), first["msg"]) from None

    def forward_inputs(self, case: Case) -> list[str]:
        return ["x", "weight"] + (["bias"] if self.options(case).bias else [])

    def validate_inputs(self, case: Case) -> None:
        x, weight = case.inputs["x"], case.inputs["weight"]
        if len(x.shape) not in (2, 3):
            raise FieldProblem(("inputs", "x", "shape"), "x is [M, in] or [S, B, in]")
        if len(weight.shape) != 2 or weight.shape[1] != x.shape[-1]:
            raise FieldProblem(("inputs", "weight", "shape"),
                               f"weight is [out, in] (torch layout) with in = {x.shape[-1]} (x's last dim), got {weight.shape}")
        out_features = weight.shape[0]
        expected = {"bias": [out_features], "grad_out": x.shape[:-1] + [out_features]}
        for name, shape in expected.items():
            spec = case.inputs.get(name)
            if spec is not None and spec.shape != shape:
                raise FieldProblem(("inputs", name, "shape"), f"{name} must be {shape}, got {spec.shape}")
        for name in ("weight", "bias", "grad_out"):
            spec = case.inputs.get(name)
            if spec is not None and spec.dtype != x.dtype:
                raise FieldProblem(("inputs", name, "dtype"), f"{name} must have x's dtype {x.dtype}")


FAMILY = LinearFamily()
