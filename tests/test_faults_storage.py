"""Faults in storage, for real: a writer process killed (SIGTERM, SIGINT, SIGKILL) at each critical point of
writing a dump or a golden, two processes updating one golden, a read-only folder, a full disk (a tiny
tmpfs), the umask's permissions, folders xfalign did not write, corrupt goldens repaired by --update, an
interrupted multi-case update. No framework is needed for the writers (numpy arrays, storage_writers.py); the
CLI tests run two cheap Paddle sides, in this process on the session's workers (the interrupted update in a
process of its own, to signal it)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from storage_writers import CASE_ID, make_dump, make_golden

from harness.cli import main
from harness.errors import OutputError
from harness.store import atomic
from harness.store.digest import digests_of
from harness.store.dump import Dump, DumpTargetError, check_dump_target
from harness.store.golden import Golden, GoldenError, GoldenMismatch

from conftest import ROOT, SMALL_WEIGHTED

TESTS = Path(__file__).resolve().parent
STEM = "sweep_x_1_y_fp32_"

SIDES = "  megatron: {framework: megatron, mode: compile}\n  paddle: {framework: paddle, impl: fp32_island}\n"
TINY = (SMALL_WEIGHTED.replace(SIDES, "  ref: {framework: paddle, impl: fp32_island}\n"
                                      "  per_op: {framework: paddle, impl: per_op_rounding}\n")
        .replace("all: bitwise", "all: report")
        .replace("[16, 64]", "[2, 64]").replace("[16, 1]", "[2, 1]").replace("[16, 32]", "[2, 32]"))
assert "ref:" in TINY and "[2, 64]" in TINY


def dump_seed(directory: Path) -> int:
    """Which dump is at `directory`: read in full (digests verified) and matched by its tensors."""
    dump = Dump.read(directory)
    seed = dump.meta["environment"]["seed"]
    assert dump.digests == digests_of(make_dump(seed, elements=dump.tensors["out"].size).tensors)
    return seed


def golden_seed(directory: Path, case: str = CASE_ID) -> int:
    golden = Golden.read(directory, case)  # values verified against the YAML's digests
    assert golden is not None
    seed = golden.environment["megatron"]["seed"]
    expected = make_golden(seed, case, elements=golden.tensors["megatron"]["out"].shape[0])
    assert golden.tensors == expected.tensors
    if golden.arrays is not None:
        assert all(np.array_equal(golden.arrays[k], expected.arrays[k]) for k in expected.arrays)
    return seed


WRITER = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from pathlib import Path
import harness.store.atomic
from harness.store.golden import Golden
from storage_writers import make_dump, make_golden
kind, path, seed, elements = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if "no-exchange" in sys.argv[5:]:
    harness.store.atomic.exchange = lambda a, b: False
if kind == "dump":
    make_dump(seed, elements=elements).write(path)
elif kind == "golden":
    make_golden(seed, elements=elements).write(path)
else:  # "golden-loop": update one golden 100 times, reading it back each time; print the failures
    failures = 0
    for i in range(100):
        try:
            make_golden(seed * 1000 + i, elements=elements).write(path)
            golden = Golden.read(path, {CASE_ID!r})
            assert golden is not None and golden.arrays is not None
        except Exception as error:
            failures += 1
            print(type(error).__name__, error, file=sys.stderr)
    print("failures", failures)
"""


