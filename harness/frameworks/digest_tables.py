"""The fast64 tables (harness.store.fast_hash: the block weights W and the factors V) as int64 tensors (the
uint64 bits) on a device, made once per device and kept: used by the torch ops (harness.frameworks.torch) and
the fused kernel's launch (harness.frameworks.triton_digest)."""

from __future__ import annotations

import numpy as np

from harness.store import fast_hash

_CONSTANTS: dict = {}  # (device, table) -> W or V (int64, the uint64 bits) on that device


def device_table(device, name: str, count: int):
    import torch

    key = (str(device), name)
    table = _CONSTANTS.get(key)
    if table is None or table.numel() < count:
        values = fast_hash.block_weights() if name == "W" else fast_hash.block_factors(max(count, 1) * 2)
        table = torch.from_numpy(values.view(np.int64).copy()).to(device)
        _CONSTANTS[key] = table
    return table[:count]
