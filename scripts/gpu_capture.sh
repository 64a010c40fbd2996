#!/usr/bin/env bash
# The Megatron side of examples/mlp_alignment captured on a GPU (the H200: torch 2.11+cu130, megatron-core
# 0.19.2 and xfalign's own dependencies from carried wheels; no Paddle needed there). One training step of
# the megatron-core MLP (compiled bias SwiGLU, as in production), every module, full tensors, written to
# "$OUT/tree" (or $1/tree) and packed as tree.tar.gz beside it. Then, on a CPU machine with Paddle:
#   tar -xzf tree.tar.gz && python3 examples/mlp_alignment/run_demo.py --megatron-tree tree
# which loads the Paddle model with the weights and inputs from that capture and compares every variant.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-dumps/gpu-capture}}
mkdir -p "$out"
# a persistent compile cache: the compiled SwiGLU's first call costs seconds on a fresh machine
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$out/.inductor-cache}
python3 - "$out/tree" <<'PY'
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, "examples/mlp_alignment")
import torch  # noqa: E402

import run_demo  # noqa: E402

if not torch.cuda.is_available():
    sys.exit("gpu_capture.sh: no CUDA device here")
tree = run_demo.capture_megatron(Path(sys.argv[1]), device="cuda")
print(f"captured {tree} on {torch.cuda.get_device_name(0)} (torch {torch.__version__})")
PY
tar -C "$out" -czf "$out/tree.tar.gz" tree
echo "wrote $out/tree and $out/tree.tar.gz"
