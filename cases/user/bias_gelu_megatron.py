"""Megatron side of the bias GeLU family (cases/user/bias_gelu.py): megatron-core's own fused function, and
the family's float64 reference: the same function on float64 tensors. bias_gelu and bias_gelu_back compute in
their inputs' dtype (Python-float constants, no cast), so in float64 nothing rounds below float64; the backward
is GeLUFunction's hand-written one (its [tokens, hidden] bias gradient summed over tokens by autograd)."""

from megatron.core.fusions.fused_bias_gelu import bias_gelu_impl

from harness.ops import load_object
from harness.ops.family import Implementations, reference, variant

BiasGeluFamily = load_object("bias_gelu.py:BiasGeluFamily", __file__)  # the family file beside this one, loaded once


class BiasGeluMegatron(Implementations, family=BiasGeluFamily, framework="megatron"):
    @variant(provenance="megatron-core: megatron.core.fusions.fused_bias_gelu.bias_gelu_impl (GeLUFunction: "
                        "jit_fuser'd bias_gelu forward, hand-written bias_gelu_back)")
    def megatron(x, bias, options):
        return bias_gelu_impl(x, bias)


@reference(provenance="float64 reference: megatron-core's megatron.core.fusions.fused_bias_gelu.bias_gelu_impl, "
                      "run eagerly on float64 tensors (hand-written bias_gelu_back)")
def bias_gelu_reference(x, bias, options):
    return BiasGeluMegatron.megatron(x, bias, options)
