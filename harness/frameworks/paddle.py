"""paddlepaddle (`framework: paddle`): CPU, and a GPU's fast digests written but never run (this project's
machines have no Paddle GPU build); no execution modes (dygraph) and no default implementation (a side names
its variant)."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import numpy as np

from harness.frameworks.base import FrameworkAdapter, Pins, Threads, as_returned, outputs_in_order
from harness.machine import nvidia_smi
from harness.store.fast_hash import HOST_BATCHED, PendingDigest

# Paddle switches a case may flip (deterministic kernels, oneDNN): saved before each case in a long-lived
# worker and put back after; a build that does not have one (CPU builds lack the cuDNN ones) skips it.
_CASE_FLAGS = ("FLAGS_cudnn_deterministic", "FLAGS_embedding_deterministic", "FLAGS_use_mkldnn", "FLAGS_use_onednn",
               "FLAGS_check_nan_inf")


def _readable_flags() -> dict:
    import paddle

    flags: dict[str, object] = {}
    for name in _CASE_FLAGS:
        try:
            flags |= paddle.get_flags([name])
        except (ValueError, KeyError):
            pass
    return flags


class PaddlePins(Pins):
    """A numerics profile's `paddle:` section."""

    threads: Threads | None = None  # paddle.base.core.set_num_threads


