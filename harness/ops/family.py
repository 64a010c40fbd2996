"""What every op family shares: input and side checks, and the names of captured tensors."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ValidationError

from harness.case import Case, FieldProblem
from harness.dtypes import FLOAT_DTYPES


class OpFamily:
    name: str
    paddle_variants: tuple[str, ...]
    megatron_variants: tuple[str, ...] = ("megatron",)
    upstream: dict[str, str] = {"out": "grad_out"}  # output name -> input holding its upstream gradient
    signature: tuple[str, ...]  # implementation's tensor parameters, in order (absent ones get None)
    working_inputs: tuple[str, ...]  # inputs in the working dtype (what a `dtype` sweep sets)
    # Layout adapter: inputs a framework takes transposed (same bits, last two dims swapped). Their
    # gradients are transposed back, so every tensor is compared in one layout (torch's).
    transposed: dict[str, tuple[str, ...]] = {}

    options_model: type[BaseModel]

    def parse_options(self, raw: dict):
        try:
            return self.options_model(**raw)
        except ValidationError as error:
            first = error.errors()[0]
            raise FieldProblem(("options",) + tuple(first["loc"]), first["msg"]) from None

    def options(self, case: Case):
        return self.parse_options(case.options)

    # -- per family -------------------------------------------------------------------------

    def forward_inputs(self, case: Case) -> list[str]:
        """Inputs passed to the implementation, in signature order (all differentiable)."""
        raise NotImplementedError

    def validate_inputs(self, case: Case) -> None:
        raise NotImplementedError

    def generate_input(self, name: str, case: Case, rng) -> np.ndarray | None:
        """Inputs the family makes itself (e.g. a routing map); None: the generic generator."""
        return None

    def grad_inputs(self, case: Case) -> list[str]:
        return [n for n in self.forward_inputs(case) if case.inputs[n].dtype in FLOAT_DTYPES]

    # -- shared -----------------------------------------------------------------------------
    @staticmethod
    def require(case: Case, shapes: dict[str, list[int]], dtype_of: str | None = None, same_dtype: tuple = ()) -> None:
        """Inputs present in the case must have these shapes, and those in same_dtype dtype_of's dtype."""
        for name, shape in shapes.items():
            spec = case.inputs.get(name)
            if spec is not None and spec.shape != shape:
                raise FieldProblem(("inputs", name, "shape"), f"{name} must have shape {shape}, got {spec.shape}")
        for name in same_dtype:
            spec = case.inputs.get(name)
            if spec is not None and spec.dtype != case.inputs[dtype_of].dtype:
                raise FieldProblem(("inputs", name, "dtype"), f"{name} must have {dtype_of}'s dtype {case.inputs[dtype_of].dtype}")

    def tensor_axes(self, case: Case) -> dict[str, list[str]]:
        """Names of a tensor's last two axes, where the op knows them (for heatmap labels)."""
        return {}

    def tensor_notes(self, case: Case) -> dict[str, str]:
        """What a reader must know to read a tensor's comparison (e.g. its layout)."""
        return {}

    def deterministic(self, case: Case) -> bool:
        """Whether the Megatron side runs under torch.use_deterministic_algorithms (forward and backward)."""
        return False

    def extra_outputs(self, case: Case) -> list[str]:
        """Forward outputs captured beside the differentiated ones (no upstream gradient)."""
        return []

    def tensor_names(self, case: Case) -> list[str]:
        """Captured tensors in forward -> backward order."""
        return list(self.upstream) + self.extra_outputs(case) + [f"grad.{n}" for n in self.grad_inputs(case)]

    def default_impl(self, framework: str) -> str | None:
        return "megatron" if framework == "megatron" else None

    def validate(self, case: Case) -> None:
        self.options(case)
        needed = self.forward_inputs(case) + list(self.upstream.values())
        for name in needed:
            if name not in case.inputs:
                raise FieldProblem(("inputs",), f"missing input {name!r} (this case needs {', '.join(needed)})")
        for name in case.inputs:
            if name not in needed:
                raise FieldProblem(("inputs", name), f"input {name!r} is not used by these options (needs {', '.join(needed)})")
        self.validate_inputs(case)
        for side_name, side in case.sides.items():
            variants = self.megatron_variants if side.framework == "megatron" else self.paddle_variants
            impl = side.impl or self.default_impl(side.framework)
            if impl is None:
                raise FieldProblem(("sides", side_name), f"impl is required: one of {', '.join(variants)} or module:function")
            if not side.is_user_function and impl not in variants:
                raise FieldProblem(("sides", side_name, "impl"),
                                   f"unknown {side.framework} implementation {impl!r}; built-in: {', '.join(variants)}")
        names = self.tensor_names(case)
        for name in case.expect.tensors:
            if name not in names:
                raise FieldProblem(("expect", "tensors", name), f"no tensor {name!r}; this case captures {', '.join(names)}")
