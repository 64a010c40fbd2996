"""Worker process: runs one side of one case and writes its dump.

    python -m harness.worker JOB.json

JOB.json holds the validated case, its source path, the side name, the inputs file and the dump
directory, and optionally a status file. The side's framework adapter sets what the framework reads
at import before anything imports it.

The status file (JSON) is written last: {"dump": PATH} once the dump is in place, {"error": "Type:
message"} when the side raised, {"output_error": message} when the dump could not be written (exit 2).
A worker that ends without writing it (user code calling sys.exit or os._exit, a signal) exited before
writing its dump, whatever its exit code; the parent reports it so.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

from safetensors import SafetensorError

from harness import __version__, fingerprint
from harness.case import Case
from harness.digest import Digest
from harness.dump import Dump
from harness.execute import SideOutput, execute
from harness.frameworks import FrameworkAdapter, adapter_for
from harness.inputs import read_inputs
from harness.numerics import NumericsProfile, environment_class
from harness.ops import NotAvailable, family_for


def run_side(case: Case, side_name: str, arrays: dict, profile: NumericsProfile, adapter: FrameworkAdapter) -> SideOutput:
    """One run of the side's op, with the environment recorded."""
    device = case.device_of(side_name)
    reason = adapter.unavailable(device)
    if reason:
        raise NotAvailable(reason)  # a result (N/A), not a crash
    adapter.use_device(device)
    adapter.apply_profile(profile)
    # The family's settings hold for forward and backward, as in a training run, and are read there.
    with adapter.deterministic(family_for(case.op, case.source).deterministic(case)):
        output = execute(case, case.sides[side_name], arrays, adapter, device)
        runtime = adapter.runtime_fingerprint(device)
    output.environment = (fingerprint.common(profile.name) | adapter.fingerprint(device, profile) | runtime
                          | {"environment_class": environment_class(profile, [device])})
    return output


def run_job(job: dict) -> Path:
    case = Case(**job["case"], source=job["source"])
    side = case.sides[job["side"]]
    profile = NumericsProfile(**job["numerics"])
    adapter = adapter_for(side.framework)
    mode = side.mode or adapter.default_mode
    adapter.before_import(profile, mode)  # ISA and thread pins are read when the framework loads
    warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex|ccache).*")
    family = family_for(case.op, case.source)
    meta = {
        "xfalign": __version__,
        "case": case.to_json(),
        "case_name": case.name,
        "side": job["side"],
        "framework": side.framework,
        "impl": side.impl or adapter.default_impl,
        "mode": mode,
        "axes": family.tensor_axes(case),
        "notes": family.tensor_notes(case),
    }
    arrays = read_inputs(Path(job["inputs"]))
    try:
        runs = [run_side(case, job["side"], arrays, profile, adapter) for _ in range(job.get("repeat", 1))]
    except NotAvailable as reason:
        meta |= {"provenance": "-", "environment": {}, "inputs": {}, "unavailable": str(reason)}
        return _write_dump(Dump(meta, {}), job["dump"])
    output = runs[0]
    meta |= {
        "provenance": output.provenance,
        "environment": output.environment,
        "inputs": {name: digest.to_json() for name, digest in output.input_digests.items()},
        # MD5 of each tensor in every repeat: more than one distinct value means nondeterminism.
        "repeats": {name: [Digest.of(run.tensors[name]).md5 if name in run.tensors else None for run in runs]
                    for name in output.tensors} if len(runs) > 1 else {},
    }
    return _write_dump(Dump(meta, output.tensors), job["dump"])


class DumpWriteFailed(Exception):
    """The dump could not be written (unwritable folder, full disk): an output error, not a crash."""


def _write_dump(dump: Dump, directory: str) -> Path:
    try:
        return dump.write(directory)
    except (OSError, SafetensorError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise DumpWriteFailed(f"cannot write the dump {directory}: {reason}") from error


def _report(status: str | None, record: dict) -> None:
    if status:
        Path(status).write_text(json.dumps(record))


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    status = job.get("status")
    try:
        written = run_job(job)
    except DumpWriteFailed as error:
        _report(status, {"output_error": str(error)})
        return 2
    except Exception as error:
        _report(status, {"error": f"{type(error).__name__}: {error}"})
        raise  # the traceback goes to the worker's output, whose tail the parent shows
    _report(status, {"dump": str(written)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
