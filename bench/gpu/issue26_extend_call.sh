#!/usr/bin/env bash
# Issue 26, prefill-attention round, in one device call: tune the extend kernel's launch on the
# job's prefill steps (extend_tune.py), make the chosen launch this tree's default, run the CUDA
# kernel and model tests with it, then the before/after A/B at 1,024 requests (gpu_async.py --ab),
# whose passes also record where the device idles (the "idle" field of each pass).
#   OUT=/tmp/out bash bench/gpu/issue26_extend_call.sh            (on the GPU machine, repo root)
set -u
OUT=${OUT:-/tmp/gpuout}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=${TRITON_INTERPRET:-0} TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; nproc; lscpu | grep -i "model name"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if [[ -z ${EXTEND:-} ]]; then
  PYTHONPATH=$PWD timeout "${TUNE_TIMEOUT:-150}" python3 bench/gpu/extend_tune.py --out "$OUT/extend-tune.json" \
    --launch-out "$OUT/extend-launch.json" ${TUNE_ARGS:-} > "$OUT/tune.log" 2>&1
  echo "tune rc $? at $(( $(date +%s) - T0 )) s"; tail -4 "$OUT/tune.log"
  EXTEND=$(cat "$OUT/extend-launch.json" 2>/dev/null)
fi
# EXTEND (JSON of ExtendLaunch fields) becomes DEFAULT_EXTEND for the tests and the A/B's "after"
[[ -n ${EXTEND:-} ]] && python3 bench/gpu/set_default_launch.py DEFAULT_EXTEND ExtendLaunch "$EXTEND"
grep -n "^DEFAULT_EXTEND" engine/attention/triton_backend.py | tee "$OUT/default-extend.txt"
[[ ${TESTS:-1} == 1 ]] && (cd tests && PYTHONPATH=$PWD/..:$PWD timeout "${TEST_TIMEOUT:-200}" python3 -m pytest --noconftest -q \
  -p no:cacheprovider -n 12 engine/test_triton_cuda.py engine/test_cuda_model_zoo.py \
  --junitxml="$OUT/cuda-tests-junit.xml" -rf 2>&1 | tail -6)
echo "tests done at $(( $(date +%s) - T0 )) s"
PYTHONPATH=$PWD timeout "${AB_TIMEOUT:-200}" python3 bench/gpu/gpu_async.py --out "$OUT/gpu-async.json" --requests 1024 \
  --ab ${AB:-1024:1024:8192} --pairs "${PAIRS:-3}" --skip ${SKIP:-float32 logprobs seeded} ${AB_ARGS:-} > "$OUT/async.log" 2>&1
echo "async rc $? at $(( $(date +%s) - T0 )) s"
grep -v "Loading weights\|Writing model" "$OUT/async.log" | tail -16
