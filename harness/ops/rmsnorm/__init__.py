"""RMSNorm family: out = x / sqrt(mean(x^2, -1) + eps) * weight (weight + 1 when zero-centred).

Signature of every implementation, built-in or user (`module:function`, `file.py:function`):

    fn(x, weight, options) -> out

x is [tokens, hidden] or [s, b, hidden]; weight is [hidden], in x's dtype (Megatron casts its params to
the training dtype); options is a dict with `eps` and `zero_centered_gamma`. The harness runs backward
with `grad_out` and captures out, grad.x, grad.weight.

Megatron variants: `megatron` is megatron-core's own CPU norm (WrappedTorchNorm -> torch.nn.RMSNorm);
`te_reference` is a torch reference of Transformer Engine's RMSNorm (TENorm, the GPU default), the only
one of the two with zero-centred gamma. Paddle variants: `fp32_island`, `per_op_rounding`, and Paddle's
kernels `rms_norm_kernel` (paddle.nn.functional.rms_norm) and `fused_rms_norm` (incubate), which report
NotAvailable where they cannot run (both on CPU: see harness/ops/rmsnorm/paddle.py).

Float64 reference (`rmsnorm_reference`, whichever Megatron variant a case uses): the `megatron` variant's own code
on float64 tensors; with zero-centred gamma, which that norm refuses, the TE formula with float64 compute.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from harness.case import Case
from harness.ops.family import OpFamily
from harness.schema import FieldProblem, Strict


class RmsNormOptions(Strict):
    eps: float = Field(1e-5, ge=0.0)  # Megatron's layernorm_epsilon (--norm-epsilon), default 1e-5
    zero_centered_gamma: bool = False  # Megatron's layernorm_zero_centered_gamma (--apply-layernorm-1p)


class RmsNormFamily(OpFamily):
    name = "rmsnorm"
    options_model = RmsNormOptions
    variants: ClassVar[dict[str, tuple[str, ...]]] = {"megatron": ("megatron", "te_reference"),
                                                      "paddle": ("fp32_island", "per_op_rounding", "rms_norm_kernel", "fused_rms_norm")}
    implementations: ClassVar[dict[str, str]] = {"megatron": "harness.ops.rmsnorm.megatron:RmsNormMegatron",
                                                  "paddle": "harness.ops.rmsnorm.paddle:RmsNormPaddle"}
    reference: ClassVar[dict[str, str]] = {"megatron": "harness.ops.rmsnorm.megatron:rmsnorm_reference"}
    signature = ("x", "weight")
    working_inputs = ("x", "weight", "grad_out")

    def tensor_axes(self, case: Case) -> dict[str, list[str]]:
        rows = "token" if len(case.inputs["x"].shape) == 2 else "batch"
        return {"out": [rows, "hidden"], "grad.x": [rows, "hidden"]}

    def validate_inputs(self, case: Case) -> None:
        x = case.inputs["x"]
        if len(x.shape) not in (2, 3):
            raise FieldProblem(("inputs", "x", "shape"), "x is [tokens, hidden] or [s, b, hidden]")
        self.require(case, {"weight": [x.shape[-1]], "grad_out": x.shape}, dtype_of="x",
                     same_dtype=("weight", "grad_out"))
