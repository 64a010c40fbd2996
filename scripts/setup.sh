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
# PaddleFormers' released LLaMA layers (examples/mlp_alignment/paddleformers_mlp.py): its requirements would
# replace numpy and ml_dtypes, so the wheel and the few packages its LLaMA modules import go, without their
# dependencies, into build/paddleformers (found there by the example, after everything installed)
[ -d build/paddleformers/paddleformers-1.2.0.dist-info ] || python3 -m pip install -q --no-deps \
    --target build/paddleformers paddleformers==1.2.0 transformers==5.3.0 huggingface-hub==1.33.0 \
    tokenizers==0.22.2 colorlog==6.12.0 tqdm==4.70.1 psutil==7.2.2 omegaconf==2.4.0 aistudio-sdk==0.3.9
# Triton, for the CPU-interpreter test of the fused GPU digest kernel (tests/test_triton_digest.py), apart from
# torch's site-packages: torch.compile must not see it
[ -d build/tritonsite/triton-3.7.0.dist-info ] || python3 -m pip install -q --no-deps --target build/tritonsite triton==3.7.0
