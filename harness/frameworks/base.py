"""What the harness needs from a framework. An adapter imports its framework inside its methods only, so
the parent process (case loading, comparison, reports) can use adapters without loading a framework."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from harness.store.fast_hash import PendingDigest


class FrameworkAdapter(ABC):
    name: str = ""  # the name cases use (`framework: ...`); set from the entry point
    modes: tuple[str, ...] = ()  # execution modes a side may ask for; the first is the default
    default_impl: str | None = None  # the variant a side without `impl` runs
    tensor_kind: str = "a tensor"  # for messages: "expected a torch tensor"

    @property
    def default_mode(self) -> str | None:
        return self.modes[0] if self.modes else None

    # -- process setup (the worker calls these in this order) ---------------------------------------

    def before_import(self, profile, mode: str | None) -> None:
        """Environment the framework reads when it loads: the profile's variables, then the adapter's."""
        os.environ.update(profile.env)

    @abstractmethod
    def apply_profile(self, profile) -> None:
        """The profile's switches that are set after import (threads, backends)."""

    @abstractmethod
    def unavailable(self, device: str) -> str | None:
        """Why this framework cannot run on `device` here (an N/A result), or None."""

    def use_device(self, device: str) -> None:
        """Make `device` the one new tensors and ops use."""

    def import_framework(self) -> None:
        """Import the framework (a long-lived worker does it once, after `before_import`)."""

    def set_mode(self, mode: str | None) -> None:
        """Switch to the case's execution mode at runtime (a long-lived worker serves every mode)."""

    # The state is opaque to the harness (it only hands `save_state`'s result back to `restore_state`),
    # so each adapter picks its own type: Any, which an override may narrow.
    def save_state(self) -> Any:
        """What a case may change in the framework (flags, RNG): recorded before each case."""
        return None

    def restore_state(self, state: Any) -> None:
        """Put back what `save_state` recorded and undo what a case leaves behind (process groups,
        compile caches), so the next case in a reused worker starts as in a fresh one."""
        self.reset()

    def compile_stats(self) -> dict:
        """Running totals of compilation inside ops ({"compile_s": seconds, cache hits and misses}); a
        worker records their change over each op, so that op time and compile time can be told apart."""
        return {}

    def kept_processes(self) -> frozenset[int]:
        """Child processes of the framework's own that a worker keeps from one case to the next (a compile
        pool); every other process a case leaves is killed when it ends."""
        return frozenset()

    def reset(self) -> None:
        """Undo what one case may have changed (for a worker reused across cases)."""

    # -- tensors --------------------------------------------------------------------------------------

    @abstractmethod
    def to_tensor(self, array: np.ndarray, device: str, requires_grad: bool) -> Any:
        """The array's exact bits as a tensor on `device`."""

    @abstractmethod
    def to_numpy(self, tensor: Any) -> np.ndarray:
        """The tensor's exact bits as a numpy array (bfloat16 as ml_dtypes.bfloat16)."""

    @abstractmethod
    def tensor_type(self) -> type: ...

    @abstractmethod
    def backward(self, outputs: list, grads: list) -> None: ...

    @abstractmethod
    def grad_of(self, tensor: Any) -> Any | None: ...

    @abstractmethod
    def tracks_grad(self, tensor: Any) -> bool: ...

    @abstractmethod
    def custom_function(self, forward: Callable, backward: Callable) -> Callable:
        """forward(*inputs, options) with a hand-written backward(*upstream_grads, *inputs, options) -> one
        gradient per input, as one differentiable function(*inputs, options) of this framework."""

    def deterministic(self, enabled: bool) -> AbstractContextManager:
        """Forward and backward run inside this: the framework's deterministic-algorithms switch."""
        return nullcontext()

    # -- what decides the bits ------------------------------------------------------------------------

    @abstractmethod
    def fingerprint(self, device: str, profile) -> dict:
        """Framework fields of the environment fingerprint, `version_line` included."""

    def runtime_fingerprint(self, device: str) -> dict:
        """Settings an op may change while it runs: read right after its forward and backward."""
        return {}

    # -- capture inside models (harness.capture) -------------------------------------------------------
    # A framework that supports capture overrides these; the defaults say it does not.

    def owns_model(self, model: Any) -> bool:
        """Whether `model` is a module of this framework (checked without importing the framework)."""
        return False

    def named_modules(self, model: Any) -> list[tuple[str, Any]]:
        """Every module of `model`, the model itself first (name ""), in the model's order, each once."""
        raise NotImplementedError(f"{self.name}: capture is not supported")

    def own_parameters(self, module: Any) -> list[tuple[str, Any]]:
        """The parameters `module` holds itself (not those of its submodules)."""
        raise NotImplementedError(f"{self.name}: capture is not supported")

    def load_parameter(self, param: Any, array: np.ndarray) -> None:
        """Overwrite `param` in place with the array's exact bits (same dtype and shape): replay loads the
        other side's parameters this way."""
        raise NotImplementedError(f"{self.name}: cannot load parameters")

    def hook_module(self, module: Any, before: Callable, after: Callable) -> list[Callable[[], object]]:
        """Call before(module, args, kwargs) when a call of `module` starts and after(module, args, kwargs,
        output) when it returns; returns the functions that remove the hooks."""
        raise NotImplementedError(f"{self.name}: capture is not supported")

    def hook_grad(self, tensor: Any, on_grad: Callable[[Any], None]) -> Callable[[], object]:
        """Call on_grad(gradient) when the gradient of `tensor` is computed in a backward pass (the
        gradient is left as it is); returns the function that removes the hook. torch and Paddle tensors
        both take `register_hook(fn)` and return a handle with `remove()`."""

        def hook(grad: Any) -> None:
            on_grad(grad)  # returns None: the gradient goes on unchanged

        return tensor.register_hook(hook).remove

    def parameter_grad(self, param: Any) -> Any | None:
        """The gradient a training step accumulated for `param`: main_grad where the framework or the
        training code keeps one (Megatron, PaddleFleet), else .grad; None when there is none."""
        main_grad = getattr(param, "main_grad", None)
        return main_grad if main_grad is not None else self.grad_of(param)

    def host_copy(self, tensor: Any) -> np.ndarray:
        """The tensor's exact bits as a numpy array that owns its memory (later in-place updates of the
        tensor do not reach it): a device tensor is copied to the host once."""
        return np.array(self.to_numpy(tensor), copy=True)

    def device_digest(self, tensor: Any) -> PendingDigest | None:
        """Start the fast digest (harness.store.fast_hash) and the statistics of `tensor` where it lives,
        without copying it to the host; `fetch_digests` reads the handle's values at the step's end.
        None: this adapter has no such path (the capture hashes a host copy with numpy instead).
        ValueError: a dtype no dump holds."""
        return None

    def fetch_digests(self, handles: list) -> Callable[[], np.ndarray]:
        """Start moving the values (fast_hash.SLOTS, float64) of the handles `device_digest` made to the host,
        together, without waiting; the function returned waits for them and gives one row per handle (the
        capture's writer thread calls it, so the training does not wait for the device)."""
        raise NotImplementedError(f"{self.name}: no device digests")

    def tensor_version(self, tensor: Any) -> int | None:
        """A counter the framework bumps on every in-place change of the tensor (None: no such counter):
        a tensor recorded twice in a step (a module's output is its parent's) is hashed once while it holds."""
        return None

    def model_device(self, model: Any) -> str:
        """Where the model's parameters are: "cpu" or "cuda"."""
        return "cpu"

    def distributed(self) -> tuple[int, int] | None:
        """(rank, world size) when the framework's distributed environment is initialized, else None."""
        return None


def outputs_in_order(result: Any, names: list[str]) -> tuple:
    """A forward's result as a tuple (a dict's values in its order), remembering the dict's keys in names."""
    if isinstance(result, dict):
        names[:] = list(result)
        return tuple(result.values())
    return result


def as_returned(result: Any, names: list[str]) -> Any:
    """Undo outputs_in_order: the dict the forward returned, or its single tensor."""
    if names:
        return dict(zip(names, result if isinstance(result, (tuple, list)) else (result,)))
    return result
