"""MoE combine (unpermute): expert outputs in expert-major order back to tokens, optionally times probs.

Signature of every implementation, built-in or user:

    fn(expert_out, probs, routing_map, logits, options) -> {"out": ..., ...}   (or just out)

expert_out is [N*topk, H] in `permute`'s order (expert-major, tokens ascending within an expert);
routing_map is [N, E] bool and probs [N, E] (routing: map), or both are None and logits [N, E] is given
(routing: router, each side routes with its own top-k softmax and returns "routing.probs" and
"routing.map" beside "out"). options: topk, apply_probs, deterministic, routing, empty_experts.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from harness.case import Case
from harness.ops.family import OpFamily
from harness.schema import FieldProblem, Strict


class MoeCombineOptions(Strict):
    topk: int = Field(ge=1)
    routing: Literal["map", "router"] = "map"
    apply_probs: bool = True  # probs applied in unpermute (before mcore 0.13) or by the experts (since)
    deterministic: bool = False  # deterministic algorithms (Megatron: index_add_ instead of scatter_add_)
    empty_experts: int = Field(0, ge=0)  # experts that receive no token (routing: map)

    @model_validator(mode="after")
    def _combination(self) -> MoeCombineOptions:
        if self.routing == "router" and self.empty_experts:
            raise FieldProblem(("options", "empty_experts"), "empty_experts needs routing: map (a router picks its own experts)")
        return self


class MoeCombineFamily(OpFamily):
    name = "moe_combine"
    options_model = MoeCombineOptions
    variants = {"megatron": ("megatron",), "paddle": ("default", "fp32_accumulate", "gather_sum")}
    implementations = {"megatron": "harness.ops.moe_combine.megatron:MoeCombineMegatron",
                       "paddle": "harness.ops.moe_combine.paddle:MoeCombinePaddle"}
    reference = {"megatron": "harness.ops.moe_combine.megatron:moe_combine_reference"}
    signature = ("expert_out", "probs", "routing_map", "logits")
    working_inputs = ("expert_out", "grad_out")

    def forward_inputs(self, case: Case) -> list[str]:
        options = self.options(case)
        if options.routing == "router":
            return ["expert_out", "logits"]
        return ["expert_out"] + (["probs"] if options.apply_probs else []) + ["routing_map"]

    def deterministic(self, case: Case) -> bool:
        return self.options(case).deterministic

    def extra_outputs(self, case: Case) -> list[str]:
        return ["routing.probs", "routing.map"] if self.options(case).routing == "router" else []

    def tensor_axes(self, case: Case) -> dict[str, list[str]]:
        by_expert = ["token", "expert"]
        return {"out": ["token", "hidden"], "grad.expert_out": ["permuted row (expert-major)", "hidden"],
                "grad.probs": by_expert, "grad.logits": by_expert, "routing.probs": by_expert, "routing.map": by_expert}

    def validate_inputs(self, case: Case) -> None:
        options = self.options(case)
        grad = case.inputs["grad_out"].shape
        if len(grad) != 2:
            raise FieldProblem(("inputs", "grad_out", "shape"), "grad_out is [tokens, hidden]")
        tokens, hidden = grad
        scores = "logits" if options.routing == "router" else "routing_map"
        shape = case.inputs[scores].shape
        if len(shape) != 2 or shape[0] != tokens:
            raise FieldProblem(("inputs", scores, "shape"), f"{scores} must be [tokens={tokens}, experts], got {shape}")
        experts = shape[1]
        if options.topk > experts - options.empty_experts:
            raise FieldProblem(("options", "topk"), f"topk {options.topk} is more than the {experts - options.empty_experts} "
                               f"experts that can receive tokens ({experts} experts, {options.empty_experts} left empty)")
        expected = {"expert_out": [tokens * options.topk, hidden], "probs": [tokens, experts]}
        self.require(case, expected, dtype_of="expert_out", same_dtype=("grad_out",))
        if "routing_map" in case.inputs and case.inputs["routing_map"].dtype != "bool":
            raise FieldProblem(("inputs", "routing_map", "dtype"), "routing_map is bool")

    def generate_input(self, name: str, case: Case, rng) -> np.ndarray | None:
        if name != "routing_map":
            return None
        options = self.options(case)
        tokens, experts = case.inputs[name].shape
        # Leave the last `empty_experts` experts without tokens; pick topk distinct others per token,
        # in random (unsorted) order of preference.
        choices = np.argsort(rng.random((tokens, experts - options.empty_experts)), axis=1)[:, : options.topk]
        routing = np.zeros((tokens, experts), dtype=bool)
        np.put_along_axis(routing, choices, True, axis=1)
        return routing

