"""Megatron side of the training demo: a small language model made of megatron-core 0.16.1 modules, trained with
what megatron-core's optimizer factory builds on a machine without Transformer Engine or Apex.

Model: `megatron.core.models.gpt.GPTModel` with an attention-free layer spec (attention needs CUDA on CPU
builds: examples/mlp_alignment/README.md): VocabParallelEmbedding -> layers x [pre_mlp_layernorm (torch RMSNorm,
what megatron-core's local spec builds without TE), MLP (ColumnParallelLinear -> SwiGLU -> RowParallelLinear),
the bias-dropout-add residual] -> final_layernorm -> output_layer (untied) -> vocab_parallel_cross_entropy (the
per-token loss GPTModel returns when given labels). TP=1 in a one-process gloo group.

Training step (what Megatron-LM's pretrain_gpt + schedules + MixedPrecision/FP32 optimizer do):
- loss = sum(per_token_loss * loss_mask) / sum(loss_mask) (pretrain_gpt.loss_func, then
  schedules.forward_step_calc_loss divides by num_tokens);
- optimizer: `torch.optim.AdamW` (megatron/core/optimizer/__init__.py picks it when neither TE nor Apex is
  installed) over megatron-core's own param groups (`_get_param_groups`: wd_mult 0 for 1-D and bias params),
  learning rate and weight decay set by megatron-core's `OptimizerParamScheduler` (warmup, cosine);
- global-norm clipping as megatron/core/optimizer/clip_grads.py does it: megatron-core's optimizer wrappers
  (FP32Optimizer, Float16OptimizerWithFloat16Params) and `get_grad_norm_fp32` allocate CUDA tensors in their
  constructors and norms (`torch.zeros(1, device='cuda')`: "Torch not compiled with CUDA enabled" on this CPU
  build), so `grad_norm_fp32` and `clip_by_total_norm_fp32` below restate them line by line on the CPU, with the
  fallback norm megatron.core.utils.local_multi_tensor_l2_norm (no TE/Apex) and local_multi_tensor_scale;
- bf16: the model wrapped in megatron-core's `Float16Module` (bf16 params, its output back in fp32), fp32 main params
  with the bf16 copy-back of Float16OptimizerWithFloat16Params, restated (same reason).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from lm_setup import RMS_EPS, SCHEDULE, SIZES, Schedule, Sizes
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.gpt import GPTModel
from megatron.core.optimizer import OptimizerConfig, _get_param_groups
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.identity_op import IdentityFuncOp, IdentityOp
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from harness.frameworks.megatron_group import one_process_group


@contextmanager
def megatron_group() -> Iterator[None]:
    with one_process_group("cpu"):
        yield


def layer_spec() -> ModuleSpec:
    """megatron-core's local GPT layer without attention: IdentityOp attention and an IdentityFuncOp for its
    bias-dropout-add (a plain IdentityOp there fails: the layer calls the bda with (training, fused) first)."""
    return ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules(
        input_layernorm=IdentityOp, self_attention=IdentityOp, self_attn_bda=IdentityFuncOp,
        pre_mlp_layernorm=WrappedTorchNorm,
        mlp=ModuleSpec(module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear,
                                                            linear_fc2=RowParallelLinear)),
        mlp_bda=get_bias_dropout_add))


def gpt_config(sizes: Sizes = SIZES, dtype: torch.dtype = torch.float32) -> TransformerConfig:
    """LLaMA-like: RMSNorm, gated SiLU (SwiGLU) without bias, no dropout. bias_activation_fusion off: the SwiGLU
    runs eagerly (F.silu(gate) * up), as megatron-core's MLP.glu does without the fused bias_swiglu."""
    return TransformerConfig(
        num_layers=sizes.layers, hidden_size=sizes.hidden, ffn_hidden_size=sizes.ffn, num_attention_heads=4,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        bias_activation_fusion=False, hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        gradient_accumulation_fusion=False, params_dtype=torch.float32, bf16=dtype == torch.bfloat16,
        layernorm_epsilon=RMS_EPS, init_method_std=sizes.init_std)