def start_writer(tmp_path: Path, *args, pause: str | None = None) -> tuple[subprocess.Popen, Path]:
    marker = tmp_path / f"paused-{time.monotonic_ns()}"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if pause:
        env |= {atomic.PAUSE_ENV: pause, atomic.PAUSE_MARKER_ENV: str(marker)}
    process = subprocess.Popen([sys.executable, "-c", WRITER, *map(str, args)], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return process, marker


def wait_for(process: subprocess.Popen, marker: Path, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not marker.exists():
        if process.poll() is not None:
            raise AssertionError(f"the writer ended before pausing: {process.communicate()}")
        assert time.monotonic() < deadline, "the writer never reached the pause point"
        time.sleep(0.02)


def kill_at(tmp_path: Path, point: str, signum: int, *args) -> subprocess.CompletedProcess:
    process, marker = start_writer(tmp_path, *args, pause=point)
    try:
        wait_for(process, marker)
        process.send_signal(signum)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode != 0
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGKILL]


# --- dumps: killed at every step of a replace, the path holds the complete old or new dump ---------------

@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("point, expected", [("dump-staged", 1), ("dump-exchanged", 2)])
def test_dump_replace_killed_at_each_point_leaves_old_or_new(tmp_path, point, expected, signum):
    target = tmp_path / "dumps" / "paddle"
    make_dump(1).write(target)
    kill_at(tmp_path, point, signum, "dump", target, 2, 256)
    assert dump_seed(target) == expected
    leftovers = [p.name for p in target.parent.iterdir() if p.name != "paddle"]
    if signum == signal.SIGINT:  # KeyboardInterrupt: the writer removed its staging folder on the way out
        assert leftovers == []
    else:  # killed outright: at most the hidden staging folder (the new dump, or the old one swapped out)
        assert all(name.startswith(".paddle.") and name.endswith(".tmp") for name in leftovers) and len(leftovers) <= 1
    make_dump(3).write(target)  # a later write is not disturbed by what a killed one left
    assert dump_seed(target) == 3


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL], ids=lambda s: signal.Signals(s).name)
def test_dump_replace_without_exchange_has_the_documented_window(tmp_path, signum):
    """Where renameat2 cannot exchange, the old dump is renamed aside first: killed in that window, the path
    is empty but the complete old dump is at `.<name>.old-*`; interrupted (SIGINT), it is put back."""
    target = tmp_path / "paddle"
    make_dump(1).write(target)
    kill_at(tmp_path, "dump-moved-aside", signum, "dump", target, 2, 256, "no-exchange")
    if signum == signal.SIGINT:
        assert dump_seed(target) == 1
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".paddle.")] == []
    else:
        assert not target.exists()
        [aside] = [p for p in tmp_path.iterdir() if p.name.startswith(".paddle.old-")]
        assert dump_seed(aside) == 1


