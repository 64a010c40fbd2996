"""What capture(..., optimizer=) reads of a torch optimizer and of a megatron-core one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.frameworks.base import OptimizerProbe, wrap_method


def _tensors(state: dict) -> list[tuple[str, Any]]:
    import torch

    return [(str(name), value) for name, value in state.items() if isinstance(value, torch.Tensor)]


class TorchOptimizerProbe(OptimizerProbe):
    """A torch.optim.Optimizer (Adam, AdamW, ...): hooked through its step pre- and post-hooks; its state is
    `optimizer.state[param]` (exp_avg, exp_avg_sq, max_exp_avg_sq, step)."""

    def __init__(self, optimizer: Any):
        self.optimizer, self.kind = optimizer, type(optimizer).__name__

    def hook(self, begins: Callable[[], None], ends: Callable[[float | None], None]) -> list[Callable[[], object]]:
        handles = [self.optimizer.register_step_pre_hook(lambda opt, args, kwargs: begins()),
                   self.optimizer.register_step_post_hook(lambda opt, args, kwargs: ends(None))]
        return [handle.remove for handle in handles]

    def learning_rates(self) -> list[float]:
        return [float(group["lr"]) for group in self.optimizer.param_groups]

    def consumed_grad(self, param: Any) -> Any | None:
        return param.grad  # clipping, where the training code does it, happened before the step

    def states(self, param: Any) -> list[tuple[str, Any]]:
        return _tensors(self.optimizer.state.get(param, {}))


class MegatronOptimizerProbe(OptimizerProbe):
    """A megatron-core MegatronOptimizer (FP32Optimizer, Float16OptimizerWithFloat16Params, ChainedOptimizer):
    not a torch optimizer but a wrapper of one, so its own `step` is wrapped: the inner optimizer's
    post-hook would fire before the bf16 copy-back. A parameter's state is the inner optimizer's state of
    its fp32 main parameter (`param.main_param`) where there is one, recorded as `main_param` too. The
    distributed optimizer keeps flat shards of main parameters and states: not read (states() is empty)."""

    def __init__(self, optimizer: Any):
        self.optimizer, self.kind = optimizer, type(optimizer).__name__
        self.inner = [chained.optimizer for chained in getattr(optimizer, "chained_optimizers", [optimizer])]

    def hook(self, begins: Callable[[], None], ends: Callable[[float | None], None]) -> list[Callable[[], object]]:
        def wrapper(step: Callable) -> Callable:
            def stepping(*args, **kwargs):
                begins()
                result = step(*args, **kwargs)  # (successful, grad_norm before clipping, zeros counted)
                norm = result[1] if isinstance(result, tuple) and len(result) > 1 else None
                ends(float(norm) if isinstance(norm, (int, float)) else None)
                return result
            return stepping

        return [wrap_method(self.optimizer, "step", wrapper)]

    def learning_rates(self) -> list[float]:
        return [float(group["lr"]) for group in self.optimizer.param_groups]

    @staticmethod
    def _main(param: Any) -> Any | None:
        if getattr(param, "main_param_sharded", False):
            return None  # the distributed optimizer's flat shard
        main = getattr(param, "main_param", None)
        return param if main is None else main

    def consumed_grad(self, param: Any) -> Any | None:
        main = self._main(param)
        return None if main is None else main.grad  # clipped in place by the step

    def states(self, param: Any) -> list[tuple[str, Any]]:
        main = self._main(param)
        if main is None:
            return []
        found = [("main_param", main)] if main is not param else []
        for inner in self.inner:
            found += _tensors(inner.state.get(main, {}))
        return found


def torch_optimizer_probe(optimizer: Any) -> OptimizerProbe | None:
    import torch

    if isinstance(optimizer, torch.optim.Optimizer):
        return TorchOptimizerProbe(optimizer)
    if any(kind.__name__ == "MegatronOptimizer" for kind in type(optimizer).__mro__):
        return MegatronOptimizerProbe(optimizer)
    return None
