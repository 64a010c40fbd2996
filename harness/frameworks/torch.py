"""torch + megatron-core (`framework: megatron`): CPU or one CUDA GPU; execution modes compile and eager."""

from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from harness.fingerprint import cuda_library, nvidia_smi, version_of
from harness.frameworks.base import FrameworkAdapter, as_returned, outputs_in_order

INDUCTOR_CACHE = Path.home() / ".cache" / "xfalign" / "inductor"


class TorchAdapter(FrameworkAdapter):
    modes = ("compile", "eager")  # torch.compile (Megatron's jit_fuser) or eager (TORCHDYNAMO_DISABLE)
    default_impl = "megatron"
    tensor_kind = "a torch tensor"

    def before_import(self, profile, mode: str | None) -> None:
        super().before_import(profile, mode)
        if (mode or self.default_mode) == "eager":
            os.environ["TORCHDYNAMO_DISABLE"] = "1"
        else:
            os.environ.pop("TORCHDYNAMO_DISABLE", None)
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(INDUCTOR_CACHE))

    def apply_profile(self, profile) -> None:
        import torch

        pins = profile.torch
        if pins.mkldnn is not None:
            torch.backends.mkldnn.enabled = pins.mkldnn
        if pins.threads is not None:
            torch.set_num_threads(pins.threads)
        if pins.inductor_simdlen is not None:
            import torch._inductor.config as inductor_config

            inductor_config.cpp.simdlen = pins.inductor_simdlen

    def unavailable(self, device: str) -> str | None:
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            return "case asks for cuda but torch sees no GPU"
        return None

    def reset(self) -> None:
        import torch

        torch.use_deterministic_algorithms(False)

    # -- tensors --------------------------------------------------------------------------------------

    def to_tensor(self, array: np.ndarray, device: str, requires_grad: bool):
        import ml_dtypes
        import torch

        if array.dtype == ml_dtypes.bfloat16:  # numpy has no bf16: move the bits as int16
            tensor = torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array.copy())
        return tensor.to(device).requires_grad_(requires_grad)

    def to_numpy(self, tensor) -> np.ndarray:
        import ml_dtypes
        import torch

        tensor = tensor.detach().cpu().contiguous()
        if tensor.dtype == torch.bfloat16:
            return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return tensor.numpy()

    def tensor_type(self) -> type:
        import torch

        return torch.Tensor

    def backward(self, outputs: list, grads: list) -> None:
        import torch

        torch.autograd.backward(outputs, grads)

    def grad_of(self, tensor):
        return tensor.grad

    def tracks_grad(self, tensor) -> bool:
        return bool(getattr(tensor, "requires_grad", False))

    def custom_function(self, forward, backward):
        import torch

        names: list[str] = []

        class UserFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, options, *inputs):
                ctx.options = options
                ctx.save_for_backward(*inputs)
                return outputs_in_order(forward(*inputs, options), names)

            @staticmethod
            def backward(ctx, *grads):
                return (None, *backward(*grads, *ctx.saved_tensors, ctx.options))

        def apply(*args):
            *inputs, options = args
            return as_returned(UserFunction.apply(options, *inputs), names)

        return apply

    @contextmanager
    def deterministic(self, enabled: bool):
        import torch

        previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(enabled)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(previous)

    # -- what decides the bits ------------------------------------------------------------------------

    def fingerprint(self, device: str, profile) -> dict:
        import torch

        fields = {
            "torch": torch.__version__,
            "megatron_core": version_of("megatron-core"),
            "device": device,
            "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_mkldnn_enabled": torch.backends.mkldnn.enabled,
            "onednn": _build_info(r"MKL-DNN v([\w.]+)"),
            "mkl": _build_info(r"Math Kernel Library Version ([\w.]+)"),
            "torch_threads": torch.get_num_threads(),
        }
        if "torch._inductor.config" in sys.modules:
            from torch._inductor import config as inductor_config

            fields["inductor_simdlen"] = inductor_config.cpp.simdlen
        if "torch._inductor.cpu_vec_isa" in sys.modules and device == "cpu":
            from torch._inductor.cpu_vec_isa import pick_vec_isa

            fields["inductor_vec_isa"] = str(pick_vec_isa()) or "none"
        if device == "cuda":
            major, minor = torch.cuda.get_device_capability()
            fields |= {"compute_capability": f"{major}.{minor}", "driver": nvidia_smi("driver_version"),
                       "cuda": torch.version.cuda, "cublas": cuda_library("nvidia-cublas"),
                       "cudnn": torch.backends.cudnn.version()}
        mcore = fields["megatron_core"]
        fields["version_line"] = f"torch {torch.__version__}" + (f", megatron-core {mcore}" if mcore else "")
        return fields

    def runtime_fingerprint(self, device: str) -> dict:
        import torch

        fields = {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}
        if device == "cuda":
            matmul = torch.backends.cuda.matmul
            fields |= {"allow_tf32_matmul": matmul.allow_tf32, "allow_tf32_cudnn": torch.backends.cudnn.allow_tf32,
                       "float32_matmul_precision": torch.get_float32_matmul_precision(),
                       "bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
                       "fp16_reduced_precision_reduction": matmul.allow_fp16_reduced_precision_reduction,
                       "cudnn_deterministic": torch.backends.cudnn.deterministic,
                       "cudnn_benchmark": torch.backends.cudnn.benchmark}
        return fields


def _build_info(pattern: str) -> str | None:
    import torch

    match = re.search(pattern, torch.__config__.show())
    return match.group(1) if match else None
