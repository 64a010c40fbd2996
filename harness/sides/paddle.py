"""Paddle side: paddlepaddle on CPU (this project's machines have no Paddle GPU build)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import paddle

from harness.case import Case
from harness.sides.common import SideOutput, base_environment, run_family


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


def environment() -> dict:
    return base_environment() | {
        "framework": "paddle " + paddle.__version__,
        "paddle": paddle.__version__,
        "paddle_commit": paddle.version.commit,
        "device": paddle.device.get_device(),
        "device_name": "cpu" if paddle.device.get_device() == "cpu" else paddle.device.cuda.get_device_name(),
        "cuda": paddle.version.cuda() if paddle.device.is_compiled_with_cuda() else None,
        "paddle_threads": paddle.base.core.get_num_threads() if hasattr(paddle.base.core, "get_num_threads") else None,
    }


def run(case: Case, side_name: str, arrays: dict[str, np.ndarray]) -> SideOutput:
    device = case.device_of(side_name)
    if device == "cuda" and not paddle.device.is_compiled_with_cuda():
        raise RuntimeError("Paddle on cuda is not available here (this paddlepaddle build is CPU only)")
    paddle.set_device("gpu" if device == "cuda" else "cpu")

    def to_tensor(array, requires_grad):
        tensor = to_framework(array)
        tensor.stop_gradient = not requires_grad
        return tensor

    output = run_family(case, case.sides[side_name], arrays, to_tensor, to_numpy, backward,
                        grad_of=lambda t: t.grad)
    output.environment = environment()
    return output
