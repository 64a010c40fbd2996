"""HTML report of a 64M-element tensor pair: file size (target < 5 MB) and time to open it in headless
Chromium (target < 2 s).

    python3 scripts/bench_html_report.py [--elements 67108864]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from harness.compare.case import compare_dumps
from harness.reports.html import write_reports
from harness.store.digest import Digest
from harness.store.dump import Dump

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def dumps(elements: int) -> tuple[Dump, Dump]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((elements // 8192, 8192), dtype=np.float32)
    b = a.copy()
    where = rng.choice(a.size, a.size // 100, replace=False)  # 1% differ by 1-40 ULP
    b.reshape(-1).view(np.uint32)[where] += rng.integers(1, 40, where.size).astype(np.uint32)
    inputs = {"x": Digest.of(a[:1]).to_json()}
    meta = lambda side: {"case": {"expect": {"all": {"max_ulp": 8}}}, "case_name": "big_pair", "side": side,  # noqa: E731
                         "framework": side, "impl": "bench", "mode": None, "provenance": "scripts/bench_html_report.py",
                         "environment": {"device_name": "cpu"}, "inputs": inputs}
    return Dump(meta("a"), {"out": a}), Dump(meta("b"), {"out": b})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--elements", type=int, default=64 << 20)
    args = parser.parse_args()
    a, b = dumps(args.elements)
    start = time.perf_counter()
    comparison = compare_dumps(a, b)
    compared = time.perf_counter() - start
    folder = Path(tempfile.mkdtemp(prefix="xfalign-bench-"))
    report = write_reports([comparison], folder / "big_pair.html")
    written = time.perf_counter() - start - compared
    size = report.stat().st_size
    print(f"{args.elements:,} elements x 2 (float32): compared in {compared:.2f} s, report written in {written:.2f} s")
    print(f"report size: {size / 1e6:.3f} MB (target < 5 MB): {'ok' if size < 5e6 else 'MISSED'}")

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in FLAGS + [f"--user-data-dir={folder / 'profile'}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    try:
        driver.get("about:blank")
        loads = []
        for _ in range(3):
            start = time.perf_counter()
            driver.get(report.as_uri())  # returns once the load event has fired
            loads.append(time.perf_counter() - start)
            timing = driver.execute_script("const t = performance.timing; return t.loadEventEnd - t.navigationStart;")
        print(f"open in Chromium: {', '.join(f'{t:.3f}' for t in loads)} s wall (navigation->load {timing} ms);"
              f" target < 2 s: {'ok' if max(loads) < 2 else 'MISSED'}")
    finally:
        driver.quit()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
