"""torch CPU bits under ISA caps, with and without the pins of the portable-avx2 numerics profile.

    TAG=name [PIN=1] [SIMDLEN=256] [NOCOMPILE=1] [ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE ...] \
        python3 scripts/isa_probe_torch.py

Prints the MD5 (first 8 hex) of a bf16 GEMM and its two gradients, an fp32 GEMM and a torch.compile'd
row reduction. PIN=1 disables oneDNN and uses one thread; SIMDLEN sets inductor's vector width.
scripts/isa_probe_matrix.sh runs it under every cap, pinned and not.
"""
import hashlib
import os

import numpy as np
import torch

if os.environ.get("SIMDLEN"):
    import torch._inductor.config as ic

    ic.cpp.simdlen = int(os.environ["SIMDLEN"])
if os.environ.get("PIN") == "1":
    torch.backends.mkldnn.enabled = False
    torch.set_num_threads(1)
g = np.random.default_rng(0)


def bf(shape):
    return torch.from_numpy(g.normal(size=shape).astype(np.float32)).bfloat16()


x, w, go = bf((256, 512)), bf((384, 512)), bf((256, 384))
x.requires_grad_()
w.requires_grad_()
out = torch.matmul(x, w.t())
out.backward(go)
xf, wf = x.detach().float(), w.detach().float()
of = xf @ wf.t()


@torch.compile
def red(y, p):
    return torch.sum(torch.nn.functional.silu(y.float()) * p.float(), dim=-1)


r = red(bf((512, 1024)), bf((512, 1024))) if os.environ.get("NOCOMPILE") != "1" else torch.zeros(1)


def h(t):
    """MD5 (first 8 hex) of the tensor's bits."""
    bits = t.detach().contiguous().view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)
    return hashlib.md5(bits.numpy().tobytes()).hexdigest()[:8]


print(f"{os.environ.get('TAG'):40s} cap={torch.backends.cpu.get_cpu_capability():8s} "
      f"bf16mm={h(out)} gx={h(x.grad)} gw={h(w.grad)} fp32mm={h(of)} compiled_sum={h(r)}")
