"""scripts/bench_capture.py --runs: the runs' figures summed up as the capture guide's rows give them (the median of
the runs' ratios and their range; the plain step's range), and the options passed on to each run."""

from __future__ import annotations

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
