"""The two megatron-core layers the parallel runs compare, built the same way at every parallel size:

- "layer": a TransformerLayer of the local spec (RMSNorm, self-attention with a causal mask, SwiGLU MLP,
  no biases), run at tensor-parallel size TP (sequence parallel off);
- "moe": a MoELayer (4 experts, top 2, the all-to-all token dispatcher, SequentialMLP experts, no aux
  loss), run at expert-parallel size EP (TP=1): the MLP of a MoE TransformerLayer, alone.

Parameters are drawn once in the canonical (one-rank) layout (`canonical_parameters`) and each rank is
given its piece (`rank_parameters`, through the same shardings the maps declare), so that the runs at
different parallel sizes start from bit-identical weights.

On the CPU megatron-core 0.16 asks CUDA for three things this module supplies instead, without changing
any arithmetic (`cpu_adaptations`): DotProductAttention's scratch buffer for baddbmm (multiplied by
beta=0, its contents unused) comes from parallel_state's global memory buffer, which allocates on
`torch.cuda.current_device()`: it is placed on the CPU first; its attention dropout (p=0: the identity)
runs inside the CUDA RNG tracker's fork, which reads CUDA's RNG state: megatron's own inference tracker
(initialize_rng_tracker(inference_rng_tracker=True), whose fork does nothing) is used instead; the
default causal mask (`attention_mask=None`) is made with device="cuda", so every run passes the causal
mask explicitly (`causal_mask`), on the GPU too.
The MoE layer has no such way round: its router moves a CPU weight to CUDA in forward (TopKRouter.gating)
and its all-to-all dispatcher makes a torch.cuda.Stream when built: it runs on CUDA only.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

HIDDEN, HEADS, FFN, SEQ, BATCH = 64, 4, 128, 16, 2  # the CPU sizes
EXPERTS, TOPK = 4, 2
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def config(kind: str, hidden: int, heads: int, ffn: int, dtype: torch.dtype, tp: int = 1, ep: int = 1,
           deterministic: bool = False):
    from megatron.core.transformer.transformer_config import TransformerConfig

    moe = dict(num_moe_experts=EXPERTS, moe_router_topk=TOPK, moe_token_dispatcher_type="alltoall",
               moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, moe_grouped_gemm=False,
               expert_model_parallel_size=ep, moe_ffn_hidden_size=ffn) if kind == "moe" else {}
    return TransformerConfig(num_layers=1, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads,
                             gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
                             bias_activation_fusion=False, normalization="RMSNorm", bf16=dtype == torch.bfloat16,
                             params_dtype=dtype, use_cpu_initialization=True, hidden_dropout=0.0,
                             attention_dropout=0.0, tensor_model_parallel_size=tp, sequence_parallel=False,
                             gradient_accumulation_fusion=False, deterministic_mode=deterministic, **moe)


def build(kind: str, hidden: int = HIDDEN, heads: int = HEADS, ffn: int = FFN, dtype: torch.dtype = torch.float32,
          tp: int = 1, ep: int = 1, deterministic: bool = False) -> torch.nn.Module:
    """The layer at the parallel sizes parallel_state holds (call after initialize_model_parallel)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module

    cfg = config(kind, hidden, heads, ffn, dtype, tp, ep, deterministic)
    if kind == "layer":
        return build_module(get_gpt_layer_local_spec(normalization="RMSNorm"), config=cfg, layer_number=1)
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.spec_utils import ModuleSpec

    spec = get_moe_module_spec(use_te=False, num_experts=EXPERTS, moe_grouped_gemm=False)
    if isinstance(spec, ModuleSpec):  # megatron-core 0.16
        return build_module(spec, config=cfg)
    return spec(config=cfg)  # 0.19: a builder, functools.partial(MoELayer, submodules=...)


def cpu_adaptations(device: str) -> None:
    """On the CPU: parallel_state's global memory buffer (attention's baddbmm input, beta=0) on the CPU, and
    an RNG tracker whose fork does nothing (dropout is 0). Call after initialize_model_parallel, which
    makes a new buffer; on CUDA: megatron's RNG tracker seeded as in training."""
    from megatron.core import parallel_state, tensor_parallel

    if device != "cpu":
        tensor_parallel.random.model_parallel_cuda_manual_seed(0)
        return
    tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)

    parallel_state.get_global_memory_buffer().buffer.clear()
    for dtype in DTYPES.values():  # get_tensor only allocates (on CUDA) when this one is too small
        parallel_state.get_global_memory_buffer().buffer[("mpu", dtype)] = torch.empty(1 << 20, dtype=dtype)


def causal_mask(seq: int, device: str) -> torch.Tensor:
    """Megatron's causal mask: True where a query may not attend (a later key), [1, 1, s, s]."""
    return torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=device), diagonal=1)[None, None]


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    from harness.frameworks import adapter_for

    return adapter_for("megatron").to_numpy(tensor.detach().cpu())


def to_torch(array: np.ndarray, device: str) -> torch.Tensor:
    from harness.frameworks import adapter_for

    return adapter_for("megatron").to_tensor(array, "cpu", requires_grad=False).to(device)


def draw_parameters(model: torch.nn.Module, seed: int = 0) -> dict[str, np.ndarray]:
    """Values for `model`'s parameters (the canonical layout when `model` is built at size 1): weights
    normal(0, 0.05); norms' weights 1 + normal(0, 0.1), so that they matter; rounded to each dtype."""
    generator = torch.Generator().manual_seed(seed)
    values = {}
    for name, param in model.named_parameters():
        draw = torch.randn(param.shape, generator=generator)
        draw = 1 + 0.1 * draw if "layernorm" in name else 0.05 * draw
        values[name] = to_numpy(draw.to(param.dtype))
    return values


def load_parameters(model: torch.nn.Module, values: dict[str, np.ndarray]) -> None:
    params = dict(model.named_parameters())
    if sorted(params) != sorted(values):
        raise KeyError(f"parameters {sorted(params)} but values for {sorted(values)}")
    with torch.no_grad():
        for name, param in params.items():
            if tuple(param.shape) != values[name].shape:
                raise ValueError(f"{name}: the rank holds {tuple(param.shape)}, its piece is {values[name].shape}")
            param.copy_(to_torch(values[name], str(param.device)))


def draw_inputs(seq: int, batch: int, hidden: int, dtype: torch.dtype, seed: int = 1) -> dict[str, np.ndarray]:
    """The step's input x [s, b, h] and the gradient fed to the output (exact bits)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(seq, batch, hidden, generator=generator).to(dtype)
    grad = (torch.randn(seq, batch, hidden, generator=generator) * 0.1).to(dtype)
    return {"x": to_numpy(x), "grad_out": to_numpy(grad)}


def step(model: torch.nn.Module, kind: str, inputs: dict[str, np.ndarray], device: str) -> None:
    """One forward and backward (grads of the parameters left for the capture's step)."""
    for param in model.parameters():
        param.grad = None
    x = to_torch(inputs["x"], device).requires_grad_(True)
    if kind == "layer":
        output, _ = model(x, attention_mask=causal_mask(x.shape[0], device))
    else:
        output, _ = model(x)  # (output, the MLP bias: None without biases)
    output.backward(to_torch(inputs["grad_out"], device))
