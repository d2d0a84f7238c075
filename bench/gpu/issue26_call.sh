#!/usr/bin/env bash
# Issue 26 in one device call: the CUDA tests (sampler, model zoo, fused kernels), then sync vs async at 1,024 and 256 requests (per-step host and device
# times, graph coverage, device time by step kind), a kernel profile, the eager reference, the
# seeded and float32 checks.
# SKIP="float32 defaults" leaves sections out, TESTS=0 the tests.
#   OUT=/tmp/out bash bench/gpu/issue26_call.sh            (on the GPU machine, repo root)
set -u
OUT=${OUT:-/tmp/gpuout}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  git log -1 --format='tree %h %s' 2>/dev/null; nproc; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
[[ ${TESTS:-1} == 1 ]] && (cd tests && PYTHONPATH=$PWD/..:$PWD timeout "${TEST_TIMEOUT:-170}" python3 -m pytest --noconftest -q \
  -p no:cacheprovider -n 8 engine/test_sampler.py engine/test_cuda_model_zoo.py engine/test_fused_triton.py ${MORE_TESTS:-} \
  --junitxml="$OUT/cuda-tests-junit.xml" -rf 2>&1 | tail -8)
echo "tests done at $(( $(date +%s) - T0 )) s"
PYTHONPATH=$PWD timeout "${ASYNC_TIMEOUT:-330}" python3 bench/gpu/gpu_async.py --out "$OUT/gpu-async.json" \
  --requests ${REQUESTS:-1024 256} --pairs "${PAIRS:-2}" --profile --skip ${SKIP:-} > "$OUT/async.log" 2>&1
echo "async rc $? at $(( $(date +%s) - T0 )) s"
grep -v "Loading weights\|Writing model" "$OUT/async.log" | tail -22
