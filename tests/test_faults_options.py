"""Faults in options, profiles and goldens (issue 19): every option is honoured or refused. Numerics profiles are
validated as case files are, and their environment class cannot lead out of --baseline; corrupt goldens are found
before any side runs and fail only their case; digest changes show digests that differ; a golden of another case
says so; an interrupted `gate --tree --update` says which goldens it wrote; long ids are shortened; `gate --tree`
writes its reports; -j is capped at the cores; --max-input-gib is positive and the run's peak memory is checked.
The CLI tests run two cheap Paddle sides on the session's workers (the interrupted update in a process of its own)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from storage_writers import make_dump
from test_capture_compare import one_ulp_in_weight, write_tree
from test_faults_storage import TINY, cli, one_error_line

import harness.inputs
from harness.case import CaseError
from harness.cli import _parser, _run_options, usable_cores
from harness.compare.findings import Finding, InputChanged
from harness.gate import _step_golden, check_step
from harness.inputs import check_input_size
from harness.load import load_cases
from harness.numerics import ProfileError, load_profile
from harness.reports.html import MAX_FILE_STEM, safe_file_stem
from harness.reports.text import CODE_CHANGED, INPUTS_CHANGED, finding_text, gate_lines
from harness.store.digest import Digest
from harness.store.golden import MAX_STEM, Golden, file_stem

from conftest import ROOT


def unwrapped(text: str) -> str:
    """The terminal's text with its lines joined (the console wraps long lines at 160 characters)."""
    return " ".join(text.split())


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- numerics profiles: validated as case files are ----------------------------------------------------------

BAD_PROFILES = {
    "escape": ("environment_class: ../../../x/ESCAPED\ntorch: {threads: 1}\n", 1, "environment_class",
               "is not a safe class name"),
    "absolute": ("environment_class: /tmp/x\n", 1, "environment_class", "is not a safe class name"),
    "no threads": ("torch:\n  threads: 0\n", 2, "torch.threads", "greater than or equal to 1"),
    "negative threads": ("description: d\npaddle: {threads: -4}\n", 2, "paddle.threads", "greater than or equal to 1"),
    "simdlen": ("torch:\n  mkldnn: false\n  inductor_simdlen: 17\n", 3, "torch.inductor_simdlen", "128, 256 or 512"),
    "name key": ("env: {}\nname: other\n", 2, "name", "a profile is named by its file"),
    "a list": ("- torch\n- paddle\n", 1, "(top level)", "a mapping of fields"),
    "broken yaml": ("env:\n  A: [1,\n", 3, "(yaml)", ""),
    "empty": ("", 1, "(top level)", "the profile is empty"),
    "empty mapping": ("{}\n", 1, "(top level)", "the profile is empty"),
    "env name": ("env:\n  A=B: x\n", 1, "env", "is not an environment variable name"),
    "mkldnn": ("torch: {mkldnn: 1}\n", 1, "torch.mkldnn", "valid boolean"),
}


@pytest.mark.parametrize("key", BAD_PROFILES)
def test_bad_profiles_are_one_line_naming_file_line_and_field(tmp_path, key):
    text, line, field, fragment = BAD_PROFILES[key]
    path = tmp_path / "prof.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as error:
        load_profile(str(path))
    message = str(error.value)
    assert message.startswith(f"{path}:{line}: {field}: ") and fragment in message, message
    assert "\n" not in message and error.value.exit_code == 2


def test_builtin_profiles_still_load():
    assert load_profile(None).environment_class == "cpu-avx2" and load_profile(None).torch.inductor_simdlen == 256
    assert load_profile("native").environment_class is None


