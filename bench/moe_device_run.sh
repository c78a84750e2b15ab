#!/usr/bin/env bash
# One batched run of the moe_gemm family on a GPU machine (the device tool's `run`):
# correctness through the loader, SASS check, our timings and the torch baselines, each
# under a time limit, logs into $OUT. Expects, carried from the build machine:
#   .bundle-kernels/  (bundle-libs of moe_gemm_gpu_test and moe_gemm_bench)
#   .device-kernels/art/  (scripts/build-artifacts output: the whole family)
# Usage: bench/moe_device_run.sh [test|sass|bench|baselines ...]  (default: all four)
set -uo pipefail
OUT=${OUT:-/tmp/moe-out}
mkdir -p "$OUT"
art=.device-kernels/art
steps=${*:-test sass bench baselines}
command -v cuobjdump >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
for step in $steps; do
  echo "=== $step"
  case $step in
    test)
      CUBIST_MOE_ARTIFACTS=$art CUBIST_MOE_RESULTS=$OUT/gpu_results.txt \
        timeout ${TEST_LIMIT:-150} .bundle-kernels/run moe_gemm_gpu_test > "$OUT/gpu_test.log" 2>&1
      echo "gpu test exit $?"; grep -E "FAIL|within tolerance|PASSED|Skipped" "$OUT/gpu_test.log" | head -40
      ;;
    sass)
      for f in $art/cubins/sm_90a/*.cubin; do
        s=$(cuobjdump --dump-sass "$f" 2>&1)
        printf '%s HGMMA=%s QGMMA=%s LDL=%s STL=%s\n' "$(basename "$f" .cubin)" \
          "$(grep -c HGMMA <<<"$s")" "$(grep -c QGMMA <<<"$s")" "$(grep -c 'LDL' <<<"$s")" \
          "$(grep -c 'STL' <<<"$s")"
      done > "$OUT/sass.txt"
      awk '{print $2, $3}' "$OUT/sass.txt" | sort | uniq -c
      ;;
    bench)
      timeout ${BENCH_LIMIT:-220} .bundle-kernels/run moe_gemm_bench $art --csv "$OUT/bench.csv" \
        ${BENCH_ARGS:-} > "$OUT/bench.md" 2>&1
      echo "bench exit $?"; cat "$OUT/bench.md" | tail -70
      ;;
    baselines)
      PYTHONUNBUFFERED=1 timeout ${BASE_LIMIT:-170} python3 bench/moe_baselines.py --csv "$OUT/baselines.csv" \
        > "$OUT/baselines.md" 2>&1
      echo "baselines exit $?"; cat "$OUT/baselines.md"
      ;;
  esac
done
