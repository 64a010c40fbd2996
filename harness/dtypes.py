"""Dtype names used in cases and dumps, and their numpy / bit-level views."""

from __future__ import annotations

import ml_dtypes
import numpy as np

NUMPY_DTYPES: dict[str, np.dtype] = {
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "bool": np.dtype(np.bool_),
}
FLOAT_DTYPES = ("bfloat16", "float16", "float32", "float64")
INTEGER_DTYPES = ("int32", "int64")

_UNSIGNED: dict[int, type[np.unsignedinteger]] = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23, "float64": 52}


def dtype_name(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    for name, candidate in NUMPY_DTYPES.items():
        if candidate == dtype:
            return name
    raise ValueError(f"unsupported dtype {dtype}")


def to_numpy_dtype(name: str) -> np.dtype:
    try:
        return NUMPY_DTYPES[name]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; expected one of {sorted(NUMPY_DTYPES)}") from None


def unsigned_view(array: np.ndarray) -> np.ndarray:
    """The same bytes as unsigned integers of the element's width (no copy)."""
    return np.ascontiguousarray(array).view(_UNSIGNED[array.dtype.itemsize])


class FloatLayout:
    """Bit masks of one IEEE-style float format."""

    def __init__(self, name: str):
        itemsize = NUMPY_DTYPES[name].itemsize
        bits = itemsize * 8
        self.name = name
        self.uint = _UNSIGNED[itemsize]
        self.mantissa_bits = _MANTISSA_BITS[name]
        self.sign_mask = self.uint(1 << (bits - 1))
        self.magnitude_mask = self.uint((1 << (bits - 1)) - 1)
        self.exponent_mask = self.uint(((1 << (bits - 1)) - 1) ^ ((1 << self.mantissa_bits) - 1))
        self.inf_bits = self.exponent_mask
