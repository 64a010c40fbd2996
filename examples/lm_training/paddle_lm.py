"""Paddle side of the training demo: the language model of megatron_lm.py as PaddleFormers writes it (LLaMA's
names: embed_tokens, layers.{i}.post_attention_layernorm, layers.{i}.mlp, norm, lm_head, criterion; activations
[b, s, h]), float32, in three variants:

- `released`: PaddleFormers 1.2.0's own layers: `Embedding.create` (paddle.nn.Embedding), `Norm.create`
  (its RMSNorm, fuse_rms_norm=False: the fused kernel is GPU only), `MLP(config, fuse_up_gate=True)` (one
  up_gate_proj [h, 2 * ffn], gate columns first: the layout of Megatron's linear_fc1; LLaMA's decoder builds
  the unfused MLP, which examples/mlp_alignment compares), `LMHead`, `CriterionLayer` (its loss_func per token
  and its masked mean); paddle.optimizer.AdamW + ClipGradByGlobalNorm(1.0);
- `matched_layers`: the same modules with forward and backward written in Paddle ops that give torch's CPU
  results bit for bit (torch_exact.py: GEMMs in MKL's order, torch's sums, Sleef's exp, MKL's exp/log, and
  autograd's order of additions); paddle.optimizer.AdamW + ClipGradByGlobalNorm(1.0);
- `matched_all`: `matched_layers` + `MatchedAdamW` (a paddle.optimizer.AdamW whose update is torch's
  _single_tensor_adam in Paddle ops) + `MegatronClip` (megatron-core's clip_grads formula in Paddle ops).

All three take their learning rate from `MegatronLR` (Megatron's OptimizerParamScheduler values) and decay
no 1-D parameter (megatron-core's param groups).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import torch_exact as T
from lm_setup import RMS_EPS, SCHEDULE, SIZES, Schedule, Sizes, megatron_lr
from paddle.nn.clip import ClipGradBase

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "mlp_alignment"))
from paddle_mlp import load_parameters  # noqa: E402,F401  (the MLP demo's: names and shapes checked, bits copied)

VARIANTS = ("released", "matched_layers", "matched_all")
F32 = paddle.float32


# --- PaddleFormers ------------------------------------------------------------------------------------------------

def paddleformers_config(sizes: Sizes = SIZES) -> Any:
    """A LLaMA config of the demo's sizes: untied embeddings, no biases, silu, unfused RMSNorm, TP=1."""
    import paddleformers_mlp  # the PaddleFormers install and version check of the MLP demo

    paddleformers_mlp.import_llama()
    from paddleformers.transformers.llama.configuration import LlamaConfig

    return LlamaConfig(vocab_size=sizes.vocab, hidden_size=sizes.hidden, intermediate_size=sizes.ffn,
                       num_hidden_layers=sizes.layers, num_attention_heads=4, num_key_value_heads=4,
                       rms_norm_eps=RMS_EPS, tie_word_embeddings=False, hidden_act="silu", mlp_bias=False,
                       fuse_swiglu=False, fuse_rms_norm=False, tensor_model_parallel_size=1)


class PaddleFormersLoss(paddle.nn.Layer):
    """PaddleFormers' CriterionLayer, its per-token half: loss_impl (logits to float32, its loss_func
    nn.CrossEntropyLoss(reduction="none")). Its masked mean (sft_postprocess_loss) is `released_loss`."""

    def __init__(self, config: Any):
        super().__init__()
        from paddleformers.nn.criterion.interface import CriterionLayer

        self.criterion = CriterionLayer(config)

    def forward(self, logits: paddle.Tensor, labels: paddle.Tensor) -> paddle.Tensor:
        from paddleformers.nn.criterion.sft_loss import loss_impl

        return loss_impl(self.criterion, logits, labels.unsqueeze(-1)).squeeze(-1)


