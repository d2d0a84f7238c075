#!/usr/bin/env bash
# One device call for issue 44's FP8 path (at most about 8.5 minutes on an H200): the compiled FP8 tests
# (tests/engine/test_fp8_cuda.py), an FP8 graphs-vs-eager token check on a small model, then the
# 1,024-request job on the 1B and 8B shapes in bf16,
# FP8 weights, and FP8 weights + FP8 KV (bench/gpu/fp8_throughput.py). Logs and JSON to $OUT.
#   bash bench/gpu/fp8_check.sh ["<fp8_throughput.py args>"]     e.g. "--shapes 1b" or "--passes 2"
set -u
OUT=${OUT:-/tmp/gpuout}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_INTERPRET=0 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.mem --format=csv; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"; } 2>&1 | tee "$OUT/env.txt"
timeout ${KERNEL_TIMEOUT:-80} python3 -m pytest --noconftest -q -p no:cacheprovider tests/engine/test_fp8_cuda.py \
  --junitxml="$OUT/fp8-cuda-junit.xml" -rf --durations=5 2>&1 | tail -40 | tee "$OUT/fp8-cuda-tests.txt"
echo "fp8 tests done at $(( $(date +%s) - T0 )) s"
timeout ${TP_TIMEOUT:-420} python3 bench/gpu/fp8_throughput.py --out "$OUT/fp8-throughput.json" ${1:-} 2>&1 \
  | grep -v "Loading weights\|Writing model" > "$OUT/fp8-throughput.log"
grep -A12 "^SUMMARY" "$OUT/fp8-throughput.log" || tail -40 "$OUT/fp8-throughput.log"
echo "throughput done at $(( $(date +%s) - T0 )) s"
