"""Paddle side: paddlepaddle on CPU (this project's machines have no Paddle GPU build)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import paddle

from harness import fingerprint
from harness.case import Case
from harness.numerics import NumericsProfile, apply_paddle, environment_class
from harness.ops import NotAvailable
from harness.sides.common import SideOutput, run_family


def to_framework(array: np.ndarray) -> paddle.Tensor:
    if array.dtype == ml_dtypes.bfloat16:
        return paddle.to_tensor(array.view(np.uint16))  # uint16 bits become a bf16 tensor
    return paddle.to_tensor(array)


def to_numpy(tensor: paddle.Tensor) -> np.ndarray:
    array = tensor.detach().numpy()
    if tensor.dtype == paddle.bfloat16:
        return array.view(ml_dtypes.bfloat16)
    return array


def backward(outputs, grads) -> None:
    paddle.autograd.backward(outputs, grads)


def run(case: Case, side_name: str, arrays: dict[str, np.ndarray], profile: NumericsProfile) -> SideOutput:
    device = case.device_of(side_name)
    if device == "cuda" and not paddle.device.is_compiled_with_cuda():  # a result (N/A), not a crash
        raise NotAvailable("Paddle on cuda is not available here (this paddlepaddle build is CPU only)")
    if device == "cuda" and paddle.device.cuda.device_count() == 0:
        raise NotAvailable("case asks for cuda but Paddle sees no GPU")
    paddle.set_device("gpu" if device == "cuda" else "cpu")
    apply_paddle(profile)

    def to_tensor(array, requires_grad):
        tensor = to_framework(array)
        tensor.stop_gradient = not requires_grad
        return tensor

    output = run_family(case, case.sides[side_name], arrays, to_tensor, to_numpy, backward,
                        grad_of=lambda t: t.grad)
    output.environment = (fingerprint.common(profile.name) | fingerprint.paddle_fields(device, profile.paddle.threads)
                          | {"environment_class": environment_class(profile, [device])})
    return output
