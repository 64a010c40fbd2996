"""The HTML report, opened in headless Chromium: verdicts, numbers, sorting, filter, screenshot."""

import re
import shutil
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from harness.compare.case import compare_dumps
from harness.reports.html import write_reports

from report_fixtures import known_diff_dumps

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1400,1800"]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    for tool in ("chromium", "chromedriver"):
        assert shutil.which(tool), f"{tool} is missing: run scripts/setup.sh"
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    comparison = compare_dumps(*known_diff_dumps())
    return write_reports([comparison], tmp_path_factory.mktemp("html") / "known_diff.html")


def visible_names(browser):
    return [row.get_attribute("data-name") for row in browser.find_elements(By.CSS_SELECTOR, "#tensors tbody tr")
            if row.is_displayed()]


def test_report_is_self_contained(report):
    html = report.read_text()
    assert "http://" not in html and "https://" not in html and "<link" not in html and "src=" not in html


@pytest.mark.slow  # starts Chromium
def test_report_in_browser(browser, report, tmp_path):
    browser.get(report.as_uri())
    assert browser.find_element(By.ID, "verdict").text == "FAIL"
    assert browser.find_element(By.ID, "first-divergent").text == "out"
    rows = {row.get_attribute("data-name"): [c.text for c in row.find_elements(By.TAG_NAME, "td")]
            for row in browser.find_elements(By.CSS_SELECTOR, "#tensors tbody tr")}
    # columns: tensor, shape, dtype, md5 A, md5 B, bitwise, differing, max ULP, max abs, max rel, to exact A | B, closer, expect, holds
    assert rows["out"][5:8] == ["no", "1", "1"] and rows["out"][13] == "NO"
    assert rows["grad.x"][5:8] == ["yes", "0", "0"] and rows["grad.x"][13] == "yes"
    assert rows["grad.probs"][5:8] == ["no", "3", "1"]
    section = browser.find_element(By.ID, "t-out")
    assert "[3, 5]" in section.find_element(By.CSS_SELECTOR, "table.worst tbody tr").text  # the 1-ULP element
    caption = section.find_element(By.CSS_SELECTOR, ".heatmap-caption").text
    assert caption.startswith("Where they differ:") and "up to 1." in caption
    assert "rows: token, columns: hidden" in caption  # the op's axis names label the heatmap
    assert section.find_element(By.CSS_SELECTOR, "canvas.heatmap").size["width"] > 0

    browser.find_element(By.ID, "only-differing").click()
    assert visible_names(browser) == ["out", "grad.probs"]
    browser.find_element(By.ID, "only-differing").click()
    assert visible_names(browser) == ["out", "grad.x", "grad.probs"]

    differing = browser.find_elements(By.CSS_SELECTOR, "#tensors thead th")[6]
    differing.click()
    assert visible_names(browser) == ["grad.x", "out", "grad.probs"]
    differing.click()
    assert visible_names(browser) == ["grad.probs", "out", "grad.x"]

    screenshot = tmp_path / "known_diff.png"
    assert browser.save_screenshot(str(screenshot))
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_several_cases_get_an_index(tmp_path):
    first, second = compare_dumps(*known_diff_dumps()), compare_dumps(*known_diff_dumps(rows=16, cols=16))
    second.case_name = "smaller"
    index = write_reports([first, second], tmp_path / "reports")
    assert index == tmp_path / "reports" / "index.html"
    html = index.read_text()
    assert 'href="known_diff.html"' in html and 'href="smaller.html"' in html and "0 of 2 cases pass" in html
    assert (tmp_path / "reports" / "smaller.html").exists()


def test_text_from_dumps_is_escaped(tmp_path):
    a, b = known_diff_dumps()
    a.meta["provenance"] = "<script>alert(1)</script>"
    html = write_reports([compare_dumps(a, b)], tmp_path / "r.html").read_text()
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html


