"""A one-process torch.distributed group with Megatron's model-parallel state (TP=PP=CP=1), for Megatron
implementations that read their groups from parallel_state. Imported only by those (in a worker)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from megatron.core import parallel_state


@contextmanager
def one_process_group(device: str) -> Iterator[None]:
    """gloo on CPU, nccl on GPU, torn down after. Its rendezvous is an in-process HashStore: no port, no
    environment variable left behind (the long-lived worker that runs it serves the next case too)."""
    torch.distributed.init_process_group("nccl" if device == "cuda" else "gloo", store=torch.distributed.HashStore(),
                                         rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)
        yield
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()
