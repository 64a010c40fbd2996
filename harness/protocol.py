"""The messages between the runner and a worker: pydantic models, one JSON line each on a private pipe.

Each kind of message carries a `kind` tag (as pytest's `_report_to_json` does): a worker's channel carries
several kinds each way, and a line is read as the kind it names, never guessed from the keys it happens to
hold. A line that is not a message of the expected direction is refused with a ProtocolError naming what is
wrong.

    runner -> worker   Prepare (import the framework, nothing else), SideJob (one side of a case, optionally
                       followed by its ReferenceJob), ReferenceJob (the case's float64 reference)
    worker -> runner   Prepared, Dumped (the dump is in place), Failed (the side raised), OutputFailed (the
                       dump could not be written)
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_serializer

from harness.case import Case
from harness.numerics import NumericsProfile

# seconds by step ("op_s": one per repeat), compilation counts, and the worker's "framework"
Timings = dict[str, int | float | str | list[float]]


class ProtocolError(Exception):
    """A line on a worker's channel that is not a message of the kind expected there."""


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- runner -> worker -------------------------------------------------------------------------------------


class Prepare(_Message):
    """Started ahead of its first case: set the profile's variables and import the framework, nothing else."""

    kind: Literal["prepare"] = "prepare"
    framework: str
    numerics: NumericsProfile
    log: str  # the worker's output while it imports


class _CaseJob(_Message):
    """A job that runs a case's op and writes a dump."""

    case: Case
    numerics: NumericsProfile
    environment_class: str  # of the device it runs on: recorded in the dump's fingerprint
    inputs: str  # the case's inputs (safetensors), made by the runner
    dump: str  # the folder its dump is written to
    durable: bool  # False: the dump's folder is removed when the run ends, so it is not fsynced
    log: str  # the case's output: fds 1 and 2 point there while it runs
    cwd: str  # the runner's working directory, where the case runs
    env: dict[str, str]  # the case's environment: the runner's variables with the profile's on top

    @field_serializer("case")
    def _case_with_source(self, case: Case) -> dict[str, Any]:
        # the case file's path is left out of a case's JSON (dumps, goldens); the worker needs it for user code
        return case.to_json() | {"source": case.source}


class ReferenceJob(_CaseJob):
    """The case's float64 reference, run by `framework` on the CPU."""

    kind: Literal["reference"] = "reference"
    framework: str


class SideJob(_CaseJob):
    """One side of a case, its op run `repeat` times; `then`: the reference the same worker runs right after."""

    kind: Literal["side"] = "side"
    side: str
    repeat: int = Field(1, ge=1)
    then: ReferenceJob | None = None
    # a side of several ranks (tensor parallel): this worker's rank, the world's size, and where the ranks meet
    # (a file the framework's store uses); the dump is this rank's, of its pieces
    rank: int = Field(default=0, ge=0)
    world: int = Field(default=1, ge=1)
    rendezvous: str | None = None

    @property
    def framework(self) -> str:
        return self.case.sides[self.side].framework


Job = Annotated[Prepare | SideJob | ReferenceJob, Field(discriminator="kind")]
CaseJob = SideJob | ReferenceJob


# -- worker -> runner -------------------------------------------------------------------------------------


class Prepared(_Message):
    kind: Literal["prepared"] = "prepared"
    timings: Timings = {}


class Dumped(_Message):
    kind: Literal["dumped"] = "dumped"
    dump: str
    timings: Timings = {}


class Failed(_Message):
    """The side raised (the traceback is in the case's log), or did not run."""

    kind: Literal["failed"] = "failed"
    error: str  # "Type: message"
    exit: int = 1
    timings: Timings = {}


class OutputFailed(_Message):
    """The dump could not be written (unwritable folder, full disk): an output error (exit 2), not a crash."""

    kind: Literal["output_failed"] = "output_failed"
    error: str
    timings: Timings = {}


Result = Annotated[Prepared | Dumped | Failed | OutputFailed, Field(discriminator="kind")]

_JOB: TypeAdapter[Prepare | SideJob | ReferenceJob] = TypeAdapter(Job)
_RESULT: TypeAdapter[Prepared | Dumped | Failed | OutputFailed] = TypeAdapter(Result)


def encode(message: _Message) -> bytes:
    """One line of the channel."""
    return message.model_dump_json().encode() + b"\n"


def _decode(line: bytes, adapter: TypeAdapter, what: str) -> Any:
    # parsed in Python mode, as a case file's YAML is: the case validates exactly as when it was loaded
    try:
        return adapter.validate_python(json.loads(line))
    except (ValueError, ValidationError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        if isinstance(error, ValidationError):
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "(message)"
            reason = f"{where}: {first['msg']}"
        else:
            reason = f"not JSON ({error})"
        excerpt = line[:120].decode(errors="replace")
        raise ProtocolError(f"malformed {what} on the worker channel: {reason} (line: {excerpt!r}"
                            f"{'...' if len(line) > 120 else ''})") from None


def decode_job(line: bytes) -> Prepare | SideJob | ReferenceJob:
    return _decode(line, _JOB, "job")


def decode_result(line: bytes) -> Prepared | Dumped | Failed | OutputFailed:
    return _decode(line, _RESULT, "result")
