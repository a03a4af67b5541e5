#!/usr/bin/env bash
# GPU check of the GPU-resident cache and the append kernels (issue 5), for a
# machine with an NVIDIA GPU (sm_90): configure with CUDA, build this work's
# targets, run gpu_append and gpu_cache_step (and the CPU suites of the
# append primitives), compute-sanitizer memcheck over both GPU suites, then
# bench/append_bench. Logs and the benchmark's JSON/Markdown go to $OUT
# (default ./gpu-out), at most 7 files.
#
# cmocka: when it is not installed, .deps/*.deb (apt-get download libcmocka0
# libcmocka-dev) are unpacked to /tmp/cm and used (as scripts/gpu-check.sh).
#
# Environment: OUT, BUILD_DIR (build-gpucache), JOBS, SKIP_SANITIZER=1, SKIP_BENCH=1.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
BUILD_DIR=${BUILD_DIR:-build-gpucache}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
status=0
note() { echo "== $*" | tee -a "$OUT/summary.log"; }

cmocka_args=()
if ! ls /usr/include/cmocka.h >/dev/null 2>&1 && ls .deps/*.deb >/dev/null 2>&1; then
  for f in .deps/*.deb; do dpkg -x "$f" /tmp/cm; done
  cmocka_args=(-DCMOCKA_INCLUDE_DIR=/tmp/cm/usr/include
               -DCMOCKA_LIBRARY=/tmp/cm/usr/lib/x86_64-linux-gnu/libcmocka.so.0)
  export LD_LIBRARY_PATH=/tmp/cm/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

note "device: $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | head -1)"
note "commit: ${GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} $(date -u +%Y-%m-%dT%H:%M:%SZ)"

start=$SECONDS
targets=(gpu_append gpu_cache_step test_kv_append test_kv_append_cache append_bench)
if ! cmake -S . -B "$BUILD_DIR" -G Ninja -DFLASHDEC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
     -DCMAKE_BUILD_TYPE=Release "${cmocka_args[@]}" >"$OUT/build.log" 2>&1 ||
   ! cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}" >>"$OUT/build.log" 2>&1; then
  note "BUILD FAILED (see build.log)"
  grep -B2 -A6 -E "error|FAILED" "$OUT/build.log" | head -40
  exit 1
fi
note "build ok in $((SECONDS - start)) s"

: >"$OUT/tests.log"
for t in gpu_append gpu_cache_step test_kv_append test_kv_append_cache; do
  start=$SECONDS
  CMOCKA_MESSAGE_OUTPUT=stdout timeout 60 "$BUILD_DIR/tests/$t" >>"$OUT/tests.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  note "$t rc=$rc ($((SECONDS - start)) s): $(grep -cE '^\[       OK' "$OUT/tests.log") OK so far"
done
grep -E "SKIPPED|FAILED|gpu_append:|test_kv_append:|rel error|error" "$OUT/tests.log" | head -20 | tee -a "$OUT/summary.log"

if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  : >"$OUT/sanitizer.log"
  for t in gpu_cache_step gpu_append; do
    start=$SECONDS
    CMOCKA_MESSAGE_OUTPUT=stdout timeout 70 compute-sanitizer --tool memcheck --leak-check full \
      --error-exitcode 3 "$BUILD_DIR/tests/$t" >>"$OUT/sanitizer.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && status=1
    note "compute-sanitizer memcheck $t: rc=$rc, $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1) ($((SECONDS - start)) s)"
  done
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  start=$SECONDS
  timeout 100 "$BUILD_DIR/bench/append_bench" --out "$OUT" >"$OUT/bench.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  note "append_bench rc=$rc in $((SECONDS - start)) s"
  cat "$OUT/bench.log"
fi
note "overall status $status"
exit $status
