"""Digests of tensors at hand together (a step's parameters as its forward pass ends, with the hooks' tensors
deferred to then; their gradients at its end, with the backward pass's; the optimizer's states): the small ones of
one device, stream and dtype read where they are by one launch of `grouped_digest` over their addresses
(triton_digest.Group.in_place), no copy into an arena, no launch each.

A training step hands over lists of the same make every step (parameters, gradients, optimizer states: the same
dtypes and shapes; the same tensors, or new ones such as gradients made by each backward pass). So what a list
makes (which tensors are grouped, by dtype; which need a contiguous copy, into buffers it keeps) is kept as a
`Plan`, keyed by each tensor's dtype, shape, contiguity and device (and the stream, and the settings its launches
depend on), and used again while the next list matches: per call that leaves a tuple and an address per tensor, the
copies, one launch per dtype (Triton's launcher called at once: triton_digest.GroupsLaunch) and a handle per
tensor. The groups' tables hold the tensors' places: a device's launch made for the addresses of a call is kept
(the last TABLES per plan and device) and launched again as it is when the same addresses come again (the kernel
resets each segment's arrival counter once done); other addresses make a new one (its tables: one transfer). A
list that does not match makes a new plan (the last PLANS are kept)."""

from __future__ import annotations

from typing import Any

from harness.frameworks import triton_digest
from harness.frameworks.triton_digest import _ALIGN, Group, GroupsLaunch, GroupSlot, Launched

PLANS = 16  # plans kept (a capture hands over a few lists per step: parameters, gradients, states)
TABLES = 4  # tables kept per plan and device, for the addresses they were made for
_PLANS: dict[tuple, Plan] = {}  # per tensor of a list its dtype, shape, contiguity and device -> its plan, oldest first
_DTYPE_FACTS: dict[Any, tuple[tuple[int, bool, bool] | None, int]] = {}  # torch dtype -> (its _layout, element bytes)
# lists digested together (calls of batched_device_digests with tensors), plans made, tables made (per device and set
# of addresses): what scripts/bench_capture.py reports, to tell whether a training's lists reuse their plans
COUNTS = {"lists": 0, "plans": 0, "tables": 0}


class Batch:
    """The tensors of a list that one launch of `grouped_digest` reads: their indices in the list, and per tensor the
    contiguous buffer it is copied into each call (None: read in place); `group` their rows but their places
    (triton_digest.Group.in_place), placed per set of addresses."""

    def __init__(self, group: Group, indices: list[int], buffers: list[Any]):
        self.group, self.indices, self.buffers = group, indices, buffers

    def reads(self, tensors) -> list[Any]:
        """What it reads of `tensors`: each tensor, or its buffer."""
        return [tensors[i] if buffer is None else buffer for i, buffer in zip(self.indices, self.buffers, strict=True)]


class Plan:
    """A list of tensors' batches (per device), launched on each list that has its key (the dtypes, shapes,
    contiguity and devices of its tensors: the key `_PLANS` finds it by), and per device the launches made for the
    addresses seen last (TABLES of them: a capture's parameters and gradients share a plan).
    facts: whatever the caller keeps per tensor with it (valid as long as the key matches), set by the caller."""

    def __init__(self, settings: tuple, streams: list[tuple[int, int]]):
        self.settings, self.streams = settings, streams
        self.devices: list[list[Batch]] = []  # the batches of each device
        self.live: list[list[int]] = []  # per device: the indices of the tensors its batches read in place, in order
        # per device: the indices of the tensors its batches read, in the order of the rows of its launch's block
        self.rows: list[list[int]] = []
        # per device: those tensors' addresses -> the launch of its groups placed there (triton_digest.GroupsLaunch:
        # holds no tensor of the caller's) and what each group's lowest member is (the tensor's index, or the buffer
        # it is copied into)
        self.made: list[dict[tuple[int, ...], tuple[GroupsLaunch, list[tuple[int, Any]]]]] = []
        self.copied: list[int] = []  # the indices of the tensors copied each call, and the buffers they go into
        self.buffers: list[Any] = []
        self.facts: list | None = None

    def matches(self, settings: tuple) -> bool:
        return self.settings == settings and all(triton_digest.raw_stream(index) == stream
                                                 for index, stream in self.streams)

    def launch(self, tensors) -> list[GroupSlot | None] | None:
        """The contiguous copies, then each device's launch on these tensors (whose key is the plan's); the handles.
        None, launching nothing, where a tensor read in place does not start on a 16-byte boundary."""
        import torch

        launches = []
        for batches, live, made in zip(self.devices, self.live, self.made, strict=True):
            addresses = tuple([tensors[i].data_ptr() for i in live])
            kept = made.pop(addresses, None)  # put back last: the least recently used goes first
            if kept is None:
                kept = self._launch(batches, tensors)
                if kept is None:
                    return None
                COUNTS["tables"] += 1
                if len(made) >= TABLES:
                    del made[next(iter(made))]
            made[addresses] = kept
            launches.append(kept)
        if self.copied:  # detached: a copy from a tensor that requires grad would put the buffer into the graph
            torch._foreach_copy_(self.buffers, [tensors[i].detach() for i in self.copied])
        found: list[GroupSlot | None] = [None] * len(tensors)
        for (launch, lowest), indices in zip(launches, self.rows, strict=True):
            launched = Launched(launch([tensors[i] if buffer is None else buffer for i, buffer in lowest]), launch.device)
            for row, index in enumerate(indices):
                found[index] = GroupSlot(launched, row)
        return found

    @staticmethod
    def _launch(batches: list[Batch], tensors) -> tuple[GroupsLaunch, list[tuple[int, Any]]] | None:
        """The launch of a device's batches' groups placed at the addresses of `tensors` (and the buffers), and what
        each group's lowest member is; None where a tensor read in place does not start on a 16-byte boundary."""
        groups, lowest = [], []
        for batch in batches:
            group = batch.group.placed([tensor.data_ptr() for tensor in batch.reads(tensors)])
            if group is None:
                return None
            groups.append(group)
            lowest.append((batch.indices[group.lowest], batch.buffers[group.lowest]))
        return GroupsLaunch(groups, triton_digest.group_tables(groups)), lowest


