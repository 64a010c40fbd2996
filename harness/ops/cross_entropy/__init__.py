"""Vocab-parallel cross entropy: a language model's per-token loss, as megatron-core computes it with the vocabulary
split across tensor-parallel ranks (`megatron.core.tensor_parallel.vocab_parallel_cross_entropy`).

Signature of every implementation, built-in or user:

    fn(logits, target, options) -> loss

logits is [s, b, vocab] (Megatron's layout) or [tokens, vocab], bf16, fp16 or fp32; target is int64 of logits'
leading shape, in [0, vocab): the family draws it uniformly unless the case gives `dist: randint`. loss is fp32
per token whatever the logits' dtype (Megatron takes the logits to fp32 first), so its upstream gradient grad_out
is fp32 too. The harness captures loss and grad.logits (in the logits' dtype).

options: tensor_parallel (1, 2, 4: ranks the vocabulary is split across; Megatron runs that many ranks, each
holding vocab / tensor_parallel consecutive logits of every token), label_smoothing (Megatron's: alpha spread over
the vocab - 1 other tokens).

Float64 reference (`cross_entropy_reference`): megatron-core's own steps (VocabParallelCrossEntropy's static
methods) at TP=1 on float64 logits. Megatron's function itself accepts float64 logits but computes in fp32
(`calculate_logits_max` calls `.float()`), so it cannot be the reference as it is.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from harness.case import Case
from harness.ops.family import OpFamily
from harness.schema import FieldProblem, Strict
from harness.sharding import Sharding


class CrossEntropyOptions(Strict):
    tensor_parallel: Literal[1, 2, 4] = 1
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0)


class CrossEntropyFamily(OpFamily):
    name = "vocab_parallel_cross_entropy"
    options_model = CrossEntropyOptions
    signature = ("logits", "target")
    working_inputs = ("logits",)  # grad_out stays fp32: it is the upstream gradient of Megatron's fp32 loss
    upstream: ClassVar[dict[str, str]] = {"loss": "grad_out"}
    no_grad = ("target",)
    variants: ClassVar[dict[str, tuple[str, ...]]] = {
        "megatron": ("megatron",), "paddle": ("cross_entropy", "megatron_formula", "fleet_parallel")}
    implementations: ClassVar[dict[str, str]] = {
        "megatron": "harness.ops.cross_entropy.megatron:CrossEntropyMegatron",
        "paddle": "harness.ops.cross_entropy.paddle:CrossEntropyPaddle"}
    reference: ClassVar[dict[str, str]] = {"megatron": "harness.ops.cross_entropy.megatron:cross_entropy_reference"}

    def ranks(self, case: Case, framework: str) -> int:
        """Megatron runs one rank per vocabulary shard; the Paddle variants run in one process (megatron_formula
        emulates the split there; Paddle's own parallel cross entropy does not run on this CPU)."""
        return self.options(case).tensor_parallel if framework == "megatron" else 1

    def shardings(self, case: Case, framework: str) -> dict[str, Sharding]:
        """Each rank holds a vocabulary slice of the logits (and of their gradient); the target and the loss
        (after Megatron's all-reduces) are whole on every rank, and grad_out follows the loss."""
        if self.ranks(case, framework) == 1:
            return {}
        vocab = Sharding(axis=-1)
        return {"logits": vocab, "grad.logits": vocab, "target": Sharding(), "loss": Sharding()}

    def tensor_axes(self, case: Case) -> dict[str, list[str]]:
        if len(case.inputs["logits"].shape) == 3:
            return {"loss": ["sequence", "batch"], "grad.logits": ["batch", "vocab"]}
        return {"grad.logits": ["token", "vocab"]}

    def tensor_notes(self, case: Case) -> dict[str, str]:
        options = self.options(case)
        if options.tensor_parallel > 1 and options.label_smoothing > 0:
            return {"loss": "Megatron smooths with each rank's own vocabulary slice at TP > 1 (its size and its mean "
                            "log-probability; Megatron-LM issue #737): the ranks' losses differ, and the loss "
                            "compared is rank 0's"}
        return {}

    def validate_inputs(self, case: Case) -> None:
        options = self.options(case)
        logits = case.inputs["logits"]
        if len(logits.shape) not in (2, 3):
            raise FieldProblem(("inputs", "logits", "shape"), "logits is [s, b, vocab] or [tokens, vocab]")
        if logits.dtype not in ("bfloat16", "float16", "float32"):
            raise FieldProblem(("inputs", "logits", "dtype"), f"logits are bfloat16, float16 or float32, got {logits.dtype}")
        vocab, tokens = logits.shape[-1], logits.shape[:-1]
        self.require(case, {"target": tokens, "grad_out": tokens})
        if case.inputs["grad_out"].dtype != "float32":
            raise FieldProblem(("inputs", "grad_out", "dtype"), "grad_out is float32: the upstream gradient of "
                                                                "Megatron's loss, which is fp32 for any logits")
        target = case.inputs["target"]
        if target.dtype != "int64":
            raise FieldProblem(("inputs", "target", "dtype"), "target is int64 (token ids)")
        if target.dist == "randint" and not (target.low >= 0 and target.high <= vocab):
            raise FieldProblem(("inputs", "target"), f"target ids are in [0, vocab={vocab}), got randint "
                                                     f"[{target.low:g}, {target.high:g})")
        if vocab % options.tensor_parallel:
            raise FieldProblem(("options", "tensor_parallel"), f"vocab {vocab} does not split into "
                                                               f"{options.tensor_parallel} equal shards")
        if options.label_smoothing > 0 and vocab // options.tensor_parallel < 2:
            raise FieldProblem(("options", "label_smoothing"), "label smoothing needs at least 2 logits per rank "
                                                               "(Megatron divides by the slice's size - 1)")

    def generate_input(self, name: str, case: Case, rng) -> np.ndarray | None:
        spec = case.inputs[name]
        if name != "target" or spec.dist == "randint":
            return None
        return rng.integers(0, case.inputs["logits"].shape[-1], size=spec.shape, dtype=np.int64)
