"""What capture(..., optimizer=) reads of a Paddle optimizer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.frameworks.base import OptimizerProbe, wrap_method


class PaddleOptimizerProbe(OptimizerProbe):
    """A paddle.optimizer.Optimizer (AdamW, Adam, ...; a fleet HybridParallelOptimizer through its inner
    one). Paddle has no step hooks: the instance's `step` is wrapped, and so is its gradient clip's
    `_dygraph_clip`, whose output (new tensors; param.grad is left as it was) is what the step applies.
    States are the optimizer's accumulators of the parameter (moment1, moment2, beta1_pow_acc, ...; keyed by
    the parameter's generated name) and its fp32 master weight under multi_precision."""

    def __init__(self, optimizer: Any):
        self.optimizer, self.kind = optimizer, type(optimizer).__name__
        self.inner = getattr(optimizer, "_inner_opt", optimizer)
        self.clipped: dict[int, Any] = {}  # id(param) -> the gradient the clip gave the step

    def hook(self, begins: Callable[[], None], ends: Callable[[float | None], None]) -> list[Callable[[], object]]:
        def stepping(step: Callable) -> Callable:
            def wrapped(*args, **kwargs):
                self.clipped.clear()
                begins()
                result = step(*args, **kwargs)
                ends(None)  # Paddle's clip does not return the norm
                return result
            return wrapped

        def clipping(clip: Callable) -> Callable:
            def wrapped(params_grads):
                clipped = clip(params_grads)
                self.clipped.update({id(param): grad for param, grad in clipped if grad is not None})
                return clipped
            return wrapped

        removers: list[Callable[[], object]] = [wrap_method(self.optimizer, "step", stepping)]
        grad_clip = getattr(self.inner, "_grad_clip", None)
        if grad_clip is not None and hasattr(grad_clip, "_dygraph_clip"):
            removers.append(wrap_method(grad_clip, "_dygraph_clip", clipping))
        return removers

    def learning_rates(self) -> list[float]:
        return [float(self.inner.get_lr())]

    def consumed_grad(self, param: Any) -> Any | None:
        return self.clipped.get(id(param), param.grad)

    def states(self, param: Any) -> list[tuple[str, Any]]:
        found = [(str(name), per_param[param.name]) for name, per_param in self.inner._accumulators.items()
                 if param.name in per_param]
        master = getattr(self.inner, "_master_weights", {}).get(param.name)
        return found + ([("master_weight", master)] if master is not None else [])


def paddle_optimizer_probe(optimizer: Any) -> OptimizerProbe | None:
    import paddle

    inner = getattr(optimizer, "_inner_opt", optimizer)
    return PaddleOptimizerProbe(optimizer) if isinstance(inner, paddle.optimizer.Optimizer) else None
