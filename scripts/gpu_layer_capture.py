"""Capture a megatron-core TransformerLayer (local spec: attention + MLP) and a MoE TransformerLayer on a
CUDA device, one training step each, in full and in digest mode: what does not run on CPU (see
examples/mlp_alignment/README.md) captured where it does. Prints each capture's records and tensors, and
whether the digest capture's MD5s equal the full capture's (the same step, run twice).

    python3 scripts/gpu_layer_capture.py OUT_DIR
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import torch
from bench_capture import build_layer
from megatron.core import tensor_parallel

from harness.capture import capture
from harness.frameworks.megatron_group import one_process_group
from harness.store.tree import read_tree


def layer(moe: bool) -> torch.nn.Module:
    return build_layer(256, 512, 4, moe, torch.bfloat16).cuda()


def step(model: torch.nn.Module, seed: int = 0) -> None:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(64, 2, 256, device="cuda", generator=generator).bfloat16().requires_grad_()
    output = model(x, attention_mask=None)
    output = output[0] if isinstance(output, tuple) else output
    output.float().square().mean().backward()


def main(out: Path) -> None:
    with one_process_group("cuda"):
        tensor_parallel.random.model_parallel_cuda_manual_seed(0)
        for name, moe in (("layer", False), ("moe_layer", True)):
            try:
                model = layer(moe)
                digests = {}
                for mode in ("full", "digest"):
                    model.zero_grad(set_to_none=True)
                    with capture(model, out / f"{name}-{mode}", mode=mode, provenance=f"scripts/gpu_layer_capture.py {name}") as cap:
                        step(model)
                        cap.step()
                    dump = read_tree(out / f"{name}-{mode}").step(0)
                    digests[mode] = {n: d.md5 for n, d in dump.digests.items()}
                    records = dump.meta["capture"]["records"]
                    print(f"{name} {mode}: {len(dump.meta['capture']['modules'])} modules, {len(records)} records, "
                          f"{len(digests[mode])} tensors, {len(dump.tensors)} stored")
                same = [n for n in digests["full"] if digests["digest"].get(n) == digests["full"][n]]
                print(f"{name}: {len(same)} of {len(digests['full'])} MD5s equal between the full and the digest run")
            except Exception:  # noqa: BLE001  (report and go on to the next model)
                print(f"{name}: FAILED")
                traceback.print_exc()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
