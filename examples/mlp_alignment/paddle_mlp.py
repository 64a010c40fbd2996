"""Paddle side of the demo: a SwiGLU MLP written the way PaddleFormers writes it, with variants of its
bf16 rounding.

The released PaddleFormers classes cannot run in bf16 on CPU (no bf16 matmul kernel); they are compared in
fp32 in paddleformers_mlp.py. These bf16 variants follow their structure:

- PaddlePaddle/PaddleFormers@08a66deb313fb05e850edc83f9cd39b8f3668a1b paddleformers/nn/mlp.py `MLP`
  (used by paddleformers/transformers/llama/modeling.py LlamaDecoderLayer as `self.mlp = MLP(config)`,
  @068b0563af160d8453e28a8a334118f85d6ae931): separate `gate_proj`, `up_proj`, `down_proj` Linear layers,
  weights in Paddle's [in, out] layout, a bias on each when `mlp_bias` is set; forward
  `down_proj(act_fn(gate_proj(x)) * up_proj(x))`.
- The variant that matches Megatron follows PaddleFleet's port of Megatron's fused bias SwiGLU,
  PaddlePaddle/PaddleFleet@0642f935cd6cc069f99b9055197b2fef7ac154fb src/paddlefleet/fusions/fused_bias_swiglu.py
  (a PyLayer whose forward is `bias_swiglu(y, bias)` and whose backward is the hand-written
  `swiglu_back` formula, with the projection's bias handed to the activation: `skip_bias_add=True` in
  src/paddlefleet/transformer/mlp.py @05da5a93356cb6d7a9ea875f33c9d4a77634a6ef).

Paddle 3.3.1 has no CPU bf16 kernel for matmul, add or silu, so every arithmetic op here runs in fp32
from the bf16 values and the variants differ only in where they round to bf16:

- `layer_fp32`: each layer rounds once (F.linear with its bias, then silu(gate) * up): what a fused
  bf16 kernel with an fp32 epilogue computes;
- `per_op`: every op rounds (matmul, + bias, silu, *): Megatron's bias SwiGLU run eagerly;
- `fused_bias_swiglu`: the projections round after the matmul and hand their bias on; bias + SwiGLU is
  one fp32 island rounded once, its backward the hand-written formula in fp32, rounded once: Megatron's
  bias SwiGLU as torch.compile makes it (the production setting).
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F

FP32 = paddle.float32
VARIANTS = ("layer_fp32", "per_op", "fused_bias_swiglu")


def _round(t: paddle.Tensor, dtype) -> paddle.Tensor:
    return t.cast(dtype)


class Linear(paddle.nn.Layer):
    """paddle.nn.Linear's parameters (weight [in, out], bias [out]); the forward rounds as the variant says.
    With `skip_bias_add` the forward returns the product only and the caller adds the bias (PaddleFleet)."""

    def __init__(self, in_features: int, out_features: int, dtype: str, variant: str, skip_bias_add: bool = False):
        super().__init__()
        self.weight = self.create_parameter([in_features, out_features], dtype=dtype)  # type: ignore[arg-type]
        self.bias = self.create_parameter([out_features], dtype=dtype, is_bias=True)  # type: ignore[arg-type]
        self.variant, self.skip_bias_add = variant, skip_bias_add

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        dtype = x.dtype
        if self.variant == "layer_fp32" and not self.skip_bias_add:
            return _round(F.linear(x.cast(FP32), self.weight.cast(FP32), self.bias.cast(FP32)), dtype)
        out = _round(paddle.matmul(x.cast(FP32), self.weight.cast(FP32)), dtype)
        if self.skip_bias_add:
            return out
        return _round(out.cast(FP32) + self.bias.cast(FP32), dtype)


class BiasSwiGLU(paddle.autograd.PyLayer):
    """silu(gate + b_gate) * (up + b_up) in fp32 from the bf16 values, rounded once; backward: Megatron's
    (and PaddleFleet's) `swiglu_back` formula on y + bias in fp32, rounded once; the biases' gradients are
    that rounded gradient summed over tokens (as torch reduces a broadcast gradient)."""

    @staticmethod
    def forward(ctx, gate, up, gate_bias, up_bias):
        ctx.save_for_backward(gate, up, gate_bias, up_bias)
        y1 = gate.cast(FP32) + gate_bias.cast(FP32)
        y2 = up.cast(FP32) + up_bias.cast(FP32)
        return _round(F.silu(y1) * y2, gate.dtype)

    @staticmethod
    def backward(ctx, grad):
        gate, up, gate_bias, up_bias = ctx.saved_tensor()
        g = grad.cast(FP32)
        y1 = gate.cast(FP32) + gate_bias.cast(FP32)
        y2 = up.cast(FP32) + up_bias.cast(FP32)
        sig = F.sigmoid(y1)
        d_gate = _round(g * sig * (1 + y1 * (1 - sig)) * y2, gate.dtype)
        d_up = _round(g * F.silu(y1), up.dtype)
        rows = list(range(d_gate.ndim - 1))
        return (d_gate, d_up, _round(d_gate.cast(FP32).sum(axis=rows), gate.dtype),
                _round(d_up.cast(FP32).sum(axis=rows), up.dtype))


class PaddleMLP(paddle.nn.Layer):
    """PaddleFormers' MLP (gate_proj, up_proj, down_proj, mlp_bias=True), input [s, b, h]."""

    def __init__(self, hidden: int, ffn: int, dtype: str = "bfloat16", variant: str = "fused_bias_swiglu"):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
        fused = variant == "fused_bias_swiglu"
        self.variant = variant
        self.gate_proj = Linear(hidden, ffn, dtype, variant, skip_bias_add=fused)
        self.up_proj = Linear(hidden, ffn, dtype, variant, skip_bias_add=fused)
        self.down_proj = Linear(ffn, hidden, dtype, variant)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if self.variant == "fused_bias_swiglu":
            hidden = BiasSwiGLU.apply(gate, up, self.gate_proj.bias, self.up_proj.bias)
        elif self.variant == "per_op":
            hidden = _round(_round(F.silu(gate.cast(FP32)), x.dtype).cast(FP32) * up.cast(FP32), x.dtype)
        else:
            hidden = _round(F.silu(gate.cast(FP32)) * up.cast(FP32), x.dtype)
        return self.down_proj(hidden)


def build_paddle_mlp(hidden: int, ffn: int, variant: str = "fused_bias_swiglu", dtype: str = "bfloat16") -> PaddleMLP:
    paddle.set_device("cpu")
    return PaddleMLP(hidden, ffn, dtype, variant)


def load_parameters(model: paddle.nn.Layer, values: dict[str, np.ndarray]) -> None:
    """Copy `values` (parameter name -> array with the exact bits, Paddle's layout) into the model."""
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(values))
    if missing:
        raise KeyError(f"no value for parameter(s) {', '.join(missing)}")
    for name, param in params.items():
        array = values[name]
        if tuple(array.shape) != tuple(param.shape):
            raise ValueError(f"parameter {name}: shape {list(array.shape)} given, {param.shape} expected")
        param.set_value(_to_paddle(array))


def parameters_numpy(model: paddle.nn.Layer) -> dict[str, np.ndarray]:
    from harness.frameworks import adapter_for

    adapter = adapter_for("paddle")
    return {name: adapter.to_numpy(param) for name, param in model.named_parameters()}


def _to_paddle(array: np.ndarray) -> paddle.Tensor:
    from harness.frameworks import adapter_for

    return adapter_for("paddle").to_tensor(array, "cpu", requires_grad=False)


def paddle_step(model: PaddleMLP, inputs: dict[str, np.ndarray]) -> paddle.Tensor:
    """One forward and backward on the demo inputs (x [s, b, h], grad_out); returns the output."""
    x = _to_paddle(inputs["x"])
    x.stop_gradient = False
    out = model(x)
    out.backward(_to_paddle(inputs["grad_out"]))
    return out
