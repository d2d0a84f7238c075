#!/usr/bin/env bash
# One device call: compiled kernel tests, throughput, correctness checks; logs and JSON to $OUT.
#   bash bench/gpu/run_all.sh "<throughput args>" "<sections: kernels,throughput,check>"
set -u
OUT=${OUT:-/tmp/gpuout}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_INTERPRET=0 TOKENIZERS_PARALLELISM=false
TP_ARGS=${1:---requests 256}
SECTIONS=${2:-kernels,throughput,check}
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.mem --format=csv; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"; } 2>&1 | tee "$OUT/env.txt"
if [[ $SECTIONS == *kernels* ]]; then
  timeout ${KERNEL_TIMEOUT:-150} python3 -m pytest --noconftest -q -p no:cacheprovider -n 8 tests/engine/test_triton_cuda.py tests/engine/test_fused_triton.py \
    --junitxml="$OUT/kernels-junit.xml" -rf --durations=8 2>&1 | tail -40 | tee "$OUT/kernels.txt"
  echo "kernels done at $(( $(date +%s) - T0 )) s"
fi
if [[ $SECTIONS == *throughput* ]]; then
  timeout ${TP_TIMEOUT:-200} python3 bench/gpu/gpu_throughput.py --out "$OUT/gpu-throughput.json" $TP_ARGS 2>&1 \
    | grep -v "Loading weights\|Writing model" > "$OUT/throughput.log"
  tail -25 "$OUT/throughput.log"
  echo "throughput done at $(( $(date +%s) - T0 )) s"
fi
if [[ $SECTIONS == *check* ]]; then
  timeout ${CHECK_TIMEOUT:-230} python3 bench/gpu/gpu_check.py --out "$OUT/gpu-check.json" ${CHECK_ARGS:-} 2>&1 \
    | grep -v "Loading weights\|Writing model" > "$OUT/check.log"
  grep -E "^  |^===.*FAILED|Error" "$OUT/check.log" | tail -70
  echo "check done at $(( $(date +%s) - T0 )) s"
fi
