"""Tensor digests: MD5 of the raw C-order little-endian bytes, with dtype and shape beside it.

MD5 is the digest users see and baselines keep. A dump also records XXH3-128 of the same bytes (tens of
times cheaper than MD5). Every check of stored bytes against their record (`verify` / `mismatches` all at once,
in threads; `StreamCheck` fed by the comparison's one pass over the bytes) hashes them with MD5 and with
every other hash the record holds (XXH3-128, fast64), and refuses the bytes unless each one agrees: the MD5
shown is then the MD5 of the bytes, and a record edited in any one hash is caught. Older dumps, without
XXH3, are checked by MD5 alone.

A tensor a capture recorded with hash="fast" (digest only, never stored) has fast64
(harness.store.fast_hash) instead of MD5. Two digests are equal when dtype and shape agree and so does
a hash both record: MD5 where both have it, else fast64; two digests that share no hash are never equal
(`comparable` tells that case apart). A digest-only tensor (stored: false) has no bytes: it is shown as
recorded, and there is nothing to verify it against.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from harness.dtypes import dtype_name, unsigned_view
from harness.store.fast_hash import fast64
from harness.store.stats import tensor_stats

_PARALLEL_BYTES = 1 << 20  # below this in all, hashing in threads costs more than it saves


@dataclass(frozen=True, eq=False)
class Digest:
    dtype: str
    shape: tuple[int, ...]
    md5: str | None  # None only for a tensor captured with hash="fast" (then fast64 is set)
    # Not part of a digest's identity: older dumps and goldens do not record it.
    xxh3: str | None = field(default=None)
    fast64: str | None = field(default=None)  # harness.store.fast_hash, where recorded

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Digest):
            return NotImplemented
        if self.dtype != other.dtype or tuple(self.shape) != tuple(other.shape):
            return False
        kind = self.shared_hash(other)
        return kind is not None and getattr(self, kind) == getattr(other, kind)

    def __hash__(self) -> int:
        return hash((self.dtype, tuple(self.shape)))

    def shared_hash(self, other: Digest) -> str | None:
        """The hash both record, by which they are compared: "md5", else "fast64"; None: none."""
        if self.md5 is not None and other.md5 is not None:
            return "md5"
        if self.fast64 is not None and other.fast64 is not None:
            return "fast64"
        return None

    @property
    def label(self) -> str:
        """The hash to show: the MD5, or (no MD5 recorded) "fast:" and the fast64."""
        return self.md5 if self.md5 is not None else f"fast:{self.fast64}"

    @classmethod
    def of(cls, array: np.ndarray, xxh3: bool = True) -> Digest:
        """The digest of `array`; with `xxh3=False`, MD5 only (what is not checked on a later read,
        such as an input's digest, needs no XXH3)."""
        return digests_of({"": array}, xxh3=xxh3)[""]

    def to_json(self, xxh3: bool = False) -> dict:
        """dtype, shape and MD5 (fast64 where recorded); with `xxh3`, the XXH3-128 too (as a dump records it)."""
        data: dict = {"dtype": self.dtype, "shape": list(self.shape)}
        if self.md5 is not None:
            data["md5"] = self.md5
        if xxh3 and self.xxh3 is not None:
            data["xxh3"] = self.xxh3
        if self.fast64 is not None:
            data["fast64"] = self.fast64
        return data

    @classmethod
    def from_json(cls, data: dict) -> Digest:
        if data.get("md5") is None and data.get("fast64") is None:
            raise KeyError("md5")
        return cls(data["dtype"], tuple(data["shape"]), data.get("md5"), data.get("xxh3"), data.get("fast64"))


def _raw(array: np.ndarray) -> np.ndarray:
    # ml_dtypes arrays don't export a buffer: hash the bytes as unsigned integers of the same width
    return unsigned_view(array).reshape(-1).view(np.uint8)


def _md5(raw: np.ndarray) -> str:
    return hashlib.md5(raw.data).hexdigest()  # .data: the array's own buffer (1-D uint8), the same bytes


def _xxh3(raw: np.ndarray) -> str:
    return xxhash.xxh3_128(raw.data).hexdigest()


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


def digests_of(arrays: Mapping[str, np.ndarray], threads: int | None = None, xxh3: bool = True) -> dict[str, Digest]:
    """MD5 and XXH3-128 (with `xxh3=False`: MD5 only) of every array, the hashes running in parallel
    threads: one task per hash of a tensor, the longest first, so that the big tensors' MD5 (one
    sequential stream each) start at once while the small ones fill the other threads."""
    hashers = (_md5, _xxh3) if xxh3 else (_md5,)
    raws = {name: _raw(array) for name, array in arrays.items()}  # no copy for a C-contiguous array
    order = sorted(raws, key=lambda name: -raws[name].nbytes)
    tasks = [lambda raw=raws[name], h=h: h(raw) for name in order for h in hashers]
    hashes = iter(_run(tasks, sum(raw.nbytes for raw in raws.values()), threads))
    found = {name: tuple(next(hashes) for _ in hashers) for name in order}
    return {name: Digest(dtype_name(array.dtype), tuple(int(n) for n in array.shape), *found[name])
            for name, array in arrays.items()}


_PIECE = 1 << 20  # bytes fed to each hasher in turn: MD5 reads them from memory, XXH3 from the cache


def _hashers(digest: Digest) -> dict[str, Any]:
    """A fresh hasher for MD5 (always: the digest shown) and for XXH3-128 where the record holds it."""
    hashers: dict[str, Any] = {"MD5": hashlib.md5()}
    if digest.xxh3 is not None:
        hashers["XXH3-128"] = xxhash.xxh3_128()
    return hashers


def _feed(hashers: dict[str, Any], data: memoryview) -> None:
    """Every hasher fed `data`, a piece at a time (each hasher releases the GIL while it hashes)."""
    for start in range(0, len(data), _PIECE):
        piece = data[start:start + _PIECE]
        for hasher in hashers.values():
            hasher.update(piece)


def _layout_mismatch(array: np.ndarray, digest: Digest) -> str | None:
    if not _dtype_is(array.dtype, digest.dtype):
        try:
            found = dtype_name(array.dtype)
        except ValueError:
            found = str(array.dtype)
        return f"dtype {found} does not match the recorded {digest.dtype}"
    if tuple(array.shape) != tuple(digest.shape):
        return f"shape {list(array.shape)} does not match the recorded {list(digest.shape)}"
    return None


def _hash_mismatch(array: np.ndarray, digest: Digest, hashers: dict[str, Any]) -> str | None:
    """What the record gets wrong, given the hashers fed all of `array`'s bytes (None: nothing)."""
    if digest.md5 is None:  # stored bytes always have an MD5 (a dump's schema refuses one without)
        return "bytes have no recorded MD5"
    recorded = {"MD5": digest.md5, "XXH3-128": digest.xxh3}
    wrong = [name for name, hasher in hashers.items() if hasher.hexdigest() != recorded[name]]
    if digest.fast64 is not None:  # recorded beside the MD5 of a stored tensor: rare; hashed whole, here
        if fast64(array) != digest.fast64:
            wrong.append("fast64")
    return f"bytes do not match the recorded {' and '.join(wrong)}" if wrong else None


def mismatches(arrays: Mapping[str, np.ndarray], digests: Mapping[str, Digest],
               threads: int | None = None) -> dict[str, str]:
    """The arrays whose dtype, shape or bytes do not match their digest (in `arrays`' order), each with what
    disagrees: "bytes do not match the recorded MD5" (or XXH3-128, or both), "shape [..] does not match the
    recorded [..]", ...

    Bytes are checked by MD5 (the digest shown) and by XXH3-128 where the digest records it (the same pass
    over them, a piece at a time): a record whose MD5 or XXH3 disagrees with the bytes is refused either
    way. The arrays hash in parallel threads, the longest first (MD5 is one sequential stream per array).
    Every name in `arrays` must have a digest; names of `digests` without an array are not looked at (a
    digest-only tensor has no bytes to verify).
    """
    found = {name: _layout_mismatch(array, digests[name]) for name, array in arrays.items()}
    checked = sorted((name for name, problem in found.items() if problem is None), key=lambda name: -arrays[name].nbytes)

    def check(name: str) -> str | None:
        hashers = _hashers(digests[name])
        _feed(hashers, _raw(arrays[name]).data)
        return _hash_mismatch(arrays[name], digests[name], hashers)

    tasks = [lambda name=name: check(name) for name in checked]
    found.update(zip(checked, _run(tasks, sum(arrays[name].nbytes for name in checked), threads)))
    return {name: problem for name, problem in found.items() if problem is not None}


def verify(arrays: Mapping[str, np.ndarray], digests: Mapping[str, Digest], threads: int | None = None) -> list[str]:
    """Names (in `arrays`' order) of the arrays whose dtype, shape or bytes do not match their digest:
    `mismatches`' names (MD5 always checked, XXH3-128 too where recorded)."""
    return list(mismatches(arrays, digests, threads))


class StreamCheck:
    """The check of one array's bytes against its recorded digest (MD5, and XXH3-128 where recorded: see
    `mismatches`), fed in order, piece by piece, by the threads of a pass that reads the bytes anyway (the
    comparison's one pass, harness.compare.metrics): a thread calls `advance(stop)` once it has read the
    elements before `stop`; whichever thread finds the stream idle hashes every byte asked for so far, while
    the others go on (nobody waits on a lock held for hashing). `mismatch()` / `matches()`, once the pass is
    over, hash what is left and say what disagrees / whether the bytes are those recorded; a dtype or shape
    that disagrees with the record never matches."""

    def __init__(self, array: np.ndarray, digest: Digest):
        self.digest = digest
        self._array = array
        self._layout = _layout_mismatch(array, digest)
        self._raw = _raw(array)
        self._itemsize = array.itemsize
        self._hashers = _hashers(digest)
        self._state = threading.Lock()
        self._hashed = self._wanted = 0
        self._busy = False
        self._result: str | None = None
        self._done = False

    def advance(self, stop: int) -> None:
        """Elements [0, stop) have been read: hash them, unless another thread is hashing (it takes
        them on)."""
        with self._state:
            self._wanted = max(self._wanted, stop * self._itemsize)
            if self._busy:
                return
            self._busy = True
        while True:
            with self._state:
                start, end = self._hashed, self._wanted
                if start >= end:
                    self._busy = False
                    return
            _feed(self._hashers, self._raw.data[start:end])
            with self._state:
                self._hashed = end

    @property
    def unfed_bytes(self) -> int:
        """Bytes not hashed yet (all of them where no pass fed the check)."""
        return self._raw.size - self._hashed if self._layout is None and not self._done else 0

    def mismatch(self) -> str | None:
        """What disagrees with the record, as `mismatches` says it; None: the bytes are those recorded (call
        once the threads feeding it are done)."""
        if not self._done:
            if self._layout is None:
                self.advance(self._raw.size // self._itemsize if self._itemsize else 0)
                assert self._hashed == self._raw.size
                self._result = _hash_mismatch(self._array, self.digest, self._hashers)
            else:
                self._result = self._layout
            self._done = True
        return self._result

    def matches(self) -> bool:
        """Whether the bytes are those recorded (call once the threads feeding it are done)."""
        return self.mismatch() is None


def digest_entry(array: np.ndarray) -> dict:
    """An unstored tensor's entry of a dump (Dump.unstored): dtype, shape, MD5, XXH3 and stats."""
    digest = digests_of({"": array}, threads=1)[""]  # one thread: this already runs on the capture's pool
    return {**digest.to_json(xxh3=True), "stats": tensor_stats(array)}
