#!/usr/bin/env bash
# GPU check for the CUDA backend, meant for a machine with an NVIDIA GPU
# (sm_90): configure and build with CUDA, run every ctest suite (the "gpu"
# label first), the decode benchmark, then compute-sanitizer (memcheck,
# racecheck, initcheck) over a reduced GPU test. Logs and the benchmark's
# JSON/Markdown/SVG go to $OUT (default ./gpu-out), at most 7 files.
#
# cmocka: when it is not installed, .deps/*.deb (apt-get download libcmocka0
# libcmocka-dev) are unpacked to /tmp/cm and used.
#
# Environment: OUT, BUILD_DIR (build-gpu), JOBS, SKIP_SANITIZER=1,
# SKIP_BENCH=1, BENCH_ARGS (e.g. "--quick", "--explore" or "--filter A,B"),
# GPU_ONLY=1 (ctest runs only the "gpu" label), BUILD_TARGETS (e.g.
# "gpu_decode decode_bench": build only these; implies GPU_ONLY),
# SANITIZER_TIMEOUT (seconds per compute-sanitizer tool, 240). The benchmark
# runs before the sanitizers so its results come back even if they run long.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
BUILD_DIR=${BUILD_DIR:-build-gpu}
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
if ! cmake -S . -B "$BUILD_DIR" -G Ninja -DFLASHDEC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
     -DCMAKE_BUILD_TYPE=Release "${cmocka_args[@]}" >"$OUT/build.log" 2>&1; then
  note "CONFIGURE FAILED (see build.log)"
  tail -30 "$OUT/build.log"
  exit 1
fi
# Keep going past a failing target so one broken suite does not hide the rest.
targets=()
[ -n "${BUILD_TARGETS:-}" ] && targets=(--target ${BUILD_TARGETS}) && GPU_ONLY=1
if cmake --build "$BUILD_DIR" -j "$JOBS" "${targets[@]}" -- -k 0 >>"$OUT/build.log" 2>&1; then
  note "build ok in $((SECONDS - start)) s"
else
  status=1
  note "BUILD FAILED for some targets (see build.log): $(grep -c FAILED "$OUT/build.log") failures"
  grep -A3 FAILED "$OUT/build.log" | head -20
  [ -x "$BUILD_DIR/tests/gpu_decode" ] || exit 1
fi

start=$SECONDS
if [ "${GPU_ONLY:-0}" = 1 ]; then
  (cd "$BUILD_DIR" && ctest -L gpu --output-on-failure) >"$OUT/ctest.log" 2>&1 || status=1
else
  (cd "$BUILD_DIR" && ctest -L gpu --output-on-failure && ctest -LE gpu --output-on-failure) \
    >"$OUT/ctest.log" 2>&1 || status=1
fi
note "ctest: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tr '\n' ' ') ($((SECONDS - start)) s)"
grep -E "SKIPPED|sweep cases|\[  FAILED|\[  PASSED|\[  SKIPPED" "$OUT/ctest.log" | head -20 | tee -a "$OUT/summary.log"

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  start=$SECONDS
  "$BUILD_DIR/bench/decode_bench" --out "$OUT" ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  note "bench rc=$rc in $((SECONDS - start)) s"
  tail -12 "$OUT/bench.log"
fi
if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  : >"$OUT/sanitizer.log"
  for tool in memcheck racecheck initcheck; do
    start=$SECONDS
    extra=()
    [ "$tool" = memcheck ] && extra=(--leak-check full)
    FD_GPU_TEST_REDUCED=1 timeout "${SANITIZER_TIMEOUT:-240}" compute-sanitizer --tool "$tool" "${extra[@]}" \
      --error-exitcode 3 "$BUILD_DIR/tests/gpu_decode" >>"$OUT/sanitizer.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && status=1
    note "compute-sanitizer $tool: rc=$rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.log" | tail -1) ($((SECONDS - start)) s)"
  done
fi

note "overall status $status"
exit $status
