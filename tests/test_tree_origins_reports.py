"""The origins of two capture trees' differences (harness.compare.origins) in the JSON and HTML reports of
`xfalign compare`: the trees of tests/test_tree_origins.py, B with another op in one module."""

import json
import re

import jsonschema
import pytest
from test_tree_origins import trees  # noqa: F401 (a fixture)

from harness.cli import main
from harness.reports.json_schema import SCHEMA_PATH

pytestmark = pytest.mark.xdist_group("in_process_frameworks")


def test_json_and_html_carry_each_differing_tensors_origin(trees, tmp_path, capsys):  # noqa: F811
    a, b = trees["act"]
    paths = {"json": tmp_path / "r.json", "html": tmp_path / "r.html"}
    assert main(["compare", str(a), str(b), *(x for key, path in paths.items() for x in (f"--{key}", str(path)))]) == 1
    capsys.readouterr()
    data = json.loads(paths["json"].read_text())
    jsonschema.validate(data, json.loads(SCHEMA_PATH.read_text()))
    (step,) = data["tree"]["steps"]
    made = [entry for entry in step["origins"] if entry["origin"]]
    assert [entry["tensor"] for entry in made] == ["act#0:output.0"]
    assert made[0]["module_type"] == "Act" and made[0]["rule"] == "inputs" and "inputs and parameters" in made[0]["text"]
    differing = {t["name"] for t in data["cases"][0]["tensors"] if not t["bitwise"]}
    assert {entry["tensor"] for entry in step["origins"]} == differing
    assert step["inherited"] == len(differing) - 1 and f"{step['inherited']} differing tensors inherited" in step["origins_text"]
    html = paths["html"].read_text()
    row = re.search(r'<tr [^>]*data-name="act#0:output.0"[^>]*>.*?</tr>', html, re.S).group(0)
    assert 'data-origin="1"' in row and "origin (Act)" in row
    assert len(re.findall(r'data-origin="1"', html)) == 1  # the inherited ones carry no badge
    assert re.search(r'data-module="act"><code>act</code>.*?<span class="tag"[^>]*>origin</span>', html)
    assert "differing tensors inherited" in html
