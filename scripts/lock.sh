#!/usr/bin/env bash
# Refreshes configs/lock-cpu.txt, the exact version of every package the CPU machine installs, from
# pyproject.toml (the package and its test and docs extras) and configs/requirements-cpu.in (the frameworks).
# Needs uv (pip install uv); torch's CPU wheel is found in /opt/wheels (elsewhere, add --find-links https://download.pytorch.org/whl/torch/).
set -euo pipefail
cd "$(dirname "$0")/.."
uv pip compile pyproject.toml --extra test --extra docs configs/requirements-cpu.in \
    --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
    --find-links /opt/wheels \
    --no-emit-find-links --no-emit-index-url --custom-compile-command "scripts/lock.sh" -q -o configs/lock-cpu.txt "$@"
