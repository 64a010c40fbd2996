"""A one-process torch.distributed group with Megatron's model-parallel state (TP=PP=CP=1), for Megatron
implementations that read their groups from parallel_state. Imported only by those (in a worker)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from megatron.core import parallel_state


class _Hold:
    """Inside `hold()`: the group one_process_group made, kept for the rest of the block."""

    active = False
    device: str | None = None
    world: object | None = None  # torch.distributed's default group at the time it was made


@contextmanager
def one_process_group(device: str) -> Iterator[None]:
    """gloo on CPU, nccl on GPU, torn down after (inside `hold()`: when the hold ends). Its rendezvous is an
    in-process HashStore: no port, no environment variable left behind (the long-lived worker that runs it
    serves the next case too)."""
    if _Hold.active and _Hold.device == device and holds_world():
        yield
        return
    release()  # a group held for another device
    torch.distributed.init_process_group("nccl" if device == "cuda" else "gloo", store=torch.distributed.HashStore(),
                                         rank=0, world_size=1)
    try:
        # Megatron's extra gloo duplicates of the data-parallel groups are unused here, and half the set-up time
        parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
    except BaseException:
        _teardown()
        raise
    if _Hold.active:
        _Hold.device, _Hold.world = device, torch.distributed.group.WORLD
        yield
        return
    try:
        yield
    finally:
        _teardown()


def holds_world() -> bool:
    """Whether torch.distributed's default group is the one a hold keeps."""
    return (_Hold.world is not None and torch.distributed.is_initialized()
            and torch.distributed.group.WORLD is _Hold.world)


@contextmanager
def hold() -> Iterator[None]:
    """Groups one_process_group makes inside the block are kept, and reused, until it ends: a worker's job
    that runs a Megatron side and then the case's float64 reference sets the group up once (about 0.1 s)."""
    _Hold.active = True
    try:
        yield
    finally:
        _Hold.active = False
        release()


def release() -> None:
    """Tear down the group a hold keeps (one made by other code is left alone)."""
    if holds_world():
        _teardown()
    _Hold.device = _Hold.world = None


def _teardown() -> None:
    parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
