"""The CI gate: goldens, drift named per tensor, environment changes, nondeterminism, exit codes."""

import re

import numpy as np
import pytest
import yaml

from harness.cli import main
from harness.compare.findings import GOLDEN, judged
from harness.compare.pairs import originate
from harness.gate import check
from harness.load import load_case
from harness.reports.text import environment_change_text, finding_text
from harness.runner import run_case
from harness.store.digest import Digest
from harness.store.dump import GENERATOR
from harness.store.golden import FORMAT, Golden

from conftest import REPORT_ONLY


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One real run of a small case, and its golden written to a baseline folder."""
    root = tmp_path_factory.mktemp("gate")
    path = root / "small.yaml"
    # zeros planted in x give exact +-0.0 outputs, for the signed-zero check
    path.write_text(REPORT_ONLY.replace("std: 2.0}", "std: 2.0, special_values: [0.0], special_fraction: 0.05}"))
    run = run_case(load_case(path))
    Golden.from_run(run).write(root / "baseline")
    return run, root / "baseline"


def mutate(baseline, key, change):
    """Rewrite the golden as if tensor `key` had been `change(values)` when it was recorded."""
    golden = Golden.read(baseline, "small")
    side, name = key.split("/")
    golden.arrays[key] = np.ascontiguousarray(change(golden.arrays[key].copy()))
    golden.tensors[side][name] = Digest.of(golden.arrays[key])
    return golden


def flip_bit(values):
    bits = values.view(np.uint16).reshape(-1)
    bits[5] ^= 1
    return values


def test_unchanged_rerun_passes(recorded):
    run, baseline = recorded
    golden = Golden.read(baseline, "small")
    result = check(run, golden)
    assert result.passed and result.golden_environment == golden.environment  # for the HTML report's golden column


def test_one_bit_flip_fails_naming_tensor_and_ulp(recorded):
    run, baseline = recorded
    result = check(run, mutate(baseline, "paddle/grad.x", flip_bit))
    assert not result.passed
    drift = [finding_text(f) for f in result.failures if f.expected == GOLDEN]
    assert len(drift) == 1 and drift[0].startswith("paddle/grad.x: drifted from the golden: 1 of 32,768 elements differ, max 1 ULP")
    assert result.environment_changes == []


def test_signed_zero_nan_payload_and_shape_changes_are_named(recorded):
    run, baseline = recorded
    out = run.dumps["megatron"].tensors["out"]
    zero_at = int(np.flatnonzero(out.view(np.uint16).reshape(-1) == 0)[0])

    def plus_to_minus_zero(values):
        bits = values.view(np.uint16).reshape(-1)
        bits[zero_at] = 0x8000
        return values

    text = finding_text(check(run, mutate(baseline, "megatron/out", plus_to_minus_zero)).failures[0])
    assert text.startswith("megatron/out: drifted") and "1 differ only in the sign of zero" in text

    def nan_payload(values):  # the run's tensor has no NaN: plant one in the golden, and a NaN with
        values.reshape(-1)[3] = np.nan  # another payload is still a NaN mismatch against a number
        return values

    text = finding_text(check(run, mutate(baseline, "megatron/grad.probs", nan_payload)).failures[0])
    assert "megatron/grad.probs" in text and "1 NaN and 0 Inf mismatches" in text

    text = finding_text(check(run, mutate(baseline, "paddle/grad.probs", lambda v: v.reshape(-1))).failures[0])
    assert text == "paddle/grad.probs: drifted from the golden: shape differs: [64] vs [64, 1]; values compared flattened"


def test_nan_payload_only_drift():
    """Golden and run both NaN at one place, with different payloads: named as a NaN-payload drift."""
    a = np.array([1.0, np.nan], dtype=np.float32)
    b = a.copy()
    b.view(np.uint32)[1] = 0x7FC00001
    (finding,) = judged(originate("t", a, b).compare(), False, GOLDEN)
    text = finding_text(finding)
    assert text.startswith("t: drifted from the golden: 1 of 2 elements differ")
    assert text.endswith("1 differ only in NaN payload (first at flat index 1)")


def test_environment_change_is_reported_beside_drift(recorded):
    run, baseline = recorded
    golden = mutate(baseline, "megatron/out", flip_bit)
    golden.environment["megatron"]["torch"] = "2.12.0"
    result = check(run, golden)
    assert "megatron: torch 2.12.0 → 2.13.0+cpu" in [environment_change_text(f) for f in result.environment_changes]


def test_input_digest_change_fails(recorded):
    run, baseline = recorded
    golden = Golden.read(baseline, "small")
    golden.inputs["x"] = Digest("bfloat16", (64, 512), "0" * 32)
    (finding,) = check(run, golden).failures
    assert finding.kind == "input" and finding_text(finding).startswith("input x: bfloat16 [64, 512] 00000000 → bfloat16")


def test_golden_of_another_input_generator_is_one_finding_not_drift(recorded, tmp_path):
    """A golden whose inputs another generator made: one finding that says so; no tensor is called drifted."""
    run, baseline = recorded
    text_path, values = Golden.paths(baseline, "small")
    text = text_path.read_text()
    assert f"\ngenerator: {GENERATOR}\n" in text
    older = text.replace(f"\ngenerator: {GENERATOR}\n", "\n").replace(f"values: {values.name}", "values: null")
    (tmp_path / text_path.name).write_text(older)  # generator unrecorded: 1
    golden = Golden.read(tmp_path, "small")
    golden.inputs["x"] = Digest("bfloat16", (64, 512), "0" * 32)  # and so every input and tensor differs
    golden.tensors["paddle"]["out"] = Digest("bfloat16", (64, 256), "0" * 32)
    result = check(run, golden)
    (finding,) = result.failures
    assert result.drifted and finding.kind == "generator"
    assert finding_text(finding).startswith(f"inputs made by generator 1, this run uses {GENERATOR}: update the goldens")


def test_cli_gate_update_cycle_and_identical_goldens(write_case, tmp_path, capsys):
    path = write_case(REPORT_ONLY, "small.yaml")
    root = tmp_path / "baseline"
    assert main(["gate", str(path), "--baseline", str(root), "--golden", "check"]) == 2  # no goldens for this class
    assert f"this run's environment class is cpu-avx2; {root} has no goldens for it" in capsys.readouterr().err
    assert main(["gate", str(path), "--baseline", str(root), "--update"]) == 0
    assert "golden small: created" in capsys.readouterr().out
    baseline = root / "cpu-avx2"  # the default profile's class
    first = {p.name: p.read_bytes() for p in baseline.iterdir()}
    values = [name for name in first if name != "small.golden.yaml"]  # named by a hash of its bytes
    assert "small.golden.yaml" in first and len(values) == 1
    assert re.fullmatch(r"small\.golden\.[0-9a-f]{12}\.safetensors", values[0])
    text = first["small.golden.yaml"].decode()
    assert str(tmp_path) not in text and "2026" not in text  # no paths, no timestamps

    golden = mutate(baseline, "paddle/grad.x", flip_bit)
    golden.write(baseline)
    assert main(["gate", str(path), "--baseline", str(root)]) == 1
    out = capsys.readouterr().out
    assert "[drift] paddle/grad.x: drifted from the golden: 1 of 32,768 elements differ, max 1 ULP" in out
    assert "environment fingerprint unchanged since the golden" in out
    obtained = baseline / "small.golden.obtained.yaml"  # what the run produced, beside the golden, to diff
    assert "golden small: drifted; this run's digests are in" in " ".join(out.split()) and obtained.is_file()
    assert yaml.safe_load(obtained.read_text())["sides"]["paddle"]["tensors"]["grad.x"] != \
        yaml.safe_load((baseline / "small.golden.yaml").read_text())["sides"]["paddle"]["tensors"]["grad.x"]
    assert main(["gate", str(path), "--baseline", str(root), "--update", "--only-failing"]) == 0  # force-regen
    assert "golden small: updated: paddle/grad.x" in capsys.readouterr().out
    assert not obtained.exists()  # the golden was rewritten
    assert {p.name: p.read_bytes() for p in baseline.iterdir()} == first  # same bits as the first update
    assert main(["gate", str(path), "--baseline", str(root), "--update", "--only-failing"]) == 0
    assert "golden small" not in capsys.readouterr().out  # nothing failing, nothing rewritten


def test_cli_gate_html_report_shows_the_goldens_fingerprints(write_case, tmp_path):
    """The gate's HTML report puts each side's fingerprint in the golden beside this run's, marked where it differs
    (no column where there is no golden to show)."""
    path = write_case(REPORT_ONLY, "small.yaml")
    root = tmp_path / "baseline"
    assert main(["gate", str(path), "--baseline", str(root), "--html", str(tmp_path / "written.html")]) == 1
    assert "golden A" not in (tmp_path / "written.html").read_text()  # none when it ran: written now
    golden = Golden.read(root / "cpu-avx2", "small")
    golden.environment["paddle"]["python"] = "2.7.18"
    golden.write(root / "cpu-avx2")
    assert main(["gate", str(path), "--baseline", str(root), "--html", str(tmp_path / "gate.html")]) == 0
    html = (tmp_path / "gate.html").read_text()
    assert "golden A</th><th>golden B</th>" in html and "1 differs from the golden" in html
    assert re.findall(r'<tr data-field="([^"]+)" class="drifted">', html) == ["python"]
    assert '<td class="mono drifted">2.7.18</td>' in html


def test_cli_missing_golden_is_written_and_fails_once_check_writes_none_and_unused_are_listed(write_case, tmp_path,
                                                                                                capsys):
    """The rule of every path (harness.golden_policy): a missing golden is written and fails once; `--golden check`
    writes none; `--warn-unused` lists a golden of this class that no case of the run produces."""
    path = write_case(REPORT_ONLY, "small.yaml")
    folder = tmp_path / "baseline" / "cpu-avx2"
    folder.mkdir(parents=True)
    gate = ["gate", str(path), "--baseline", str(tmp_path / "baseline")]
    assert main([*gate, "--golden", "check"]) == 1 and list(folder.iterdir()) == []
    assert "no golden yet, and the check policy writes none" in " ".join(capsys.readouterr().out.split())
    assert main(gate) == 1  # write-missing, the default
    out = " ".join(capsys.readouterr().out.split())
    assert f"no golden yet: wrote {folder}/small.golden.yaml; this fails once" in out
    stale = folder / "gone.golden.yaml"
    stale.write_text("# a golden of a case no longer run\n")
    assert main([*gate, "--warn-unused"]) == 0
    assert f"xfalign: warning: unused golden: {stale}: no case of this run produces it" in capsys.readouterr().out


def test_nondeterminism_is_reported_per_side_not_blamed_on_the_other(write_case, tmp_path, capsys):
    (tmp_path / "noisy.py").write_text(
        "import paddle\n"
        "import paddle.nn.functional as F\n"
        "def swiglu(x, bias, probs, options):\n"
        "    gate, linear = paddle.chunk(x.cast('float32'), 2, axis=-1)\n"
        "    noise = 1 + 1e-2 * paddle.rand(gate.shape)\n"
        "    return (F.silu(gate) * linear * probs * noise).cast(x.dtype)\n"
    )
    path = write_case(REPORT_ONLY.replace("impl: fp32_island", "impl: 'noisy.py:swiglu'")
                      .replace("all: report", "all: report\n  tensors: {out: bitwise}"), "small.yaml")
    baseline = tmp_path / "baseline"
    assert main(["gate", str(path), "--baseline", str(baseline), "--update", "--repeat", "3"]) == 1
    out = capsys.readouterr().out
    assert "[nondeterministic] paddle/out: 3 different digests in 3 repeats on side paddle" in out
    assert "[expectation] out" not in out  # the unstable tensor is not blamed on Megatron
    assert main(["run", str(path), "--repeat", "2"]) == 1
    assert "out is nondeterministic on side paddle: 2 different digests over the repeats" in capsys.readouterr().out


def test_golden_names_its_format_and_a_golden_without_one_is_refused(tmp_path):
    from harness.store.golden import GoldenError

    from conftest import ROOT

    committed = ROOT / "baselines" / "cpu-avx2"
    golden = Golden.read(committed, "linear[rows=7]")
    assert golden.case == "linear[rows=7]" and golden.tensors["megatron"]["out"].dtype == "bfloat16"
    for path in committed.glob("*.golden.yaml"):  # every committed golden names its format and generator
        assert re.search(rf"^format: {FORMAT}$", path.read_text(), re.M), path
        assert re.search(rf"^generator: {GENERATOR}$", path.read_text(), re.M), path

    golden.write(tmp_path, with_arrays=False)
    text_path = tmp_path / "linear_rows_7_.golden.yaml"
    written = text_path.read_text()
    assert written.splitlines()[1] == f"format: {FORMAT}" and FORMAT == "xfalign-golden/1"
    assert Golden.read(tmp_path, "linear[rows=7]").tensors == golden.tensors

    text_path.write_text(written.replace(FORMAT, "xfalign-golden/9"))
    with pytest.raises(GoldenError, match=r"golden format 'xfalign-golden/9'; this xfalign reads 'xfalign-golden/1'"):
        Golden.read(tmp_path, "linear[rows=7]")
    text_path.write_text(written.replace(f"format: {FORMAT}\n", ""))
    with pytest.raises(GoldenError, match=r"linear_rows_7_.golden.yaml: not a readable golden \(format: missing\)"):
        Golden.read(tmp_path, "linear[rows=7]")
