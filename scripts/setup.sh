#!/usr/bin/env bash
# Installs everything xfalign and its tests need on a Debian CPU machine with Python 3.11:
# Chromium + ChromeDriver (browser test of the HTML report) when missing, then the pinned frameworks
# and the package itself (editable, with test extras).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver
fi
python3 -m pip install -q -r configs/requirements-cpu.txt -e ".[test]"
