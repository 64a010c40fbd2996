"""The GPU checks of the capture's digest path and their targets, one stage per call of a lent GPU machine.

    python3 scripts/gpu_checks.py STAGE [STAGE ...] [--out DIR] [--baseline DIR] [--dry-run]

Stages (each fits one 600 s call: its commands' time limits add up to at most STAGE_SECONDS):
  tests   the GPU tests of the digest and capture paths (pytest -m gpu)
  digest  scripts/check_fast_digest.py --paths grouped, four turns: every digest equal to numpy's, and a step of 100
          small tensors' host cost per tensor (digested together and at new addresses) against HOST_US
  mlp     scripts/bench_capture.py rows: the MLP 1024/4096 and 4096/11008 steps
  layers  the same: TransformerLayer and MoE layer steps
  gpt     the same: the 8-layer GPTModel step
  optimizer  the same with megatron-core's Float16Optimizer (issue 22's rows): TransformerLayer and GPTModel steps
Each bench row is three runs (a process each) of three rounds; its verdict takes the median of the runs' ratios, of
the whole round and of the loop, against the row's target. --baseline DIR: a checkout of other code (e.g.
`git archive REV | tar -x -C DIR`), its harness checked in turns with this code's by the digest stage.

Writes DIR/STAGE.log (the machine and versions, then each command and its whole output) and DIR/STAGE.json (each
command's exit, seconds and figures, and the verdicts); prints each command's last lines and the verdicts. Exit 1
where a command failed or timed out or a target was missed. DIR: --out, else $OUT, else ./gpu-checks.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.machine import cpu_model, nvidia_smi, python_version, version_of

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs_in_turns import is_checkout, median_range, turn_medians  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STAGE_SECONDS = 570  # a call's 600 s less the installs before it
HOST_US = 10.0  # issue 23: a 100-tensor step's host cost per tensor
TAIL_LINES = 12


@dataclass(frozen=True)
class Command:
    label: str
    argv: tuple[str, ...]
    seconds: int  # its time limit
    target: float | None = None  # a bench row's ratio to the plain step, at most
    figures: str | None = None  # the option that makes the script write its figures (JSON)
    takes_baseline: bool = False  # runs in turns with --baseline's checkout (the bench rows would not fit a call)


BENCH = ("scripts/bench_capture.py", "--device", "cuda", "--dtype", "bf16", "--hash", "fast", "--no-full",
         "--rounds", "3", "--writer", "process", "--runs", "3")
LARGE = ("--hidden", "4096", "--ffn", "11008", "--tokens", "4096")


def _row(label: str, options: tuple[str, ...], seconds: int, target: float) -> Command:
    return Command(label, (*BENCH, *options), seconds, target, "--summary")


STAGES: dict[str, tuple[Command, ...]] = {
    "tests": (Command("GPU tests", ("-m", "pytest", "-q", "-m", "gpu", "tests/test_gpu.py", "tests/test_triton_grouped.py",
                                    "tests/test_triton_digest.py", "tests/test_capture.py", "tests/test_capture_writer.py",
                                    "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts="), 400),),
    "digest": (Command("fast digest, grouped", ("scripts/check_fast_digest.py", "--paths", "grouped", "--turns", "4"),
                       540, figures="--figures", takes_baseline=True),),
    "mlp": (_row("MLP, hidden 1024, ffn 4096, 2048 tokens",
                 ("--model", "mlp", "--hidden", "1024", "--ffn", "4096", "--tokens", "2048", "--steps", "30"), 240, 2.0),
            _row("MLP, hidden 4096, ffn 11008, 4096 tokens", ("--model", "mlp", *LARGE, "--steps", "30"), 300, 1.3)),
    "layers": (_row("TransformerLayer", ("--model", "layer", *LARGE, "--steps", "30"), 270, 1.15),
               _row("MoE layer, 4 experts, top 2", ("--model", "moe-layer", *LARGE, "--steps", "30"), 290, 1.2)),
    "gpt": (_row("GPTModel, 8 layers, vocab 32000", ("--model", "gpt", *LARGE, "--steps", "6"), 540, 1.1),),
    "optimizer": (_row("TransformerLayer with Float16Optimizer", ("--model", "layer", *LARGE, "--steps", "30", "--optimizer"),
                       240, 1.3),
                  _row("GPTModel with Float16Optimizer", ("--model", "gpt", *LARGE, "--steps", "6", "--optimizer"), 330, 1.3)),
}


@dataclass
class Outcome:
    label: str
    command: list[str]
    exit: int | None  # None: timed out
    seconds: float
    figures: dict | None = None
    verdicts: list[str] = field(default_factory=list)
    met: bool = True


def command_line(command: Command, baseline: Path | None, figures: Path | None) -> list[str]:
    """The command as run: this Python, its options, --baseline where asked, where its figures go."""
    line = [sys.executable, *command.argv]
    if baseline is not None and command.takes_baseline:
        line += ["--baseline", str(baseline)]
    if command.figures is not None and figures is not None:
        line += [command.figures, str(figures)]
    return line


def run_logged(line: list[str], seconds: int, log: Path) -> tuple[int | None, float]:
    """Run `line` in ROOT in a session of its own, its output appended to `log`; past `seconds` the whole session is
    killed (the bench's runs are processes of their own). Its exit (None: timed out) and wall seconds."""
    started = time.perf_counter()
    with log.open("a") as sink:
        sink.write(f"\n$ {' '.join(line)}\n")
        sink.flush()
        process = subprocess.Popen(line, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: int | None = process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
            sink.write(f"\n[gpu_checks: killed after its limit of {seconds} s]\n")
    return code, time.perf_counter() - started


def bench_verdicts(figures: dict, target: float) -> tuple[list[str], bool]:
    """Per part (whole round, loop) of each capture variant: the median of the runs' ratios against `target`, with
    their range; with a baseline's runs, its median too."""
    lines, met = [], True
    for part, variants in figures["runs"][0].items():
        for variant in variants:
            if variant == "no capture":
                continue
            ratios = [run[part][variant][1] for run in figures["runs"]]
            median = statistics.median(ratios)
            met &= median <= target
            text = (f"{part}, {variant}: {median_range(ratios)} over {len(ratios)} runs "
                    f"{'<=' if median <= target else '>'} {target}x: {'met' if median <= target else 'NOT MET'}")
            if figures.get("baseline"):
                theirs = [run[part][variant][1] for run in figures["baseline"]]
                text += f"; the baseline {median_range(theirs)}"
            lines.append(text)
    return lines, met


def digest_verdicts(figures: dict) -> tuple[list[str], bool]:
    """Per way timed on the grouped path: each turn's median host us per tensor and their median; met where that of
    the step digested together (a capture's list of tensors seen before) is under HOST_US."""
    lines, met = [], True
    turns = [turn for turn in figures["turns"] if turn]
    if not turns:
        return ["no host costs came back (timed on cuda only)"], False
    for way in turns[0]:
        medians = turn_medians(turns, way)
        overall = statistics.median(medians)
        text = (f"{way}: {overall:.1f} us per tensor, the median of {len(medians)} turns' "
                f"({', '.join(f'{value:.1f}' for value in medians)})")
        if way.endswith(", together"):
            met &= overall < HOST_US
            text += f" {'<' if overall < HOST_US else '>='} {HOST_US}: {'met' if overall < HOST_US else 'NOT MET'}"
        if figures.get("baseline"):
            theirs = turn_medians(figures["baseline"], way)
            text += f"; the baseline {', '.join(f'{value:.1f}' for value in theirs)}"
        lines.append(text)
    return lines, met


def machine() -> dict[str, str]:
    """Where and with what the checks ran."""
    facts = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"), "python": python_version()}
    for package in ("torch", "triton", "megatron-core", "numpy"):
        facts[package] = version_of(package) or "not installed"
    facts["gpu"] = nvidia_smi("name,driver_version") or "none found"
    model = cpu_model()
    facts["cpu"] = f"{model}, {os.cpu_count()} threads" if model else "unknown"
    # "-dirty": the files run are not that commit's (a lent machine's copy came with an older .git)
    head = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True, check=False) \
        if shutil.which("git") else None
    facts["commit"] = head.stdout.strip() if head and head.returncode == 0 else "not a git checkout"
    return facts


def run_stage(stage: str, out: Path, baseline: Path | None) -> list[Outcome]:
    log, record = out / f"{stage}.log", out / f"{stage}.json"
    facts = machine()
    log.write_text("".join(f"{key}: {value}\n" for key, value in facts.items()))
    print(f"== stage {stage}: " + "; ".join(f"{key} {value}" for key, value in facts.items()), flush=True)
    outcomes = []
    for index, command in enumerate(STAGES[stage]):
        figures = out / f"{stage}-{index}.figures.json" if command.figures else None
        if figures is not None:  # left by a run that was stopped before reading it: never this run's figures
            figures.unlink(missing_ok=True)
        line = command_line(command, baseline, figures)
        code, seconds = run_logged(line, command.seconds, log)
        outcome = Outcome(command.label, line, code, round(seconds, 1))
        outcome.met = code == 0
        if figures is not None and figures.is_file():
            outcome.figures = json.loads(figures.read_text())
            figures.unlink()
            verdicts, met = bench_verdicts(outcome.figures, command.target) if command.target is not None \
                else digest_verdicts(outcome.figures)
            outcome.verdicts, outcome.met = verdicts, outcome.met and met
        elif figures is not None:
            outcome.met = False
            outcome.verdicts = ["no figures came back"]
        outcomes.append(outcome)
        status = "timed out" if code is None else f"exit {code}"
        print(f"-- {command.label}: {status} after {seconds:.0f} s; its last lines:", flush=True)
        print("\n".join(log.read_text().splitlines()[-TAIL_LINES:]))
        for verdict in outcome.verdicts:
            print(f"   {verdict}")
        record.write_text(json.dumps({"machine": facts, "commands": [vars(each) for each in outcomes]}, indent=1))
    return outcomes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stages", nargs="+", choices=tuple(STAGES), metavar="STAGE", help=", ".join(STAGES))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-checks"))
    parser.add_argument("--baseline", type=Path, help="a checkout of other code to take turns with")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and their limits only")
    args = parser.parse_args()
    if args.baseline is not None and not is_checkout(args.baseline):
        parser.error(f"--baseline {args.baseline}: no harness/ there (a checkout of xfalign)")
    if args.dry_run:
        for stage in args.stages:
            for command in STAGES[stage]:
                print(f"{stage} ({command.seconds} s): {' '.join(command_line(command, args.baseline, None))}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    outcomes = [outcome for stage in args.stages for outcome in run_stage(stage, args.out, args.baseline)]
    failed = [outcome.label for outcome in outcomes if not outcome.met]
    print("ALL MET" if not failed else f"NOT MET: {'; '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
