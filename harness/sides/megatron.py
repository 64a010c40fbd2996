"""Megatron side: torch + megatron-core, on CPU or one CUDA GPU."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

from harness import fingerprint
from harness.case import Case
from harness.numerics import NumericsProfile, apply_torch, environment_class
from harness.ops import NotAvailable, family_for
from harness.sides.common import SideOutput, run_family


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


def run(case: Case, side_name: str, arrays: dict[str, np.ndarray], profile: NumericsProfile) -> SideOutput:
    device = case.device_of(side_name)
    if device == "cuda" and not torch.cuda.is_available():
        raise NotAvailable("case asks for cuda but torch sees no GPU")  # a result (N/A), not a crash
    apply_torch(profile)

    def to_tensor(array, requires_grad):
        return to_framework(array, device).requires_grad_(requires_grad)

    # The family's settings hold for forward and backward, as in a training run, and are read there.
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(family_for(case.op).deterministic(case))
    try:
        output = run_family(case, case.sides[side_name], arrays, to_tensor, to_numpy, backward,
                            grad_of=lambda t: t.grad)
        runtime = fingerprint.torch_runtime(device)
    finally:
        torch.use_deterministic_algorithms(previous)
    output.environment = (fingerprint.common(profile.name) | fingerprint.torch_fields(device) | runtime
                          | {"environment_class": environment_class(profile, [device])})
    return output