def released_loss(criterion: PaddleFormersLoss, per_token: paddle.Tensor, labels: paddle.Tensor,
                  loss_mask: paddle.Tensor) -> paddle.Tensor:
    """PaddleFormers' sft_postprocess_loss: sum(loss * mask) / mask.sum() in float32."""
    from paddleformers.nn.criterion.sft_loss import sft_postprocess_loss

    loss, _ = sft_postprocess_loss(criterion.criterion, per_token, labels, loss_mask)
    return loss


# --- layers that give torch's bits --------------------------------------------------------------------------------

def _tokens_first(x: paddle.Tensor) -> paddle.Tensor:
    """[b, s, ...] as [s * b, ...]: Megatron's token order ([s, b, h] activations), which decides the order of the
    sums over tokens (weight gradients)."""
    return x.transpose([1, 0] + list(range(2, x.ndim))).reshape([-1] + list(x.shape[2:]))


class _EmbeddingFn(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, weight, ids):
        ctx.save_for_backward(ids)
        ctx.vocab = weight.shape[0]
        return paddle.gather(weight, ids.reshape([-1])).reshape(list(ids.shape) + [weight.shape[1]])

    @staticmethod
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensor()
        return T.embedding_backward(grad.reshape([-1, grad.shape[-1]]), ids.reshape([-1]), ctx.vocab)


class MatchedEmbedding(paddle.nn.Layer):
    """paddle.nn.Embedding's parameter; backward: torch's embedding_dense_backward order (ids in [b, s] order, as
    Megatron's VocabParallelEmbedding gets them)."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.weight = self.create_parameter([vocab, hidden], dtype=F32)

    def forward(self, ids: paddle.Tensor) -> paddle.Tensor:
        return _EmbeddingFn.apply(self.weight, ids)


class _RmsNormFn(paddle.autograd.PyLayer):
    """Returns (norm(x), x): the second output is the residual, so that the backward receives the residual's
    gradient too and adds the three gradients of x in torch's order."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        out, t, r = T.rms_norm(x, weight, eps)
        ctx.save_for_backward(x, weight, t, r)
        return out, x.clone()

    @staticmethod
    def backward(ctx, grad, grad_residual):
        x, weight, t, r = ctx.saved_tensor()
        through_mul, through_pow, grad_weight = T.rms_norm_backward(grad, x, weight, t, r, _tokens_first(grad * t))
        # torch's engine: the residual's gradient arrives first, then x * r's, then pow's (measured)
        grad_x = through_mul + through_pow if grad_residual is None else (grad_residual + through_mul) + through_pow
        return grad_x, grad_weight


