#!/usr/bin/env bash
# torch bits under each ISA cap, without and with the portable-avx2 pins: bash scripts/isa_probe_matrix.sh
lscpu | grep -E "Model name|^Flags" | sed 's/Flags:/Flags:/' | tr ' ' '\n' | grep -E "Model|name|avx2|avx512f|avx512bw|avx512_bf16|amx_bf16|amx_tile" | tr '\n' ' '; echo
export TORCHINDUCTOR_CACHE_DIR=/tmp/ind
for pin in 0 1; do
  for cap in NONE AVX2 AVX512_CORE AVX512_CORE_BF16 AVX512_CORE_AMX; do
    if [ $pin = 1 ]; then extra="ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE OMP_NUM_THREADS=1 PIN=1 SIMDLEN=256"; else extra=""; fi
    mk=$cap; [ $cap = AVX512_CORE ] && mk=AVX512; [ $cap = AVX512_CORE_BF16 ] && mk=AVX512_E1; [ $cap = AVX512_CORE_AMX ] && mk=AVX512_E4
    if [ $cap = NONE ]; then capenv=""; else capenv="ONEDNN_MAX_CPU_ISA=$cap MKL_ENABLE_INSTRUCTIONS=$mk"; fi
    env $capenv $extra TAG="pin=$pin cap=$cap" python3 scripts/isa_probe_torch.py 2>/dev/null
  done
done