def batched_device_digests(tensors: list) -> tuple[list[GroupSlot | None], Plan | None]:
    """The handles of the tensors' digests, launched now, and the plan that made them (None for no tensors): the
    small ones (at most triton_digest.route()[2]: BATCH_BYTES, none where grouping is off), not empty, of one
    device, stream and dtype, by one launch of `grouped_digest`; one that is not contiguous or does not start on a
    16-byte boundary (a transposed weight, a view) is read from a contiguous copy (the plan's, made now in stream
    order). None for the others (digested one by one by the caller: a large tensor reads faster by the fused
    kernel, whose grid is capped at the programs resident at once: H200, a layer's 4 weights of 32-172 MiB, 0.31 ms
    grouped against 0.16 ms)."""
    if not tensors:
        return [], None
    COUNTS["lists"] += 1
    # the whole list's key: a step hands over several lists (the forward pass's, the backward pass's, the optimizer's)
    key = tuple([(tensor.dtype, tensor.shape, tensor.is_contiguous(), tensor.get_device()) for tensor in tensors])
    # what a plan and its launches depend on besides its tensors: the largest grouped tensor, the kernel's settings
    settings = (triton_digest.route()[2], triton_digest.group_settings())
    kept = _PLANS.pop(key, None)  # put back last: the least recently used goes first
    found = kept.launch(tensors) if kept is not None and kept.matches(settings) else None
    if kept is not None and found is not None:
        plan = kept
    else:
        plan = _plan(tensors, key, settings)
        COUNTS["plans"] += 1
        while len(_PLANS) >= PLANS:
            del _PLANS[next(iter(_PLANS))]
        found = plan.launch(tensors)
        assert found is not None  # its tensors read in place start on 16-byte boundaries
    _PLANS[key] = plan
    return found, plan


def _plan(tensors: list, key: tuple, settings: tuple) -> Plan:
    import torch

    limit = settings[0]
    # (device index, raw stream, dtype) -> (layout, a tensor, [(the tensor's index, its elements, its buffer or None)])
    batches: dict[tuple, tuple[tuple[int, bool, bool], Any, list[tuple[int, int, Any]]]] = {}
    streams: dict[int, int] = {}  # device index -> its current raw stream
    copies = []
    for i, (tensor, (dtype, _, contiguous, index)) in enumerate(zip(tensors, key, strict=True)):
        layout, width = _DTYPE_FACTS.get(dtype) or _dtype_facts(tensor)
        n = tensor.numel()
        if layout is None or not n or n * width > limit:
            continue
        buffer = None
        if tensor.data_ptr() % _ALIGN or not contiguous:
            buffer = torch.empty(tensor.shape, dtype=dtype, device=tensor.device)  # the allocator's alignment
            if buffer.data_ptr() % _ALIGN:
                continue
            copies.append((i, buffer))
        if index not in streams:
            streams[index] = triton_digest.raw_stream(index)
        batches.setdefault((index, streams[index], dtype), (layout, tensor, []))[2].append((i, n, buffer))
    plan = Plan(settings, [(index, stream) for index, stream in streams.items() if index >= 0])
    plan.copied, plan.buffers = [i for i, _ in copies], [buffer for _, buffer in copies]
    by_device: dict[int, list[Batch]] = {}
    for batch_key, (layout, tensor, members) in batches.items():
        indices, counts, buffers = zip(*members, strict=True)
        group = Group.in_place(batch_key, tensor, counts, layout)
        by_device.setdefault(batch_key[0], []).append(Batch(group, list(indices), list(buffers)))
    plan.devices = list(by_device.values())
    plan.live = [[i for batch in batches for i, buffer in zip(batch.indices, batch.buffers, strict=True) if buffer is None]
                 for batches in plan.devices]
    plan.rows = [[i for batch in batches for i in batch.indices] for batches in plan.devices]
    plan.made = [{} for _ in plan.devices]
    return plan


def _dtype_facts(tensor) -> tuple[tuple[int, bool, bool] | None, int]:
    fact = _DTYPE_FACTS[tensor.dtype] = (triton_digest._layout(tensor), tensor.element_size())
    return fact