def test_a_profile_cannot_lead_goldens_out_of_the_baseline(tmp_path, capsys, monkeypatch):
    """Through --numerics and through a case's `numerics:`: refused at load, exit 2, nothing written anywhere."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "prof.yaml").write_text(BAD_PROFILES["escape"][0])
    (tmp_path / "work" / "case.yaml").write_text(TINY)
    (tmp_path / "work" / "own.yaml").write_text(TINY.replace("seed: 3\n", "seed: 3\nnumerics: prof.yaml\n"))
    monkeypatch.chdir(tmp_path / "work")
    before = files(tmp_path)
    done = cli(capsys, "gate", "case.yaml", "--baseline", "b", "--numerics", "prof.yaml", "--update", "--html", "h")
    assert done.returncode == 2
    assert one_error_line(done).startswith(f"xfalign: error: {tmp_path / 'work' / 'prof.yaml'}:1: environment_class: ")
    done = cli(capsys, "gate", "own.yaml", "--baseline", "b", "--update", "--html", "h")
    assert done.returncode == 2
    assert one_error_line(done).startswith("xfalign: error: own.yaml:4: numerics: ")
    assert files(tmp_path) == before and not (tmp_path / "x").exists()
    with pytest.raises(CaseError, match="is not a safe class name"):
        load_cases(tmp_path / "work" / "own.yaml")


def test_a_bad_profile_is_refused_before_any_side_runs(tmp_path, capsys):
    (tmp_path / "case.yaml").write_text(TINY)
    (tmp_path / "prof.yaml").write_text(BAD_PROFILES["no threads"][0])
    done = cli(capsys, "run", "case.yaml", "--numerics", "prof.yaml", "--html", "h")
    assert done.returncode == 2, (done.stdout, done.stderr)  # was 3: the side crashed on threads 0
    assert one_error_line(done) == (f"xfalign: error: {tmp_path / 'prof.yaml'}:2: torch.threads: Input should be "
                                    "greater than or equal to 1")
    assert done.stdout == "" and not (tmp_path / "h").exists()


# --- goldens: corrupt ones fail their case before any side runs; the others run ------------------------------

CORRUPTIONS = {  # what a golden's YAML is replaced with, and what the error says of it
    "empty": ("", "(top level): a mapping expected, got nothing"),
    "no inputs": (None, "inputs: missing"),
    "broken yaml": ("sides: [unclosed\n", "not YAML at line 2: "),
}


@pytest.fixture(scope="module")
def two_goldens(tmp_path_factory):
    """Cases a and b (two cheap Paddle sides each) and their goldens."""
    root = tmp_path_factory.mktemp("goldens")
    (root / "a.yaml").write_text(TINY)
    (root / "b.yaml").write_text(TINY.replace("seed: 3", "seed: 4"))
    from harness.cli import main

    previous = Path.cwd()
    os.chdir(root)
    try:
        assert main(["gate", "a.yaml", "b.yaml", "--baseline", "base", "--update", "--html", "h"]) == 0
    finally:
        os.chdir(previous)
    return root


def copy_of(root: Path, tmp_path: Path) -> None:
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text((root / name).read_text())
    for path in (root / "base").rglob("*"):
        if path.is_file():
            (tmp_path / path.relative_to(root)).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path.relative_to(root)).write_bytes(path.read_bytes())


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_a_corrupt_golden_fails_its_case_and_the_others_run(two_goldens, tmp_path, capsys, corruption):
    copy_of(two_goldens, tmp_path)
    golden = tmp_path / "base" / "cpu-avx2" / "a.golden.yaml"
    text, said = CORRUPTIONS[corruption]
    golden.write_text(text if text is not None else re.sub(r"(?ms)^inputs:.*?(?=^sides:)", "", golden.read_text()))
    done = cli(capsys, "gate", "a.yaml", "b.yaml", "--baseline", "base", "--html", "h", "--json", "r.json")
    assert done.returncode == 2, (done.stdout, done.stderr)
    error = f"base/cpu-avx2/a.golden.yaml: not a readable golden ({said}"
    assert one_error_line(done).startswith(f"xfalign: error: {error}")
    out = unwrapped(done.stdout)
    assert out.startswith(f"GATE FAIL a: [no-golden] golden unreadable: {error}")  # said before any side ran
    assert "; repair it, or rewrite it with --update A ref: fp32_island" in out
    assert "GATE PASS b: expectations hold, digests match the golden" in out
    assert out.endswith("gate: 1 passed, 1 failed")
    assert [case["case"] for case in json.loads((tmp_path / "r.json").read_text())["cases"]] == ["b"]  # a did not run
    assert (tmp_path / "h" / "b.html").is_file()
    assert "Traceback" not in done.stdout + done.stderr


def test_update_rewrites_a_corrupt_golden_and_never_another_cases(two_goldens, tmp_path, capsys):
    copy_of(two_goldens, tmp_path)
    folder = tmp_path / "base" / "cpu-avx2"
    (folder / "a.golden.yaml").write_text("")
    (folder / "b.golden.yaml").write_text((folder / "b.golden.yaml").read_text().replace("case: b", "case: c"))
    done = cli(capsys, "gate", "a.yaml", "b.yaml", "--baseline", "base", "--update", "--html", "h")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert one_error_line(done) == ("xfalign: error: base/cpu-avx2/b.golden.yaml: holds the golden of case 'c', not 'b' "
                                    "(two case names that make one file name: rename one)")
    out = unwrapped(done.stdout)
    assert out.startswith("GATE FAIL b: [no-golden] golden unreadable: base/cpu-avx2/b.golden.yaml: holds the golden "
                          "of case 'c'")  # before any side ran: b does not run
    assert "golden a: unreadable, rewriting it" in out and "goldens written: 1 of 2: a" in out
    assert out.endswith("gate: 1 passed, 1 failed")
    assert "case: c\n" in (folder / "b.golden.yaml").read_text() and Golden.read(folder, "a") is not None


# --- what drift says: digests that differ, a golden of another case --------------------------------------

def test_digest_changes_show_digests_that_differ():
    dump = make_dump(1)
    golden = _step_golden("s", dump)
    digest = golden.tensors["paddle"]["out"]
    edited = digest.md5[:20] + ("0" if digest.md5[20] != "0" else "1") + digest.md5[21:]
    golden.tensors["paddle"]["out"] = Digest(digest.dtype, digest.shape, edited)
    [line] = gate_lines(check_step("s", dump, golden).failures)
    assert f"digest {edited[:21]} → {digest.md5[:21]}" in line, line
    before, now = Digest.of(np.zeros(4, np.float32)).to_json(), Digest.of(np.zeros(4, np.float32)).to_json()
    now["md5"] = before["md5"][:9] + ("0" if before["md5"][9] != "0" else "1") + before["md5"][10:]
    text = finding_text(Finding("x", False, InputChanged(golden=before, now=now)))
    assert text == f"input x: float32 [4] {before['md5'][:10]} → float32 [4] {now['md5'][:10]}"


def test_a_golden_of_another_case_is_said_to_be(two_goldens, tmp_path, capsys):
    copy_of(two_goldens, tmp_path)
    folder = tmp_path / "base" / "cpu-avx2"
    (folder / "b.golden.yaml").write_text((folder / "a.golden.yaml").read_text().replace("case: a", "case: b"))
    done = cli(capsys, "gate", "b.yaml", "--baseline", "base", "--html", "h")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "[input] input x: " in done.stdout
    assert INPUTS_CHANGED in unwrapped(done.stdout) and CODE_CHANGED not in unwrapped(done.stdout)


# --- an interrupted gate --tree --update says which goldens it wrote ---------------------------------------

@pytest.mark.slow  # a process of its own, interrupted
def test_interrupted_tree_update_says_which_goldens_it_wrote(tmp_path):
    steps = 100
    tree = write_tree(tmp_path / "tree", "megatron", steps=steps, mode="digest")
    base = tmp_path / "base"
    command = [sys.executable, "-m", "harness.cli", "gate", "--tree", str(tree), "--baseline", str(base), "--html", "h"]
    assert subprocess.run(command, cwd=tmp_path, capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT))).returncode == 1
    for path in base.iterdir():  # marked: an update rewrites the whole file, without the mark
        path.write_text(path.read_text() + "# old\n")
    process = subprocess.Popen([*command, "--update"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        deadline = time.monotonic() + 120
        while not any("# old" not in path.read_text() for path in base.glob("*.yaml")):
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.005)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, (out, err)
    new = sorted(path.name.removesuffix(".golden.yaml") for path in base.glob("*.yaml") if "# old" not in path.read_text())
    names = [f"megatron.step-{n:05d}" for n in range(steps)]
    assert 0 < len(new) < steps and new == names[:len(new)]
    said = out.strip().splitlines()[-1]
    if len(new) > 2:
        assert said == (f"goldens written: {len(new)} of {steps}: the first {len(new)} steps, {new[0]} to {new[-1]}; "
                        "the others are as they were")
    else:
        assert said == f"goldens written: {len(new)} of {steps}: {', '.join(new)}"
    assert err.strip() == "xfalign: interrupted by SIGINT"
    assert [p.name for p in base.iterdir() if not p.name.endswith(".golden.yaml")] == []  # no staging file


# --- names too long for a file name ------------------------------------------------------------------------

def test_long_names_are_shortened_and_stay_distinct():
    long_a, long_b = "c" * 128 + "[" + "x=1," * 30 + "]", "c" * 128 + "[" + "x=1," * 29 + "y=2]"
    for stem, limit in ((file_stem, MAX_STEM), (safe_file_stem, MAX_FILE_STEM)):
        assert len(stem(long_a)) == limit and stem(long_a) != stem(long_b)
        assert stem(long_a).startswith("c" * 100) and stem("linear[dtype=bf16]").startswith("linear_dtype_bf16")
    assert file_stem("linear[dtype=bf16]") == "linear_dtype_bf16_"  # as before: committed goldens keep their names


def test_a_long_sweep_point_id_gates(tmp_path, capsys):
    labels = {"sides.ref.impl": "fp32_island", "sides.per_op.impl": "per_op_rounding", "inputs.x.mean": 0.0,
              "inputs.x.std": 2.0, "inputs.grad_out.mean": 0.0, "inputs.grad_out.std": 1.0}
    sweep = "sweep:\n" + "".join(f"  {label}: [{value}]\n" for label, value in labels.items())
    (tmp_path / "case.yaml").write_text(f"name: {'n' * 128}\n{sweep}{TINY}")
    [case] = load_cases(tmp_path / "case.yaml")
    assert len(case.name) > 255 - len(".golden.yaml")
    done = cli(capsys, "gate", "case.yaml", "--baseline", "b", "--update", "--html", "h")
    assert done.returncode == 0, (done.stdout, done.stderr)  # was 2: "File name too long", after every side ran
    [golden] = (tmp_path / "b" / "cpu-avx2").glob("*.yaml")
    assert golden.name == f"{file_stem(case.name)}.golden.yaml" and len(golden.name) <= 255
    assert cli(capsys, "gate", "case.yaml", "--baseline", "b", "--html", "h").returncode == 0


# --- gate --tree writes its reports and refuses what it cannot honour -----------------------------------------

def test_tree_gate_writes_json_and_html(tmp_path, capsys):
    tree = write_tree(tmp_path / "tree", "megatron", mode="digest")
    gate = ["gate", "--tree", tree, "--baseline", "base", "--json", "r.json", "--html", "r.html"]
    assert cli(capsys, *gate).returncode == 1  # goldens written, failing once
    assert cli(capsys, *gate).returncode == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["tree"]["status"] == "pass" and [s["step"] for s in report["tree"]["steps"]] == ["step-00000", "step-00001"]
    assert report["tree"]["a"]["side"] == "golden" and report["tree"]["b"]["path"] == str(tree)
    assert "golden vs megatron" in (tmp_path / "r.html").read_text()
    drifted = write_tree(tmp_path / "drifted", "megatron", mode="digest", change=one_ulp_in_weight)
    done = cli(capsys, "gate", "--tree", drifted, "--baseline", "base", "--json", "r.json", "--html", "r.html")
    assert done.returncode == 1 and "HTML report: r.html" in done.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert [s["status"] for s in report["tree"]["steps"]] == ["pass", "fail"]


@pytest.mark.parametrize("option", [["--numerics", "native"], ["-j", "2"], ["--timeout", "5"], ["--no-reference"],
                                    ["--max-input-gib", "1"], ["--repeat", "2"]])
def test_tree_gate_refuses_options_it_cannot_honour(tmp_path, capsys, option):
    tree = write_tree(tmp_path / "tree", "megatron", steps=1, mode="digest")
    done = cli(capsys, "gate", "--tree", tree, "--baseline", "base", *option)
    assert done.returncode == 2 and f"not {option[0]} " in one_error_line(done)
    assert not (tmp_path / "base").exists()


def test_a_corrupt_step_golden_fails_its_step_and_the_others_are_checked(tmp_path, capsys):
    tree = write_tree(tmp_path / "tree", "megatron", steps=3, mode="digest")
    assert cli(capsys, "gate", "--tree", tree, "--baseline", "base", "--html", "h").returncode == 1
    (tmp_path / "base" / "megatron.step-00001.golden.yaml").write_text("")
    done = cli(capsys, "gate", "--tree", tree, "--baseline", "base", "--html", "h")
    assert done.returncode == 2
    assert "GATE PASS megatron.step-00000" in done.stdout and "GATE PASS megatron.step-00002" in done.stdout
    assert "gate: 2 passed, 1 failed" in done.stdout
    assert one_error_line(done).startswith("xfalign: error: base/megatron.step-00001.golden.yaml: not a readable golden")


# --- resource limits -----------------------------------------------------------------------------------------

def test_jobs_above_the_cores_are_capped_with_a_warning(capsys):
    args = _parser().parse_args(["run", "case.yaml", "-j", str(usable_cores() + 62)])
    _run_options(args)
    assert args.jobs == usable_cores()
    assert capsys.readouterr().err == (f"xfalign: warning: -j {usable_cores() + 62} is more than the {usable_cores()} "
                                       f"cores here: running up to {usable_cores()} cases at once\n")
    args = _parser().parse_args(["gate", "case.yaml", "--baseline", "b"])
    _run_options(args)
    assert args.jobs == usable_cores() and capsys.readouterr().err == ""


@pytest.mark.parametrize("limit", ["0", "-1", "nan"])
def test_an_input_limit_of_zero_or_less_is_refused(tmp_path, capsys, limit):
    (tmp_path / "case.yaml").write_text(TINY)
    done = cli(capsys, "run", "case.yaml", "--max-input-gib", limit)
    assert done.returncode == 2
    assert one_error_line(done) == f"xfalign: error: --max-input-gib must be a positive number of GiB (got {float(limit):g})"


def test_the_input_limit_accounts_for_the_runs_peak_memory(tmp_path, capsys, monkeypatch):
    """0.5 GiB of bfloat16 inputs take about 13 GiB at a run's peak (measured: see harness.inputs): refused on a
    machine of 4 GiB before anything is allocated, unless a limit is given."""
    big = TINY.replace("[2, 64]", "[16384, 11264]").replace("[2, 1]", "[16384, 1]").replace("[2, 32]", "[16384, 5632]")
    (tmp_path / "case.yaml").write_text(big)
    [case] = load_cases(tmp_path / "case.yaml")
    monkeypatch.setattr(harness.inputs, "machine_memory", lambda: 4 << 30)
    monkeypatch.setattr(harness.inputs.np, "empty", lambda *a, **k: pytest.fail("inputs allocated before the check"))
    with pytest.raises(CaseError) as error:
        check_input_size(case)
    assert str(error.value) == (f"{tmp_path / 'case.yaml'}: inputs need 0.52 GiB, and a run holds about 6.5 float64 "
                                "copies of them at its peak (13.4 GiB): more than this machine's 4.0 GiB of memory "
                                "(make the inputs smaller, or set --max-input-gib to run it anyway)")
    done = cli(capsys, "run", "case.yaml")
    assert done.returncode == 2 and "a run holds about 6.5 float64 copies" in one_error_line(done)
    assert check_input_size(case, 1.0) == 16384 * (11264 * 2 + 4 + 5632 * 2)  # a limit given: the user's word
