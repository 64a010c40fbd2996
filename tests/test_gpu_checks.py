"""scripts/gpu_checks.py: its stages are the commands the capture guide's GPU figures come from (options the scripts
accept), each stage fits one call of a lent GPU, a command past its limit is killed with the processes it started,
and the verdicts read the scripts' own figures against the targets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from scripts_loader import SCRIPTS, load_script


def test_every_bench_row_is_three_runs_of_the_fast_digest_capture_on_cuda_that_the_bench_accepts(torch):
    checks, bench = load_script("gpu_checks"), load_script("bench_capture")
    rows = [command for stage in checks.STAGES.values() for command in stage if command.target is not None]
    assert {command.argv[command.argv.index("--model") + 1] for command in rows} == {"mlp", "layer", "moe-layer", "gpt"}
    for command in rows:
        assert command.argv[0] == "scripts/bench_capture.py"
        parsed = bench.options().parse_args(list(command.argv[1:]) + [command.figures, "x.json"])
        assert (parsed.device, parsed.hash, parsed.no_full, parsed.writer) == ("cuda", ["fast"], True, "process"), command.label
        assert parsed.runs >= 3 and parsed.rounds >= 3, command.label


def test_every_row_but_the_small_mlp_runs_the_capture_guide_s_layer_sizes(torch):
    # the guide's layer, MoE, larger MLP and GPTModel ("8 such layers") rows: hidden 4096, ffn 11008, 4096 tokens
    checks, bench = load_script("gpu_checks"), load_script("bench_capture")
    rows = [command for stage in checks.STAGES.values() for command in stage if command.target is not None]
    for command in rows:
        parsed = bench.options().parse_args(list(command.argv[1:]))
        sizes = (parsed.hidden, parsed.ffn, parsed.tokens)
        assert sizes == ((1024, 4096, 2048) if "1024" in command.label else (4096, 11008, 4096)), command.label


def test_the_digest_stage_is_a_check_of_the_grouped_path_that_the_check_accepts(torch, tmp_path):
    checks, check = load_script("gpu_checks"), load_script("check_fast_digest")
    (command,) = checks.STAGES["digest"]
    line = checks.command_line(command, tmp_path, tmp_path / "f.json")
    assert line[:2] == [sys.executable, "scripts/check_fast_digest.py"]
    parsed = check.options().parse_args(line[2:])
    assert (parsed.paths, parsed.baseline, parsed.figures) == (["grouped"], tmp_path, tmp_path / "f.json")
    assert parsed.turns >= 3


def test_only_the_digest_stage_takes_the_baseline(torch, tmp_path):
    checks = load_script("gpu_checks")
    for stage, commands in checks.STAGES.items():
        for command in commands:
            assert ("--baseline" in checks.command_line(command, tmp_path, None)) == (stage == "digest"), command.label


def test_each_stage_fits_one_call_of_a_lent_gpu():
    checks = load_script("gpu_checks")
    for stage, commands in checks.STAGES.items():
        assert sum(command.seconds for command in commands) <= checks.STAGE_SECONDS < 600, stage


def test_a_command_past_its_limit_is_killed_with_what_it_started_and_its_output_kept(tmp_path):
    checks = load_script("gpu_checks")
    child = tmp_path / "child.pid"
    script = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              f"open({str(child)!r}, 'w').write(str(child.pid))\n"
              "print('started', flush=True)\n"
              "time.sleep(60)\n")
    log = tmp_path / "stage.log"
    started = time.perf_counter()
    code, seconds = checks.run_logged([sys.executable, "-c", script], 3, log)
    assert code is None and seconds < 30 and time.perf_counter() - started < 30
    text = log.read_text()
    assert "started" in text and "killed after its limit of 3 s" in text
    pid = int(child.read_text())
    for _ in range(50):  # the killed child is reaped by init; until then it may show as a zombie
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        if _zombie(pid):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the command's child {pid} still runs")


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_command_s_exit_and_output_are_kept(tmp_path):
    checks = load_script("gpu_checks")
    log = tmp_path / "stage.log"
    log.write_text("machine\n")
    code, _ = checks.run_logged([sys.executable, "-c", "print('out'); import sys; sys.exit(3)"], 30, log)
    assert code == 3
    assert log.read_text().startswith("machine\n") and "out" in log.read_text()


def _run(whole: float, loop: float) -> dict:
    return {"whole round": {"no capture": [25.0, 1.0], "capture, digest fast": [25.0 * whole, whole]},
            "loop": {"no capture": [25.0, 1.0], "capture, digest fast": [25.0 * loop, loop]}}


def test_a_bench_row_is_met_where_the_median_of_its_runs_ratios_is_within_its_target():
    checks = load_script("gpu_checks")
    runs = [_run(1.10, 1.08), _run(1.20, 1.09), _run(1.12, 1.30)]  # whole: median 1.12; loop: median 1.09
    lines, met = checks.bench_verdicts({"runs": runs, "baseline": None}, 1.15)
    assert met
    assert lines == ["whole round, capture, digest fast: x1.12 (1.10-1.20) over 3 runs <= 1.15x: met",
                     "loop, capture, digest fast: x1.09 (1.08-1.30) over 3 runs <= 1.15x: met"]
    lines, met = checks.bench_verdicts({"runs": runs, "baseline": [_run(1.3, 1.2)] * 3}, 1.1)
    assert not met
    assert lines[0].endswith("> 1.1x: NOT MET; the baseline x1.30 (1.30-1.30)")
    assert lines[1].endswith("<= 1.1x: met; the baseline x1.20 (1.20-1.20)")


def _turn(together: float, elsewhere: float) -> dict:
    return {"path grouped, together": {"host": [together - 1, together, together + 4], "digesting": [1.0], "gpu": [0.1]},
            "path grouped, together, new addresses": {"host": [elsewhere] * 3, "digesting": [1.0], "gpu": [0.1]}}


def test_the_digest_stage_is_met_where_the_median_turn_digests_a_step_together_under_10_us_per_tensor():
    checks = load_script("gpu_checks")
    lines, met = checks.digest_verdicts({"turns": [_turn(8.0, 14.0), _turn(12.0, 9.0), _turn(9.5, 9.0)], "baseline": None})
    assert met  # together: 8.0, 12.0, 9.5 -> 9.5; new addresses are reported, not judged
    assert lines == ["path grouped, together: 9.5 us per tensor, the median of 3 turns' (8.0, 12.0, 9.5) < 10.0: met",
                     "path grouped, together, new addresses: 9.0 us per tensor, the median of 3 turns' (14.0, 9.0, 9.0)"]
    lines, met = checks.digest_verdicts({"turns": [_turn(11.0, 5.0), _turn(10.0, 5.0)], "baseline": [_turn(9.0, 5.0)] * 2})
    assert not met
    assert lines[0].endswith(">= 10.0: NOT MET; the baseline 9.0, 9.0")
    assert checks.digest_verdicts({"turns": [{}], "baseline": None}) == (["no host costs came back (timed on cuda only)"], False)


def test_a_command_that_writes_no_figures_misses_its_target_whatever_an_earlier_run_left(tmp_path, monkeypatch):
    """A row's figures file left in --out by an earlier run that was stopped (with figures that meet the target) is not
    read as this run's: the command failed and wrote none."""
    checks = load_script("gpu_checks")
    failing = checks.Command("fails", ("-c", "import sys; sys.exit(1)"), 30, target=1.5, figures="--summary")
    monkeypatch.setitem(checks.STAGES, "failing", (failing,))
    (tmp_path / "failing-0.figures.json").write_text(json.dumps({"runs": [_run(1.0, 1.0)] * 3, "baseline": None}))
    (outcome,) = checks.run_stage("failing", tmp_path, None)
    assert (outcome.exit, outcome.met, outcome.verdicts) == (1, False, ["no figures came back"])
    assert json.loads((tmp_path / "failing.json").read_text())["commands"][0]["met"] is False


