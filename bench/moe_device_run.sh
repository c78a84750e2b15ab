#!/usr/bin/env bash
# One batched run of the moe_gemm family on a GPU machine (the device tool's `run`):
# correctness through the loader, SASS check, our timings and the torch baselines, each
# under a time limit, logs into $OUT. Expects, carried from the build machine:
#   $BUNDLE (default .bundle-kernels/): moe_gemm_gpu_test, moe_gemm_bench and
#           libcubist_moe_shim.so, with their shared libraries and a `run` wrapper
#           that finds them
#   $ART (default .device-kernels/art/): scripts/build-artifacts output
# Usage: bench/moe_device_run.sh [test|sass|bench|baselines|compare ...]
#   (default: test sass compare). `compare` is bench/moe_bench.py: ours through the
#   engine API and torch's grouped GEMMs in one process ($COMPARE_ARGS adds flags).
set -uo pipefail
OUT=${OUT:-/tmp/moe-out}
mkdir -p "$OUT"
art=${ART:-.device-kernels/art}
bundle=${BUNDLE:-.bundle-kernels}
steps=${*:-test sass compare}
command -v cuobjdump >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
for step in $steps; do
  echo "=== $step"
  case $step in
    test)
      CUBIST_MOE_ARTIFACTS=$art CUBIST_MOE_RESULTS=$OUT/gpu_results.txt \
        timeout ${TEST_LIMIT:-150} "$bundle/run" moe_gemm_gpu_test > "$OUT/gpu_test.log" 2>&1
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
      timeout ${BENCH_LIMIT:-220} "$bundle/run" moe_gemm_bench $art --csv "$OUT/bench.csv" \
        ${BENCH_ARGS:-} > "$OUT/bench.md" 2>&1
      echo "bench exit $?"; cat "$OUT/bench.md" | tail -70
      ;;
    compare)
      LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONUNBUFFERED=1 \
        timeout ${COMPARE_LIMIT:-300} python3 bench/moe_bench.py --manifest "$art/manifest.json" \
        --shim "$bundle/bin/libcubist_moe_shim.so" --csv "$OUT/compare.csv" ${COMPARE_ARGS:-} \
        > "$OUT/compare.md" 2>&1
      echo "compare exit $?"; cat "$OUT/compare.md"
      ;;
    baselines)
      PYTHONUNBUFFERED=1 timeout ${BASE_LIMIT:-170} python3 bench/moe_baselines.py --csv "$OUT/baselines.csv" \
        > "$OUT/baselines.md" 2>&1
      echo "baselines exit $?"; cat "$OUT/baselines.md"
      ;;
  esac
done
