#!/usr/bin/env bash
# The Megatron side of every built-in CPU case, dumped on another machine's CPU (e.g. the host of a GPU
# machine, which has no Paddle), under each case's numerics profile. Bring back the meta.json files and
# check their digests against this machine's goldens with scripts/check_dumps_against_goldens.py.
#   bash scripts/megatron_cpu_dumps.sh OUT [EXTRA_ENV...]     # e.g. ONEDNN_MAX_CPU_ISA=AVX2
set -uo pipefail
out=${1:?usage: megatron_cpu_dumps.sh OUT [VAR=value ...]}
shift
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/xfalign-inductor}
ls cases/*.yaml | xargs -P "${JOBS:-6}" -I{} sh -c \
  'env '"$*"' python3 -m harness.cli run {} --side megatron --dump "'"$out"'/$(basename {} .yaml)" --html /tmp/xfalign-html >/dev/null 2>&1 || echo "FAILED {}"'
