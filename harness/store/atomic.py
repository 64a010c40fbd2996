"""Atomic writes, shared by dumps, goldens and reports: a reader sees the old file (or folder) or the new
one, never half of one, and a process killed at any instant leaves one of the two complete at the path.

- `write_atomic(path, data)`: a file replaced in one step: written under a unique hidden staging name
  beside it, fsynced, given the umask's mode, then `os.replace`d over the path.
- `stage_file(directory, name, data)`: the first half of that (a complete, fsynced file under a unique
  hidden name), for a caller that chooses the final name from the content (a golden's values file).
- `staging_dir(target)` and `replace_dir(staging, target)`: a folder replaced in one step, by swapping
  the two names with Linux `renameat2(RENAME_EXCHANGE)` and then removing the old folder (now at the
  staging name). Where that call is missing (not Linux, kernel < 3.15, a file system without it) the old
  folder is renamed aside and the new one renamed into place: between those two renames nothing is at the
  path (the old folder is at `.<name>.old-*`, and is put back if the second rename fails).

Files get `0666 & ~umask`, folders `0777 & ~umask` (not mkstemp's 0600 / mkdtemp's 0700).

Every file and rename is fsynced, except by a thread inside `unsynced()`: a writer that makes many small
writes durable later, all at once (a capture's steps, harness.capture.api); renames keep them atomic for a
killed process meanwhile, only a crash of the machine could lose them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

Data = bytes | str | Callable[[Path], object]

# Test-only: XFALIGN_TEST_PAUSE=<point> makes a writer that reaches `pause(<point>)` create the file named by
# XFALIGN_TEST_PAUSE_MARKER and sleep until it is killed (tests/test_faults_storage.py).
PAUSE_ENV, PAUSE_MARKER_ENV = "XFALIGN_TEST_PAUSE", "XFALIGN_TEST_PAUSE_MARKER"
PAUSE_POINTS = ("dump-staged", "dump-exchanged", "dump-moved-aside", "golden-values-written", "golden-yaml-replaced")


def pause(point: str) -> None:
    assert point in PAUSE_POINTS, point  # the tests name these
    if os.environ.get(PAUSE_ENV) != point:
        return
    marker = os.environ.get(PAUSE_MARKER_ENV)
    if marker:
        Path(marker).write_text(str(os.getpid()))
    while True:
        time.sleep(3600)


def umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc/self/status); inside
    `umask_known(mask)`, the calling thread's `mask`."""
    known = getattr(_THREAD, "umask", None)
    if known is not None:
        return known
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)  # the brief window is restrictive, not permissive, for other threads
    os.umask(mask)
    return mask


def file_mode() -> int:
    return 0o666 & ~umask()


def dir_mode() -> int:
    return 0o777 & ~umask()


_THREAD = threading.local()


@contextmanager
def unsynced() -> Iterator[None]:
    """Inside the block, this module's fsyncs made by the calling thread are skipped (see the module's note)."""
    _THREAD.unsynced = True
    try:
        yield
    finally:
        _THREAD.unsynced = False


@contextmanager
def umask_known(mask: int) -> Iterator[None]:
    """Inside the block, `umask()` of the calling thread is `mask`, not read again (a read of /proc costs ~50 us:
    a capture's writer, harness.store.tree.TreeWriter, reads it once when it opens the tree)."""
    before, _THREAD.umask = getattr(_THREAD, "umask", None), mask
    try:
        yield
    finally:
        _THREAD.umask = before


def _unsynced() -> bool:
    return getattr(_THREAD, "unsynced", False)


def fsync(fd: int) -> None:
    if not _unsynced():
        os.fsync(fd)


