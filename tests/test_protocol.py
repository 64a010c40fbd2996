"""The worker protocol (harness.protocol): typed jobs and results that round-trip through their JSON line, and a
malformed line refused with a one-line error on either end of a real worker's channel. The run's options
(harness.run_options): a gate run reads each numerics profile once and computes each environment class once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_faults_process import TINY, make_case

import harness.numerics
import harness.run_options
from harness.cli import main
from harness.errors import SideCrashed
from harness.load import load_case
from harness.numerics import load_profile
from harness.protocol import (
    Dumped,
    Failed,
    OutputFailed,
    Prepare,
    Prepared,
    ProtocolError,
    ReferenceJob,
    SideJob,
    decode_job,
    decode_result,
    encode,
)
from harness.run_options import RunOptions
from harness.runner import run_case

from conftest import SMALL_WEIGHTED

# both sides Paddle (no compilation, a cheap import); without the float64 reference, no torch worker is needed
PADDLE_ONLY = TINY.replace("'f.py:swiglu'", "fp32_island")


def _jobs(case) -> tuple[Prepare, ReferenceJob, SideJob]:
    profile = load_profile(None)
    reference = ReferenceJob(case=case, framework="megatron", numerics=profile, environment_class="cpu-avx2",
                             inputs="/run/inputs.safetensors", dump="/run/exact", durable=False, log="/run/exact.log",
                             cwd="/work", env={"PATH": "/bin", "OMP_NUM_THREADS": "1"})
    side = SideJob(case=case, side="paddle", repeat=3, numerics=profile, environment_class="cpu-avx2",
                   inputs="/run/inputs.safetensors", dump="/out/paddle", durable=True, log="/run/paddle.log", cwd="/work",
                   env={"PATH": "/bin"}, then=reference)
    return Prepare(framework="paddle", numerics=profile, log="/run/start.log"), reference, side


def test_jobs_and_results_round_trip(write_case):
    case = load_case(write_case(SMALL_WEIGHTED))
    for job in _jobs(case):
        line = encode(job)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert decode_job(line) == job
    side = decode_job(encode(_jobs(case)[2]))
    assert isinstance(side, SideJob) and isinstance(side.then, ReferenceJob)
    # the case file's path travels (user code is found beside it) though a case's own JSON leaves it out
    assert side.case.source == side.then.case.source == case.source != ""
    assert side.framework == "paddle" and side.then.framework == "megatron"
    for result in (Prepared(timings={"import_s": 2.5, "framework": "paddle"}),
                   Dumped(dump="/out/paddle", timings={"op_s": [0.25, 0.5], "fx_cache_hits": 3, "total_s": 1.0}),
                   Failed(error="ValueError: no"), OutputFailed(error="cannot write the dump /out: No space left")):
        back = decode_result(encode(result))
        assert back == result and type(back) is type(result)
    hits = decode_result(encode(Dumped(dump="/d", timings={"fx_cache_hits": 3}))).timings["fx_cache_hits"]
    assert hits == 3 and type(hits) is int  # a count stays a count


@pytest.mark.parametrize("line, fragment", [
    (b"no job here", "malformed job on the worker channel: not JSON"),
    (b'["prepare"]', "malformed job on the worker channel: (message): Input should be a valid dictionary"),
    # the untyped job of old: told apart by its keys, no kind
    (b'{"case": {}, "side": "paddle", "inputs": "/i"}', "Unable to extract tag using discriminator 'kind'"),
    (b'{"kind": "run"}', "malformed job on the worker channel: (message): Input tag 'run' found using 'kind' does not "
                         "match any of the expected tags"),
    (b'{"kind": "prepare", "framework": "paddle", "log": "/l"}', "prepare.numerics: Field required"),
    (b'{"kind": "dumped", "dump": "/d"}', "Input tag 'dumped' found"),  # a result where a job belongs
])
def test_a_malformed_job_is_refused(line, fragment):
    with pytest.raises(ProtocolError) as refused:
        decode_job(line)
    message = str(refused.value)
    assert fragment in message and "\n" not in message and message.startswith("malformed job on the worker channel: ")


def test_a_job_with_a_stray_key_or_a_bad_field_is_refused(write_case):
    line = encode(_jobs(load_case(write_case(SMALL_WEIGHTED)))[2])
    with pytest.raises(ProtocolError, match=r"side\.profile_env: Extra inputs are not permitted"):
        decode_job(line.replace(b'"kind":"side"', b'"kind":"side","profile_env":{}'))
    with pytest.raises(ProtocolError, match=r"side\.repeat: Input should be greater than or equal to 1"):
        decode_job(line.replace(b'"repeat":3', b'"repeat":0'))
    with pytest.raises(ProtocolError, match="malformed result on the worker channel: "):
        decode_result(b'{"dump": "/d", "timings": {}}')  # the untyped result of old


def test_the_worker_refuses_a_malformed_job(tmp_path):
    """A real worker process (python -m harness.worker) given a line that is no job: one line on its stderr,
    exit 2, nothing sent back."""
    jobs_read, jobs_write = os.pipe()
    results_read, results_write = os.pipe()
    os.write(jobs_write, b'{"case": {}, "side": "paddle"}\n')
    os.close(jobs_write)
    try:
        done = subprocess.run([sys.executable, "-m", "harness.worker", "--serve", str(jobs_read), str(results_write)],
                              pass_fds=(jobs_read, results_write), capture_output=True, text=True, timeout=120)
    finally:
        os.close(jobs_read)
        os.close(results_write)
    with os.fdopen(results_read, "rb") as results:
        assert results.read() == b""
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("xfalign worker: malformed job on the worker channel: (message): Unable to extract "
                                  "tag using discriminator 'kind'"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_malformed_result_fails_the_side_and_the_next_case_gets_a_new_worker(tmp_path):
    """User code that writes on its worker's result channel puts it out of step: the side fails (SideCrashed,
    naming the side and the malformed line) and its worker is replaced."""
    # the worker is started as `python -c BOOT PACKAGE PID --serve IN OUT`: OUT, its result channel, is argv's last
    broken = make_case(tmp_path / "broken", "os.write(int(sys.argv[-1]), b'{\"kind\": \"dumped\"}\\n')")
    with pytest.raises(SideCrashed) as crashed:
        run_case(load_case(broken), options=RunOptions(reference=False))
    assert str(crashed.value).startswith("side 'user': malformed result on the worker channel: dumped.dump: Field "
                                         "required (line: '{\"kind\": \"dumped\"}'); last "), str(crashed.value)
    run = run_case(load_case(make_case(tmp_path / "fine")), options=RunOptions(reference=False))
    assert run.comparison is not None and run.comparison.status != "n/a"


def test_a_gate_run_reads_each_profile_once_and_computes_each_class_once(write_case, tmp_path, monkeypatch):
    """A sweep of three points naming its profile: loading validates it, the golden folders, the workers'
    early starts and each point's run need it; one read in all (before: 15). The classes: the case's (both
    sides' devices) and a side's (one device), each computed once."""
    reads: list[str | None] = []
    classes: list[tuple[str, ...]] = []
    read, classify = harness.numerics.load_profile, harness.run_options.environment_class

    def counted_read(name, relative_to=None):
        reads.append(name)
        return read(name, relative_to)

    def counted_class(profile, devices):
        classes.append(tuple(devices))
        return classify(profile, devices)

    monkeypatch.setattr(harness.numerics, "load_profile", counted_read)
    monkeypatch.setattr(harness.run_options, "environment_class", counted_class)
    path = write_case(PADDLE_ONLY.replace("seed: 3", "numerics: portable-avx2\nsweep: {seed: [1, 2, 3]}"))
    code = main(["gate", str(path), "--baseline", str(tmp_path / "base"), "--no-reference", "--golden", "write-missing"])
    assert code == 1  # three goldens written: each case fails once
    assert len(list((tmp_path / "base" / "cpu-avx2").glob("*.golden.yaml"))) == 3
    assert reads == ["portable-avx2"]
    assert sorted(classes) == [("cpu",), ("cpu", "cpu")]
