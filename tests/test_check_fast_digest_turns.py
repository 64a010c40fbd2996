"""scripts/check_fast_digest.py --turns / --baseline: each turn is one check in a process of its own, on the harness
of this checkout or of the baseline's (first on PYTHONPATH), and the turns' host costs are summed up per way, with a
baseline turn by turn."""

from __future__ import annotations

import pytest
from scripts_loader import load_script


def _turn(**medians: float) -> dict:
    return {f"path grouped, {way.replace('_', ' ')}": {"host": [value - 1, value, value + 5], "digesting": [value],
                                                      "gpu": [0.07]} for way, value in medians.items()}


def test_each_turn_gets_the_options_but_the_turns_the_baseline_and_its_figures(torch, tmp_path):
    """However spelled (argparse takes a prefix and --option=value), --turns, --baseline and --figures are taken out:
    a turn is one check, never a check that starts turns; it writes its figures where the turns read them."""
    check = load_script("check_fast_digest")
    for asked in (["--turns", "3", "--baseline", str(tmp_path)], ["--turns=3", f"--baseline={tmp_path}"],
                  ["--tur", "3", "--base", str(tmp_path), "--figures", "elsewhere.json"]):
        command, environment = check.turn_command(["--paths", "grouped", *asked, "--steps", "5"], tmp_path / "f.json",
                                                  tmp_path)
        assert command[:2] == [check.sys.executable, check.__file__]
        assert command[2:] == ["--paths", "grouped", "--steps", "5", "--figures", str(tmp_path / "f.json")], asked
        assert environment["PYTHONPATH"].split(check.os.pathsep)[0] == str(tmp_path.resolve())


def test_turns_are_summed_up_per_way_and_against_a_baseline_turn_by_turn(torch, tmp_path):
    check = load_script("check_fast_digest")
    found = [_turn(together=5.0, new_addresses=9.0), _turn(together=8.0, new_addresses=12.0)]
    based = [_turn(together=10.0, new_addresses=9.0), _turn(together=10.0, new_addresses=10.0)]
    lines = check.turn_summary(found, based, tmp_path).splitlines()
    assert lines[0].startswith("host us per tensor, each turn's median, 2 turns; the baseline")
    # together: 5/10 and 8/10; new addresses: 9/9 and 12/10
    assert lines[1:] == ["  path grouped, together: 5.0, 8.0; baseline 10.0, 10.0; x0.65 (0.50-0.80)",
                         "  path grouped, new addresses: 9.0, 12.0; baseline 9.0, 10.0; x1.10 (1.00-1.20)"]
    assert check.turn_summary(found, None, None).splitlines()[1:] == ["  path grouped, together: 5.0, 8.0",
                                                                      "  path grouped, new addresses: 9.0, 12.0"]


def test_a_turn_without_timed_ways_sums_up_to_a_sentence_not_an_error(torch):
    """On the CPU no way is timed (its figures are empty), nor in a turn that failed before writing them."""
    check = load_script("check_fast_digest")
    assert check.turn_summary([{}, {}], None, None) == "no host costs to sum up (they are timed on cuda only)"
    assert check.turn_summary([_turn(together=5.0)], [{}], None) == \
        "no host costs to sum up (they are timed on cuda only)"


@pytest.mark.parametrize("asked, message", [(["--turns", "0"], "--turns 0: at least 1"),
                                            (["--baseline", "{tmp}"], "--baseline {tmp}: no harness/ there")])
def test_bad_turns_or_baseline_are_refused_by_name(torch, tmp_path, monkeypatch, capsys, asked, message):
    check = load_script("check_fast_digest")
    monkeypatch.setattr(check.sys, "argv", ["check_fast_digest.py", *[a.format(tmp=tmp_path) for a in asked]])
    with pytest.raises(SystemExit) as stopped:
        check.main()
    assert stopped.value.code == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err


@pytest.mark.slow
def test_turns_against_a_baseline_run_each_check_in_turn_and_pass_on_its_verdict(torch, tmp_path):
    """On the CPU (no way timed), this checkout as its own baseline, two turns: four checks, the baseline's first in
    each turn, every digest equal, exit 0; --figures gets each turn's figures (empty: none timed)."""
    import json
    import subprocess
    import sys

    check = load_script("check_fast_digest")
    done = subprocess.run([sys.executable, check.__file__, "--device", "cpu", "--turns", "2", "--baseline", str(check.HERE),
                           "--figures", str(tmp_path / "turns.json")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    turns = [line for line in done.stdout.splitlines() if line.startswith("turn ")]
    assert turns == ["turn 1 of 2, the baseline:", "turn 1 of 2, this code:", "turn 2 of 2, the baseline:",
                     "turn 2 of 2, this code:"]
    assert done.stdout.count(": ALL EQUAL") == 4
    assert done.stdout.rstrip().endswith("no host costs to sum up (they are timed on cuda only)")
    assert json.loads((tmp_path / "turns.json").read_text()) == {"turns": [{}, {}], "baseline": [{}, {}]}
