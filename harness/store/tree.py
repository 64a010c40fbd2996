"""Reading a capture tree (harness.store.tree_format): its manifest, its steps (each an xfalign dump) and,
for a capture of several ranks, the tree of each rank."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from harness.errors import field_text, validation_problem
from harness.schema import NAME_RULE, is_safe_name
from harness.store.dump import Dump, DumpError, read_meta
from harness.store.tree_format import MANIFEST_FILE, CaptureManifest


class TreeError(DumpError):
    """A path that is not a readable capture tree."""


def is_tree(path: str | Path) -> bool:
    """Whether `path` holds a capture tree (its capture.json, or rank folders that do)."""
    path = Path(path)
    return (path / MANIFEST_FILE).is_file() or bool(_rank_dirs(path))


def _rank_dirs(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.glob("rank-[0-9]*") if (p / MANIFEST_FILE).is_file())
    except OSError:
        return []


def _check_step_names(manifest_path: Path, steps: list[str]) -> None:
    """Each step is a folder of the tree: a safe single name (`../x` would read a dump outside it), listed once."""
    seen: set[str] = set()
    for index, step in enumerate(steps):
        if not is_safe_name(step):
            raise TreeError(f"{manifest_path}: steps.{index}: {ascii(step)} is not a step folder of the tree "
                            f"({NAME_RULE}); the file is corrupt or edited: capture again")
        if step in seen:
            raise TreeError(f"{manifest_path}: steps.{index}: {step!r} is listed twice; the file is corrupt or edited: "
                            "capture again")
        seen.add(step)


class Tree:
    """One capture tree. `path` holds capture.json, or (world size > 1) rank folders, each a Tree: then
    `manifest`, `steps` and `step` are those of the first rank (`ranks` lists them all)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        manifest_path = self.path / MANIFEST_FILE
        rank_dirs = [] if manifest_path.is_file() else _rank_dirs(self.path)
        self.ranks: dict[int, Tree] = {}
        if rank_dirs:
            for folder in rank_dirs:
                tree = Tree(folder)
                self.ranks[tree.manifest.rank if tree.manifest.rank is not None else int(folder.name[5:])] = tree
            first = self.ranks[min(self.ranks)]
            self.manifest: CaptureManifest = first.manifest
            self._folder = first.path
            return
        self._folder = self.path
        if not self.path.is_dir():
            raise TreeError(f"{self.path}: not a capture tree (no such folder)")
        try:
            data = json.loads(manifest_path.read_text())
        except FileNotFoundError:
            raise TreeError(f"{self.path}: not a capture tree (no {MANIFEST_FILE} and no rank-* folders)") from None
        except (OSError, ValueError) as error:
            raise TreeError(f"{manifest_path}: not readable JSON ({error})") from None
        try:
            self.manifest = CaptureManifest.model_validate(data)
        except ValidationError as error:
            location, message = validation_problem(error)
            raise TreeError(f"{manifest_path}: {field_text(location)}: {message}") from None
        if not is_safe_name(self.manifest.side):  # printed in reports and terminals: no control characters
            raise TreeError(f"{manifest_path}: side: {ascii(self.manifest.side)} is not a side name ({NAME_RULE}); "
                            "the file is corrupt or edited: capture again")
        _check_step_names(manifest_path, self.manifest.steps)

    @property
    def steps(self) -> list[str]:
        """The step folders written, in order (`step-00000`, ...)."""
        return list(self.manifest.steps)

    def step_path(self, index: int | str) -> Path:
        name = index if isinstance(index, str) else self._step_name(index)
        return self._folder / name

    def _step_name(self, index: int) -> str:
        try:
            return self.manifest.steps[index]
        except IndexError:
            raise TreeError(f"{self.path}: has {len(self.manifest.steps)} step(s); no step {index}") from None

    def step(self, index: int | str) -> Dump:
        """The dump of step `index` (a position in `steps`, or a step folder's name); its stored tensors' bytes
        are checked against their recorded MD5 and XXH3 on first use or by the comparison's pass (Dump.read
        with check_bytes=False); digest-only tensors have no bytes to check."""
        if isinstance(index, str) and index not in self.manifest.steps:
            raise TreeError(f"{self.path}: no step {index!r}; steps: {', '.join(self.manifest.steps) or 'none'}")
        return Dump.read(self.step_path(index), check_bytes=False)

    def tensor_names(self) -> set[str]:
        """Every tensor name recorded in a step of the tree (of any rank), read from the steps' meta.json only."""
        trees = list(self.ranks.values()) or [self]
        return {entry["name"] for tree in trees for step in tree.steps for entry in read_meta(tree.step_path(step))["tensors"]}

    def __repr__(self) -> str:
        return f"Tree({str(self.path)!r}, steps={len(self.steps)}, ranks={sorted(self.ranks) or None})"


def read_tree(path: str | Path) -> Tree:
    """The capture tree at `path`; TreeError (a DumpError, one line naming the path) if it is not one."""
    return Tree(path)
