"""Faults and bad input, with real worker processes and real signals (no framework is mocked): exit
codes, one-line messages, no traceback, no process of a worker's group left behind, no temporary folder
left behind. Both sides are Paddle (cheap: no compilation); the second runs a user function that
injects the fault. Where the test is about xfalign's process (signals, a file size limit, a helper holding
its output) it runs `python -m harness.cli`; elsewhere the same command runs in this process
(`harness.cli.main`, the session's workers; same exit code, output and stderr)."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.errors import safe_name

from conftest import SMALL_WEIGHTED

SIDES = "  megatron: {framework: megatron, mode: compile}\n  paddle: {framework: paddle, impl: fp32_island}\n"
assert SIDES in SMALL_WEIGHTED
PAIR = (SMALL_WEIGHTED.replace(SIDES, "  ref: {framework: paddle, impl: fp32_island}\n"
                                      "  user: {framework: paddle, impl: 'f.py:swiglu'}\n")
        .replace("all: bitwise", "all: report"))
# the same with 2 tokens: inputs and tensors of a few hundred bytes, meta.json of some KB
TINY = PAIR.replace("[16, 64]", "[2, 64]").replace("[16, 1]", "[2, 1]").replace("[16, 32]", "[2, 32]")

USER_FUNCTION = '''\
import os, signal, subprocess, sys, time
from pathlib import Path

import paddle

HERE = Path(__file__).parent


def swiglu(x, bias, probs, options):
    print("user function started", flush=True)
    (HERE / "worker.pid").write_text(str(os.getpid()))
{fault}
    a, b = paddle.chunk(x.cast("float32"), 2, axis=-1)
    return (paddle.nn.functional.silu(a) * b * probs).cast(x.dtype)
'''
HELPER = '''\
helper = subprocess.Popen(["sleep", "1000"])
(HERE / "helper.pid").write_text(str(helper.pid))
'''


def make_case(folder: Path, fault: str = "", text: str = PAIR, name: str = "case.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "f.py").write_text(USER_FUNCTION.format(fault="\n".join(f"    {line}" for line in fault.splitlines())))
    path = folder / name
    path.write_text(text)
    return path


def xfalign_env(tmp_path: Path) -> dict:
    tmp = tmp_path / "tmp"  # the run's temporary folders go here, so the test can see they are removed
    tmp.mkdir(exist_ok=True)
    return dict(os.environ, TMPDIR=str(tmp))


def xfalign(tmp_path: Path, *args, timeout: float = 180, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *map(str, args)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout, env=xfalign_env(tmp_path), **popen)


def xfalign_here(capsys, *args) -> subprocess.CompletedProcess:
    """The same command in this process (`harness.cli.main`, the session's workers): exit code, stdout, stderr."""
    from harness.cli import main

    capsys.readouterr()
    code = main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["xfalign", *map(str, args)], code, out, err)


