#!/usr/bin/env bash
# Issue 26, host round, in one device call: the 1,024-request job from two trees in alternating
# processes (BASE, a `git archive` of the tree before, against this one; gpu_async.py --timed, one
# async engine each, with the idle probe), then the CUDA kernel, sampler and model tests on this
# tree. nvidia-smi samples clocks, power and throttle reasons throughout.
#   BASE=.base922 OUT=/tmp/out bash bench/gpu/issue26_host_call.sh       (on the GPU machine, repo root)
# The ninth session's changes (generate's requests fed as admitted, the heap frozen during generate)
# against the tree before them: `mkdir .base0e0 && git archive 0e0a073 engine | tar -x -C .base0e0`
# here (untracked, it travels with the working tree), then BASE=.base0e0 (the default).
set -u
OUT=${OUT:-/tmp/gpuout}; BASE=${BASE:-.base0e0}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv; nproc; lscpu | grep -i "model name"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active \
  --format=csv -l 1 > "$OUT/smi.csv" 2>&1 &
SMI=$!
for k in $(seq 1 "${PAIRS:-3}"); do
  order="base new"; (( k % 2 == 0 )) && order="new base"
  for tree in $order; do
    path=$PWD; [[ $tree == base ]] && path=$PWD/$BASE
    PYTHONPATH=$path timeout "${RUN_TIMEOUT:-90}" python3 bench/gpu/gpu_async.py --timed ${JOB:-1024:1024:8192} --pairs 1 \
      --out "$OUT/timed-$tree-$k.json" > "$OUT/timed-$tree-$k.log" 2>&1
    echo "$tree $k rc $? at $(( $(date +%s) - T0 )) s: $(grep -h 'timed pass\|async = sync' "$OUT/timed-$tree-$k.log" | tr '\n' ' ')"
  done
done
[[ ${TESTS:-1} == 1 ]] && (cd tests && PYTHONPATH=$PWD/..:$PWD timeout "${TEST_TIMEOUT:-240}" python3 -m pytest --noconftest -q \
  -p no:cacheprovider -n 12 engine/test_triton_cuda.py engine/test_sampler.py engine/test_cuda_model_zoo.py engine/test_fused_triton.py \
  --junitxml="$OUT/cuda-tests-junit.xml" -rf 2>&1 | tail -6)
echo "tests done at $(( $(date +%s) - T0 )) s"
kill $SMI
