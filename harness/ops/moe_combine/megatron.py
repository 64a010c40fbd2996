"""Megatron side of MoE combine: real megatron-core `permute` (for the sorted indices), `unpermute`
and, with routing: router, `topk_routing_with_score_function`."""

from __future__ import annotations

import torch
from megatron.core.transformer.moe.moe_utils import (
    permute,
    topk_routing_with_score_function,
    unpermute,
)

from harness.ops.family import Implementations, variant
from harness.ops.moe_combine import MoeCombineFamily


def _provenance(options: dict) -> str:
    accumulate = "index_add_ (deterministic)" if options["deterministic"] else "scatter_add_"
    router = " after moe_utils.topk_routing_with_score_function(softmax)" if options["routing"] == "router" else ""
    return f"megatron-core: megatron.core.transformer.moe.moe_utils.unpermute ({accumulate}){router}"


class MoeCombineMegatron(Implementations, family=MoeCombineFamily, framework="megatron"):
    @variant(provenance=_provenance)
    def megatron(expert_out, probs, routing_map, logits, options):
        outputs = {}
        if options["routing"] == "router":
            probs, routing_map = topk_routing_with_score_function(logits, options["topk"], score_function="softmax")
            outputs = {"routing.probs": probs, "routing.map": routing_map}
        tokens, hidden = routing_map.shape[0], expert_out.shape[-1]
        placeholder = torch.zeros(tokens, hidden, dtype=expert_out.dtype, device=expert_out.device)
        # permute returns 3 values in mcore 0.16 and 5 in 0.19 (which requires num_out_tokens)
        sorted_indices = permute(placeholder, routing_map, num_out_tokens=expert_out.shape[0])[:3][2]
        # options["deterministic"] is applied around forward and backward by the side (index_add_ instead of
        # scatter_add_ under torch.use_deterministic_algorithms)
        out = unpermute(expert_out, sorted_indices, torch.Size((tokens, hidden)),
                        probs=probs if options["apply_probs"] else None, routing_map=routing_map)
        return outputs | {"out": out}
