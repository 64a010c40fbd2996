#!/usr/bin/env bash
# The Megatron side of every case in cases/gpu/, run on a GPU machine (no Paddle needed there), each
# side repeated 3 times to catch nondeterminism. Bring the dumps back and compare them with Paddle
# dumps made on a CPU machine:
#   bash scripts/gpu_megatron_dumps.sh dumps/gpu                                   # on the GPU machine
#   xfalign run cases/gpu/X.yaml --side paddle --dump dumps/cpu/X                  # here
#   xfalign compare dumps/gpu/X dumps/cpu/X
set -uo pipefail
out=${1:-dumps/gpu}
status=0
for case_file in cases/gpu/*.yaml; do
    name=$(basename "$case_file" .yaml)
    python3 -m harness.cli run "$case_file" --side megatron --dump "$out/$name" --repeat 3 || { echo "FAILED $case_file"; status=1; }
done
exit $status
