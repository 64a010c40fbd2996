"""What a run could leave behind: processes and temporary folders.

Processes. Each worker process is started under a keeper (`keep`): a small process that forks the worker
before any framework is loaded and stays its parent. Keeper and worker are child subreapers (Linux
prctl PR_SET_CHILD_SUBREAPER), so a helper that leaves the worker's process group (a new session, a new
group, a double-fork daemon) is re-parented to the worker, or to the keeper when the worker is gone,
never to pid 1: every process a worker started stays a descendant of its keeper. `kill_descendants`
walks /proc for them. The worker ends what a case started when the case ends; the runner ends a keeper's
tree on a timeout or when the run ends; the keeper ends it when the worker dies and when the run's
process dies (it polls its parent: a SIGKILLed run leaves nothing running), then exits as the worker
did, so the runner reports the worker's exit code or signal.

Temporary folders. A run's folder holds a file naming its owner process (`claim`); `sweep` removes the
folders whose owner is gone (a run that was SIGKILLed), never one whose owner runs, another user's, or
one without that file.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import NoReturn

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_KEEPER_POLL_S = 0.1  # how soon the keeper sees that the run's process died
_KILL_WITHIN_S = 5.0  # a process in uninterruptible sleep dies when it returns; not waited for longer
# what the keeper answers by ending the worker's tree (it is in its own session: these come from `kill`)
_ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _prctl(option: int, value: int) -> None:
    """Set an attribute of this process (Linux's prctl: this module needs Linux, as /proc does)."""
    ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _stat(pid: int) -> list[bytes]:
    """The fields of /proc/PID/stat after the command name (state, parent pid, ...); OSError if it is gone."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().rsplit(b")", 1)[1].split()  # the command name may hold ')' or spaces


def _processes() -> dict[int, tuple[int, str]]:
    """{pid: (parent pid, state)} of every process this one can see."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = _stat(int(name))
        except OSError:  # exited meanwhile
            continue
        table[int(name)] = (int(fields[1]), fields[0].decode())
    return table


def _descendants(root: int, spare: frozenset[int]) -> dict[int, tuple[int, str]]:
    """{pid: (parent pid, state)} of the processes under `root`, leaving out those in `spare` and theirs."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in spare:
                found[child] = table[child]
                todo.append(child)
    return found


def kill_descendants(root: int, spare: frozenset[int] = frozenset()) -> set[int]:
    """SIGKILL every process under `root` (its children, theirs, ...) but those in `spare` and theirs, until
    none is left running (one that forks meanwhile: its child is found on the next pass, re-parented to the
    nearest subreaper, `root` or below). Returns the direct children of `root` found, for it to reap."""
    children: set[int] = set()
    deadline = time.monotonic() + _KILL_WITHIN_S
    while True:
        found = _descendants(root, spare)
        children |= {pid for pid, (parent, _) in found.items() if parent == root}
        running = [pid for pid, (_, state) in found.items() if state not in ("Z", "X")]
        if not running or time.monotonic() > deadline:
            return children
        for pid in running:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)  # SIGKILLed processes take a moment to become zombies


def reap(pids: set[int]) -> None:
    """Wait for these children of this process (killed: each is, or is about to be, a zombie)."""
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # reaped already (a subprocess.Popen of the case's)
            pass


def keep(parent: int) -> None:
    """Fork: the child returns and becomes the worker; this process stays as its keeper and never returns.
    Called first thing in the worker's process, before any framework is loaded (the keeper stays small);
    `parent` is the run's process, which started this one."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    keeper = os.getpid()
    worker = os.fork()
    if worker == 0:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the keeper is single-threaded: its death, not a thread's
        if os.getppid() != keeper:  # it died before that was set
            os._exit(1)
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)  # the worker's orphans stay its own: it ends them when a case ends
        return
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the worker's channel: the run sees it close when the worker dies
    waited = {signal.SIGCHLD, *_ENDING}
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    status = None
    while status is None and os.getppid() == parent:
        received = signal.sigtimedwait(waited, _KEEPER_POLL_S)
        if received is not None and received.si_signo in _ENDING:
            break
        status = _reap_exited(worker)
    kill_descendants(keeper)
    while True:  # the worker and whatever it left, each a zombie now (re-parented here)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    _exit_as(status)


def _reap_exited(worker: int) -> int | None:
    """Reap every exited child (the worker's orphans that ended on their own, the worker); the worker's
    wait status if it was one of them."""
    status = None
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == worker:
            status = code


def _exit_as(status: int | None) -> NoReturn:
    """Exit as the worker did: its exit code, or killed by its signal (no core file of the keeper's)."""
    if status is not None and os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        if number != signal.SIGKILL:  # its disposition is fixed
            signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {number})
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status) if status is not None else 1)


# -- temporary folders ---------------------------------------------------------------------------------

OWNER_FILE = "owner.json"


def _identity(pid: int) -> str | None:
    """Which process `pid` is: the boot and the process's start time (a pid is reused; these are not).
    None when there is no such process."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        started = _stat(pid)[19].decode()
    except (OSError, IndexError):
        return None
    return f"{boot}:{started}"


def claim(folder: Path) -> None:
    """Mark `folder` as this process's (OSError if it cannot be written)."""
    owner = {"pid": os.getpid(), "process": _identity(os.getpid()), "host": socket.gethostname()}
    (folder / OWNER_FILE).write_text(json.dumps(owner))


def sweep(directory: Path, prefix: str) -> None:
    """Remove the folders `prefix`* in `directory` that this user's runs on this machine left when they were
    killed: their owner file names a process that is gone."""
    try:
        entries = [entry for entry in os.scandir(directory) if entry.name.startswith(prefix)]
    except OSError:
        return
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            owner = json.loads(Path(entry.path, OWNER_FILE).read_text())
        except (OSError, ValueError):  # gone meanwhile, or not a claimed folder (an older run's, a live one just made)
            continue
        if isinstance(owner, dict) and owner.get("host") == socket.gethostname() and _gone(owner):
            shutil.rmtree(entry.path, ignore_errors=True)


def _gone(owner: dict) -> bool:
    pid = owner.get("pid")
    return isinstance(pid, int) and owner.get("process") != _identity(pid)
