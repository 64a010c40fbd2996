"""A dump: every tensor one side produced (safetensors) plus JSON metadata, written atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from harness.digest import Digest

FORMAT = "xfalign-dump/1"
TENSORS_FILE = "tensors.safetensors"
META_FILE = "meta.json"


class DumpError(Exception):
    """A dump directory that cannot be read."""


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
            return {name: Digest.of(array) for name, array in self.tensors.items()}
        return {entry["name"]: Digest.from_json(entry) for entry in self.meta["tensors"]}

    @property
    def nondeterministic(self) -> dict[str, int]:
        """Tensors whose digest varied between repeats, with the number of distinct digests."""
        return {name: len(set(md5s)) for name, md5s in self.meta.get("repeats", {}).items() if len(set(md5s)) > 1}

    def write(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        meta = dict(self.meta, format=FORMAT,
                    tensors=[{"name": name, **Digest.of(array).to_json()} for name, array in self.tensors.items()])
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
        except (OSError, ValueError) as error:
            raise DumpError(f"{directory}: not a readable xfalign dump ({error})") from None
        if meta.get("format") != FORMAT:
            raise DumpError(f"{directory}: unknown dump format {meta.get('format')!r}")
        return cls(meta, {entry["name"]: arrays[entry["name"]] for entry in meta["tensors"]})