def fsync_file(path: str | Path) -> None:
    if _unsynced():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Make renames in `path` durable; a file system that cannot fsync a folder is left as it is."""
    if _unsynced():
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def stage_file(directory: str | Path, name: str, data: Data) -> Path:
    """A complete, fsynced file with the umask's mode under a unique hidden name `.<name>.*.tmp` in
    `directory`; `data` is bytes, text (UTF-8) or a function that writes the file at the path it gets.
    Removed again if anything fails."""
    fd, staging_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    staging = Path(staging_name)
    try:
        if callable(data):
            os.close(fd)
            fd = -1
            data(staging)
            fsync_file(staging)
        else:
            with os.fdopen(fd, "wb") as handle:
                fd = -1
                handle.write(data.encode("utf-8") if isinstance(data, str) else data)
                handle.flush()
                fsync(handle.fileno())
        os.chmod(staging, file_mode())  # mkstemp makes 0600
    except BaseException:
        if fd >= 0:
            os.close(fd)
        staging.unlink(missing_ok=True)
        raise
    return staging


def write_atomic(path: str | Path, data: Data) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = stage_file(path.parent, path.name, data)
    try:
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_atomic(path, text)


def staging_dir(target: str | Path) -> Path:
    """A new empty folder beside `target` (same file system, so it can be swapped in), named
    `.<target name>.*.tmp`, with the umask's mode."""
    target = Path(target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    os.chmod(staging, dir_mode())  # mkdtemp makes 0700
    return staging


def remove_tree(path: str | Path) -> None:
    """Remove a folder (or a file or link) if it is there; what cannot be removed is left."""
    path = Path(path)
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2
_SYS_RENAMEAT2 = {"x86_64": 316, "amd64": 316, "aarch64": 276, "arm64": 276}
_renameat2_fn: list = []  # [callable or None], looked up once


def _renameat2():
    if not _renameat2_fn:
        function: Callable[..., int] | None = None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if hasattr(libc, "renameat2"):  # glibc >= 2.28
                call = libc.renameat2
                call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
                call.restype = ctypes.c_int
                function = call
            elif platform.machine().lower() in _SYS_RENAMEAT2 and hasattr(libc, "syscall"):
                number = _SYS_RENAMEAT2[platform.machine().lower()]
                syscall = libc.syscall
                syscall.restype = ctypes.c_long

                def via_syscall(olddirfd, old, newdirfd, new, flags):
                    return syscall(ctypes.c_long(number), ctypes.c_int(olddirfd), ctypes.c_char_p(old),
                                   ctypes.c_int(newdirfd), ctypes.c_char_p(new), ctypes.c_uint(flags))

                function = via_syscall
        except (OSError, AttributeError):
            function = None
        _renameat2_fn.append(function)
    return _renameat2_fn[0]


def exchange(a: str | Path, b: str | Path) -> bool:
    """Swap the two existing paths `a` and `b` in one step (renameat2 RENAME_EXCHANGE). False, with
    nothing changed, where the system or the file system cannot; another failure raises OSError."""
    function = _renameat2()
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False  # EPERM: a seccomp filter that refuses the call
    raise OSError(code, os.strerror(code), str(b))


def replace_dir(staging: str | Path, target: str | Path) -> None:
    """Put the complete folder `staging` at `target` (beside it: see `staging_dir`): at every instant the
    old folder or the new one is at `target` (but see the module's note on the fallback). Afterwards
    `staging` is gone, or, if this was interrupted, holds whichever folder is not at `target`, for the
    caller to remove."""
    staging, target = Path(staging), Path(target)
    if not os.path.lexists(target):
        try:
            os.rename(staging, target)  # one step; fails if a non-empty folder appeared there meanwhile
            fsync_dir(target.parent)
            return
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    if exchange(staging, target):
        fsync_dir(target.parent)
        pause("dump-exchanged")
        remove_tree(staging)  # the old folder, now at the staging name
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    try:
        os.rename(target, retired)  # replaces the empty folder mkdtemp made; the window opens here
    except BaseException:
        remove_tree(retired)
        raise
    try:
        pause("dump-moved-aside")
        os.rename(staging, target)
    except BaseException:
        if not os.path.lexists(target):
            os.rename(retired, target)  # put the old folder back
        raise
    fsync_dir(target.parent)
    remove_tree(retired)