def gone(pid: int, within: float = 5.0) -> bool:
    """The process has exited (a zombie waiting for its reaper counts as exited)."""
    deadline = time.monotonic() + within
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def assert_one_error_line(done: subprocess.CompletedProcess, *fragments: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xfalign: error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in done.stdout + done.stderr
    return lines[0]


def assert_no_temp_left(tmp_path: Path) -> None:
    assert [p.name for p in (tmp_path / "tmp").iterdir()] == []


def case_folders(pool) -> set[str]:
    """The cases' temporary folders inside a pool's (in-process runs; the pool's own goes when it closes)."""
    return {p.name for p in pool.workdir.iterdir() if p.name.startswith("case-")}


# --- cheap: usage and output paths, refused before any side runs --------------------------------------


def test_safe_name():
    assert safe_name("moe_combine[topk=1,dtype=bf16]") == "moe_combine_topk_1_dtype_bf16_"
    assert safe_name("a/b c") == "a_b_c" and safe_name("x-1.2_y") == "x-1.2_y"
    assert safe_name("..") == "__" and safe_name("") == "_"


def test_timeout_resolution(write_case):
    from harness.load import load_case
    from harness.run_options import DEFAULT_SIDE_TIMEOUT_S, RunOptions

    assert DEFAULT_SIDE_TIMEOUT_S == 600
    assert RunOptions().settings(load_case(write_case(SMALL_WEIGHTED))).timeout == 600  # a case without the field
    timed = load_case(write_case(SMALL_WEIGHTED.replace("seed: 3", "seed: 3\ntimeout: 30"), "timed.yaml"))
    assert RunOptions().settings(timed).timeout == 30  # the case's
    assert RunOptions(timeout=5).settings(timed).timeout == 5  # --timeout wins


@pytest.mark.parametrize("args, fragment", [
    (["run", "case.yaml", "--repeat", "0"], "--repeat must be >= 1 (got 0)"),
    (["run", "case.yaml", "--repeat", "-2"], "--repeat must be >= 1 (got -2)"),
    (["gate", "case.yaml", "--baseline", "b", "--repeat", "0"], "--repeat must be >= 1 (got 0)"),
    (["run", "case.yaml", "--timeout", "0"], "--timeout must be a positive number of seconds"),
    (["gate", "case.yaml", "--baseline", "b", "--update", "--timeout", "-5"], "--timeout must be"),
    (["run", "case.yaml", "case.yaml"], "two cases named 'case': case.yaml is given twice"),
    (["run", "case.yaml", "other/case.yaml"], "two cases named 'case': in case.yaml and in other/case.yaml"),
])
def test_usage_errors_exit_2_before_running(tmp_path, capsys, args, fragment):
    make_case(tmp_path)
    make_case(tmp_path / "other")
    done = xfalign_here(capsys, *args)
    assert done.returncode == 2
    assert_one_error_line(done, fragment)
    assert not (tmp_path / "worker.pid").exists() and not (tmp_path / "other" / "worker.pid").exists()


@pytest.mark.parametrize("debug_first", [True, False])
def test_debug_flag_before_or_after_the_command(tmp_path, capsys, debug_first):
    make_case(tmp_path)
    args = ["--debug", "run", "case.yaml", "--repeat", "0"] if debug_first else ["run", "case.yaml", "--repeat", "0", "--debug"]
    done = xfalign_here(capsys, *args)
    assert done.returncode == 2
    assert "Traceback (most recent call last)" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "xfalign: error: --repeat must be >= 1 (got 0)"


def test_internal_error_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    # an unexpected exception in xfalign itself (forced here in xfalign's own case loader)
    from harness import cli

    def broken(*args):
        raise RuntimeError("something xfalign did not expect\nsecond line")

    monkeypatch.setattr(cli, "load_cases", broken)
    assert cli.main(["run", str(make_case(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert err == ("xfalign: internal error: RuntimeError: something xfalign did not expect ... "
                   "(run with --debug for the traceback)\n")
    assert cli.main(["run", str(tmp_path / "case.yaml"), "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.strip().splitlines()[-1].startswith("xfalign: internal error: RuntimeError")


def _unwritable_cases(tmp_path: Path) -> list[tuple[list, str]]:
    (tmp_path / "plain_file").write_text("x")
    (tmp_path / "a_folder").mkdir()
    cases = [
        (["run", "case.yaml", "--json", "plain_file/r.json"], "--json plain_file/r.json: plain_file is not a directory"),
        (["run", "case.yaml", "--json", "a_folder"], "--json a_folder: is a directory, not a file"),
        (["run", "case.yaml", "--html", "plain_file/deeper/r.html"], "--html plain_file/deeper/r.html: plain_file is not a directory"),
        (["run", "case.yaml", "--html", "plain_file"], "--html plain_file: exists and is not a directory"),
        (["run", "case.yaml", "--dump", "plain_file/d"], "--dump plain_file/d/ref: plain_file is not a directory"),
        (["run", "case.yaml", "--side", "user", "--dump", "a_folder/../plain_file"], "exists and is not a directory"),
        (["run", "case.yaml", "--side", "user", "--dump", "."], "--dump .: exists and is not an xfalign dump"),
        (["gate", "case.yaml", "--baseline", "plain_file/b", "--update"], "--baseline plain_file/b: plain_file is not a directory"),
        (["compare", "x", "y", "--json", "plain_file/r.json"], "--json plain_file/r.json"),
        (["run", "case.yaml", "--json", "/proc/xfalign/r.json"], "--json /proc/xfalign/r.json: cannot write in /proc"),
    ]
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o500)
    try:
        (read_only / "probe").touch()  # root writes anyway: that variant is covered by the paths above
        (read_only / "probe").unlink()
    except PermissionError:
        cases += [(["run", "case.yaml", "--json", "read_only/r.json"],
                   "--json read_only/r.json: cannot write in read_only: Permission denied"),
                  (["run", "case.yaml", "--html", "read_only/sub/r.html"], "cannot write in read_only: Permission denied")]
    return cases


def test_unwritable_outputs_refused_before_any_side_runs(tmp_path, capsys):
    make_case(tmp_path)
    for args, fragment in _unwritable_cases(tmp_path):
        started = time.monotonic()
        done = xfalign_here(capsys, *args)
        elapsed = time.monotonic() - started
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert_one_error_line(done, fragment)
        assert not (tmp_path / "worker.pid").exists(), args  # no side ran
        assert elapsed < 10, (args, elapsed)  # the checks only
    assert (tmp_path / "plain_file").read_text() == "x" and [p.name for p in (tmp_path / "a_folder").iterdir()] == []
    (tmp_path / "read_only").chmod(0o700)


@pytest.mark.slow  # an end-to-end run of both sides in a fresh process
def test_write_error_while_writing_outputs_is_exit_2(tmp_path, capsys):
    """A real write error after the checks passed (file size limit: EFBIG, as a full disk gives ENOSPC)."""
    case = make_case(tmp_path, text=TINY)

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))  # inputs and tensors fit, meta.json does not

    done = xfalign(tmp_path, "run", case, "--side", "ref", "--dump", "dumps/ref", preexec_fn=limit_file_size)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert_one_error_line(done, f"cannot write the dump {tmp_path / 'dumps' / 'ref'}: File too large")  # made absolute
    assert not (tmp_path / "dumps" / "ref").exists() and list((tmp_path / "dumps").iterdir()) == []  # no staging left
    # a dump written without the limit, then a report that does not fit
    assert xfalign_here(capsys, "run", case, "--side", "ref", "--dump", "dumps/ref").returncode == 0
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)  # compare starts no worker: in this process
    resource.setrlimit(resource.RLIMIT_FSIZE, (2000, hard))  # (Python ignores SIGXFSZ: writes fail with EFBIG)
    try:
        done = xfalign_here(capsys, "compare", "dumps/ref", "dumps/ref", "--json", "out/r.json", "--html", "out")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert_one_error_line(done, "cannot write the JSON report out/r.json: File too large")
    assert_no_temp_left(tmp_path)


# --- side faults: a real worker crashes, exits early, hangs, leaves a helper ----------------------------


@pytest.mark.parametrize("fault, expected", [
    ("os.kill(os.getpid(), signal.SIGSEGV)", "side 'user' was killed by SIGSEGV (signal 11)"),
    ("os.kill(os.getpid(), signal.SIGKILL)", "side 'user' was killed by SIGKILL (likely out of memory) (signal 9)"),
    # sys.exit(0): test_side_that_exits_early_is_not_mistaken_for_an_old_dump, with the same checks
    ("os._exit(1)", "side 'user' exited before writing its dump (exit 1)"),
    ("raise ValueError('bad shapes in user code')", "side 'user' failed (exit 1): ValueError: bad shapes in user code"),
])
def test_side_fault_is_exit_3_naming_the_cause_with_output_tail(tmp_path, capsys, workers, fault, expected):
    """In this process, with the session's workers: the fault is the case's, and a fresh worker is not the
    point (the next case gets one; test_workers counts them). An exception leaves its worker serving, so that
    one gets a pool of its own, closed here, to see its helper killed with the worker's group."""
    from harness.runner import WorkerPool

    case = make_case(tmp_path, HELPER + fault)
    if "raise" in fault:
        with WorkerPool(jobs=1) as own, own.as_default():
            done = xfalign_here(capsys, "run", case)
            assert case_folders(own) == set()
    else:
        before = case_folders(workers)  # other tests' runs may still be ending in the session's pool
        done = xfalign_here(capsys, "run", case)
        assert case_folders(workers) <= before
    assert done.returncode == 3, (done.stdout, done.stderr)
    crash = [line for line in done.stdout.splitlines() if line.startswith("CRASH")]
    assert len(crash) == 1 and crash[0].startswith(f"CRASH case: {expected}; last "), done.stdout
    # the tail of the worker's output: what the user function printed, or the end of the traceback
    assert ("  ValueError: bad shapes in user code" if "raise" in fault else "  user function started") in done.stdout
    assert "xfalign: error" not in done.stderr and "Traceback" not in done.stderr
    if "SIGSEGV" not in fault and "raise" not in fault:  # Paddle's own handler prints a "C++ Traceback"
        assert "Traceback" not in done.stdout
    assert "not a readable xfalign dump" not in done.stdout + done.stderr
    assert gone(int((tmp_path / "worker.pid").read_text()), within=0.5)
    assert gone(int((tmp_path / "helper.pid").read_text())), "a helper of the crashed worker was left running"


def test_side_that_exits_early_is_not_mistaken_for_an_old_dump(tmp_path, capsys):
    """--side into a folder that holds an earlier dump: a worker that exits 0 without writing is reported
    as such; the earlier dump is neither read as this run's nor reported as unreadable."""
    case = make_case(tmp_path)
    assert xfalign_here(capsys, "run", case, "--side", "user", "--dump", "d").returncode == 0
    make_case(tmp_path, HELPER + "sys.exit(0)")
    done = xfalign_here(capsys, "run", case, "--side", "user", "--dump", "d")
    assert done.returncode == 3
    crash = [line for line in done.stdout.splitlines() if line.startswith("CRASH")]
    assert len(crash) == 1 and crash[0].startswith("CRASH case: side 'user' exited before writing its dump (exit 0); last ")
    assert "  user function started" in done.stdout and "Traceback" not in done.stdout + done.stderr
    assert "dumped" not in done.stdout and "not a readable" not in done.stdout + done.stderr
    assert gone(int((tmp_path / "worker.pid").read_text()), within=0.5)
    assert gone(int((tmp_path / "helper.pid").read_text())), "a helper of the exited worker was left running"


def test_timeout_kills_the_side_and_its_group(tmp_path, capsys, workers):
    """In this process, with the session's workers, so that a short --timeout does not include a framework
    import: the Paddle worker is started first (a fresh worker's first job counts its import)."""
    from harness.load import load_case
    from harness.runner import run_case

    run_case(load_case(make_case(tmp_path / "warm")))  # the session's Paddle worker is up
    case = make_case(tmp_path, HELPER + "time.sleep(1000)")
    before = case_folders(workers)  # other tests' runs may still be ending in the session's pool
    started = time.monotonic()
    done = xfalign_here(capsys, "run", case, "--timeout", "1")
    elapsed = time.monotonic() - started
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "CRASH case: side 'user' timed out after 1 s; last 1 lines of its output:\n  user function started" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert 1 <= elapsed < 60
    assert gone(int((tmp_path / "worker.pid").read_text()), within=0.5)
    assert gone(int((tmp_path / "helper.pid").read_text()))
    assert case_folders(workers) <= before


def test_helper_left_by_user_code_does_not_hold_the_run_open(tmp_path):
    """The user function starts `sleep 1000` (which inherits the worker's stdout and stderr) and returns:
    the run ends when the worker does, and the helper is killed with the worker's group."""
    case = make_case(tmp_path, HELPER)
    done = xfalign(tmp_path, "run", case, "--json", "r.json", timeout=120)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "PASS case" in done.stdout and (tmp_path / "r.json").is_file()
    assert gone(int((tmp_path / "helper.pid").read_text()))
    assert_no_temp_left(tmp_path)


@pytest.mark.parametrize("signum, code", [
    (signal.SIGTERM, 143),
    # SIGINT to xfalign in the fast suite: test_faults_storage's interrupted updates
    pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow),
])
def test_signal_to_xfalign_kills_the_workers_and_removes_the_temp_folder(tmp_path, signum, code):
    case = make_case(tmp_path, HELPER + "time.sleep(1000)")
    process = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(case)], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=xfalign_env(tmp_path))
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "helper.pid").exists():  # the worker is inside the user function
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the worker never reached the user function"
            time.sleep(0.1)
        worker, helper = (int((tmp_path / f"{name}.pid").read_text()) for name in ("worker", "helper"))
        assert [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("xfalign-")]  # the run's folder
        process.send_signal(signum)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == code, (out, err)
    assert err.strip().splitlines() == [f"xfalign: interrupted by {signal.Signals(signum).name}"]
    assert gone(worker, within=0.5) and gone(helper)
    assert_no_temp_left(tmp_path)


