#!/usr/bin/env bash
# Sets up xfalign on a Debian CPU machine with Python 3.11, in the virtual environment $XFALIGN_VENV (default
# .venv, made when missing): Chromium + ChromeDriver (browser test of the HTML report) when missing, then exactly
# the versions of configs/lock-cpu.txt (a venv that holds other versions is brought to the lock), then the
# package itself (editable) without resolving anything again.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${XFALIGN_VENV:-.venv}
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
python="$venv/bin/python"
"$python" -m pip install -q --disable-pip-version-check -r configs/lock-cpu.txt
"$python" -m pip install -q --disable-pip-version-check --no-deps -e .
"$python" -m pip check -q >/dev/null
# PaddleFormers' released LLaMA layers (examples/mlp_alignment/paddleformers_mlp.py), exactly the versions of
# configs/paddleformers-cpu.txt, without their dependencies, into build/paddleformers (its requirements would
# replace numpy and ml_dtypes); made again whenever that file changes
pins=configs/paddleformers-cpu.txt
if ! cmp -s "$pins" build/paddleformers/.installed-from.txt; then
    rm -rf build/paddleformers
    "$python" -m pip install -q --disable-pip-version-check --no-deps --target build/paddleformers -r "$pins"
    cp "$pins" build/paddleformers/.installed-from.txt
fi
# Triton, for the CPU-interpreter test of the fused GPU digest kernel (tests/test_triton_digest.py), apart from
# torch's site-packages: torch.compile must not see it
[ -d build/tritonsite/triton-3.7.0.dist-info ] || "$python" -m pip install -q --no-deps --target build/tritonsite triton==3.7.0
