"""A dump: every tensor one side produced (safetensors) plus JSON metadata, written atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from harness.digest import Digest, digests_of, verify
from harness.errors import XfalignError

FORMAT = "xfalign-dump/1"
TENSORS_FILE = "tensors.safetensors"
META_FILE = "meta.json"


class DumpError(XfalignError):
    """A dump directory that cannot be read."""


class IntegrityError(DumpError):
    """Stored tensors whose bytes, dtype or shape do not match the digests recorded with them: a
    corrupt or edited dump (or golden)."""


@dataclass
class Dump:
    meta: dict  # case, side, framework, impl, provenance, environment, input digests
    tensors: dict[str, np.ndarray] = field(default_factory=dict)  # forward -> backward order

    @property
    def side(self) -> str:
        return self.meta["side"]

    @property
    def input_digests(self) -> dict[str, Digest]:
        return {name: Digest.from_json(d) for name, d in self.meta["inputs"].items()}

    @property
    def digests(self) -> dict[str, Digest]:
        """As recorded when the dump was written; a dump never written is hashed now."""
        if "tensors" not in self.meta:
            return digests_of(self.tensors)
        return {entry["name"]: Digest.from_json(entry) for entry in self.meta["tensors"]}

    @property
    def nondeterministic(self) -> dict[str, int]:
        """Tensors whose digest varied between repeats, with the number of distinct digests."""
        return {name: len(set(md5s)) for name, md5s in self.meta.get("repeats", {}).items() if len(set(md5s)) > 1}

    def write(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        digests = digests_of(self.tensors)  # MD5 and XXH3, hashed in parallel threads
        meta = dict(self.meta, format=FORMAT,
                    tensors=[{"name": name, **digests[name].to_json(xxh3=True)} for name in self.tensors])
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
        try:
            save_file({name: np.ascontiguousarray(a) for name, a in self.tensors.items()}, staging / TENSORS_FILE)
            (staging / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
            if directory.exists():
                retired = directory.with_name(f".{directory.name}.old-{os.getpid()}")
                directory.rename(retired)
                shutil.rmtree(retired)
            staging.rename(directory)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self.meta = meta
        return directory

    @classmethod
    def read(cls, directory: str | Path) -> Dump:
        directory = Path(directory)
        try:
            meta = json.loads((directory / META_FILE).read_text())
            arrays = load_file(directory / TENSORS_FILE)
        except (OSError, ValueError, SafetensorError) as error:
            raise DumpError(f"{directory}: not a readable xfalign dump ({error})") from None
        if meta.get("format") != FORMAT:
            raise DumpError(f"{directory}: unknown dump format {meta.get('format')!r}")
        try:
            digests = {entry["name"]: Digest.from_json(entry) for entry in meta["tensors"]}
        except (KeyError, TypeError, ValueError) as error:
            raise DumpError(f"{directory}: not a readable xfalign dump (bad tensor entry in {META_FILE}: {error!r})") from None
        for name in digests:
            if name not in arrays:
                raise DumpError(f"{directory}: tensor {name}: listed in {META_FILE} but not in {TENSORS_FILE}")
        for name in arrays:
            if name not in digests:
                raise DumpError(f"{directory}: tensor {name}: in {TENSORS_FILE} but not listed in {META_FILE}")
        tensors = {name: arrays[name] for name in digests}
        # The digests shown and kept (MD5) must be digests of these bytes: check each tensor (by XXH3)
        corrupt = verify(tensors, digests)
        if corrupt:
            raise IntegrityError(f"{directory}: tensor {corrupt[0]}: bytes do not match the recorded digest (corrupt or edited dump)")
        return cls(meta, tensors)