def test_several_cases_dump_into_safe_folder_names(tmp_path, capsys):
    sweep = PAIR.replace("seed: 3\n", "seed: 3\nsweep:\n  seed: [1, 2]\n")
    case = make_case(tmp_path, text=sweep, name="sw.yaml")
    done = xfalign_here(capsys, "run", case, "--dump", "dumps", "--html", "html")
    assert done.returncode == 0, (done.stdout, done.stderr)
    folders = sorted(p.name for p in (tmp_path / "dumps").iterdir())
    assert len(folders) == 2 and all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in folders), folders
    for folder in folders:
        assert sorted(p.name for p in (tmp_path / "dumps" / folder).iterdir()) == ["exact", "ref", "user"]
        assert (tmp_path / "dumps" / folder / "user" / "meta.json").is_file()


def test_stray_modules_in_the_working_directory_are_not_imported_by_workers(tmp_path, monkeypatch):
    """A `click.py` (Paddle imports click) or `numpy.py` in the folder xfalign runs from must not be imported."""
    from harness.cli import main

    path = make_case(tmp_path / "case", text=TINY)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for module in ("click", "numpy", "yaml"):
        (cwd / f"{module}.py").write_text(f"raise SystemExit('stray {module}.py imported')\n")
    monkeypatch.chdir(cwd)
    assert main(["run", str(path), "--html", str(tmp_path / "html")]) == 0


