"""Megatron's model-parallel state for implementations that read their groups from parallel_state: at TP=1 a
one-process torch.distributed group of its own; at TP=N the world of N rank workers xfalign started for the
case (torch.distributed already joined by each rank's worker). Imported only by those (in a worker)."""

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


@contextmanager
def model_parallel_group(device: str, tensor_parallel: int = 1) -> Iterator[None]:
    """Megatron's parallel state for TP=`tensor_parallel` (PP=CP=1). At TP>1 it is made on the rank workers'
    world once and kept: the next case of that size, on the same workers, reuses it."""
    if tensor_parallel == 1:
        with one_process_group(device):
            yield
        return
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    if world != tensor_parallel:
        raise RuntimeError(f"tensor_parallel {tensor_parallel} runs on a world of {tensor_parallel} ranks; this "
                           f"worker's world has {world}")
    if not (parallel_state.model_parallel_is_initialized()
            and parallel_state.get_tensor_model_parallel_world_size() == tensor_parallel):
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(tensor_parallel, 1, create_gloo_process_groups=False)
    yield


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