def one_field_apart(tmp_path) -> Path:
    """A report of two dumps whose fingerprints differ in one field only (device_name)."""
    a, b = known_diff_dumps()
    b.meta["environment"] = {**a.meta["environment"], "device_name": "NVIDIA H200"}
    return write_reports([compare_dumps(a, b)], tmp_path / "one_field.html")


def test_verdict_divergence_and_tensors_come_before_the_fingerprints(report):
    html = report.read_text()
    places = [html.index(marker) for marker in ('id="verdict"', 'id="first-divergent"', '<table id="tensors">',
                                                  '<details class="fingerprint"', '<table id="fingerprints">')]
    assert places == sorted(places)
    assert html.index('<table id="tensors">') < html.index('<section class="tensor')  # the table, then each tensor


def test_fingerprints_are_one_collapsed_table_marked_where_they_differ(tmp_path):
    html = one_field_apart(tmp_path).read_text()
    assert html.count("<details") == 1 and html.count('<table id="fingerprints">') == 1
    details = re.search(r"<details[^>]*>.*?</details>", html, re.S).group(0)
    assert " open" not in details.split(">", 1)[0]  # collapsed by default
    summary = re.search(r"<summary>(.*?)</summary>", details, re.S).group(1)
    assert "3 fields, 1 differs between the sides" in summary and "≠" in summary
    header = re.search(r"<thead>(.*?)</thead>", details, re.S).group(1)
    assert re.findall(r"<th>(.*?)</th>", header) == ["field", "A: megatron", "B: paddle"]
    differing = re.findall(r'<tr data-field="([^"]+)" class="differs">', details)
    assert differing == ["device_name"]
    row = re.search(r'<tr data-field="device_name".*?</tr>', details, re.S).group(0)
    assert "≠" in row and ">cpu</td>" in row and ">NVIDIA H200</td>" in row
    same = re.search(r'<tr data-field="python">.*?</tr>', details, re.S).group(0)
    assert "≠" not in same


def test_a_field_one_side_did_not_record_differs(report):
    html = report.read_text()  # the fixture's sides record their own framework's version only
    assert "4 fields, 2 differ between the sides" in html
    assert re.findall(r'<tr data-field="([^"]+)" class="differs">', html) == ["megatron", "paddle"]
    row = re.search(r'<tr data-field="paddle".*?</tr>', html, re.S).group(0)
    assert "not recorded" in row and ">0.0</td>" in row


def test_same_fingerprints_say_so(tmp_path):
    a, b = known_diff_dumps()
    b.meta["environment"] = dict(a.meta["environment"])
    html = write_reports([compare_dumps(a, b)], tmp_path / "same.html").read_text()
    assert "3 fields, the same on both sides" in html and 'class="differs"' not in html and "≠" not in html


def gate_report(tmp_path, golden: dict) -> str:
    """A gate's report of the known_diff dumps (environment: python 3.11, device_name cpu, and each side's
    framework version), `golden` the fingerprints its golden recorded."""
    a, b = known_diff_dumps()
    return write_reports([compare_dumps(a, b)], tmp_path / "gate.html", goldens={"known_diff": golden}).read_text()