def test_a_baseline_that_is_not_a_checkout_is_refused_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPTS / "gpu_checks.py"), "digest", "--baseline", str(tmp_path),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(f"--baseline {tmp_path}: no harness/ there (a checkout of xfalign)")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_bench_s_runs_write_the_figures_a_row_s_verdict_reads(torch, tmp_path):
    """On the CPU (the bench's MLP is megatron-core's): two runs of a small MLP, their figures written by --summary, and
    the verdicts over them: a part per line, its median within a target it is certainly within, and not within 0."""
    checks = load_script("gpu_checks")
    summary = tmp_path / "summary.json"
    subprocess.run([sys.executable, str(SCRIPTS / "bench_capture.py"), "--device", "cpu", "--hash", "fast", "--no-full",
                    "--rounds", "1", "--steps", "1", "--hidden", "64", "--ffn", "128", "--tokens", "16", "--runs", "2",
                    "--summary", str(summary)], check=True, capture_output=True, cwd=tmp_path)
    figures = json.loads(summary.read_text())
    assert len(figures["runs"]) == 2 and figures["baseline"] is None
    lines, met = checks.bench_verdicts(figures, 1e9)
    assert met and [line.split(",")[0] for line in lines] == ["whole round", "loop"]
    assert all("2 runs" in line and line.endswith("met") for line in lines)
    assert checks.bench_verdicts(figures, 0.0)[1] is False