# --- processes and folders a run leaves behind: helpers outside the worker's group, a killed run -------

# helpers that leave the worker's process group (the first is in it), each writing its pid to helper.pid
DETACHED = {
    "in the group": HELPER,
    "new session": 'helper = subprocess.Popen(["sleep", "1000"], start_new_session=True)\n'
                   '(HERE / "helper.pid").write_text(str(helper.pid))\n',
    "new group": 'helper = subprocess.Popen(["sleep", "1000"], process_group=0)\n'
                 '(HERE / "helper.pid").write_text(str(helper.pid))\n',
    # a forked copy of the worker (Paddle loaded), detached as a daemon is: fork, setsid, fork, parent exits
    "daemon": 'first = os.fork()\n'
              'if first == 0:\n'
              '    os.setsid()\n'
              '    if os.fork() == 0:\n'
              '        (HERE / "helper.pid").write_text(str(os.getpid()))\n'
              '        time.sleep(1000)\n'
              '    os._exit(0)\n'
              'os.waitpid(first, 0)\n'
              'while not (HERE / "helper.pid").exists():\n'
              '    time.sleep(0.01)\n',
}


def absent(pid: int, within: float = 2.0) -> bool:
    """The process has exited and was reaped (no zombie left)."""
    deadline = time.monotonic() + within
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def helpers(tmp_path):
    """The pids of the helpers the test's user functions recorded; any still running at the end is killed
    (a failing test leaves no `sleep 1000`)."""
    recorded: list[int] = []
    yield recorded
    for pid in recorded:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def helper_pid(folder: Path, helpers: list[int]) -> int:
    pid = int((folder / "helper.pid").read_text())
    helpers.append(pid)
    return pid


