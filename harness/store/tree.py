"""A capture tree (harness.store.tree_format): reading one (its manifest, its steps, each an xfalign dump, and,
for a capture of several ranks, the tree of each rank), and writing one step by step (TreeWriter)."""

from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import threading
import time
from pathlib import Path

from pydantic import ValidationError

from harness.errors import XfalignError, field_text, validation_problem
from harness.schema import NAME_RULE, is_safe_name
from harness.store.atomic import (
    fsync_dir,
    fsync_file,
    remove_tree,
    replace_dir,
    staging_dir,
    umask,
    umask_known,
    unsynced,
    write_text_atomic,
)
from harness.store.dump import Dump, DumpError, DumpTargetError, read_meta
from harness.store.tree_format import MANIFEST_FILE, CaptureManifest, rank_folder, step_folder


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


def _check_ranks(path: Path, ranks: dict[int, Tree]) -> None:
    """TreeError (one line naming the tree) unless the rank folders are one capture's every rank: all of one
    world size, each rank of it present once (a capture that died, or folders copied from two captures, would
    otherwise be compared as if whole)."""
    worlds = {rank: tree.manifest.world_size for rank, tree in ranks.items()}
    if len(set(worlds.values())) > 1:
        listed = ", ".join(f"{rank_folder(rank)}: {world}" for rank, world in sorted(worlds.items()))
        raise TreeError(f"{path}: its ranks disagree on the world size ({listed}): not one capture")
    world = next(iter(worlds.values()))
    if world is None:
        raise TreeError(f"{path}: {rank_folder(min(ranks))}/{MANIFEST_FILE} records no world size: not a rank of a capture")
    missing = [rank for rank in range(world) if rank not in ranks]
    extra = [rank for rank in ranks if not 0 <= rank < world]
    if missing or extra:
        found = ", ".join(rank_folder(rank) for rank in sorted(ranks))
        what = (f"lacks {', '.join(rank_folder(rank) for rank in missing)}" if missing else
                f"has {', '.join(rank_folder(rank) for rank in extra)} beyond it")
        raise TreeError(f"{path}: a capture of world size {world} {what} (rank folders with a {MANIFEST_FILE}: {found})")


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
                rank = tree.manifest.rank if tree.manifest.rank is not None else int(folder.name[5:])
                if rank in self.ranks:
                    raise TreeError(f"{self.path}: {folder.name} and {self.ranks[rank].path.name} both hold rank {rank}")
                self.ranks[rank] = tree
            _check_ranks(self.path, self.ranks)
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


# -- writing --------------------------------------------------------------------------------------------

class TreeBusyError(XfalignError):
    """A tree folder that another writer (a capture of this process, or another process) is writing."""


# the folders writers of this process are writing (an flock does the same across processes)
_WRITING: set[Path] = set()
_WRITING_LOCK = threading.Lock()
# the manifest is rewritten after a step at most this often (and after the first step, and on closing): replacing a
# file costs a flush of its data on ext4 (auto_da_alloc): 0.3 ms on this project's CI machine when idle, 3.5 ms while
# other processes wrote (docs/capture-guide.md), against a small model's step of 9-16 ms. A process killed meanwhile
# leaves the steps of its last second written but not listed.
MANIFEST_INTERVAL = 1.0  # seconds
# the names a tree holds: the manifest, step folders, and the hidden staging names of their atomic writes
_TREE_ENTRY = re.compile(r"^(capture\.json|step-\d+|\.(capture\.json|step-\d+)\..+)$")


def _lock(folder: Path) -> int | None:
    """An exclusive flock on `folder`, held (by the descriptor returned) while the tree is written there;
    TreeBusyError if another process holds it; None where the file system has no flock."""
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise TreeBusyError(f"capture {folder}: another process is capturing into it; wait for it to end or give "
                            "another path") from None
    except OSError:  # no flock on this file system: only this process's writers are refused
        os.close(descriptor)
        return None
    return descriptor


