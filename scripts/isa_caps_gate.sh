#!/usr/bin/env bash
# Gate the built-in cases with the CPU's instruction set capped at each level, as a machine with less
# would run them: oneDNN (ONEDNN_MAX_CPU_ISA) and MKL (MKL_ENABLE_INSTRUCTIONS). The numerics profile
# must make every cap give the goldens' bits. Caps above what this CPU has change nothing here.
#   bash scripts/isa_caps_gate.sh [CASES...]      # prints one summary line per cap
set -uo pipefail
cd "$(dirname "$0")/.."
cases=("${@:-cases/*.yaml}")
[ $# -gt 0 ] || cases=(cases/*.yaml)
status=0
for cap in AVX2:AVX2 AVX512_CORE:AVX512 AVX512_CORE_BF16:AVX512_E1 AVX512_CORE_AMX:AVX512_E4; do
    onednn=${cap%%:*}; mkl=${cap##*:}
    log=$(mktemp)
    ONEDNN_MAX_CPU_ISA=$onednn MKL_ENABLE_INSTRUCTIONS=$mkl xfalign gate "${cases[@]}" --baseline baselines \
        --html "$(mktemp -d)" >"$log" 2>&1
    code=$?
    echo "ONEDNN_MAX_CPU_ISA=$onednn MKL_ENABLE_INSTRUCTIONS=$mkl: exit $code, $(tail -n 1 "$log")"
    [ $code -eq 0 ] || status=1
    rm -f "$log"
done
exit $status