def build_gpt(sizes: Sizes = SIZES, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """megatron-core's GPTModel, initialised by megatron-core itself (normal std 0.02, norms 1) from
    torch.manual_seed(seed); bf16: inside megatron-core's Float16Module, as Megatron-LM wraps it. Call inside
    `megatron_group()`."""
    torch.manual_seed(seed)
    config = gpt_config(sizes, dtype)
    model = GPTModel(config, layer_spec(), vocab_size=sizes.vocab, max_sequence_length=sizes.seq,
                     position_embedding_type="none", share_embeddings_and_output_weights=False)
    return Float16Module(config, model) if dtype == torch.bfloat16 else model


def gpt_of(model: torch.nn.Module) -> GPTModel:
    return model.module if isinstance(model, Float16Module) else model  # type: ignore[return-value]


def masked_mean(per_token: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Megatron-LM's pretrain_gpt.loss_func (sum(losses * mask)) and schedules.forward_step_calc_loss
    (/= num_tokens, an int tensor; /= num_microbatches = 1)."""
    losses = per_token.view(-1).float()
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().clone().detach().to(torch.int)
    loss = loss / torch.clamp(num_tokens, min=1)
    return loss / 1


def optimizer_config(schedule: Schedule = SCHEDULE) -> OptimizerConfig:
    return OptimizerConfig(optimizer="adam", lr=schedule.max_lr, min_lr=schedule.min_lr,
                           weight_decay=schedule.weight_decay, adam_beta1=schedule.beta1, adam_beta2=schedule.beta2,
                           adam_eps=schedule.eps, clip_grad=schedule.clip)


class Trainer:
    """The model, its optimizer (torch AdamW over megatron-core's param groups; bf16: over fp32 main params),
    the scheduler, and one training step."""

    def __init__(self, model: torch.nn.Module, schedule: Schedule = SCHEDULE):
        self.model, self.schedule = model, schedule
        self.bf16 = isinstance(model, Float16Module)
        groups = _get_param_groups([gpt_of(model)], optimizer_config(schedule), None)
        self.model_params = [p for group in groups for p in group["params"]]
        if self.bf16:  # Float16OptimizerWithFloat16Params.__init__: an fp32 main copy of each bf16 param
            for group in groups:
                group["params"] = [self._main_param(p) for p in group["params"]]
        self.optimizer = torch.optim.AdamW(groups, lr=schedule.max_lr, weight_decay=schedule.weight_decay,
                                           betas=(schedule.beta1, schedule.beta2), eps=schedule.eps)
        self.scheduler = OptimizerParamScheduler(
            self.optimizer, init_lr=0.0, max_lr=schedule.max_lr, min_lr=schedule.min_lr,
            lr_warmup_steps=schedule.warmup, lr_decay_steps=schedule.decay, lr_decay_style="cosine",
            start_wd=schedule.weight_decay, end_wd=schedule.weight_decay, wd_incr_steps=schedule.decay,
            wd_incr_style="constant")
        self.main_params = [p for group in self.optimizer.param_groups for p in group["params"]]

    @staticmethod
    def _main_param(param: torch.nn.Parameter) -> torch.nn.Parameter:
        main = torch.nn.Parameter(param.detach().clone().float())
        param.main_param = main  # type: ignore[attr-defined]
        return main

    def forward(self, batch: dict[str, np.ndarray]) -> torch.Tensor:
        """GPTModel(tokens, position_ids=None, attention_mask=None, labels=) -> per-token loss [b, s]; the scalar."""
        per_token = self.model(torch.from_numpy(batch["tokens"]), None, None, labels=torch.from_numpy(batch["labels"]))
        return masked_mean(per_token, torch.from_numpy(batch["loss_mask"]))

    def prepare_grads(self) -> list[torch.Tensor]:
        """The grads the clip and the optimizer see: fp32 param.grad; bf16: main_param.grad = model grad .float()
        (Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads)."""
        if self.bf16:
            for param in self.model_params:
                param.main_param.grad = None if param.grad is None else param.grad.float()  # type: ignore[attr-defined]
        return [p.grad for p in self.main_params if p.grad is not None]

    def step(self, on_norm=None) -> float:
        """Clip, optimizer step, (bf16) copy back, scheduler step, zero grads: MixedPrecisionOptimizer.step /
        FP32Optimizer.step, then Megatron-LM's train_step. Returns the pre-clip grad norm Megatron reports
        (also given to `on_norm` before the optimizer steps)."""
        grads = self.prepare_grads()
        grad_norm = grad_norm_fp32(grads)
        if on_norm is not None:
            on_norm(grad_norm)
        clip_by_total_norm_fp32(grads, self.schedule.clip, grad_norm)
        self.optimizer.step()
        if self.bf16:  # _copy_main_params_to_model_params
            with torch.no_grad():
                for param in self.model_params:
                    param.copy_(param.main_param)  # type: ignore[attr-defined]
        self.scheduler.step(increment=1)
        self.model.zero_grad(set_to_none=True)
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm


def grad_norm_fp32(grads: list[torch.Tensor]) -> float:
    """megatron/core/optimizer/clip_grads.py get_grad_norm_fp32 (norm_type 2) with
    megatron.core.utils.local_multi_tensor_l2_norm, on the CPU: the 2-norm of the per-tensor 2-norms (fp32),
    squared, all-reduced (one rank: unchanged), `.item() ** 0.5` in Python floats."""
    l2 = [[torch.norm(tensor) for tensor in grads]]
    l2_reduced = torch.norm(torch.tensor(l2))
    grad_norm = torch.tensor([float(l2_reduced)], dtype=torch.float)
    total_norm = grad_norm**2.0
    return total_norm.item() ** (1.0 / 2.0)


def clip_by_total_norm_fp32(grads: list[torch.Tensor], max_norm: float, total_norm: float) -> None:
    """clip_grads.py clip_grad_by_total_norm_fp32 with local_multi_tensor_scale: grads scaled in place by
    max_norm / (total_norm + 1e-6) when that is below 1."""
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0:
        for grad in grads:
            grad.copy_(grad * clip_coeff)


def train(trainer: Trainer, data: list[dict[str, np.ndarray]], on_loss=None, on_norm=None) -> list[dict[str, float]]:
    """The training loop: forward, backward, step per batch; `on_loss(loss)` after the backward pass,
    `on_norm(grad_norm)` before the optimizer's step. Returns per step the loss, lr and grad norm."""
    log = []
    for batch in data:
        lr = trainer.optimizer.param_groups[0]["lr"]
        loss = trainer.forward(batch)
        loss.backward()
        if on_loss is not None:
            on_loss(loss)
        grad_norm = trainer.step(on_norm)
        log.append({"loss": loss.item(), "lr": lr, "grad_norm": grad_norm})
        if not math.isfinite(log[-1]["loss"]):
            raise FloatingPointError(f"loss {log[-1]['loss']} at step {len(log) - 1}")
    return log


def parameters_numpy(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The model's parameters by megatron-core name (GPTModel's, without Float16Module's `module.`)."""
    from harness.frameworks import adapter_for

    adapter = adapter_for("megatron")
    return {name: adapter.to_numpy(param) for name, param in gpt_of(model).named_parameters()}