def test_dump_replace_without_exchange_works(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
    make_dump(1).write(tmp_path / "d")
    make_dump(2).write(tmp_path / "d")
    assert dump_seed(tmp_path / "d") == 2 and [p.name for p in tmp_path.iterdir()] == ["d"]


def test_exchange_swaps_two_folders(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_text("a")
    (tmp_path / "b").mkdir()
    if not atomic.exchange(tmp_path / "a", tmp_path / "b"):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here: the rename-aside fallback is used")
    assert (tmp_path / "b" / "x").read_text() == "a" and list((tmp_path / "a").iterdir()) == []


# --- dumps: nothing xfalign did not write is replaced, nor another side's dump ----------------------------

def tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def test_dump_target_rules_touch_nothing(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    (tmp_path / "file").write_text("x")
    make_dump(1, side="megatron").write(tmp_path / "both" / "megatron")
    make_dump(2, side="paddle").write(tmp_path / "both" / "paddle")
    make_dump(3, side="megatron").write(tmp_path / "single")
    (tmp_path / "link").symlink_to(tmp_path / "single")
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "meta.json").write_text('{"format": "something-else"}')
    before = tree(tmp_path)
    refused = {
        "mine": "exists and is not an xfalign dump (no meta.json); refusing to replace it",
        "fake": "exists and is not an xfalign dump",
        "file": "exists and is not a directory",
        "link": "is a symbolic link",
        "single/inner": "is inside the xfalign dump",
    }
    for name, fragment in refused.items():
        with pytest.raises(DumpTargetError) as error:
            check_dump_target(tmp_path / name, "paddle", label="--dump")
        assert str(error.value).startswith(f"--dump {tmp_path / name}: ") and fragment in str(error.value)
        assert error.value.exit_code == 2 and "\n" not in str(error.value)
    with pytest.raises(DumpTargetError) as error:  # the folder of a two-sided run: never replaced by one side
        check_dump_target(tmp_path / "both", "paddle", label="--dump")
    assert str(error.value) == (f"--dump {tmp_path / 'both'}: holds the xfalign dumps megatron, paddle; refusing to "
                                f"replace them (give --dump {tmp_path / 'both' / 'paddle'} to write this side beside them)")
    with pytest.raises(DumpTargetError, match="holds the dump of side 'megatron', not 'paddle'"):
        check_dump_target(tmp_path / "single", "paddle")
    with pytest.raises(DumpTargetError):  # Dump.write itself refuses too
        make_dump(4, side="paddle").write(tmp_path / "mine")
    assert tree(tmp_path) == before
    for allowed, side in (("absent", "paddle"), ("both/paddle", "paddle"), ("single", "megatron"), ("single", None)):
        check_dump_target(tmp_path / allowed, side)
    (tmp_path / "empty").mkdir()
    make_dump(5).write(tmp_path / "empty")
    assert dump_seed(tmp_path / "empty") == 5


def test_a_fresh_dump_never_replaces_what_is_there(tmp_path):
    """Dump.write(fresh=True), a capture tree's step (the writer holds the tree, so the target's checks are skipped):
    a folder already at the path, even an xfalign dump of the same side, is refused and left as it was."""
    make_dump(1).write(tmp_path / "step")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    before = tree(tmp_path)
    for name in ("step", "mine"):
        with pytest.raises(DumpTargetError, match=f"dump {tmp_path / name}: exists already; refusing to replace it"):
            make_dump(2).write(tmp_path / name, fresh=True)
    assert tree(tmp_path) == before and dump_seed(tmp_path / "step") == 1
    make_dump(3).write(tmp_path / "new", fresh=True)
    assert dump_seed(tmp_path / "new") == 3


def cli(capsys, *args) -> subprocess.CompletedProcess:
    """The real CLI, in this process (on the session's workers; the working directory is the test's)."""
    capsys.readouterr()
    code = main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["xfalign", *map(str, args)], code, out, err)


def one_error_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xfalign: error: "), done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    return lines[0]


def test_side_never_replaces_a_folder_of_both_sides(tmp_path, capsys):
    (tmp_path / "case.yaml").write_text(TINY)
    assert cli(capsys, "run", "case.yaml", "--dump", "d", "--html", "h").returncode == 0
    before = tree(tmp_path / "d")
    assert set(p.name for p in (tmp_path / "d").iterdir()) == {"ref", "per_op", "exact"}  # exact: the float64 reference
    done = cli(capsys, "run", "case.yaml", "--side", "per_op", "--dump", "d")
    assert done.returncode == 2
    assert one_error_line(done) == ("xfalign: error: --dump d: holds the xfalign dumps exact, per_op, ref; refusing to "
                                    "replace them (give --dump d/per_op to write this side beside them)")
    assert tree(tmp_path / "d") == before
    done = cli(capsys, "run", "case.yaml", "--side", "ref", "--dump", "d/per_op")  # another side's dump
    assert done.returncode == 2 and "holds the dump of side 'per_op', not 'ref'" in one_error_line(done)
    assert tree(tmp_path / "d") == before
    assert cli(capsys, "run", "case.yaml", "--side", "per_op", "--dump", "d/per_op").returncode == 0
    assert Dump.read(tmp_path / "d" / "per_op").side == "per_op" and Dump.read(tmp_path / "d" / "ref").side == "ref"
    assert [p.name for p in (tmp_path / "d").iterdir() if p.name.startswith(".")] == []


# --- goldens: a unit; killed at every step, the YAML and the values it names agree ----------------------

@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("point, expected", [("golden-values-written", 1), ("golden-yaml-replaced", 2)])
def test_golden_update_killed_at_each_point_leaves_old_or_new(tmp_path, point, expected, signum):
    baseline = tmp_path / "baseline"
    make_golden(1).write(baseline)
    kill_at(tmp_path, point, signum, "golden", baseline, 2, 256)
    assert golden_seed(baseline) == expected
    make_golden(3).write(baseline)  # the next update removes what the killed one left
    assert golden_seed(baseline) == 3
    text_path, values = Golden.paths(baseline, CASE_ID)
    assert sorted(p.name for p in baseline.iterdir()) == sorted([text_path.name, values.name])


def test_golden_file_names_and_reference(tmp_path):
    path = make_golden(1).write(tmp_path)
    text_path, values = Golden.paths(tmp_path, CASE_ID)
    assert path == text_path == tmp_path / f"{STEM}.golden.yaml"
    assert values.name.startswith(f"{STEM}.golden.") and values.suffix == ".safetensors" and len(values.name) == len(
        f"{STEM}.golden.") + 12 + len(".safetensors")
    assert f"values: {values.name}\n" in text_path.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([text_path.name, values.name])
    first = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    make_golden(1).write(tmp_path)  # the same golden: the same bytes under the same names
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == first
    make_golden(1, with_values=False).write(tmp_path)  # digests only: no values file, `values: null`
    assert [p.name for p in tmp_path.iterdir()] == [text_path.name] and "values: null\n" in text_path.read_text()
    assert Golden.read(tmp_path, CASE_ID).arrays is None


def test_committed_golden_of_a_sweep_point_reads_by_its_case_name():
    baseline = ROOT / "baselines" / "cpu-avx2"
    golden = Golden.read(baseline, "moe_combine[topk=1,dtype=bf16,inputs.probs.dtype=bf16]")
    assert golden is not None and golden.case == "moe_combine[topk=1,dtype=bf16,inputs.probs.dtype=bf16]" and golden.tensors


def test_two_case_ids_that_make_one_file_name_are_refused(tmp_path):
    make_golden(1, case="a[b]").write(tmp_path)
    with pytest.raises(GoldenMismatch, match=r"holds the golden of case 'a\[b\]', not 'a_b_'"):
        Golden.read(tmp_path, "a_b_")


def test_corrupt_golden_is_one_error_naming_the_file(tmp_path):
    make_golden(1).write(tmp_path)
    text_path, values = Golden.paths(tmp_path, CASE_ID)
    good = text_path.read_text()
    for broken in ("sides: [unclosed\n", "case: 3\n", good.replace("float32 [256]", "float32 [2x]"), "\x00\x01"):
        text_path.write_text(broken)
        with pytest.raises((GoldenError, GoldenMismatch)) as error:
            Golden.read(tmp_path, CASE_ID)
        assert str(error.value).startswith(f"{text_path}: ") and "\n" not in str(error.value)
    text_path.write_text(good)
    values.unlink()
    with pytest.raises(GoldenError, match=f"^{values}: missing \\(named by {text_path.name}\\)$"):
        Golden.read(tmp_path, CASE_ID)


def test_two_processes_updating_one_golden_100_times_each(tmp_path):
    baseline = tmp_path / "baseline"
    writers = [start_writer(tmp_path, "golden-loop", baseline, seed, 64)[0] for seed in (1, 2)]
    for writer in writers:
        out, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err
        assert out.strip() == "failures 0", err
    assert golden_seed(baseline) // 1000 in (1, 2)
    assert sorted(p.name for p in baseline.iterdir()) == sorted(p.name for p in Golden.paths(baseline, CASE_ID))


# --- unwritable places: one error naming the path, the previous dump or golden intact ---------------------

def test_unwritable_place_is_one_error_and_nothing_lost(tmp_path):
    (tmp_path / "plain_file").write_text("x")  # a path under a regular file fails as root too
    with pytest.raises(OutputError) as error:
        make_golden(1).write(tmp_path / "plain_file" / "baseline")
    assert str(error.value).startswith(f"cannot write the golden {tmp_path / 'plain_file' / 'baseline'}/")
    with pytest.raises(OSError):
        make_dump(1).write(tmp_path / "plain_file" / "d")
    assert (tmp_path / "plain_file").read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="running as root: chmod 0o500 does not stop root's writes "
                    "(the path-under-a-file test covers the error)")