@pytest.mark.parametrize("kind", DETACHED)
def test_helpers_a_case_starts_end_with_the_case(tmp_path, workers, helpers, kind):
    """With the session's workers (which live on): by the time run_case returns, what the user function
    started is gone and reaped, however it detached; a child of this process that the pool did not start
    is left alone."""
    from harness.load import load_case
    from harness.runner import run_case

    bystander = subprocess.Popen(["sleep", "60"])
    try:
        run = run_case(load_case(make_case(tmp_path, DETACHED[kind])))
        assert run.comparison is not None
        assert absent(helper_pid(tmp_path, helpers)), f"a helper ({kind}) outlived its case"
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_helper_outside_the_group_of_a_worker_that_dies_is_killed(tmp_path, capsys, helpers):
    """The worker exits mid-job (os._exit) after detaching a daemon: the keeper ends the daemon."""
    case = make_case(tmp_path, DETACHED["daemon"] + "os._exit(1)")
    done = xfalign_here(capsys, "run", case)
    assert done.returncode == 3 and "CRASH case: side 'user' exited before writing its dump (exit 1)" in done.stdout
    assert absent(helper_pid(tmp_path, helpers))
    assert absent(int((tmp_path / "worker.pid").read_text()))


def test_timeout_kills_a_helper_outside_the_group(tmp_path, capsys, workers, helpers):
    from harness.load import load_case
    from harness.runner import run_case

    run_case(load_case(make_case(tmp_path / "warm")))  # the session's Paddle worker is up
    case = make_case(tmp_path, DETACHED["new session"] + "time.sleep(1000)")
    done = xfalign_here(capsys, "run", case, "--timeout", "2")
    assert done.returncode == 3 and "CRASH case: side 'user' timed out after 2 s" in done.stdout, done.stdout
    assert absent(helper_pid(tmp_path, helpers))
    assert absent(int((tmp_path / "worker.pid").read_text()))


