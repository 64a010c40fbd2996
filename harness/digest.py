"""Tensor digests: MD5 of the raw C-order little-endian bytes, with dtype and shape beside it.

MD5 is the digest users see and baselines keep. A dump also records XXH3-128 of the same bytes: about
50x cheaper, so that every read can check the bytes against the record (`verify`). Older dumps,
without it, are checked by MD5.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import xxhash

from harness.dtypes import dtype_name, unsigned_view

_PARALLEL_BYTES = 1 << 20  # below this in all, hashing in threads costs more than it saves


@dataclass(frozen=True)
class Digest:
    dtype: str
    shape: tuple[int, ...]
    md5: str
    # Not part of a digest's identity (excluded from ==): older dumps and goldens do not record it.
    xxh3: str | None = field(default=None, compare=False)

    @classmethod
    def of(cls, array: np.ndarray) -> Digest:
        return digests_of({"": array})[""]

    def to_json(self, xxh3: bool = False) -> dict:
        """dtype, shape and MD5; with `xxh3`, the XXH3-128 too (as a dump records it)."""
        data = {"dtype": self.dtype, "shape": list(self.shape), "md5": self.md5}
        if xxh3 and self.xxh3 is not None:
            data["xxh3"] = self.xxh3
        return data

    @classmethod
    def from_json(cls, data: dict) -> Digest:
        return cls(data["dtype"], tuple(data["shape"]), data["md5"], data.get("xxh3"))


def _raw(array: np.ndarray) -> np.ndarray:
    # ml_dtypes arrays don't export a buffer: hash the bytes as unsigned integers of the same width
    return unsigned_view(array).reshape(-1).view(np.uint8)


def _md5(array: np.ndarray) -> str:
    return hashlib.md5(_raw(array)).hexdigest()


def _xxh3(array: np.ndarray) -> str:
    return xxhash.xxh3_128(_raw(array)).hexdigest()


def _dtype_is(dtype: np.dtype, name: str) -> bool:
    try:
        return dtype_name(dtype) == name
    except ValueError:  # a dtype no dump holds
        return False


def _run(tasks: list, nbytes: int, threads: int | None) -> list:
    """Call every task, on a thread pool when there is enough to hash (hashlib and xxhash release
    the GIL)."""
    threads = threads or os.cpu_count() or 1
    if threads == 1 or len(tasks) <= 1 or nbytes < _PARALLEL_BYTES:
        return [task() for task in tasks]
    with ThreadPoolExecutor(min(threads, len(tasks))) as pool:
        futures = [pool.submit(task) for task in tasks]
        return [future.result() for future in futures]


def digests_of(arrays: Mapping[str, np.ndarray], threads: int | None = None) -> dict[str, Digest]:
    """MD5 and XXH3-128 of every array, the hashes running in parallel threads."""
    order = sorted(arrays, key=lambda name: -arrays[name].nbytes)  # longest first: best packing
    tasks = [lambda a=arrays[name], h=h: h(a) for name in order for h in (_md5, _xxh3)]
    hashes = iter(_run(tasks, sum(a.nbytes for a in arrays.values()), threads))
    found = {name: (next(hashes), next(hashes)) for name in order}
    return {name: Digest(dtype_name(array.dtype), tuple(int(n) for n in array.shape), *found[name])
            for name, array in arrays.items()}


def verify(arrays: Mapping[str, np.ndarray], digests: Mapping[str, Digest], threads: int | None = None) -> list[str]:
    """Names (in `arrays`' order) of the arrays whose dtype, shape or bytes do not match their digest.

    Bytes are checked by XXH3-128 where the digest records it, else by MD5. Every name in `arrays`
    must have a digest; names of `digests` without an array are not looked at.
    """
    def hash_of(array: np.ndarray, digest: Digest) -> tuple[str, str]:
        return (_xxh3(array), digest.xxh3) if digest.xxh3 is not None else (_md5(array), digest.md5)

    checked = [name for name, array in arrays.items()
               if _dtype_is(array.dtype, digests[name].dtype) and tuple(array.shape) == tuple(digests[name].shape)]
    tasks = [lambda name=name: hash_of(arrays[name], digests[name]) for name in checked]
    matching = {name for name, (found, recorded) in zip(checked, _run(tasks, sum(arrays[n].nbytes for n in checked), threads))
                if found == recorded}
    return [name for name in arrays if name not in matching]
