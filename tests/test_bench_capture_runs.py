"""scripts/bench_capture.py --runs: the runs' figures summed up as the capture guide's rows give them (the median of
the runs' ratios and their range; the plain step's range), and the options passed on to each run. With --baseline,
the baseline's runs get the options but --baseline, and the pairs are summed up run by run."""

from __future__ import annotations

import re

import pytest
from scripts_loader import load_script


def _run(plain_ms: float, whole: float, loop: float) -> dict:
    return {"whole round": {"no capture": [plain_ms, 1.0], "capture, digest fast": [plain_ms * whole, whole]},
            "loop": {"no capture": [plain_ms, 1.0], "capture, digest fast": [plain_ms * loop, loop]}}


def test_runs_are_summed_up_by_the_median_of_their_ratios_and_their_range(torch):
    bench = load_script("bench_capture")
    text = bench.summary([_run(25.5, 1.13, 1.10), _run(25.8, 1.12, 1.08), _run(25.6, 1.23, 1.09)])
    lines = [line.split() for line in text.splitlines()]
    assert lines[0][:3] == ["over", "3", "runs,"]
    assert lines[1:] == [["per", "step,", "whole", "round:"], ["no", "capture", "25.5-25.8", "ms"],
                         ["capture,", "digest", "fast", "x1.13", "(1.12-1.23)"],
                         ["per", "step,", "loop:"], ["no", "capture", "25.5-25.8", "ms"],
                         ["capture,", "digest", "fast", "x1.09", "(1.08-1.10)"]]


def test_each_run_gets_the_options_and_runs_once(torch, tmp_path):
    """Whatever spelling asked for several runs (argparse takes --run for --runs), each run is one: none starts runs."""
    bench = load_script("bench_capture")
    for asked in (["--runs", "3"], ["--runs=3"], ["--run", "3"]):
        command = bench.run_command(["--model", "mlp", *asked, "--no-full"], tmp_path / "f.json")
        assert command[:2] == [bench.sys.executable, bench.__file__]
        parsed = bench.options().parse_args(command[2:])
        assert (parsed.runs, parsed.model, parsed.no_full, parsed.figures) == (1, "mlp", True, tmp_path / "f.json"), asked


def test_a_baseline_run_gets_the_options_but_the_baseline_and_starts_its_own_checkout(torch, tmp_path):
    """--baseline DIR: DIR's script runs with the other options (--baseline taken out, however spelled: DIR's script
    may not know it), once, its checkout first on PYTHONPATH."""
    bench = load_script("bench_capture")
    for asked in (["--baseline", str(tmp_path)], [f"--baseline={tmp_path}"], ["--base", str(tmp_path)]):
        command, environment = bench.baseline_command(["--model", "mlp", *asked, "--runs", "3"], tmp_path / "f.json", tmp_path)
        assert command[:2] == [bench.sys.executable, str(tmp_path.resolve() / "scripts" / "bench_capture.py")]
        assert command[2:] == ["--model", "mlp", "--runs", "3", "--runs", "1", "--figures", str(tmp_path / "f.json")], asked
        assert environment["PYTHONPATH"].split(bench.os.pathsep)[0] == str(tmp_path.resolve())


def test_runs_against_a_baseline_are_summed_up_run_by_run(torch):
    bench = load_script("bench_capture")
    text = bench.paired_summary([_run(25.5, 1.10, 1.08), _run(25.8, 1.20, 1.05)],
                                [_run(25.0, 1.00, 1.20), _run(25.9, 1.25, 1.05)])
    lines = [line.split() for line in text.splitlines()]
    assert lines[0][:6] == ["this", "code", "against", "the", "baseline,", "run"]
    # whole: 1.10/1.00 and 1.20/1.25; loop: 1.08/1.20 and 1.05/1.05
    assert lines[1:] == [["per", "step,", "whole", "round:"], ["capture,", "digest", "fast", "x1.030", "(0.960-1.100)"],
                         ["per", "step,", "loop:"], ["capture,", "digest", "fast", "x0.950", "(0.900-1.000)"]]


def test_a_baseline_that_is_not_a_checkout_is_refused_by_name(torch, tmp_path):
    bench = load_script("bench_capture")
    with pytest.raises(SystemExit, match=re.escape(f"bench_capture: --baseline {tmp_path}: no scripts/bench_capture.py there")):
        bench.runs_apart(2, tmp_path)
