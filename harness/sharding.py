"""How a tensor is split across the ranks of a parallel group, and how the ranks' pieces go back together into
the canonical (one-rank) layout that is compared.

A `Sharding` says, for one tensor: along which axis each rank holds a piece (`axis`; None: every rank holds the
whole tensor, a replica), and how many blocks each rank's piece interleaves (`interleave`). Megatron's gated MLP
stores `linear_fc1.weight` per rank as `[gate_r; up_r]` (`[2*ffn/tp, h]`): interleave 2 along axis 0, so the
canonical `[gate; up]` is `[gate_0; gate_1; ...; up_0; up_1; ...]`, not the ranks' pieces one after another.

Replicas must be bit-identical on every rank (a row-parallel output after its all-reduce, its bias and the bias's
gradient): `assemble` returns rank 0's copy and the ranks whose bits differ from it, for the caller to report.

Expert parallelism adds three kinds. `ragged`: the pieces along `axis` may differ in length (the tokens each
rank's experts received, which the routing decides), concatenated in rank order. `reduce="sum"`: each rank
holds a partial sum of the canonical tensor (a replicated weight's gradient from the rank's own tokens, before
the data-parallel all-reduce), added up in rank order. `rename`: each rank's piece is a whole canonical tensor
of another name, `rename(rank)` (a rank's local expert l is the global expert rank * local count + l); the
caller (harness.store.ranks) files each piece under its name. These three cannot be cut from a canonical
tensor (`shard`): the routing decides the ragged lengths, a partial sum has no one split, and a renamed piece
is the canonical tensor `rename(rank)` itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from harness.errors import XfalignError


class ShardingError(XfalignError):
    """Pieces that cannot be put back together (a missing rank, shapes that do not line up)."""


@dataclass(frozen=True)
class Sharding:
    axis: int | None = None  # None: replicated on every rank
    interleave: int = 1  # blocks per rank's piece along `axis` (2 for a gated fc1's [gate_r; up_r])
    ragged: bool = False  # pieces of different lengths along `axis`, concatenated in rank order
    reduce: Literal["sum"] | None = None  # each rank holds a partial sum
    rename: Callable[[int], str] | None = None  # each rank's piece is the whole canonical tensor rename(rank)

    def __post_init__(self):
        if self.interleave < 1:
            raise ValueError(f"interleave must be >= 1, got {self.interleave}")
        if self.axis is None and (self.interleave != 1 or self.ragged):
            raise ValueError("a tensor split on no axis has no interleave and is not ragged")
        if self.ragged and self.interleave != 1:
            raise ValueError("ragged pieces are one block per rank (interleave 1)")
        if (self.reduce is not None or self.rename is not None) and self.axis is not None:
            raise ValueError("a partial sum or a renamed piece is not split on an axis")
        if self.reduce is not None and self.rename is not None:
            raise ValueError("a piece is a partial sum or a renamed whole tensor, not both")

    @property
    def replicated(self) -> bool:
        return self.axis is None and self.reduce is None and self.rename is None

    def describe(self) -> str:
        if self.reduce is not None:
            return f"partial {self.reduce} on each rank"
        if self.rename is not None:
            return "a whole tensor per rank, renamed (local experts)"
        if self.replicated:
            return "replicated"
        return (f"split on axis {self.axis}" + (", ragged" if self.ragged else "")
                + (f", {self.interleave} blocks per rank" if self.interleave > 1 else ""))

    def _axis(self, ndim: int) -> int:
        assert self.axis is not None
        if not -ndim <= self.axis < ndim:
            raise ShardingError(f"cannot split on axis {self.axis}: the tensor has {ndim} axes")
        return self.axis % ndim

    def shard(self, array: np.ndarray, rank: int, world: int) -> np.ndarray:
        """Rank `rank`'s piece of the canonical `array` (a copy)."""
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in a group of {world}")
        if self.replicated or world == 1:
            return array.copy()
        if self.ragged or self.reduce is not None or self.rename is not None:
            raise ShardingError(f"a rank's piece of a tensor that is {self.describe()} cannot be cut from the "
                                "canonical tensor")
        axis = self._axis(array.ndim)
        blocks = self.interleave * world
        if array.shape[axis] % blocks:
            raise ShardingError(f"axis {axis} of length {array.shape[axis]} does not split into {world} ranks x "
                                f"{self.interleave} blocks")
        pieces = np.split(array, blocks, axis=axis)  # block b of rank r is pieces[b * world + r]
        return np.concatenate([pieces[b * world + rank] for b in range(self.interleave)], axis=axis)

    def assemble(self, pieces: Sequence[np.ndarray]) -> tuple[np.ndarray, list[int]]:
        """The canonical tensor from every rank's piece (in rank order), and the ranks whose replica differs
        bitwise from rank 0's (always empty for a split tensor)."""
        if not pieces:
            raise ShardingError("no rank's piece to assemble")
        first = pieces[0]
        if self.rename is not None:
            raise ShardingError("renamed pieces are whole tensors of their own names, not assembled into one")
        if self.replicated:
            differ = [r for r, p in enumerate(pieces[1:], 1)
                      if p.shape != first.shape or p.dtype != first.dtype or p.tobytes() != first.tobytes()]
            return first, differ
        if self.reduce is not None:
            for rank, piece in enumerate(pieces):
                if piece.shape != first.shape or piece.dtype != first.dtype:
                    raise ShardingError(f"rank {rank}'s partial sum is {piece.dtype}{list(piece.shape)}, rank 0's "
                                        f"{first.dtype}{list(first.shape)}")
            total = first.copy()
            for piece in pieces[1:]:  # in rank order, in the pieces' dtype: one rounding per addition
                total = (total + piece).astype(first.dtype)
            return total, []
        axis = self._axis(first.ndim)
        for rank, piece in enumerate(pieces):
            if piece.dtype != first.dtype or piece.ndim != first.ndim or any(
                    a != b for i, (a, b) in enumerate(zip(piece.shape, first.shape)) if i != axis):
                raise ShardingError(f"rank {rank}'s piece is {piece.dtype}{list(piece.shape)}, rank 0's "
                                    f"{first.dtype}{list(first.shape)}: they do not line up on axis {axis}")
            if self.ragged:
                continue
            if piece.shape[axis] != first.shape[axis] or piece.shape[axis] % self.interleave:
                raise ShardingError(f"rank {rank}'s piece has {piece.shape[axis]} rows on axis {axis}, rank 0's "
                                    f"{first.shape[axis]}, with {self.interleave} blocks per rank")
        blocks = [np.split(p, self.interleave, axis=axis) for p in pieces]
        ordered = [blocks[r][b] for b in range(self.interleave) for r in range(len(pieces))]
        return np.concatenate(ordered, axis=axis), []