class PaddleAdapter(FrameworkAdapter):
    tensor_kind = "a paddle tensor"
    profile_section = "paddle"
    pins = PaddlePins
    numeric_env = ("FLAGS_*",)  # Paddle's switches (FLAGS_use_onednn, ...) set through the environment
    version_fields = {"paddle": "paddle"}

    def apply_profile(self, profile) -> None:
        import paddle

        pins: PaddlePins = self.pins_of(profile)
        if pins.threads is not None:
            paddle.base.core.set_num_threads(pins.threads)

    def unavailable(self, device: str) -> str | None:
        import paddle

        if device == "cuda" and not paddle.device.is_compiled_with_cuda():
            return "Paddle on cuda is not available here (this paddlepaddle build is CPU only)"
        if device == "cuda" and paddle.device.cuda.device_count() == 0:
            return "case asks for cuda but Paddle sees no GPU"
        return None

    def import_framework(self) -> None:
        import paddle  # noqa: F401

    def save_state(self) -> dict:
        import paddle

        return {"rng": paddle.get_rng_state(), "default_dtype": paddle.get_default_dtype(),
                "grad": paddle.is_grad_enabled(), "device": paddle.get_device(),
                "flags": _readable_flags()}

    def restore_state(self, state: dict) -> None:
        import paddle

        paddle.set_rng_state(state["rng"])
        paddle.set_default_dtype(state["default_dtype"])
        paddle.set_grad_enabled(state["grad"])
        paddle.set_device(state["device"])
        if state["flags"]:
            paddle.set_flags(state["flags"])

    def use_device(self, device: str) -> None:
        import paddle

        paddle.set_device("gpu" if device == "cuda" else "cpu")

    # -- tensors --------------------------------------------------------------------------------------

    def to_tensor(self, array: np.ndarray, device: str, requires_grad: bool):
        import ml_dtypes
        import paddle

        # on the device use_device set; uint16 bits become a bf16 tensor
        tensor = paddle.to_tensor(array.view(np.uint16) if array.dtype == ml_dtypes.bfloat16 else array)
        tensor.stop_gradient = not requires_grad
        return tensor

    def to_numpy(self, tensor) -> np.ndarray:
        import ml_dtypes
        import paddle

        array = tensor.detach().numpy()
        return array.view(ml_dtypes.bfloat16) if tensor.dtype == paddle.bfloat16 else array

    def tensor_type(self) -> type:
        import paddle

        return paddle.Tensor

    def backward(self, outputs: list, grads: list) -> None:
        import paddle

        paddle.autograd.backward(outputs, grads)

    def grad_of(self, tensor):
        return tensor.grad

    def tracks_grad(self, tensor) -> bool:
        return not tensor.stop_gradient

    def custom_function(self, forward, backward):
        import paddle

        names: list[str] = []

        class UserFunction(paddle.autograd.PyLayer):
            @staticmethod
            def forward(ctx, options, *inputs):
                ctx.options, ctx.inputs = options, inputs  # None inputs: kept as they are
                return outputs_in_order(forward(*inputs, options), names)

            @staticmethod
            def backward(ctx, *grads):
                gradients = backward(*grads, *ctx.inputs, ctx.options)
                # a PyLayer returns one gradient per tensor argument of forward
                return tuple(g for g, t in zip(gradients, ctx.inputs) if t is not None)

        def apply(*args):
            *inputs, options = args
            return as_returned(UserFunction.apply(options, *inputs), names)

        return apply

    # Paddle has no deterministic-algorithms switch to turn on here: the base class's no-op context.

    # -- capture inside models (harness.capture) -------------------------------------------------------

    def owns_model(self, model) -> bool:
        paddle = sys.modules.get("paddle")  # a model of Paddle's means Paddle is loaded already
        return paddle is not None and isinstance(model, paddle.nn.Layer)

    def named_modules(self, model) -> list:
        return list(model.named_sublayers(include_self=True))  # the model first (""), shared layers once

    def own_parameters(self, module) -> list:
        return list(module.named_parameters(include_sublayers=False))

    def unsupported_layout(self, tensor) -> str | None:
        # a sparse tensor's .numpy() crashes the process (Paddle's `layout` is a data layout, NCHW: not this)
        return "sparse" if tensor.is_sparse() else None

    def float64_copy(self, model):
        model.to(dtype="float64")
        return model

    @contextmanager
    def no_grad_eager(self):
        import paddle

        with paddle.no_grad():  # dygraph: eager already
            yield

    def load_parameter(self, param, array: np.ndarray) -> None:
        param.set_value(self.to_tensor(array, "cpu", False))

    def hook_module(self, module, before, after) -> list:
        handles = [module.register_forward_pre_hook(lambda m, args, kwargs: before(m, args, kwargs), with_kwargs=True),
                   module.register_forward_post_hook(lambda m, args, kwargs, out: after(m, args, kwargs, out),
                                                     with_kwargs=True)]
        return [handle.remove for handle in handles]

    def host_copy(self, tensor) -> np.ndarray:
        return self.to_numpy(tensor)  # Tensor.numpy() copies (from the device too)

    def tensor_version(self, tensor) -> int | None:
        return tensor.inplace_version

    # A CPU tensor's fast digest is numpy's of its host copy (harness.store.fast_hash, on the capture's thread
    # pool): measured faster than Paddle ops, which make full-size float64 and int64 temporaries
    # (scripts/bench_paddle_digest.py). A GPU tensor's is computed where it lives (harness.frameworks.paddle_digest:
    # DLPack into torch's fused kernel, else Paddle ops), with one transfer per step.
    digest_on_cpu = False  # True: Paddle ops on the CPU too (what a GPU without torch runs, testable here)

    def device_digest(self, tensor) -> PendingDigest | None:
        from harness.frameworks import paddle_digest

        if tensor.place.is_gpu_place():
            return paddle_digest.digest(tensor)
        if tensor.place.is_cpu_place() and self.digest_on_cpu:
            return paddle_digest.ops_digest(tensor)
        return None

    def host_layout(self, tensor) -> tuple[int, str, tuple[int, ...]] | None:
        # a step's CPU parameters, gradients and states read in place (no host copy each, hashed on the pool)
        if self.digest_on_cpu or not tensor.place.is_cpu_place() or not tensor.size or not tensor.is_contiguous():
            return None
        name = _HOST_BATCHED.get(str(tensor.dtype))
        return None if name is None else (tensor.data_ptr(), name, tuple(tensor.shape))

    def fetch_digests(self, handles: list):
        from harness.frameworks import paddle_digest

        return paddle_digest.fetch(handles)

    def optimizer_probe(self, optimizer):
        from harness.frameworks.paddle_optimizer import paddle_optimizer_probe

        return paddle_optimizer_probe(optimizer)

    def model_device(self, model) -> str:
        param = next(iter(model.parameters()), None)
        return "cuda" if param is not None and param.place.is_gpu_place() else "cpu"

    def distributed(self) -> tuple[int, int] | None:
        paddle = sys.modules.get("paddle")
        if paddle is None or not paddle.distributed.is_initialized():
            return None
        return paddle.distributed.get_rank(), paddle.distributed.get_world_size()

    # -- what decides the bits ------------------------------------------------------------------------

    def fingerprint(self, device: str, profile) -> dict:
        import paddle

        core = paddle.base.core
        threads = self.pins_of(profile).threads
        fields = {
            "paddle": paddle.__version__,
            "paddle_commit": paddle.version.commit,
            "device": device,
            "device_name": "cpu" if device == "cpu" else paddle.device.cuda.get_device_name(),
            "paddle_with_mkl": paddle.version.with_mkl,
            "paddle_onednn": core.is_compiled_with_onednn(),
            "paddle_cpu_avx512f": core.supports_avx512f(),
            "paddle_cpu_bf16": core.supports_bfloat16(),
            "paddle_threads": threads if threads is not None else "default",
        }
        if device == "cuda":
            fields |= {"cuda": paddle.version.cuda(), "cudnn": paddle.version.cudnn(),
                       "driver": nvidia_smi("driver_version")}
        return fields


_HOST_BATCHED = {f"paddle.{name}": name for name in HOST_BATCHED}  # a Paddle dtype's str -> the name host_digests reads