def keeper_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.slow  # a fresh xfalign process and its workers
def test_sigkill_to_xfalign_ends_its_workers_and_the_next_run_removes_its_folder(tmp_path, helpers, monkeypatch):
    """SIGKILL leaves xfalign no chance to clean up: each worker's keeper sees its parent die and ends the
    worker (mid-job: the side sleeps) and what it started; the next run removes the temporary folder."""
    from harness.runner import WorkerPool

    case = make_case(tmp_path, DETACHED["daemon"] + "time.sleep(1000)")
    process = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(case)], cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=xfalign_env(tmp_path))
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "helper.pid").exists():  # the worker is inside the user function
            assert process.poll() is None and time.monotonic() < deadline, "the worker never reached the user function"
            time.sleep(0.1)
        worker, helper = int((tmp_path / "worker.pid").read_text()), helper_pid(tmp_path, helpers)
        keeper = keeper_of(worker)
        left = [p for p in (tmp_path / "tmp").iterdir() if p.name.startswith("xfalign-")]
        process.kill()
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert gone(worker) and gone(helper) and gone(keeper), "a worker outlived xfalign"
    assert len(left) == 1 and left[0].is_dir()  # nothing could remove it
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    with WorkerPool(jobs=1) as pool:  # the next run
        ours = pool.workdir  # made as a run makes it: the stale folders are removed first
        assert [p.name for p in (tmp_path / "tmp").iterdir()] == [ours.name]
    assert_no_temp_left(tmp_path)


def claimed(folder: Path, **owner) -> Path:
    folder.mkdir(parents=True)
    (folder / "owner.json").write_text(json.dumps(owner))
    (folder / "inputs.safetensors").write_text("x")
    return folder


def test_next_run_removes_folders_of_killed_runs_only(tmp_path, monkeypatch):
    """A folder whose owner process is gone (or whose pid now names another process) is removed; one whose
    owner runs, one on another host, one without an owner file (an older xfalign's, or not a run's) stay."""
    from harness.reaper import _identity
    from harness.runner import WorkerPool

    tmp = tmp_path / "tmp"
    ended = subprocess.Popen(["true"])
    ended.wait()
    host = socket.gethostname()
    me = {"pid": os.getpid(), "process": _identity(os.getpid()), "host": host}
    stale = [claimed(tmp / "xfalign-dead", pid=ended.pid, process=me["process"], host=host),
             claimed(tmp / "xfalign-reused", **dict(me, process=f"{me['process']}0"))]
    kept = [claimed(tmp / "xfalign-live", **me),
            claimed(tmp / "xfalign-elsewhere", pid=ended.pid, process="x", host=f"not-{host}"),
            claimed(tmp / "xfalign-hypothesis", other="x"), tmp / "xfalign-unclaimed"]
    kept[-1].mkdir()
    (tmp / "xfalign-file").write_text("x")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    with WorkerPool(jobs=1) as pool:
        ours = pool.workdir  # made as a run makes it: the stale folders are removed first
        assert {p.name for p in tmp.iterdir()} == {ours.name, "xfalign-file", *(folder.name for folder in kept)}
        assert json.loads((ours / "owner.json").read_text()) == me
    assert all((folder / "inputs.safetensors").exists() for folder in kept[:3])
    assert not any(folder.exists() for folder in stale)


