"""A capture checked against a reference tree while it runs (`capture(..., reference=TREE)`): each step's
digests are compared with the reference's step of the same index, through the map when the two sides name
or lay out their tensors differently. The capture holds a step's tensors on the host until the check; the
step that first differs is written in full, the others as digests only."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.capture.mapping import TensorMap, load_map
from harness.store.digest import Digest, digests_of
from harness.store.dump import Dump, read_meta
from harness.store.fast_hash import fast_entry
from harness.store.tree import Tree, read_tree
from harness.store.tree_format import LiveCheck

ON_DIVERGENCE = ("continue", "stop")


class LiveReference:
    """The reference tree a capture checks its steps against, and the map from the capture's names (side B)
    to the reference's (side A)."""

    def __init__(self, reference: str | Path | Tree, tensor_map: str | Path | TensorMap | None = None):
        self.tree = reference if isinstance(reference, Tree) else read_tree(reference)
        self.map = tensor_map if isinstance(tensor_map, TensorMap) else load_map(tensor_map)
        self.path = str(self.tree.path)

    def expected(self, index: int) -> dict[str, Digest] | None:
        """The reference's digests of step `index`, by name; None when it has no such step."""
        if index >= len(self.tree.steps):
            return None
        meta = read_meta(self.tree.step_path(index))
        return {entry["name"]: Digest.from_json(entry) for entry in meta.get("tensors", [])}

    def check(self, index: int, order: list[str], entries: dict[str, dict], held: dict[str, np.ndarray]) -> LiveCheck | None:
        """Compare the step's tensors (`order`: their names in record order; `entries`: their digest
        entries; `held`: their host arrays, where held) with the reference's step `index`. None: the
        reference has no step `index`."""
        expected = self.expected(index)
        if expected is None:
            return None
        # digests first (a renamed tensor keeps its bytes); a tensor whose layout the map changes is made in
        # A's layout from its held array, then hashed
        mapped = self.map.to_a(Dump({"capture": {}}, {}, unstored=dict(entries), order=list(order)))
        made = {source for name, sources in mapped.sources.items() if name in mapped.unstored for source in sources}
        reshaped = [name for name in order if name not in made and name in held and name not in mapped.ignored]
        arrays = self.map.to_a(Dump({"capture": {}}, {name: held[name] for name in reshaped}, order=reshaped)) \
            if reshaped and not self.map.is_identity else None
        found: dict[str, tuple[Digest | None, np.ndarray | None, list[str]]] = {}
        for name, entry in mapped.unstored.items():
            found[name] = (Digest.from_json(entry), _identity_array(mapped, name, held), mapped.sources.get(name, [name]))
        if arrays is not None:
            for name, made_array in arrays.tensors.items():
                found.setdefault(name, (None, made_array, arrays.sources.get(name, [name])))
        differing, not_checkable, checked = set(), set(), 0
        for name, (digest, array, sources) in found.items():
            want = expected.get(name)
            got = _comparable(digest, array, want)
            if want is None or got is None:
                not_checkable.update(sources)
                continue
            checked += 1
            if got != want:
                differing.update(sources)
        not_checkable.update(name for name in order if name not in mapped.ignored and
                             not any(name in sources for *_, sources in found.values()))
        return LiveCheck(reference=self.tree.steps[index], checked=checked,
                         differing=[name for name in order if name in differing],
                         not_checkable=[name for name in order if name in not_checkable and name not in differing],
                         full=False)


def _identity_array(mapped, name: str, held: dict[str, np.ndarray]) -> np.ndarray | None:
    """B's held array of an A name made by a plain rename (same bytes), for hashing it the reference's way."""
    sources = mapped.sources.get(name, [name])
    return held.get(sources[0]) if len(sources) == 1 and name not in mapped.how else None


def _comparable(digest: Digest | None, array: np.ndarray | None, want: Digest | None) -> Digest | None:
    """B's digest in a hash the reference's records: as it is, else made from B's array."""
    if want is None:
        return None
    if digest is not None and digest.shared_hash(want) is not None:
        return digest
    if array is None:
        return None
    if want.md5 is not None:
        return digests_of({"": array}, threads=1, xxh3=False)[""]
    entry = fast_entry(array)
    return Digest(entry["dtype"], tuple(entry["shape"]), None, fast64=entry["fast64"])