def test_a_gate_report_has_the_goldens_fingerprints_marked_where_they_differ(tmp_path):
    golden = {"megatron": {"python": "3.11", "device_name": "cpu", "megatron": "0.1"},
              "paddle": {"python": "3.10", "device_name": "cpu", "paddle": "0.0", "paddle_flag": "on"}}
    details = re.search(r"<details[^>]*>.*?</details>", gate_report(tmp_path, golden), re.S).group(0)
    header = re.search(r"<thead>(.*?)</thead>", details, re.S).group(1)
    assert re.findall(r"<th>(.*?)</th>", header) == ["field", "A: megatron", "B: paddle", "golden A", "golden B"]
    summary = re.search(r"<summary>(.*?)</summary>", details, re.S).group(1)
    assert "5 fields, 2 differ between the sides, 3 differ from the golden" in summary and "Δ" in summary
    assert dict(re.findall(r'<tr data-field="([^"]+)" class="([^"]+)">', details)) == {
        "python": "drifted", "megatron": "differs drifted", "paddle": "differs", "paddle_flag": "drifted"}
    python = re.search(r'<tr data-field="python".*?</tr>', details, re.S).group(0)
    assert re.findall(r"<td[^>]*>(.*?)</td>", python) == ["3.11", "3.11", "3.11", "3.10"]
    assert re.findall(r'<td class="([^"]+)"', python) == ["mono", "mono", "mono", "mono drifted"]  # B's golden value
    assert "Δ" in python and "≠" not in python
    flag = re.search(r'<tr data-field="paddle_flag".*?</tr>', details, re.S).group(0)  # only in the golden now
    assert re.findall(r"<td[^>]*>(.*?)</td>", flag) == ["not recorded"] * 3 + ["on"]
    same = re.search(r'<tr data-field="device_name">.*?</tr>', details, re.S).group(0)
    assert "Δ" not in same and "drifted" not in same


def test_a_gate_report_whose_golden_has_the_same_fingerprints_says_so(tmp_path):
    golden = {"megatron": {"python": "3.11", "device_name": "cpu", "megatron": "0.0"},
              "paddle": {"python": "3.11", "device_name": "cpu", "paddle": "0.0"}}
    html = gate_report(tmp_path, golden)
    assert "4 fields, 2 differ between the sides, as in the golden" in html and "Δ" not in html


def test_a_report_without_a_golden_has_no_golden_column(report):
    assert "golden A" not in report.read_text() and "Δ" not in report.read_text()


@pytest.mark.slow  # starts Chromium
def test_fingerprint_table_opens_in_browser(browser, tmp_path):
    browser.get(one_field_apart(tmp_path).as_uri())
    details = browser.find_element(By.ID, "fingerprint")
    table = browser.find_element(By.ID, "fingerprints")
    assert details.get_attribute("open") is None and not table.is_displayed()
    assert browser.find_element(By.ID, "tensors").is_displayed()
    summary = details.find_element(By.TAG_NAME, "summary")
    assert "1 differs between the sides" in summary.text and "≠" in summary.text
    summary.click()
    assert table.is_displayed()
    rows = {row.get_attribute("data-field"): [c.text for c in row.find_elements(By.CSS_SELECTOR, "th, td")]
            for row in table.find_elements(By.CSS_SELECTOR, "tbody tr")}
    # columns: field, side A, side B
    assert rows["device_name"] == ["≠ device_name", "cpu", "NVIDIA H200"]
    assert rows["python"] == ["python", "3.11", "3.11"]
    marked = table.find_element(By.CSS_SELECTOR, "tr.differs")
    assert marked.get_attribute("data-field") == "device_name"
    assert marked.find_element(By.TAG_NAME, "td").value_of_css_property("background-color") != "rgba(255, 255, 255, 1)"


@pytest.mark.slow  # starts Chromium
def test_golden_columns_in_browser(browser, tmp_path):
    golden = {"megatron": {"python": "3.11", "device_name": "cpu", "megatron": "0.0"},
              "paddle": {"python": "3.10", "device_name": "cpu", "paddle": "0.0"}}
    gate_report(tmp_path, golden)
    browser.get((tmp_path / "gate.html").as_uri())
    details = browser.find_element(By.ID, "fingerprint")
    assert "1 differs from the golden" in details.find_element(By.TAG_NAME, "summary").text
    details.find_element(By.TAG_NAME, "summary").click()
    row = browser.find_element(By.CSS_SELECTOR, '#fingerprints tr[data-field="python"]')
    assert [c.text for c in row.find_elements(By.CSS_SELECTOR, "th, td")] == ["Δ python", "3.11", "3.11", "3.11", "3.10"]
    cells = row.find_elements(By.TAG_NAME, "td")
    colors = [cell.value_of_css_property("background-color") for cell in cells]
    assert colors[3] != colors[2] and colors[2] == colors[0]  # B's golden value marked, A's not
