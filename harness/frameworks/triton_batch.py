"""Digests of tensors at hand together (a step's parameters as it begins, their gradients at its end, the
optimizer's states): the small ones of one device, stream and dtype read where they are by one launch of
`grouped_digest` over their addresses (triton_digest.Group.in_place), no copy into an arena, no launch each.

A training step hands over the same tensors every step (parameters, optimizer states, and gradients that live in
persistent buffers or come back at the same addresses from the caching allocator). So what a list of tensors
makes (its groups, their tables on the device, which tensors need a contiguous copy) is kept as a `Plan`, keyed
by each tensor's address, dtype, shape and contiguity, and launched again while the next list matches: per step
that leaves one tuple per tensor to compare, the contiguous copies, one launch per dtype and the handles. A list
that does not match makes a new plan (the last PLANS are kept). The kernel resets each segment's arrival counter
once the segment is done, so a plan's table is launched again as it is.
"""

from __future__ import annotations

from typing import Any

from harness.frameworks import triton_digest
from harness.frameworks.triton_digest import _ALIGN, Group, GroupSlot

PLANS = 16  # plans kept (a capture hands over a few lists per step: parameters, gradients, states)
_PLANS: dict[tuple, Plan] = {}  # (tensors, the first one's address) -> its plan, oldest first
_DTYPE_FACTS: dict[Any, tuple[tuple[int, bool, bool] | None, int]] = {}  # torch dtype -> (its _layout, element bytes)


class Plan:
    """A list of tensors' groups and their tables, launched on each list that has its `key`.
    facts: whatever the caller keeps per tensor with it (valid as long as the key matches), set by the caller."""

    def __init__(self, key: list[tuple], settings: tuple, streams: list[tuple[int, int]]):
        self.key, self.settings, self.streams = key, settings, streams
        # per device: [(its group, not launched; the tensors' indices, its segments' order; what it reads from:
        # the index of the tensor at the lowest address, or the contiguous copy there)], the groups' tables
        self.launches: list[tuple[list[tuple[Group, list[int], int | Any]], Any]] = []
        self.copies: list[tuple[int, Any]] = []  # (index, the contiguous buffer it is copied into each step)
        self.facts: list | None = None

    def matches(self, key: list[tuple], settings: tuple) -> bool:
        return self.key == key and self.settings == settings and all(
            triton_digest.raw_stream(index) == stream for index, stream in self.streams)

    def launch(self, tensors) -> list[GroupSlot | None]:
        """The contiguous copies, then each group's launch on these tensors (whose key is the plan's); the handles."""
        import torch

        if self.copies:
            with torch.no_grad():  # a copy from a tensor that requires grad would put the buffer into the graph
                for index, buffer in self.copies:
                    buffer.copy_(tensors[index])
        found: list[GroupSlot | None] = [None] * len(tensors)
        for same_device, table in self.launches:
            groups = [group.fresh(tensors[base].detach() if type(base) is int else base) for group, _, base in same_device]
            triton_digest.launch_on_device(groups, table)
            for group, (_, members, _) in zip(groups, same_device, strict=True):
                for segment, index in enumerate(members):
                    found[index] = GroupSlot(group, segment)
        return found


def batched_device_digests(tensors: list) -> tuple[list[GroupSlot | None], Plan | None]:
    """The handles of the tensors' digests, launched now, and the plan that made them (None for no tensors): the
    small ones (at most triton_digest.group_bytes()), not empty, of one device, stream and dtype, by one launch
    of `grouped_digest`; one that is not contiguous or does not start on a 16-byte boundary (a transposed weight, a
    view) is read from a contiguous copy (the plan's, made now in stream order). None for the others (digested
    one by one by the caller: a large tensor reads faster by the fused kernel, whose grid is capped at the programs
    resident at once: H200, a layer's 4 weights of 32-172 MiB, 0.31 ms grouped against 0.16 ms)."""
    if not tensors:
        return [], None
    key = [(tensor.data_ptr(), tensor.dtype, tensor.shape, tensor.is_contiguous()) for tensor in tensors]
    # what a plan's tables depend on besides its tensors: the largest grouped tensor, a program's tiles
    settings = (triton_digest.route()[1], triton_digest.ITEM_TILES, triton_digest.WARPS)
    name = (len(key), key[0][0])
    plan = _PLANS.get(name)
    if plan is None or not plan.matches(key, settings):
        plan = _plan(tensors, key, settings)
        _PLANS.pop(name, None)
        while len(_PLANS) >= PLANS:
            del _PLANS[next(iter(_PLANS))]
        _PLANS[name] = plan
    return plan.launch(tensors), plan


def _plan(tensors: list, key: list[tuple], settings: tuple) -> Plan:
    import torch

    limit = settings[0]
    # (device index, raw stream, dtype) -> (layout, [(the tensor's index, what is read: it or its copy, address,
    # elements)])
    batches: dict[tuple, tuple[tuple[int, bool, bool], list[tuple[int, Any, int, int]]]] = {}
    streams: dict[int, int] = {}  # device index -> its current raw stream
    copies = []
    for i, (tensor, (address, dtype, _, contiguous)) in enumerate(zip(tensors, key, strict=True)):
        layout, width = _DTYPE_FACTS.get(dtype) or _dtype_facts(tensor)
        n = tensor.numel()
        if layout is None or not n or n * width > limit:
            continue
        read = tensor
        if address % _ALIGN or not contiguous:
            read = torch.empty(tensor.shape, dtype=dtype, device=tensor.device)  # the allocator's alignment
            address = read.data_ptr()
            if address % _ALIGN:
                continue
            copies.append((i, read))
        index = tensor.get_device()
        if index not in streams:
            streams[index] = triton_digest.raw_stream(index)
        batches.setdefault((index, streams[index], dtype), (layout, []))[1].append((i, read, address, n))
    plan = Plan(key, settings, [(index, stream) for index, stream in streams.items() if index >= 0])
    plan.copies = copies
    copied = {i for i, _ in copies}
    by_device: dict[int, list[tuple[Group, list[int], int | Any]]] = {}
    for batch_key, (layout, members) in batches.items():
        indices, read, addresses, counts = zip(*members, strict=True)
        group = Group.in_place(batch_key, read, addresses, counts, layout)
        lowest = indices[group.lowest]
        group.arena = None  # the plan keeps no tensor of the caller's: each launch reads the one given then
        by_device.setdefault(batch_key[0], []).append((group, list(indices), read[group.lowest] if lowest in copied else lowest))
    plan.launches = [(same, triton_digest.group_tables([group for group, _, _ in same])) for same in by_device.values()]
    return plan


def _dtype_facts(tensor) -> tuple[tuple[int, bool, bool] | None, int]:
    fact = _DTYPE_FACTS[tensor.dtype] = (triton_digest._layout(tensor), tensor.element_size())
    return fact