class TreeWriter:
    """Writes the capture tree at `folder` (a rank's folder, with several ranks) step by step: `open`, then
    `write_step` per step, then `close`. The manifest (its `steps` left to the writer) is rewritten after the first
    step, after a step at most once per MANIFEST_INTERVAL, on `list_steps` and on closing. An earlier tree of the
    same side at the folder is kept until the first step is complete: the steps go to a staging folder beside it,
    swapped in then. Steps and manifest are written atomic but not fsynced
    (an fsync per file and step cost a small model's step several times over): `close` makes them durable, all
    at once, but those `sync_step` made durable already (the writer process does, as it goes). A folder is
    written by one writer at a time (in this process, and across processes through an flock on the folder)."""

    def __init__(self, folder: Path, manifest: CaptureManifest):
        self.folder = folder
        self.manifest = manifest
        self.steps: list[str] = []  # the step folders written
        self._claimed: Path | None = None  # the folder, in _WRITING while this writer writes it
        self._locks: list[int] = []  # flocked descriptors: the folder's, and the staging folder's
        self._staging: Path | None = None  # where steps go until the first is complete, over an earlier tree
        self._listed = 0  # the steps the manifest written lists
        self._manifest_written = 0.0  # when (time.monotonic())
        self._umask = umask()  # read once: each step's files and folders get their modes from it
        self._durable: set[str] = set()  # step folders `sync_step` made durable

    def open(self) -> None:
        """Claim the folder, check what it holds and write the manifest (no step yet). TreeBusyError: another
        writer holds the folder; DumpTargetError: it holds something other than an earlier tree of this side."""
        self._claim()
        self._prepare_folder()
        self._write_manifest()

    @classmethod
    def adopt(cls, folder: Path, manifest: CaptureManifest, staging: Path | None) -> TreeWriter:
        """A writer of a tree another writer (of another process: harness.capture.step_writer) has opened and
        keeps claimed: it writes steps and `finish`es, the other one releases the folder."""
        writer = cls(folder, manifest)
        writer._staging = staging
        return writer

    @property
    def staging(self) -> Path | None:
        """The staging folder steps go to until the first is complete (None: the folder itself)."""
        return self._staging

    @property
    def replacing(self) -> bool:
        """Whether an earlier tree at the folder is kept until the first step is complete."""
        return self._staging is not None

    def write_step(self, index: int, dump: Dump, validate: bool = True) -> Path:
        """Write `dump` as step `index` (see Dump.write for `validate`), then the manifest; the first step
        complete replaces an earlier tree. The step's folder in the tree."""
        with unsynced(), umask_known(self._umask):
            written = dump.write(self._target / step_folder(index), validate=validate, fresh=True)
            self.steps.append(written.name)
            if self._staging is not None or not self._listed or time.monotonic() - self._manifest_written >= MANIFEST_INTERVAL:
                self._write_manifest()
            if self._staging is not None:
                replace_dir(self._staging, self.folder)
                self._staging = None
        return self.folder / written.name

    def close(self) -> None:
        """`finish`, and let the folder go."""
        try:
            self.finish()
        finally:
            self.release()

    def finish(self) -> None:
        """Remove a staging folder no step completed (the earlier tree stays as it was) and make the steps written
        durable (an OSError if that fails)."""
        if self._staging is not None:
            remove_tree(self._staging)
            self._staging, self.steps = None, []
        self.list_steps()
        self._sync_written()

    def _claim(self) -> None:
        """Make the folder this writer's alone: refused if a writer of this process writes it, else created if
        missing and flocked (refused if another process holds it)."""
        folder = self.folder
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise DumpTargetError(f"capture {folder}: exists and is not a folder")
        key = folder.resolve()
        with _WRITING_LOCK:
            if key in _WRITING:
                raise TreeBusyError(f"capture {folder}: another capture of this process is writing there; end its "
                                    "`with` block first, or give another path")
            _WRITING.add(key)
        self._claimed = key
        folder.mkdir(parents=True, exist_ok=True)
        self._hold(folder)

    def _hold(self, folder: Path) -> None:
        descriptor = _lock(folder)
        if descriptor is not None:
            self._locks.append(descriptor)

    def list_steps(self) -> None:
        """Rewrite the manifest if it does not list every step written (unsynced, as a step's)."""
        if self._listed != len(self.steps):
            with unsynced():
                self._write_manifest()

    def release(self) -> None:
        """Let the folder go (its flocks and this process's claim)."""
        for descriptor in self._locks:
            fcntl.flock(descriptor, fcntl.LOCK_UN)  # for a process forked meanwhile too, which shares the lock
            os.close(descriptor)
        self._locks = []
        if self._claimed is not None:
            with _WRITING_LOCK:
                _WRITING.discard(self._claimed)
            self._claimed = None

    def _prepare_folder(self) -> None:
        """Check what the (claimed) folder holds: nothing, or an earlier capture tree of this side and nothing
        else. Over an earlier tree the steps go to a staging folder until the first is complete; one a killed
        writer of this folder left (it holds a capture.json; no other writer writes here now) is removed."""
        folder = self.folder
        for stale in folder.parent.glob(f".{glob.escape(folder.name)}.*.tmp"):
            if (stale / MANIFEST_FILE).is_file():
                remove_tree(stale)
        if not any(folder.iterdir()):
            return
        if not (folder / MANIFEST_FILE).is_file():
            raise DumpTargetError(f"capture {folder}: exists and is not a capture tree (no {MANIFEST_FILE}); "
                                  f"refusing to write there")
        earlier = read_tree(folder).manifest
        if earlier.side != self.manifest.side:
            raise DumpTargetError(f"capture {folder}: holds a capture of side {earlier.side!r}, not "
                                  f"{self.manifest.side!r}; refusing to replace it")
        foreign = sorted(entry.name for entry in folder.iterdir() if not _TREE_ENTRY.match(entry.name))
        if foreign:
            raise DumpTargetError(f"capture {folder}: holds files xfalign did not write ({', '.join(foreign[:5])}); "
                                  "refusing to replace the capture there (move them, or give another path)")
        self._staging = staging_dir(folder)
        self._hold(self._staging)

    @property
    def _target(self) -> Path:
        """Where steps and the manifest are written now: the staging folder until the first step is complete."""
        return self._staging or self.folder

    def _write_manifest(self) -> None:
        manifest = self.manifest.model_copy(update={"steps": list(self.steps)})
        write_text_atomic(self._target / MANIFEST_FILE, manifest.model_dump_json(indent=1) + "\n")
        self._listed, self._manifest_written = len(self.steps), time.monotonic()

    def sync_step(self, name: str) -> None:
        """fsync the files and the folder of step folder `name`, written, now: `finish` then leaves it out. Another
        thread than write_step's may call it (a writer process, between steps)."""
        for path in (self.folder / name).iterdir():
            fsync_file(path)
        fsync_dir(self.folder / name)
        self._durable.add(name)

    def _sync_written(self) -> None:
        """fsync the steps written unsynced, the manifest, and the folder's swap into place."""
        for name in self.steps:
            if name not in self._durable:
                self.sync_step(name)
        if self.steps:
            fsync_file(self.folder / MANIFEST_FILE)
            fsync_dir(self.folder)
            fsync_dir(self.folder.parent)
