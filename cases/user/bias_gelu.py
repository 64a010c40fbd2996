"""An op family added from a case's folder, without touching xfalign: megatron-core's fused bias GeLU
(megatron.core.fusions.fused_bias_gelu.bias_gelu_impl, the tanh approximation with a hand-written backward).

    op: user/bias_gelu.py:BiasGeluFamily

This file names the family's rules and imports no framework; the implementations live in
bias_gelu_megatron.py (torch + megatron-core) and bias_gelu_paddle.py, loaded only in their workers.
Signature of every implementation: fn(x, bias, options) -> out, x [tokens, hidden], bias [hidden].
The family's float64 reference (optional for a user family; without one the comparison says why, from
`no_reference`) has the same signature: bias_gelu_megatron.py's bias_gelu_reference.
"""

from harness.case import Case, Strict
from harness.ops.family import OpFamily


class BiasGeluOptions(Strict):
    pass


class BiasGeluFamily(OpFamily):
    name = "bias_gelu"
    options_model = BiasGeluOptions
    signature = ("x", "bias")
    working_inputs = ("x", "bias", "grad_out")
    variants = {"megatron": ("megatron",), "paddle": ("fp32_island", "megatron_backward")}
    implementations = {"megatron": "bias_gelu_megatron.py:BiasGeluMegatron",
                       "paddle": "bias_gelu_paddle.py:BiasGeluPaddle"}
    reference = {"megatron": "bias_gelu_megatron.py:bias_gelu_reference"}

    def validate_inputs(self, case: Case) -> None:
        x = case.inputs["x"]
        self.require(case, {"bias": x.shape[-1:], "grad_out": x.shape}, dtype_of="x", same_dtype=("bias", "grad_out"))
