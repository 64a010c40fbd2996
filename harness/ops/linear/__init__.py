"""Column-parallel linear at TP=1: out = x @ W^T + b.

Signature of every implementation, built-in or user:

    fn(x, weight, bias, options) -> out

x is [M, in] or [S, B, in]; weight is [out, in] on the Megatron side and [in, out] on the Paddle side
(the layout adapter hands both the same bits; grad.weight is compared in torch's [out, in] layout);
bias is [out] or None. options: bias, gradient_accumulation_fusion.

Float64 reference (`linear_reference`): the Megatron variant's own ColumnParallelLinear on float64 tensors.
"""

from __future__ import annotations

from harness.case import Case
from harness.ops.family import OpFamily
from harness.schema import FieldProblem, Strict


class LinearOptions(Strict):
    bias: bool = True
    gradient_accumulation_fusion: bool = False  # needs apex: reported as not available without it


class LinearFamily(OpFamily):
    name = "linear"
    options_model = LinearOptions
    variants = {"megatron": ("megatron",), "paddle": ("matmul_add", "functional_linear", "fused_linear")}
    implementations = {"megatron": "harness.ops.linear.megatron:LinearMegatron",
                       "paddle": "harness.ops.linear.paddle:LinearPaddle"}
    reference = {"megatron": "harness.ops.linear.megatron:linear_reference"}
    signature = ("x", "weight", "bias")
    working_inputs = ("x", "weight", "bias", "grad_out")
    layouts = {"paddle": {"weight": (1, 0)}}  # Paddle's [in, out]

    def tensor_axes(self, case: Case) -> dict[str, list[str]]:
        return {"out": ["row", "out feature"], "grad.x": ["row", "in feature"], "grad.weight": ["out feature", "in feature"]}

    def tensor_notes(self, case: Case) -> dict[str, str]:
        return {"grad.weight": "compared in torch's [out, in] layout: the Paddle side's [in, out] gradient is transposed back"}

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
        self.require(case, expected, dtype_of="x", same_dtype=("weight", "bias", "grad_out"))

