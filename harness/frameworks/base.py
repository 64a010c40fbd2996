"""What the harness needs from a framework. An adapter imports its framework inside its methods only, so
the parent process (case loading, comparison, reports) can use adapters without loading a framework."""

from __future__ import annotations

import fnmatch
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from pydantic import Field, StrictInt

from harness.schema import Strict
from harness.store.fast_hash import host_digests

if TYPE_CHECKING:
    from harness.store.fast_hash import PendingDigest

MAX_THREADS = 1024
Threads = Annotated[StrictInt, Field(ge=1, le=MAX_THREADS)]


class Pins(Strict):
    """A framework's section of a numerics profile (harness.numerics): the switches its adapter sets after
    import. A subclass adds the fields; None leaves a switch as the framework sets it."""


def names_matching(patterns: tuple[str, ...], names: list[str]) -> list[str]:
    """The names that match `patterns` (a name, or a prefix ending in `*`): in the patterns' order, each
    prefix's names sorted."""
    found = []
    for pattern in patterns:
        found += sorted(fnmatch.filter(names, pattern)) if pattern.endswith("*") else [pattern] * (pattern in names)
    return list(dict.fromkeys(found))


class FrameworkAdapter(ABC):
    name: str = ""  # the name cases use (`framework: ...`); set from the entry point
    modes: tuple[str, ...] = ()  # execution modes a side may ask for; the first is the default
    default_impl: str | None = None  # the variant a side without `impl` runs
    tensor_kind: str = "a tensor"  # for messages: "expected a torch tensor"
    # This framework's section of a numerics profile (`torch:`; "" for none) and the model that validates it.
    profile_section: str = ""
    pins: type[Pins] = Pins
    # Environment variables that decide this framework's bits (names, or prefixes ending in `*`): recorded in
    # every fingerprint.
    numeric_env: tuple[str, ...] = ()
    # Variables a worker sets before the framework's import that every case it serves keeps (cache folders),
    # whatever the case's own environment says.
    worker_env: tuple[str, ...] = ()
    # The fingerprint fields that hold this framework's versions, with the names a report shows them under.
    version_fields: Mapping[str, str] = {}

    @property
    def default_mode(self) -> str | None:
        return self.modes[0] if self.modes else None

    # -- process setup (the worker calls these in this order) ---------------------------------------

    def before_import(self, profile, mode: str | None) -> None:
        """Environment the framework reads when it loads: the profile's variables, then the adapter's."""
        os.environ.update(profile.env)

    @abstractmethod
    def apply_profile(self, profile) -> None:
        """The profile's switches that are set after import (threads, backends): `pins_of(profile)`."""

    def pins_of(self, profile) -> Any:
        """This framework's section of the numerics profile (a `pins` model)."""
        pins = getattr(profile, self.profile_section, None) if self.profile_section else None
        return pins if pins is not None else self.pins()

    @abstractmethod
    def unavailable(self, device: str) -> str | None:
        """Why this framework cannot run on `device` here (an N/A result), or None: the one place that decides
        whether a device can be used (a side on it is N/A otherwise)."""

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

    def held_for_follow_up(self) -> AbstractContextManager:
        """A worker runs a side and then its follow-up (the case's float64 reference) inside this: what the
        side set up that the follow-up reuses (a process group) is kept until it ends."""
        return nullcontext()

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
        """Framework fields of the environment fingerprint, its versions (`version_fields`) included."""

    def runtime_fingerprint(self, device: str) -> dict:
        """Settings an op may change while it runs: read right after its forward and backward."""
        return {}

    def version_line(self, fingerprint: Mapping) -> str | None:
        """The versions a fingerprint of this framework records, for a report's heading: "torch 2.9.0, ..."."""
        shown = [f"{name} {fingerprint[field]}" for field, name in self.version_fields.items() if fingerprint.get(field)]
        return ", ".join(shown) or None

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

    def unsupported_layout(self, tensor: Any) -> str | None:
        """The tensor's layout when no dump can hold it (e.g. "sparse"), checked before the tensor is read."""
        return None

    def float64_copy(self, model: Any) -> Any:
        """Widen `model`, a copy made for a float64 replay, to float64 in place (floating parameters and
        buffers), and return it."""
        raise NotImplementedError(f"{self.name}: no float64 widening")

    def no_grad_eager(self) -> AbstractContextManager:
        """A float64 replay's forward runs inside this: no autograd, and compiled functions run eagerly."""
        return nullcontext()

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

    def device_digests(self, tensors: list) -> list[PendingDigest | None]:
        """`device_digest` of tensors at hand together (a step's parameters, gradients, optimizer states), which an
        adapter may start in fewer launches. Those `host_layout` describes are digested in place by one compiled call
        (fast_hash.host_digests); the rest, and any that holds NaN or Inf, one by one."""
        layouts = {i: layout for i, tensor in enumerate(tensors) if (layout := self.host_layout(tensor)) is not None}
        found = dict(zip(layouts, host_digests(list(layouts.values())), strict=True))
        return [digest if (digest := found.get(i)) is not None else self.device_digest(tensor)
                for i, tensor in enumerate(tensors)]

    def batches(self, tensor: Any, nbytes: int) -> bool:
        """Whether `device_digests` takes the tensor (of nbytes) with others for less than one `device_digest` costs:
        a capture defers a hook's tensor to a batch only then (harness.capture.api, DEFER_BYTES)."""
        return True

    def host_layout(self, tensor: Any) -> tuple[int, str, tuple[int, ...]] | None:
        """(address, dtype name, shape) of a float32 or float64 tensor that is contiguous, not empty and in the
        host's memory, which `device_digests` may read in place; None for any other (the default)."""
        return None

    def fetch_digests(self, handles: list) -> Callable[[], np.ndarray]:
        """Start moving the values (fast_hash.SLOTS, float64) of the handles `device_digest` made to the host,
        together, without waiting; the function returned waits for them and gives one row per handle (the
        capture calls it once the device is done, or from its writer thread, so the training does not wait for the
        device). Where the function has a `ready()` method, it tells whether the values are there (no wait)."""
        raise NotImplementedError(f"{self.name}: no device digests")

    def tensor_version(self, tensor: Any) -> Hashable | None:
        """What changes on every in-place change of the tensor (None: nothing does): a counter the framework bumps,
        with whatever else tells a change it does not count. A tensor recorded twice in a step (a module's output is
        its parent's) is hashed once while it holds; a digest left to a later list reads the tensor only if it holds."""
        return None

    def optimizer_probe(self, optimizer: Any) -> OptimizerProbe | None:
        """What capture(..., optimizer=) reads of `optimizer` (an optimizer of this framework), None when this
        adapter does not know its kind."""
        return None

    def model_device(self, model: Any) -> str:
        """Where the model's parameters are: "cpu" or "cuda"."""
        return "cpu"

    def distributed(self) -> tuple[int, int] | None:
        """(rank, world size) when the framework's distributed environment is initialized, else None."""
        return None

    def join_world(self, rank: int, world: int, rendezvous: str, device: str) -> None:
        """Join the world of `world` rank workers (a side that runs on several ranks), meeting at the file
        `rendezvous`; kept for the worker's life (its next cases run in the same world)."""
        raise NotImplementedError(f"{self.name} does not run a side on several ranks here")


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


