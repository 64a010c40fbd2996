"""Megatron side of MoE combine: real megatron-core `permute` (for the sorted indices), `unpermute`
and, with routing: router, `topk_routing_with_score_function`.

The float64 reference (`moe_combine_reference`) runs the same code on float64 tensors (the input bits widened
exactly). `unpermute` computes in its inputs' dtypes (`tokens * permuted_probs` in the promoted dtype,
`scatter_add_`/`index_add_` into zeros of that dtype, `.to(input_dtype)`), so there it is megatron-core's own
code. The router is not: `topk_routing_with_score_function` takes its softmax in fp32 whatever the logits'
dtype (`torch.softmax(scores, dim=-1, dtype=torch.float32).type_as(logits)`), so the reference writes that
softmax path out (top-k of the logits, softmax of the chosen ones, scattered into [tokens, experts]) in float64.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from megatron.core.transformer.moe.moe_utils import (
    permute,
    topk_routing_with_score_function,
    unpermute,
)

from harness.frameworks.torch import TorchAdapter
from harness.ops.family import Implementations, reference, variant
from harness.ops.moe_combine import MoeCombineFamily


def _provenance(options: dict) -> str:
    accumulate = "index_add_ (deterministic)" if options["deterministic"] else "scatter_add_"
    router = " after moe_utils.topk_routing_with_score_function(softmax)" if options["routing"] == "router" else ""
    return f"megatron-core: megatron.core.transformer.moe.moe_utils.unpermute ({accumulate}){router}"


def megatron_route(logits, topk: int):
    return topk_routing_with_score_function(logits, topk, score_function="softmax")


def combine(expert_out, probs, routing_map, logits, options: dict, route: Callable = megatron_route) -> dict:
    """Route (routing: router) with `route`, then megatron-core's permute (for the sorted indices) and unpermute."""
    outputs = {}
    if options["routing"] == "router":
        probs, routing_map = route(logits, options["topk"])
        outputs = {"routing.probs": probs, "routing.map": routing_map}
    tokens, hidden = routing_map.shape[0], expert_out.shape[-1]
    placeholder = torch.zeros(tokens, hidden, dtype=expert_out.dtype, device=expert_out.device)
    # permute returns 3 values in mcore 0.16 and 5 in 0.19 (which requires num_out_tokens)
    sorted_indices = permute(placeholder, routing_map, num_out_tokens=expert_out.shape[0])[:3][2]
    out = unpermute(expert_out, sorted_indices, torch.Size((tokens, hidden)),
                    probs=probs if options["apply_probs"] else None, routing_map=routing_map)
    return outputs | {"out": out}


class MoeCombineMegatron(Implementations, family=MoeCombineFamily, framework="megatron"):
    @variant(provenance=_provenance)
    @staticmethod
    def megatron(expert_out, probs, routing_map, logits, options):
        # options["deterministic"] is applied around forward and backward by the side (index_add_ instead of
        # scatter_add_ under torch.use_deterministic_algorithms)
        return combine(expert_out, probs, routing_map, logits, options)


def float64_route(logits, topk: int):
    """topk_routing_with_score_function(logits, topk, score_function="softmax") as megatron-core computes it
    (use_pre_softmax False, no groups, no scaling factor), its fp32 softmax taken in the logits' own dtype:
    float64 here. The scatter into zeros (index_put_ under deterministic algorithms) moves values unchanged."""
    scores, top_indices = torch.topk(logits, k=topk, dim=1)
    probs = torch.softmax(scores, dim=-1)
    routing_probs = torch.zeros_like(logits).scatter(1, top_indices, probs)
    routing_map = torch.zeros_like(logits).int().scatter(1, top_indices, 1).bool()
    return routing_probs, routing_map


def _reference_provenance(options: dict) -> str:
    text = f"float64 reference: {_provenance(options)}, run eagerly on float64 tensors"
    if options["routing"] == "router":
        text += ("; the router is xfalign's float64 formula of topk_routing_with_score_function's softmax path "
                 "(torch.topk, softmax of the chosen logits in float64 instead of megatron-core's fp32, scatter) "
                 "(harness/ops/moe_combine/megatron.py float64_route)")
    return text


@reference(provenance=_reference_provenance, source=lambda options: unpermute)
def moe_combine_reference(expert_out, probs, routing_map, logits, options):
    # The reference runs with deterministic algorithms off; the deterministic option takes index_add_ here as on
    # the side (the backward of scatter_add_ / index_add_ is a gather, which sums nothing: the forward suffices).
    with TorchAdapter().deterministic(options["deterministic"]):
        return combine(expert_out, probs, routing_map, logits, options, route=float64_route)
