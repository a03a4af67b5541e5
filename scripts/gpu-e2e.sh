#!/usr/bin/env bash
# H200 run of bench/e2e_transformers.py (issue 18): builds libflashdec with
# CUDA (the library only) in build-e2e, then runs the bench with the Python
# package from this tree. $OUT gets e2e.json (all numbers), e2e.md (the
# table and the parity lines), e2e.log (progress, warnings) and build.log.
# BENCH_ARGS passes options to the bench (e.g. "--batch 1 64"); BENCH_TIMEOUT
# (seconds, default 480) bounds it (e2e.json is written after every part).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-out}
BUILD_DIR=${BUILD_DIR:-build-e2e}
mkdir -p "$OUT"
start=$SECONDS
{ cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DFLASHDEC_CUDA=ON -DFLASHDEC_BUILD_TESTS=OFF \
    -DFLASHDEC_BUILD_EXAMPLES=OFF && cmake --build "$BUILD_DIR" -j "$(nproc)" --target flashdec; } \
  >"$OUT/build.log" 2>&1 || { echo "build FAILED"; tail -30 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - start)) s"
# shellcheck disable=SC2086
FLASHDEC_LIBRARY=$PWD/$BUILD_DIR/libflashdec.so PYTHONPATH=$PWD/bindings/python \
  timeout "${BENCH_TIMEOUT:-480}" python3 bench/e2e_transformers.py --json "$OUT/e2e.json" ${BENCH_ARGS:-} \
  >"$OUT/e2e.md" 2>"$OUT/e2e.log"
rc=$?
echo "bench rc=$rc in $((SECONDS - start)) s"
cat "$OUT/e2e.md"
grep -E "^(parity|graph|e2e)|Error|error" "$OUT/e2e.log" | tail -30
exit $rc