class OptimizerProbe(ABC):
    """An optimizer, as capture(..., optimizer=) sees it: a hook around its step, and after the step each
    parameter's consumed gradient and state, and the learning rates it used."""

    kind: str  # the optimizer's class name, for the capture's manifest

    @abstractmethod
    def hook(self, begins: Callable[[], None], ends: Callable[[float | None], None]) -> list[Callable[[], object]]:
        """Call begins() when a step of the optimizer starts and ends(reported_norm) when it has returned
        (reported_norm: the global gradient norm the step returned, None when it returns none); returns the
        functions that remove the hooks."""

    @abstractmethod
    def learning_rates(self) -> list[float]:
        """The learning rate of each parameter group, as the last step used it."""

    @abstractmethod
    def consumed_grad(self, param: Any) -> Any | None:
        """The gradient the last step applied to `param` (after the optimizer's own clipping), None: none."""

    @abstractmethod
    def states(self, param: Any) -> list[tuple[str, Any]]:
        """(state name, tensor) of `param`'s optimizer state after the last step, in the framework's order;
        names outside tree_format.STATE_ROLES are left to the caller to report."""


def wrap_method(owner: Any, name: str, wrapper: Callable[[Callable], Callable]) -> Callable[[], None]:
    """Replace `owner.name` on the instance by wrapper(the method as it was); returns the function that puts
    it back (or, where something wrapped it again since, leaves that in place: the wrapper then passes
    calls straight through)."""
    had_own = name in vars(owner)
    original = getattr(owner, name)
    inner = wrapper(original)
    active = True

    def wrapped(*args, **kwargs):
        return inner(*args, **kwargs) if active else original(*args, **kwargs)

    setattr(owner, name, wrapped)

    def restore() -> None:
        nonlocal active
        active = False
        if vars(owner).get(name) is wrapped:
            if had_own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)

    return restore
