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
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.spec_utils import build_module
from megatron.core.transformer.transformer_config import TransformerConfig

from harness.capture import capture
from harness.capture.tree import read_tree
from harness.ops.megatron_group import one_process_group


def layer(moe: bool) -> torch.nn.Module:
    extra = dict(num_moe_experts=4, moe_router_topk=2, moe_token_dispatcher_type="alltoall", moe_aux_loss_coeff=0.0) if moe else {}
    config = TransformerConfig(num_layers=1, hidden_size=256, ffn_hidden_size=512, num_attention_heads=4,
                               gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
                               bf16=True, params_dtype=torch.bfloat16, hidden_dropout=0.0, attention_dropout=0.0,
                               normalization="RMSNorm", **extra)
    spec = get_gpt_layer_local_spec(num_experts=4 if moe else None, moe_grouped_gemm=False, normalization="RMSNorm")
    return build_module(spec, config=config, layer_number=1).cuda()


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
