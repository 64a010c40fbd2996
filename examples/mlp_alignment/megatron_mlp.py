"""Megatron side of the demo: a real megatron-core MLP (megatron.core.transformer.mlp.MLP with a
TransformerConfig: gated_linear_unit, add_bias_linear, bias_activation_fusion, activation silu), i.e.
ColumnParallelLinear -> bias_swiglu_impl -> RowParallelLinear, at TP=1.

The MLP returns (output, output_bias): its linear_fc2 skips the bias add, which the transformer layer's
bias-dropout-add does later. `MLPBlock` is the model we capture: it runs the MLP and adds the bias (the
bias-dropout-add of a layer with dropout 0 and no residual), so its output is the MLP's result.

Megatron reads its process groups from parallel_state: build and run the model inside
`megatron_group(device)` (a one-process gloo group on CPU, nccl on CUDA).

`bias_swiglu_impl` is compiled by torch.compile (megatron.core.jit.jit_fuser) in production; `eager=True`
(megatron_step) runs it op by op instead (torch.compiler.set_stance("force_eager")), which changes its bf16 bits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig

from harness.frameworks.megatron_group import one_process_group

HIDDEN, FFN = 64, 128  # the demo's sizes (small: the fast tests run them)


@contextmanager
def megatron_group(device: str = "cpu") -> Iterator[None]:
    """Megatron's model-parallel state (TP=PP=1) in a one-process group; on CUDA also its RNG tracker."""
    with one_process_group(device):
        if device == "cuda":
            tensor_parallel.random.model_parallel_cuda_manual_seed(0)
        yield


def mlp_config(hidden: int = HIDDEN, ffn: int = FFN, dtype: torch.dtype = torch.bfloat16,
               bias: bool = True) -> TransformerConfig:
    return TransformerConfig(
        num_layers=1, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=4,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=bias, bias_activation_fusion=True,
        bf16=dtype == torch.bfloat16, params_dtype=dtype, use_cpu_initialization=True,
        hidden_dropout=0.0, attention_dropout=0.0, gradient_accumulation_fusion=False)


class MLPBlock(torch.nn.Module):
    """The megatron-core MLP and the add of its output bias: what a transformer layer feeds to the residual."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.mlp = MLP(config, MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
                       ffn_hidden_size=config.ffn_hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        output, bias = self.mlp(hidden_states)
        return output if bias is None else output + bias  # add_bias_linear=False: no bias


def stance(eager: bool):
    """Around forward AND backward (the compiled SwiGLU backward runs in backward): eager or compiled."""
    return torch.compiler.set_stance("force_eager") if eager else nullcontext()


def build_megatron_mlp(hidden: int = HIDDEN, ffn: int = FFN, dtype: torch.dtype = torch.bfloat16,
                       device: str = "cpu", seed: int = 0, bias: bool = True) -> MLPBlock:
    """The model, its parameters drawn from `seed` (normal, std 0.05 for weights and 0.5 for biases, so that
    the biases matter), on `device`; `bias=False`: no biases (LLaMA's MLP). Call inside `megatron_group(device)`."""
    model = MLPBlock(mlp_config(hidden, ffn, dtype, bias))
    load_parameters(model, demo_parameters(model, seed))
    return model.to(device)


def demo_parameters(model: torch.nn.Module, seed: int = 0) -> dict[str, np.ndarray]:
    """Parameter values (fp32 draws rounded to the parameter's dtype), by parameter name."""
    generator = torch.Generator().manual_seed(seed)
    values = {}
    for name, param in model.named_parameters():
        std = 0.5 if name.endswith("bias") else 0.05
        draw = torch.randn(param.shape, generator=generator) * std
        values[name] = _to_numpy(draw.to(param.dtype))
    return values


def load_parameters(model: torch.nn.Module, values: dict[str, np.ndarray]) -> None:
    """Copy `values` (parameter name -> array with the parameter's exact bits) into the model."""
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(values))
    if missing:
        raise KeyError(f"no value for parameter(s) {', '.join(missing)}")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(_to_torch(values[name]).to(param.device))


def parameters_numpy(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {name: _to_numpy(param) for name, param in model.named_parameters()}


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    from harness.frameworks import adapter_for

    return adapter_for("megatron").to_numpy(tensor)


def _to_torch(array: np.ndarray) -> torch.Tensor:
    from harness.frameworks import adapter_for

    return adapter_for("megatron").to_tensor(array, "cpu", requires_grad=False)


def demo_inputs(seq: int = 16, batch: int = 2, hidden: int = HIDDEN, seed: int = 1,
                dtype: torch.dtype = torch.bfloat16) -> dict[str, np.ndarray]:
    """The step's input x [s, b, h] and the gradient fed to the output, as arrays (exact bits)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(seq, batch, hidden, generator=generator).to(dtype)
    grad = (torch.randn(seq, batch, hidden, generator=generator) * 0.1).to(dtype)
    return {"x": _to_numpy(x), "grad_out": _to_numpy(grad)}


def megatron_step(model: MLPBlock, inputs: dict[str, np.ndarray], device: str = "cpu",
                  eager: bool = False) -> torch.Tensor:
    """One forward and backward of the model on the demo inputs; returns the output."""
    x = _to_torch(inputs["x"]).to(device).requires_grad_(True)
    with stance(eager):
        out = model(x)
        out.backward(_to_torch(inputs["grad_out"]).to(device))
    return out
