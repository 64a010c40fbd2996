"""The golden file (harness.store.golden.GoldenFile): read and written through its model, byte for byte as
before, versioned by its `format`, one-line errors naming the file and the field."""

import re

import pytest

from harness.store.golden import FORMAT, GOLDEN_HEADER, Golden, GoldenError, GoldenFile

from conftest import ROOT

COMMITTED = sorted((ROOT / "baselines").rglob("*.golden.yaml"))
ONE = ROOT / "baselines" / "cpu-avx2" / "linear_rows_7_.golden.yaml"


def test_every_committed_golden_is_rewritten_byte_for_byte(tmp_path):
    assert len(COMMITTED) > 100
    for path in COMMITTED:
        golden = Golden.of_file(GoldenFile.parse(path.read_text(), path))  # digests only: no values to read
        written = golden.write(tmp_path / path.parent.name)  # as `gate --update` writes it
        assert written.name == path.name and written.read_bytes() == path.read_bytes(), path


def test_a_golden_of_another_format_names_both_formats(tmp_path):
    newer = ONE.read_text().replace(f"format: {FORMAT}", "format: xfalign-golden/2").replace("inputs:", "arrays:")
    (tmp_path / ONE.name).write_text(newer)
    with pytest.raises(GoldenError) as error:
        Golden.read(tmp_path, "linear[rows=7]")
    assert str(error.value) == (f"{tmp_path / ONE.name}: golden format 'xfalign-golden/2'; "
                                f"this xfalign reads '{FORMAT}'")


BROKEN = {  # what is done to a committed golden's YAML, and what the error says of it
    "no tensors": (lambda t: re.sub(r"(?ms)^    tensors:\n(?:      .*\n)+", "", t), "sides.megatron.tensors: missing"),
    "a side not a mapping": (lambda t: t.replace("\n  paddle:\n", "\n  paddle: 3\n  paddlex:\n"),
                             "sides.paddle: a mapping expected, got the number 3"),
    "a digest line": (lambda t: re.sub(r"(?m)^(  x: ).*$", r"\g<1>float32 [7 256] 0", t),
                      "inputs.x: not a digest line (dtype [shape] md5), got the text 'float32 [7 256] 0'"),
    "generator": (lambda t: t.replace("generator: 2", "generator: two"), "generator: 'two' is not a version number"),
    "values": (lambda t: t.replace("values: null", "values: ../x.safetensors"),
               "values: '../x.safetensors' is not a values file name"),
    "format": (lambda t: t.replace(f"format: {FORMAT}", "format: 1"), "format: text expected, got the number 1"),
}


@pytest.mark.parametrize("broken", BROKEN)
def test_a_malformed_golden_is_one_line_naming_the_file_and_the_field(tmp_path, broken):
    change, said = BROKEN[broken]
    (tmp_path / ONE.name).write_text(change(ONE.read_text()))
    with pytest.raises(GoldenError) as error:
        Golden.read(tmp_path, "linear[rows=7]")
    assert str(error.value) == f"{tmp_path / ONE.name}: not a readable golden ({said})"


def test_the_environment_is_an_open_map(tmp_path):
    """Fingerprint fields are the adapters' to name: one added or gone reads and is written back as it is."""
    text = ONE.read_text()
    changed = re.sub(r"(?m)^      version_line: .*\n", "", text).replace("      xfalign:", "      new_field: 7\n      xfalign:")
    file = GoldenFile.parse(changed, ONE)
    assert "version_line" not in file.sides["megatron"].environment
    assert file.sides["paddle"].environment["new_field"] == 7
    assert file.text(GOLDEN_HEADER) == changed


def test_a_golden_without_a_generator_has_version_1_when_it_has_inputs():
    text = ONE.read_text().replace("generator: 2\n", "")
    assert GoldenFile.parse(text, ONE).generator == 1
    no_inputs = re.sub(r"(?ms)^inputs:\n.*?(?=^sides:)", "inputs: {}\n", text)
    file = GoldenFile.parse(no_inputs, ONE)
    assert file.generator is None and "generator" not in file.text(GOLDEN_HEADER)
