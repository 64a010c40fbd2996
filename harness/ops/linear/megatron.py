"""Megatron side of the linear family: the real megatron.core.tensor_parallel.ColumnParallelLinear or
RowParallelLinear. At TP=1 built inside a one-process torch.distributed group (gloo on CPU, nccl on GPU;
in-process HashStore rendezvous); at TP=N on each of the N rank workers, with that rank's pieces."""

from __future__ import annotations

import torch
from megatron.core import tensor_parallel
from megatron.core.model_parallel_config import ModelParallelConfig

from harness.frameworks.megatron_group import model_parallel_group
from harness.ops.family import Implementations, NotAvailable, reference, variant
from harness.ops.linear import LinearFamily


class LinearMegatron(Implementations, family=LinearFamily, framework="megatron"):
    @variant(provenance=lambda options: (
        f"megatron-core: megatron.core.tensor_parallel.{options['parallel'].capitalize()}ParallelLinear "
        f"(TP={options['tensor_parallel']}, sequence_parallel {options['sequence_parallel']}, "
        f"gradient_accumulation_fusion {options['gradient_accumulation_fusion']})"))
    @staticmethod
    def megatron(x, weight, bias, options):
        tp = options["tensor_parallel"]
        config = ModelParallelConfig(use_cpu_initialization=True, params_dtype=weight.dtype,
                                     tensor_model_parallel_size=tp, sequence_parallel=options["sequence_parallel"],
                                     gradient_accumulation_fusion=options["gradient_accumulation_fusion"])
        device = x.device.type
        if options["sequence_parallel"] and device != "cuda":
            raise NotAvailable("sequence_parallel: megatron-core allocates its all-gather and reduce-scatter buffers on "
                               "CUDA (megatron/core/utils.py get_tensor, tensor_parallel/mappings.py "
                               "_reduce_scatter_along_first_dim): it needs GPUs")
        column = options["parallel"] == "column"
        with model_parallel_group(device, tp):
            if device == "cuda":
                tensor_parallel.random.model_parallel_cuda_manual_seed(0)
            try:
                if column:
                    layer = tensor_parallel.ColumnParallelLinear(
                        weight.shape[1], weight.shape[0] * tp, config=config, init_method=torch.nn.init.zeros_,
                        bias=bias is not None, gather_output=False, skip_weight_param_allocation=True)
                else:
                    layer = tensor_parallel.RowParallelLinear(
                        weight.shape[1] * tp, weight.shape[0], config=config, init_method=torch.nn.init.zeros_,
                        bias=bias is not None, input_is_parallel=True, skip_bias_add=False)
                    del layer.weight  # the harness's tensor (this rank's piece), so its gradient lands where captured
                    layer.weight = weight
            except RuntimeError as error:
                if "gradient_accumulation_fusion" in str(error):
                    raise NotAvailable(f"gradient_accumulation_fusion needs apex's fused_weight_gradient_mlp_cuda: {error}") from None
                raise
            if bias is not None:
                del layer.bias  # use the harness's tensor, so its gradient lands where it is captured
                layer.bias = bias
            layer.to(device)
            # Megatron's input is [s, b, h]; a 2-D x is [M, 1, h] (same GEMM, rows flattened)
            inputs = x if x.dim() == 3 else x.unsqueeze(1)
            out, _ = layer(inputs, weight=weight) if column else layer(inputs)
        return out if x.dim() == 3 else out.squeeze(1)


REFERENCE_PROVENANCE = (
    "float64 reference: megatron-core: megatron.core.tensor_parallel.ColumnParallelLinear (or RowParallelLinear, as "
    "the case's parallel; TP=1 whatever the case's tensor_parallel: the exact result is one) built with "
    "params_dtype=float64 on float64 tensors, run eagerly: forward torch.matmul(x, W.t()) then + b, backward "
    "megatron.core.tensor_parallel.layers.LinearWithGradAccumulationAndAsyncCommunication's own (dgrad g @ W, "
    "wgrad g^T @ x, bias grad g.sum(0)); with gradient_accumulation_fusion the layer is built without it (apex's "
    "wgrad_gemm_accum adds the same product g^T @ x into a zero main_grad, and takes no float64)")


@reference(provenance=REFERENCE_PROVENANCE)
def linear_reference(x, weight, bias, options):
    """The Megatron side's own code path, on float64 tensors (params_dtype follows the weight's dtype)."""
    return LinearMegatron.megatron(x, weight, bias, {**options, "gradient_accumulation_fusion": False,
                                                     "tensor_parallel": 1, "sequence_parallel": False})
