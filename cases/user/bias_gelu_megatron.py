"""Megatron side of the bias GeLU family (cases/user/bias_gelu.py): megatron-core's own fused function."""

from megatron.core.fusions.fused_bias_gelu import bias_gelu_impl

from harness.ops import load_object
from harness.ops.family import Implementations, variant

BiasGeluFamily = load_object("bias_gelu.py:BiasGeluFamily", __file__)  # the family file beside this one, loaded once


class BiasGeluMegatron(Implementations, family=BiasGeluFamily, framework="megatron"):
    @variant(provenance="megatron-core: megatron.core.fusions.fused_bias_gelu.bias_gelu_impl (GeLUFunction: "
                        "jit_fuser'd bias_gelu forward, hand-written bias_gelu_back)")
    def megatron(x, bias, options):
        return bias_gelu_impl(x, bias)
