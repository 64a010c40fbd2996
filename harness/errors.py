"""Errors that end an xfalign command, each carrying its exit code, and the exit codes themselves (ExitCode).

0 and 1 are verdicts (every expectation holds / one does not) and are never raised. An `XfalignError`
is reported by the CLI as one line, `xfalign: error: <message>`, and exits with its `exit_code`.
"""

from __future__ import annotations

import hashlib
import re
import signal
from enum import IntEnum


class ExitCode(IntEnum):
    """What an xfalign command exits with (besides 128 + N, interrupted by signal N: Interrupted)."""

    OK = 0  # every expectation holds
    FAILED = 1  # a check failed
    ERROR = 2  # a harness error or bad input (case file, dump, usage, an output path that cannot be written), one
    # line `xfalign: error: ...`; an unexpected exception too (`xfalign: internal error: ...`; --debug: the traceback)
    SIDE_CRASHED = 3  # a side crashed, was killed or timed out


class XfalignError(Exception):
    """Harness error or bad input (case file, dump, usage, an output path that cannot be written)."""

    exit_code: int = ExitCode.ERROR


class UsageError(XfalignError):
    """Arguments that do not go together, or a value out of range."""


class OutputError(XfalignError):
    """An output (report, JSON, dump, golden) that cannot be written where asked: names the path and the
    operating system's reason."""


class SideCrashed(XfalignError):
    """A side's worker crashed, was killed, exited before writing its dump, or timed out; the message
    names the side and the cause and carries the tail of the worker's output."""

    exit_code = ExitCode.SIDE_CRASHED


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached xfalign. A BaseException (as KeyboardInterrupt) so that no `except
    Exception` swallows it; the runner kills the workers' process groups and removes its temporary
    folder on the way out (the workers' process groups are killed and the temporary folder removed), and the
    CLI exits with 128 + the signal number (130 SIGINT, 143 SIGTERM)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(name: str) -> str:
    """A name usable as one file or folder name: keeps [A-Za-z0-9._-], replaces anything else (brackets,
    commas, '=', '/', spaces) with '_'; never empty, '.' or '..'."""
    safe = _UNSAFE.sub("_", name)
    return safe if safe.strip(".") else safe.replace(".", "_") or "_"


def shortened(stem: str, name: str, max_chars: int) -> str:
    """`stem` (a file name stem made of `name`) when it has at most `max_chars` characters; else its start
    and 12 hex digits of `name`'s SHA-256, so that two long names that begin alike stay two names."""
    if len(stem) <= max_chars:
        return stem
    return f"{stem[:max_chars - 13]}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


def validation_problem(error) -> tuple[tuple, str]:
    """The one problem to report from a pydantic ValidationError, as (field path, message). In a union
    the member that got deepest into the value explains it best; a wrong literal or type says what it got."""
    first = max(error.errors(), key=lambda e: len(e["loc"]))
    message = first["msg"]
    if first["type"] == "literal_error":
        got = repr(first["input"])
        message = f"{message}, got {got[:80]}{'...' if len(got) > 80 else ''}"
    elif first["type"].endswith("_type"):  # e.g. `shape: [true, 256]`
        message = f"{message}, got {describe_value(first['input'])}"
    return tuple(first["loc"]), message


def describe_value(value) -> str:
    """What a YAML value is, for messages: 'the boolean true', 'the number 2.0', 'a list'."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the text {value[:40]!r}" + ("..." if len(value) > 40 else "")
    return "a list" if isinstance(value, list) else "a mapping" if isinstance(value, dict) else f"a {type(value).__name__}"


def field_text(path: tuple) -> str:
    return ".".join(str(part) for part in path) or "(top level)"