class MatchedRMSNorm(paddle.nn.Layer):
    """PaddleFormers' RMSNorm parameter (weight [h], ones); torch.rms_norm's arithmetic. Returns (out, x)."""

    def __init__(self, hidden: int, eps: float = RMS_EPS):
        super().__init__()
        self.eps = eps
        self.weight = self.create_parameter([hidden], dtype=F32, default_initializer=paddle.nn.initializer.Constant(1.0))

    def forward(self, x: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        return _RmsNormFn.apply(x, self.weight, self.eps)


class _LinearFn(paddle.autograd.PyLayer):
    """x @ W, W Paddle's [in, out], as torch's matmul(x, weight.t()) with Megatron's [out, in] weight."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return T.mm(x.reshape([-1, x.shape[-1]]), weight).reshape(list(x.shape[:-1]) + [weight.shape[1]])

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensor()
        grad_x = T.mm(grad.reshape([-1, grad.shape[-1]]), weight.t()).reshape(x.shape)
        # Megatron: grad_output.t().matmul(input) over tokens in [s, b] order -> [out, in]; Paddle's is [in, out]
        grad_weight = T.mm(_tokens_first(grad).t(), _tokens_first(x)).t()
        return grad_x, grad_weight


class MatchedLinear(paddle.nn.Layer):
    """paddle.nn.Linear's weight ([in, out], no bias) with torch's GEMM bits."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = self.create_parameter([in_features, out_features], dtype=F32)
        self.weight.torch_transposed = True  # Megatron holds it as [out, in] (MegatronClip's norm order)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return _LinearFn.apply(x, self.weight)


class _SwiGLUFn(paddle.autograd.PyLayer):
    """silu(gate) * up on [gate | up] (megatron-core's MLP.glu, eager); backward: MulBackward0 then torch's
    silu_backward kernel, the two halves concatenated (SplitBackward0)."""

    @staticmethod
    def forward(ctx, y):
        gate, up = paddle.chunk(y, 2, axis=-1)
        activated = T.silu(gate)
        ctx.save_for_backward(gate, up, activated)
        return activated * up

    @staticmethod
    def backward(ctx, grad):
        gate, up, activated = ctx.saved_tensor()
        return paddle.concat([T.silu_backward(grad * up, gate), grad * activated], axis=-1)


class MatchedMLP(paddle.nn.Layer):
    """PaddleFormers' MLP with fuse_up_gate=True: up_gate_proj [h, 2 * ffn] (gate columns first), SwiGLU,
    down_proj [ffn, h]."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.up_gate_proj = MatchedLinear(hidden, 2 * ffn)
        self.down_proj = MatchedLinear(ffn, hidden)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.down_proj(_SwiGLUFn.apply(self.up_gate_proj(x)))


class _LMHeadFn(paddle.autograd.PyLayer):
    """logits = x @ W.T, W [vocab, h] (PaddleFormers' LMHead and Megatron's output_layer hold the same layout)."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return T.mm(x.reshape([-1, x.shape[-1]]), weight.t()).reshape(list(x.shape[:-1]) + [weight.shape[0]])

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensor()
        grad_x = T.mm(grad.reshape([-1, grad.shape[-1]]), weight).reshape(x.shape)
        return grad_x, T.mm(_tokens_first(grad).t(), _tokens_first(x))


class MatchedLMHead(paddle.nn.Layer):
    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.weight = self.create_parameter([vocab, hidden], dtype=F32)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return _LMHeadFn.apply(x, self.weight)


class _CrossEntropyFn(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, logits, labels):
        loss, softmax = T.vocab_cross_entropy(logits, labels)
        ctx.save_for_backward(softmax, labels)
        return loss

    @staticmethod
    def backward(ctx, grad):
        softmax, labels = ctx.saved_tensor()
        return T.vocab_cross_entropy_backward(softmax, labels, grad), None


class MatchedCrossEntropy(paddle.nn.Layer):
    """Per-token loss [b, s]: megatron-core's vocab_parallel_cross_entropy at TP=1, in torch's bits."""

    def forward(self, logits: paddle.Tensor, labels: paddle.Tensor) -> paddle.Tensor:
        return _CrossEntropyFn.apply(logits, labels)


class _MaskedMeanFn(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, per_token, loss_mask):
        loss, grad = T.masked_mean(per_token, loss_mask)
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, grad):
        (per_token_grad,) = ctx.saved_tensor()
        return per_token_grad * grad, None


def matched_loss(per_token: paddle.Tensor, loss_mask: paddle.Tensor) -> paddle.Tensor:
    """Megatron-LM's sum(loss * mask) / num_tokens in torch's bits."""
    return _MaskedMeanFn.apply(per_token, loss_mask)


# --- the model ----------------------------------------------------------------------------------------------------

class DecoderLayer(paddle.nn.Layer):
    """LlamaDecoderLayer without attention: residual + mlp(post_attention_layernorm(h)). A matched norm hands
    back its input as the residual (its backward adds the residual's gradient in torch's order)."""

    def __init__(self, norm: paddle.nn.Layer, mlp: paddle.nn.Layer):
        super().__init__()
        self.post_attention_layernorm = norm
        self.mlp = mlp

    def forward(self, hidden: paddle.Tensor) -> paddle.Tensor:
        normed = self.post_attention_layernorm(hidden)
        normed, residual = normed if isinstance(normed, tuple) else (normed, hidden)
        return residual + self.mlp(normed)