def test_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    make_golden(1).write(folder)
    make_dump(1).write(folder / "d")
    folder.chmod(0o500)
    try:
        with pytest.raises(OutputError, match=f"^cannot write the golden {folder}/{STEM}.golden.yaml: Permission denied$"):
            make_golden(2).write(folder)
        with pytest.raises(OSError):
            make_dump(2).write(folder / "d")
        assert golden_seed(folder) == 1 and dump_seed(folder / "d") == 1
    finally:
        folder.chmod(0o700)


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs (root only)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True,
                       capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {getattr(error, 'stderr', '') or error}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False, capture_output=True)


def fill(disk: Path) -> None:
    with open(disk / "filler", "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 512)
        except OSError:
            pass


def test_full_disk_keeps_the_previous_dump_and_golden(tiny_disk):
    make_dump(1).write(tiny_disk / "d")
    make_golden(1).write(tiny_disk / "baseline")
    before = tree(tiny_disk)
    big = 64 * 1024 // 4 + 1  # more float32 values than the whole disk holds
    with pytest.raises(OSError):  # (or SafetensorError): the worker turns either into one line, exit 2
        try:
            make_dump(2, elements=big).write(tiny_disk / "d")
        except Exception as error:
            if "No space left on device" not in str(error):
                raise
            raise OSError(str(error)) from None
    with pytest.raises(OutputError) as error:
        make_golden(2, elements=big).write(tiny_disk / "baseline")
    assert str(error.value) == (f"cannot write the golden {tiny_disk / 'baseline' / STEM}.golden.yaml: "
                                "Error while serializing: I/O error: No space left on device (os error 28)")
    assert tree(tiny_disk) == before  # the old dump and golden, and no staging left
    assert dump_seed(tiny_disk / "d") == 1 and golden_seed(tiny_disk / "baseline") == 1


def test_full_disk_through_the_cli_is_exit_2_naming_the_dump(tiny_disk, tmp_path, capsys):
    (tmp_path / "case.yaml").write_text(TINY)
    dump = make_dump(1, side="ref")
    dump.write(tiny_disk / "d")
    fill(tiny_disk)
    done = cli(capsys, "run", "case.yaml", "--side", "ref", "--dump", tiny_disk / "d")
    assert done.returncode == 2, (done.stdout, done.stderr)
    line = one_error_line(done)
    assert line.startswith(f"xfalign: error: cannot write the dump {tiny_disk / 'd'}: ") and "No space left on device" in line
    assert Dump.read(tiny_disk / "d").digests == dump.digests
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["d", "filler"]


# --- permissions follow the umask -------------------------------------------------------------------------

@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_permissions_follow_the_umask(tmp_path, mask, file_mode, dir_mode):
    previous = os.umask(mask)
    try:
        make_dump(1).write(tmp_path / "d")
        make_dump(2).write(tmp_path / "d")  # replaced, too
        make_golden(1).write(tmp_path / "baseline")
        atomic.write_atomic(tmp_path / "report.json", "{}")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == dir_mode
    files = [*(tmp_path / "d").iterdir(), *(tmp_path / "baseline").iterdir(), tmp_path / "report.json"]
    assert len(files) == 5
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == file_mode, path


# --- gate --update: repairs a corrupt golden; an interrupted multi-case update says what it wrote ----------

def test_gate_update_repairs_a_corrupt_golden(tmp_path, capsys):
    (tmp_path / "case.yaml").write_text(TINY)
    assert cli(capsys, "gate", "case.yaml", "--baseline", "b", "--update", "--html", "h").returncode == 0
    text_path, values = Golden.paths(tmp_path / "b" / "cpu-avx2", "case")
    text_path.write_text("sides: [unclosed\n")
    done = cli(capsys, "gate", "case.yaml", "--baseline", "b", "--html", "h")
    assert done.returncode == 2
    assert one_error_line(done).startswith("xfalign: error: b/cpu-avx2/case.golden.yaml: not a readable golden (")
    done = cli(capsys, "gate", "case.yaml", "--baseline", "b", "--update", "--html", "h")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "golden case: unreadable, rewriting it (b/cpu-avx2/case.golden.yaml: not a readable golden" in done.stdout
    assert "golden case: created (wrote b/cpu-avx2/case.golden.yaml)" in done.stdout
    assert "goldens written: 1 of 1" in done.stdout
    assert cli(capsys, "gate", "case.yaml", "--baseline", "b", "--html", "h").returncode == 0


@pytest.mark.slow  # two cases end to end in a fresh process, interrupted
def test_interrupted_multi_case_update_says_which_goldens_it_wrote(tmp_path):
    (tmp_path / "a.yaml").write_text(TINY)
    (tmp_path / "f.py").write_text("import time\nfrom pathlib import Path\n"
                                   "def swiglu(x, bias, probs, options):\n"
                                   "    Path(__file__).with_name('sleeping').write_text('')\n"
                                   "    time.sleep(1000)\n")
    (tmp_path / "b.yaml").write_text(TINY.replace("impl: per_op_rounding", "impl: 'f.py:swiglu'"))
    # -j 1: b starts when a is done; unbuffered output: its lines are read as they are printed; -X faulthandler:
    # SIGABRT prints its threads' stacks (`stuck`, if it does not exit)
    process = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "harness.cli", "gate", "a.yaml", "b.yaml",
                                "--baseline", "base", "--update", "-j", "1"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1"))
    lines, a_written = [], threading.Event()

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if line.startswith("golden a: created"):
                a_written.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(process, tmp_path / "sleeping", within=120)  # b is inside its user function
        assert a_written.wait(120), "".join(lines)  # and the parent has written and said a's golden
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"no exit within 60 s of SIGINT; output:\n{''.join(lines)}\n{stuck(process)}") from None
        reader.join(timeout=30)
        out, err = "".join(lines), process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, (out, err)
    assert "golden a: created (wrote base/cpu-avx2/a.golden.yaml)" in out
    assert out.strip().splitlines()[-1] == "goldens written: 1 of 2: a"
    assert err.strip() == "xfalign: interrupted by SIGINT"
    assert golden_written(tmp_path / "base" / "cpu-avx2", "a") and Golden.read(tmp_path / "base" / "cpu-avx2", "b") is None


def stuck(process: subprocess.Popen) -> str:
    """Where a process that does not exit waits: its process tree (state, kernel wait), then its threads' stacks
    (it runs with -X faulthandler: SIGABRT prints them on its stderr, and ends it)."""
    rows = [row.split(None, 5) for row in subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,stat=,etimes=,wchan:32=,args="],
                                                         capture_output=True, text=True).stdout.splitlines()]
    tree, grown = set(), {str(process.pid)}
    while grown != tree:  # its descendants, listed in any order
        tree, grown = grown, grown | {row[0] for row in rows if row[1] in grown}
    listed = "\n".join(" ".join(row) for row in rows if row[0] in tree)
    process.send_signal(signal.SIGABRT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        return f"process tree (pid ppid stat seconds wchan args):\n{listed}\n(no stacks: SIGABRT did not end it)"
    return f"process tree (pid ppid stat seconds wchan args):\n{listed}\nits stderr and stacks:\n{process.stderr.read()}"


def golden_written(baseline: Path, case: str) -> bool:
    golden = Golden.read(baseline, case)
    return golden is not None and golden.arrays is not None