def test_full_temporary_folder_while_writing_the_inputs_is_one_line(tmp_path, capsys, workers):
    """In this process (the inputs are written here): a file size limit below the inputs' size (EFBIG, the
    way a full disk gives ENOSPC: safetensors raises its own error for both)."""
    case = make_case(tmp_path)
    before = case_folders(workers)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))  # x alone is 2 KiB
    try:
        done = xfalign_here(capsys, "run", case)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert done.returncode == 2, (done.stdout, done.stderr)
    line = assert_one_error_line(done, "cannot write the case's inputs ", "inputs.safetensors: File too large",
                                 "set TMPDIR to a folder with room")
    assert str(workers.workdir) in line
    assert not (tmp_path / "worker.pid").exists() and case_folders(workers) <= before


@pytest.mark.slow  # a fresh xfalign process, in a mount namespace of its own
def test_full_disk_while_writing_the_inputs_is_one_line(tmp_path):
    """A real full disk: TMPDIR on a 32 KiB tmpfs (mounted in a user and mount namespace of the run's own),
    inputs of 64 KiB."""
    big = PAIR.replace("[16, 64]", "[64, 512]").replace("[16, 1]", "[64, 1]").replace("[16, 32]", "[64, 256]")
    case = make_case(tmp_path, text=big)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    probe = subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=32k", "none", str(tmp)],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no user and mount namespaces here: {probe.stderr.decode().strip()}")
    script = f'mount -t tmpfs -o size=32k none "$TMPDIR" && exec {sys.executable} -m harness.cli run {case}'
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=180, env=xfalign_env(tmp_path))
    assert done.returncode == 2, (done.stdout, done.stderr)
    line = assert_one_error_line(done, "cannot write the case's inputs ", "No space left on device")
    assert re.search(rf"{re.escape(str(tmp))}/xfalign-[^/]+/case-[^/]+/inputs.safetensors: ", line), line


COMPILE_POOL = '''\
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._inductor.async_compile import AsyncCompile

HERE = Path(__file__).parent


def swiglu(x, bias, probs, options):
    pool = AsyncCompile.process_pool()  # what a compilation on a GPU host starts, and the next one reuses
    assert pool.submit(AsyncCompile._get_ready).result(timeout=120) == "ready"
    with open(HERE / "sidecar.txt", "a") as out:
        out.write(f"{pool.process.pid}\\n")
    a, b = torch.chunk(x.float(), 2, -1)
    return (F.silu(a) * b * probs.float()).to(x.dtype)
'''


@pytest.mark.slow  # a pool of its own: a Megatron worker started and closed here
def test_a_frameworks_compile_pool_is_kept_for_the_next_case(tmp_path):
    """torch inductor's compile workers (a sidecar process) are started by one case and reused by the next:
    not the case's to end. They end with the worker."""
    from harness.load import load_case
    from harness.runner import WorkerPool, run_case

    case = make_case(tmp_path, text=PAIR.replace("{framework: paddle, impl: 'f.py:swiglu'}",
                                                 "{framework: megatron, impl: 'f.py:swiglu'}"))
    (tmp_path / "f.py").write_text(COMPILE_POOL)
    with WorkerPool(jobs=2) as pool:
        for _ in range(2):
            run_case(load_case(case), pool=pool)
        first, second = map(int, (tmp_path / "sidecar.txt").read_text().split())
        assert first == second and not gone(first, within=0)
    assert gone(first)