class LanguageModel(paddle.nn.Layer):
    """embed_tokens -> layers -> norm -> lm_head -> criterion: the per-token loss [b, s] (the masked mean is the
    training loop's, as Megatron-LM's loss_func is)."""

    def __init__(self, variant: str, sizes: Sizes = SIZES):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
        self.variant = variant
        if variant == "released":
            config = paddleformers_config(sizes)  # imports PaddleFormers
            from paddleformers.nn.embedding import Embedding
            from paddleformers.nn.lm_head import LMHead
            from paddleformers.nn.mlp import MLP
            from paddleformers.nn.norm import Norm

            self.embed_tokens = Embedding.create(config)
            self.layers = paddle.nn.LayerList([DecoderLayer(Norm.create(config), MLP(config, fuse_up_gate=True))
                                               for _ in range(sizes.layers)])
            self.norm = Norm.create(config)
            self.lm_head = LMHead(config)
            self.criterion = PaddleFormersLoss(config)
        else:
            self.embed_tokens = MatchedEmbedding(sizes.vocab, sizes.hidden)
            self.layers = paddle.nn.LayerList([DecoderLayer(MatchedRMSNorm(sizes.hidden), MatchedMLP(sizes.hidden, sizes.ffn))
                                               for _ in range(sizes.layers)])
            self.norm = MatchedRMSNorm(sizes.hidden)
            self.lm_head = MatchedLMHead(sizes.vocab, sizes.hidden)
            self.criterion = MatchedCrossEntropy()

    def forward(self, tokens: paddle.Tensor, labels: paddle.Tensor) -> paddle.Tensor:
        hidden = self.embed_tokens(tokens)
        for layer in self.layers:
            hidden = layer(hidden)
        hidden = self.norm(hidden)
        if isinstance(hidden, tuple):
            hidden = hidden[0]
        return self.criterion(self.lm_head(hidden), labels)

    def loss(self, per_token: paddle.Tensor, labels: paddle.Tensor, loss_mask: paddle.Tensor) -> paddle.Tensor:
        if self.variant == "released":
            return released_loss(self.criterion, per_token, labels, loss_mask)
        return matched_loss(per_token, loss_mask)


def build_model(variant: str, sizes: Sizes = SIZES) -> LanguageModel:
    paddle.set_device("cpu")
    return LanguageModel(variant, sizes)


# --- optimizer ----------------------------------------------------------------------------------------------------

class MegatronLR(paddle.optimizer.lr.LRScheduler):
    """The learning rate of Megatron's OptimizerParamScheduler at each step (lm_setup.megatron_lr)."""

    def __init__(self, schedule: Schedule = SCHEDULE):
        self.schedule = schedule
        super().__init__(learning_rate=schedule.max_lr)

    def get_lr(self) -> float:
        return megatron_lr(self.schedule, self.last_epoch)


class MegatronClip(ClipGradBase):
    """megatron-core's clip_grads (get_grad_norm_fp32 with local_multi_tensor_l2_norm, clip_grad_by_total_norm_fp32)
    in Paddle ops: the norm of the per-parameter norms in megatron-core's param-group order (2-D params, then 1-D)
    and torch's layouts, squared in float32, `** 0.5` in Python floats; grads scaled by max_norm / (norm + 1e-6)
    only when that is below 1. `last_norm` holds the norm (what Megatron's optimizer step returns)."""

    def __init__(self, clip_norm: float):
        super().__init__()
        self.clip_norm = clip_norm
        self.last_norm: float | None = None
        self.on_norm = None  # called with the norm (capture's grad_norm: the norm Megatron's step returns)

    def _dygraph_clip(self, params_grads):
        ordered = [pg for pg in params_grads if pg[1] is not None and pg[0].ndim > 1] + \
                  [pg for pg in params_grads if pg[1] is not None and pg[0].ndim <= 1]
        norms = [T.norm2(grad.t() if getattr(param, "torch_transposed", False) else grad) for param, grad in ordered]
        reduced = T.norm2(paddle.stack(norms))
        squared = T.f32(float(reduced)) * T.f32(float(reduced))
        self.last_norm = float(squared) ** (1.0 / 2.0)
        if self.on_norm is not None:
            self.on_norm(self.last_norm)
        coeff = self.clip_norm / (self.last_norm + 1.0e-6)
        if coeff >= 1.0:
            return params_grads
        return [(param, None if grad is None else grad * T.f32(coeff)) for param, grad in params_grads]


