"""One golden policy (harness.golden_policy) for `gate`, `gate --tree` and the pytest plugin: check / write-missing /
force-regen / regen-all, the `.obtained` file beside a drifted golden, `--warn-unused`. Here through capture trees
(no framework runs); tests/test_gate.py and tests/test_pytest_goldens.py hold the case and pytest paths."""

from __future__ import annotations

import pytest
import yaml
from test_capture_compare import one_ulp_in_weight, write_tree

from harness.cli import main
from harness.golden_policy import GoldenPolicy, from_update

STEPS = ["megatron.step-00000.golden.yaml", "megatron.step-00001.golden.yaml"]


def gate(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["gate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, " ".join(out.split()), err  # the console wraps long lines


def goldens(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_what_each_policy_writes_and_the_old_options_map_onto_it():
    table = {policy: [policy.writes(missing, failing) for missing, failing in ((True, True), (False, True), (False, False))]
             for policy in GoldenPolicy}
    assert table == {GoldenPolicy.CHECK: [False, False, False], GoldenPolicy.WRITE_MISSING: [True, False, False],
                     GoldenPolicy.FORCE_REGEN: [True, True, False], GoldenPolicy.REGEN_ALL: [True, True, True]}
    assert from_update(False, False, None) is GoldenPolicy.WRITE_MISSING  # the default
    assert from_update(True, False, None) is GoldenPolicy.REGEN_ALL  # --update
    assert from_update(True, True, None) is GoldenPolicy.FORCE_REGEN  # --update --only-failing
    assert from_update(True, True, "force-regen") is GoldenPolicy.FORCE_REGEN
    with pytest.raises(ValueError, match=r"^--update is --golden regen-all, not --golden check: give one of them$"):
        from_update(True, False, "check")
    with pytest.raises(ValueError, match=r"^--only-failing goes with --update \(or use --golden force-regen\)$"):
        from_update(False, True, None)


def test_tree_missing_golden_is_written_and_fails_once_and_check_writes_none(tmp_path, capsys):
    tree = write_tree(tmp_path / "tree", "megatron", mode="digest")
    base = tmp_path / "base"
    code, out, _ = gate(capsys, "--tree", tree, "--baseline", base, "--golden", "check", "--html", tmp_path / "h")
    assert code == 1 and goldens(base) == []
    assert "no golden yet, and the check policy writes none: run without it to write one" in out
    code, out, _ = gate(capsys, "--tree", tree, "--baseline", base, "--html", tmp_path / "h")  # write-missing
    assert code == 1 and goldens(base) == STEPS
    assert f"no golden yet: wrote {base}/megatron.step-00000.golden.yaml; this fails once" in out
    assert gate(capsys, "--tree", tree, "--baseline", base, "--golden", "check", "--html", tmp_path / "h")[0] == 0


def test_tree_drift_leaves_an_obtained_file_that_a_pass_removes(tmp_path, capsys):
    tree = write_tree(tmp_path / "tree", "megatron", mode="digest")
    drifted = write_tree(tmp_path / "drifted", "megatron", mode="digest", change=one_ulp_in_weight)
    base, html = tmp_path / "base", tmp_path / "h"
    assert gate(capsys, "--tree", tree, "--baseline", base, "--html", html)[0] == 1
    code, out, _ = gate(capsys, "--tree", drifted, "--baseline", base, "--golden", "check", "--html", html)
    obtained = base / "megatron.step-00001.golden.obtained.yaml"
    assert code == 1 and goldens(base) == sorted([*STEPS, obtained.name])  # the step that passes gets none
    assert f"golden megatron.step-00001: drifted; this run's digests are in {obtained} (diff it with the golden)" in out
    golden = yaml.safe_load((base / STEPS[1]).read_text())
    now = yaml.safe_load(obtained.read_text())
    assert obtained.read_text().startswith("# xfalign obtained: ")
    assert set(now) == set(golden) and now["case"] == golden["case"]  # the golden's format: a diff reads well
    tensors = golden["sides"]["megatron"]["tensors"]
    changed = [name for name, line in now["sides"]["megatron"]["tensors"].items() if tensors[name] != line]
    assert changed == ["fc2:param.weight"]
    assert gate(capsys, "--tree", tree, "--baseline", base, "--html", html)[0] == 0  # passes again: removed
    assert goldens(base) == STEPS


def test_tree_force_regen_rewrites_the_failing_goldens_and_passes_regen_all_rewrites_all(tmp_path, capsys):
    tree = write_tree(tmp_path / "tree", "megatron", mode="digest")
    drifted = write_tree(tmp_path / "drifted", "megatron", mode="digest", change=one_ulp_in_weight)
    base, html = tmp_path / "base", tmp_path / "h"
    assert gate(capsys, "--tree", tree, "--baseline", base, "--html", html)[0] == 1
    assert gate(capsys, "--tree", drifted, "--baseline", base, "--html", html)[0] == 1  # leaves an .obtained
    for name in STEPS:  # marks: a rewritten golden loses its mark
        (base / name).write_text("# old\n" + (base / name).read_text())
    code, out, _ = gate(capsys, "--tree", drifted, "--baseline", base, "--golden", "force-regen", "--html", html)
    assert code == 0 and "golden megatron.step-00001: updated: megatron/fc2:param.weight" in out
    assert "goldens written: 1 of 2: megatron.step-00001" in out
    assert goldens(base) == STEPS  # the .obtained went with the rewrite
    assert (base / STEPS[0]).read_text().startswith("# old") and not (base / STEPS[1]).read_text().startswith("# old")
    code, out, _ = gate(capsys, "--tree", tree, "--baseline", base, "--golden", "regen-all", "--html", html)
    assert code == 0 and "goldens written: 2 of 2" in out
    assert not any((base / name).read_text().startswith("# old") for name in STEPS)
    # the older form: --update --only-failing is force-regen, on trees too
    assert gate(capsys, "--tree", tree, "--baseline", base, "--update", "--only-failing", "--html", html)[0] == 0


def test_tree_warn_unused_lists_a_golden_no_step_produces(tmp_path, capsys):
    tree = write_tree(tmp_path / "tree", "megatron", mode="digest")
    base, html = tmp_path / "base", tmp_path / "h"
    assert gate(capsys, "--tree", tree, "--baseline", base, "--html", html)[0] == 1
    stale = base / "megatron.step-00009.golden.yaml"
    stale.write_text((base / STEPS[0]).read_text())
    code, out, _ = gate(capsys, "--tree", tree, "--baseline", base, "--warn-unused", "--html", html)
    assert code == 0  # a warning, not a failure
    assert f"xfalign: warning: unused golden: {stale}: no case of this run produces it" in out
    assert "unused golden" not in gate(capsys, "--tree", tree, "--baseline", base, "--html", html)[1]


def test_contradicting_golden_options_are_one_line(tmp_path, capsys):
    tree = write_tree(tmp_path / "tree", "megatron", steps=1, mode="digest")
    code, _, err = gate(capsys, "--tree", tree, "--baseline", tmp_path / "base", "--update", "--golden", "check")
    assert code == 2 and err == "xfalign: error: --update is --golden regen-all, not --golden check: give one of them\n"
    code, _, err = gate(capsys, "case.yaml", "--baseline", tmp_path / "base", "--only-failing")
    assert code == 2 and err == "xfalign: error: --only-failing goes with --update (or use --golden force-regen)\n"
