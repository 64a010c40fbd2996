"""Tensor-parallel linear: out = x @ W^T + b, column- or row-parallel, at TP 1, 2 or 4.

Signature of every implementation, built-in or user:

    fn(x, weight, bias, options) -> out

x is [M, in] or [S, B, in]; weight is [out, in] on the Megatron side and [in, out] on the Paddle side
(the layout adapter hands both the same bits; grad.weight is compared in torch's [out, in] layout);
bias is [out] or None. options: bias, gradient_accumulation_fusion, parallel, tensor_parallel,
sequence_parallel.

At tensor_parallel N > 1 the Megatron side runs on N ranks, each handed its pieces (`shardings`):
- column: weight and bias split on the output features, out likewise (gather_output=False); x whole on every
  rank (its gradient all-reduced: a replica), or split on the sequence with sequence_parallel;
- row: x split on the input features (input_is_parallel=True), weight likewise; bias whole; out all-reduced (a
  replica), or reduce-scattered on the sequence with sequence_parallel.
The Paddle side runs in one process: its `tp_sharded` variant does each rank's GEMM and sums the partial
products in rank order, in the working dtype, as the all-reduce does.

Float64 reference (`linear_reference`): the Megatron variant's own ColumnParallelLinear on float64 tensors.
"""

from __future__ import annotations

from typing import Literal

from harness.case import Case
from harness.ops.family import OpFamily
from harness.schema import FieldProblem, Strict
from harness.sharding import Sharding


class LinearOptions(Strict):
    bias: bool = True
    gradient_accumulation_fusion: bool = False  # needs apex: reported as not available without it
    parallel: Literal["column", "row"] = "column"  # Megatron's ColumnParallelLinear or RowParallelLinear
    tensor_parallel: Literal[1, 2, 4] = 1
    sequence_parallel: bool = False  # Megatron's sequence_parallel (needs tensor_parallel > 1 and [S, B, in] x)


class LinearFamily(OpFamily):
    name = "linear"
    options_model = LinearOptions
    variants = {"megatron": ("megatron",), "paddle": ("matmul_add", "functional_linear", "fused_linear", "tp_sharded")}
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
        options = self.options(case)
        tp = options.tensor_parallel
        split, features = ("out", out_features) if options.parallel == "column" else ("in", x.shape[-1])
        if features % tp:
            raise FieldProblem(("options", "tensor_parallel"), f"a {options.parallel}-parallel linear splits the "
                               f"{split} features ({features}) across {tp} ranks: not divisible")
        if options.sequence_parallel:
            if tp == 1:
                raise FieldProblem(("options", "sequence_parallel"), "sequence_parallel needs tensor_parallel > 1")
            if len(x.shape) != 3 or x.shape[0] % tp:
                raise FieldProblem(("options", "sequence_parallel"), f"sequence_parallel splits x [S, B, in] on S "
                                   f"across {tp} ranks: x is {x.shape}")

    def ranks(self, case: Case, framework: str) -> int:
        return self.options(case).tensor_parallel if framework == "megatron" else 1

    def shardings(self, case: Case, framework: str) -> dict[str, Sharding]:
        options = self.options(case)
        if self.ranks(case, framework) == 1:
            return {}
        sequence = Sharding(axis=0) if options.sequence_parallel else Sharding()
        if options.parallel == "column":
            return {"x": sequence, "weight": Sharding(axis=0), "bias": Sharding(axis=0), "out": Sharding(axis=-1)}
        return {"x": Sharding(axis=-1), "weight": Sharding(axis=1), "bias": Sharding(), "out": sequence}