class MatchedAdamW(paddle.optimizer.AdamW):
    """paddle.optimizer.AdamW whose update is torch's _single_tensor_adam (torch_exact.adamw_step), state in
    Paddle's accumulators moment1 (= torch's exp_avg) and moment2 (= exp_avg_sq); torch's step count per
    parameter is kept here (it is no tensor Paddle has)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._steps: dict[str, int] = {}

    def _create_accumulators(self, block, parameters):
        for param in parameters:
            if param.name not in self._already_create_accumulator:
                self._add_accumulator(self._moment1_acc_str, param)
                self._add_accumulator(self._moment2_acc_str, param)
                self._already_create_accumulator.add(param.name)

    def _append_optimize_op(self, block, param_and_grad):
        param, grad = param_and_grad
        decay = self._apply_decay_param_fun is None or self._apply_decay_param_fun(param.name)
        moment1 = self._get_accumulator_master(self._moment1_acc_str, param)
        moment2 = self._get_accumulator_master(self._moment2_acc_str, param)
        step = self._steps[param.name] = self._steps.get(param.name, 0) + 1
        new_param, new_m, new_v = T.adamw_step(
            param, grad, moment1, moment2, step, self.get_lr(), self._beta1, self._beta2, self._epsilon,
            self._weight_decay if decay else 0.0)
        paddle.assign(new_m, moment1)
        paddle.assign(new_v, moment2)
        paddle.assign(new_param, param)


def build_optimizer(model: LanguageModel, schedule: Schedule = SCHEDULE) -> paddle.optimizer.AdamW:
    """AdamW over the model's parameters, weight decay only on parameters of 2 or more axes, Megatron's learning
    rate; `matched_all`: MatchedAdamW + MegatronClip, else Paddle's AdamW + ClipGradByGlobalNorm."""
    decayed = {param.name for param in model.parameters() if param.ndim > 1}
    matched = model.variant == "matched_all"
    cls = MatchedAdamW if matched else paddle.optimizer.AdamW
    clip = MegatronClip(schedule.clip) if matched else paddle.nn.ClipGradByGlobalNorm(schedule.clip)
    return cls(learning_rate=MegatronLR(schedule), beta1=schedule.beta1, beta2=schedule.beta2, epsilon=schedule.eps,
               parameters=model.parameters(), weight_decay=schedule.weight_decay,
               apply_decay_param_fun=lambda name: name in decayed, grad_clip=clip)


def train(model: LanguageModel, optimizer: paddle.optimizer.AdamW, data: list[dict[str, np.ndarray]],
          on_loss=None) -> list[dict[str, float]]:
    """The training loop (PaddleFormers' Trainer order: backward, optimizer step, lr step, clear grads).
    Returns per step the loss and the learning rate."""
    log = []
    for batch in data:
        lr = optimizer.get_lr()
        labels = paddle.to_tensor(batch["labels"])
        per_token = model(paddle.to_tensor(batch["tokens"]), labels)
        loss = model.loss(per_token, labels, paddle.to_tensor(batch["loss_mask"]))
        loss.backward()
        if on_loss is not None:
            on_loss(loss)
        optimizer.step()
        optimizer._learning_rate.step()
        optimizer.clear_grad()
        log.append({"loss": float(loss), "lr": lr})
        if not math.isfinite(log[-1]["loss"]):
            raise FloatingPointError(f"loss {log[-1]['loss']} at step {len(log) - 1}")
    return log
