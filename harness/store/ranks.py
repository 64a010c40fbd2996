"""The dumps of a side that ran on several ranks (tensor parallel): where each rank's dump lives, and the one
dump in the canonical (one-rank) layout made from them, which is what is compared.

    <side dump>                  the canonical dump: meta.json says `world`, each tensor's sharding, and the
                                 replicas whose bits differ between ranks
    <side dump>.rank-00000/ ...  each rank's own dump (its pieces), kept beside it
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.sharding import Sharding, ShardingError
from harness.store.dump import Dump, DumpError
from harness.store.tree_format import rank_folder


def rank_dump_dir(side_dir: str | Path, rank: int) -> Path:
    side_dir = Path(side_dir)
    return side_dir.with_name(f"{side_dir.name}.{rank_folder(rank)}")


def sharding_of(name: str, shardings: dict[str, Sharding]) -> Sharding:
    """A tensor's split: an output's as declared, a gradient `grad.x` as its input x; else a replica."""
    return shardings.get(name.removeprefix("grad."), Sharding())


def assemble_dumps(dumps: list[Dump], shardings: dict[str, Sharding]) -> Dump:
    """The canonical dump of one side from its ranks' dumps (rank order): each tensor put together as the
    family splits it, replicas checked bit for bit (`replicas_differ`: tensor -> the ranks that differ from
    rank 0). Rank 0's meta otherwise: what ran, the environment, the inputs as consumed (each rank records the
    whole input its exact piece was cut from)."""
    first = dumps[0]
    world = len(dumps)
    for rank, dump in enumerate(dumps):
        if dump.meta.get("world", 1) != world or dump.meta.get("rank", 0) != rank:
            raise DumpError(f"{dump.directory}: rank {dump.meta.get('rank', 0)} of {dump.meta.get('world', 1)}, "
                            f"expected rank {rank} of {world}")
        if dump.names != first.names:
            raise DumpError(f"{dump.directory}: rank {rank} recorded {', '.join(dump.names) or 'nothing'}; rank 0 "
                            f"{', '.join(first.names) or 'nothing'}")
    meta = {key: value for key, value in first.meta.items() if key not in ("tensors", "rank")}
    tensors: dict[str, np.ndarray] = {}
    differ: dict[str, list[int]] = {}
    for name in first.names:
        sharding = sharding_of(name, shardings)
        try:
            tensors[name], ranks = sharding.assemble([dump.tensors[name] for dump in dumps])
        except ShardingError as error:
            raise DumpError(f"{first.directory}: tensor {name}: {error}") from None
        if ranks:
            differ[name] = ranks
    meta["shardings"] = {name: sharding_of(name, shardings).describe() for name in first.names}
    meta["replicas_differ"] = differ
    if first.meta.get("repeats"):
        meta["repeats"] = {name: [_joined([dump.meta["repeats"][name][k] for dump in dumps])
                                  for k in range(len(md5s))] for name, md5s in first.meta["repeats"].items()}
    return Dump(meta, tensors)


def _joined(md5s: list[str | None]) -> str | None:
    """One digest per repeat for all ranks: it varies between repeats exactly when some rank's does."""
    if any(md5 is None for md5 in md5s):
        return None
    return hashlib.md5(",".join(md5s).encode()).hexdigest()  # type: ignore[arg-type]


@dataclass
class AssembledDump(Dump):
    """A capture step put together from its ranks' steps (`assemble_step`)."""

    left_out: dict[str, str] = field(default_factory=dict)  # name -> why it could not be assembled


_DIGEST_KEYS = ("dtype", "shape", "md5", "xxh3", "fast64")


def assemble_step(dumps: list[Dump], sharding_for: Callable[[str], Sharding | None]) -> AssembledDump:
    """One capture step in the canonical layout from its ranks' dumps (rank order): a tensor `sharding_for`
    splits is put together from the pieces; every other one is a replica, rank 0's copy kept and the ranks
    whose bits (or, digest-only, digests) differ listed in meta `replicas_differ`. A split tensor some rank
    holds digest-only cannot be put together: left out (`left_out`, with the reason). A tensor whose sharding
    renames (local experts) is filed as each rank's own tensor under the name `rename(rank)`, digest-only
    or not. Rank 0's meta and capture records otherwise (every rank records the same names)."""
    first, world = dumps[0], len(dumps)
    for rank, dump in enumerate(dumps[1:], 1):
        if dump.names != first.names:
            only = sorted(set(dump.names) ^ set(first.names)) or ["(the same names in another order)"]
            raise DumpError(f"{dump.directory}: rank {rank} recorded other tensors than rank 0 ({first.directory}): "
                            f"{', '.join(only[:3])}{' ...' if len(only) > 3 else ''}")
    tensors: dict[str, np.ndarray] = {}
    unstored: dict[str, dict] = {}
    stats: dict[str, dict] = {}
    differ: dict[str, list[int]] = {}
    shardings: dict[str, str] = {}
    left_out: dict[str, str] = {}
    order: list[str] = []
    for name in first.names:
        sharding = sharding_for(name) or Sharding()
        digest_only = [rank for rank, dump in enumerate(dumps) if name not in dump.tensors]
        if sharding.rename is not None:
            for rank, dump in enumerate(dumps):
                renamed = sharding.rename(rank)
                if renamed in shardings:
                    raise DumpError(f"{dump.directory}: tensor {name} of rank {rank} is renamed {renamed}, a name "
                                    "another piece already has: the map's local expert numbering does not fit")
                shardings[renamed] = sharding.describe()
                if name in dump.tensors:
                    tensors[renamed] = dump.tensors[name]
                    if name in dump.stats:
                        stats[renamed] = dump.stats[name]
                else:
                    unstored[renamed] = dump.unstored.get(name) or _entry_of(dump, name)
                order.append(renamed)
            continue
        if not sharding.replicated:
            shardings[name] = sharding.describe()
        if digest_only and not sharding.replicated:
            left_out[name] = (f"{name} is {sharding.describe()} across {world} ranks and digest-only on rank "
                              f"{digest_only[0]}: assembling it needs the full pieces (capture it in full)")
            continue
        if digest_only:
            entries = [dump.unstored.get(name) or _entry_of(dump, name) for dump in dumps]
            unstored[name] = entries[0]
            ranks = [r for r, e in enumerate(entries[1:], 1) if any(e.get(k) != entries[0].get(k) for k in _DIGEST_KEYS)]
        else:
            try:
                tensors[name], ranks = sharding.assemble([dump.tensors[name] for dump in dumps])
            except ShardingError as error:
                raise DumpError(f"{first.directory}: tensor {name}: {error} ({world} ranks)") from None
            if sharding.replicated and name in first.stats:
                stats[name] = first.stats[name]
        if ranks:
            differ[name] = ranks
        order.append(name)
    meta = {key: value for key, value in first.meta.items() if key != "tensors"}
    meta.update(world=world, shardings=shardings, replicas_differ=differ)
    return AssembledDump(meta, tensors, unstored=unstored, stats=stats, order=order, directory=first.directory,
                         left_out=left_out)


def _entry_of(dump: Dump, name: str) -> dict:
    """A stored tensor's digest entry as recorded (to compare with another rank's digest-only one)."""
    return next((entry for entry in dump.meta.get("tensors", []) if entry["name"] == name), {})
