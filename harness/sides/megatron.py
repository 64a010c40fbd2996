"""Megatron side: torch + megatron-core, on CPU or one CUDA GPU."""

from __future__ import annotations

import importlib.metadata

import ml_dtypes
import numpy as np
import torch

from harness.case import Case
from harness.sides.common import SideOutput, base_environment, run_family


def to_framework(array: np.ndarray, device: str) -> torch.Tensor:
    if array.dtype == ml_dtypes.bfloat16:
        tensor = torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(array.copy())
    return tensor.to(device)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def backward(outputs: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    torch.autograd.backward(outputs, grads)


def environment(device: str) -> dict:
    env = base_environment() | {
        "framework": "torch " + torch.__version__,
        "torch": torch.__version__,
        "megatron_core": importlib.metadata.version("megatron-core"),
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "cuda": torch.version.cuda,
        "torch_threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }
    if device == "cuda":
        env["allow_tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    return env


def run(case: Case, side_name: str, arrays: dict[str, np.ndarray]) -> SideOutput:
    device = case.device_of(side_name)
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("case asks for cuda but torch sees no GPU")

    def to_tensor(array, requires_grad):
        return to_framework(array, device).requires_grad_(requires_grad)

    output = run_family(case, case.sides[side_name], arrays, to_tensor, to_numpy, backward,
                        grad_of=lambda t: t.grad)
    output.environment = environment(device)
    return output
