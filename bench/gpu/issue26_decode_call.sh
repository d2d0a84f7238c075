#!/usr/bin/env bash
# Issue 26, decode round, in one device call: tune the decode kernel's launch on the job's decode
# shapes (decode_tune.py), make the chosen launch this tree's default, run the CUDA tests with it,
# then the before/after A/B at 1,024 and 256 requests (gpu_async.py --ab) and a kernel profile.
#   OUT=/tmp/out bash bench/gpu/issue26_decode_call.sh            (on the GPU machine, repo root)
set -u
OUT=${OUT:-/tmp/gpuout}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=${TRITON_INTERPRET:-0} TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; nproc; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if [[ -z ${LAUNCH:-} ]]; then
  PYTHONPATH=$PWD timeout "${TUNE_TIMEOUT:-200}" python3 bench/gpu/decode_tune.py --out "$OUT/decode-tune.json" \
    --launch-out "$OUT/decode-launch.json" ${TUNE_ARGS:-} > "$OUT/tune.log" 2>&1
  echo "tune rc $? at $(( $(date +%s) - T0 )) s"; grep -v "^  p[12]/" "$OUT/tune.log" | tail -12
  LAUNCH=$(cat "$OUT/decode-launch.json" 2>/dev/null)
fi
# LAUNCH (JSON of DecodeLaunch fields) becomes DEFAULT_DECODE for the tests and the A/B's "after"
[[ -n ${LAUNCH:-} ]] && python3 bench/gpu/set_default_launch.py DEFAULT_DECODE DecodeLaunch "$LAUNCH"
grep -n "^DEFAULT_DECODE" engine/attention/triton_backend.py | tee "$OUT/default-decode.txt"
[[ ${TESTS:-1} == 1 ]] && (cd tests && PYTHONPATH=$PWD/..:$PWD timeout "${TEST_TIMEOUT:-240}" python3 -m pytest --noconftest -q \
  -p no:cacheprovider -n 12 engine/test_triton_cuda.py engine/test_sampler.py engine/test_cuda_model_zoo.py engine/test_fused_triton.py \
  --junitxml="$OUT/cuda-tests-junit.xml" -rf 2>&1 | tail -6)
echo "tests done at $(( $(date +%s) - T0 )) s"
PYTHONPATH=$PWD timeout "${AB_TIMEOUT:-200}" python3 bench/gpu/gpu_async.py --out "$OUT/gpu-async.json" --requests 1024 \
  --ab ${AB:-1024:1024:8192 256:512:8192} --pairs "${PAIRS:-3}" --profile --skip ${SKIP:-float32} ${AB_ARGS:-} > "$OUT/async.log" 2>&1
echo "async rc $? at $(( $(date +%s) - T0 )) s"
grep -v "Loading weights\|Writing model" "$OUT/async.log" | tail -16
