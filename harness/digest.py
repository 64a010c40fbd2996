"""Tensor digests: MD5 of the raw C-order little-endian bytes, with dtype and shape beside it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from harness.dtypes import dtype_name, unsigned_view


@dataclass(frozen=True)
class Digest:
    dtype: str
    shape: tuple[int, ...]
    md5: str

    @classmethod
    def of(cls, array: np.ndarray) -> Digest:
        raw = unsigned_view(array).view(np.uint8)  # ml_dtypes arrays don't export a buffer
        return cls(dtype_name(array.dtype), tuple(int(n) for n in array.shape),
                   hashlib.md5(raw).hexdigest())

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape), "md5": self.md5}

    @classmethod
    def from_json(cls, data: dict) -> Digest:
        return cls(data["dtype"], tuple(data["shape"]), data["md5"])
