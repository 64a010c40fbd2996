"""Example of user code on the Paddle side: Paddle's own SwiGLU kernel (paddle.incubate.nn.functional.swiglu),
run in fp32 because Paddle 3.3.1 has no CPU bf16 SwiGLU kernel. Signature of the SwiGLU family:
fn(x, bias, probs, options) -> out."""

import paddle
from paddle.incubate.nn.functional import swiglu


def swiglu_kernel_fp32(x, bias, probs, options):
    return swiglu(x.cast(paddle.float32)).cast(x.dtype)
