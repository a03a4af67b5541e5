#!/usr/bin/env bash
# Same-run comparison of this tree with an earlier commit on a GPU machine
# (docs/benchmarks.md: "compare with the previous commit in the same run").
#
# The earlier commit comes as a tarball of `git archive --prefix=prev/ <sha>`
# (PREV_TAR, e.g. .deps/prev-<sha>.tar, carried to the machine); it is built
# in build-prev with only the library and the decode benchmark. This tree's
# build is BUILD_DIR (default build-gpu: run scripts/gpu-check.sh first, or
# this script builds flashdec, decode_bench and host_step_bench there).
#
# What runs (at most 6 files to $OUT: compare.log, host.jsonl and the two
# grids' decode_bench.json / .md; build and run logs stay in /tmp):
#   host   bench/host_step_bench (engine step host time, fd_decode host time
#          per call; plan and run host times on 0.2+), alternating
#          new/prev/new/prev: host.jsonl
#   grid   bench/decode_bench over the docs/benchmarks.md grid, new then prev
#          (GRID_ARGS, e.g. "--filter A"): decode-new.*, decode-prev.*
# STEPS picks them (default "host grid"; "build" only builds).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-out}
BUILD_DIR=${BUILD_DIR:-build-gpu}
PREV_TAR=${PREV_TAR:?set PREV_TAR to a git archive tarball with prefix prev/}
STEPS=${STEPS:-host grid}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
note() { echo "== $*" | tee -a "$OUT/compare.log"; }
start=$SECONDS

prev_src=/tmp/prev-src
if [ ! -f build-prev/libflashdec.so ]; then
  rm -rf "$prev_src" && mkdir -p "$prev_src" && tar -xf "$PREV_TAR" -C "$prev_src" || exit 1
  cmake -S "$prev_src/prev" -B build-prev -DCMAKE_BUILD_TYPE=Release -DFLASHDEC_CUDA=ON \
    -DFLASHDEC_BUILD_TESTS=OFF -DFLASHDEC_BUILD_EXAMPLES=OFF >/tmp/build-prev.log 2>&1 &&
    cmake --build build-prev -j "$JOBS" --target flashdec decode_bench >>/tmp/build-prev.log 2>&1 ||
    { note "prev build FAILED"; tail -30 /tmp/build-prev.log | tee -a "$OUT/compare.log"; exit 1; }
fi
if [ "$STEPS" != build ] &&
  { [ ! -x "$BUILD_DIR/bench/host_step_bench" ] || [ ! -x "$BUILD_DIR/bench/decode_bench" ]; }; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHDEC_CUDA=ON \
    -DFLASHDEC_BUILD_TESTS=OFF >/tmp/build-new.log 2>&1 &&
    cmake --build "$BUILD_DIR" -j "$JOBS" --target flashdec decode_bench host_step_bench \
      >>/tmp/build-new.log 2>&1 || { note "new build FAILED"; tail -30 /tmp/build-new.log | tee -a "$OUT/compare.log"; exit 1; }
fi
# The host benchmark's source builds against either header.
cuda_home=${CUDA_HOME:-/usr/local/cuda}
"$cuda_home/bin/nvcc" -O2 -std=c++17 -arch=sm_90 bench/host_step_bench.cu -I"$prev_src/prev/include" \
  -Lbuild-prev -lflashdec -Xlinker -rpath -Xlinker "$PWD/build-prev" \
  -o build-prev/host_step_bench >>/tmp/build-prev.log 2>&1 ||
  { note "prev host bench build FAILED"; tail -20 /tmp/build-prev.log >>"$OUT/compare.log"; exit 1; }
note "builds ready ($((SECONDS - start)) s)"

for step in $STEPS; do
  case "$step" in
    host)
      : >"$OUT/host.jsonl"
      for round in 1 2; do
        for which in new prev; do
          bin="$BUILD_DIR/bench/host_step_bench"
          [ "$which" = prev ] && bin=build-prev/host_step_bench
          if "$bin" >"$OUT/host-$which.json" 2>>"$OUT/compare.log"; then
            printf '{"build": "%s", "round": %d, "result": %s}\n' "$which" "$round" \
              "$(tr -d '\n' <"$OUT/host-$which.json")" >>"$OUT/host.jsonl"
          else
            note "host_step_bench ($which) FAILED"
          fi
        done
      done
      rm -f "$OUT"/host-new.json "$OUT"/host-prev.json
      note "host done ($((SECONDS - start)) s)"
      cat "$OUT/host.jsonl" | tee -a "$OUT/compare.log"
      ;;
    grid)
      read -ra grid_args <<<"${GRID_ARGS:-}"
      for which in new prev; do
        bin="$BUILD_DIR/bench/decode_bench"
        [ "$which" = prev ] && bin=build-prev/bench/decode_bench
        mkdir -p "$OUT/grid-$which"
        "$bin" --out "$OUT/grid-$which" "${grid_args[@]}" >"/tmp/grid-$which.log" 2>&1 ||
          { note "decode_bench ($which) FAILED"; tail -20 "/tmp/grid-$which.log" >>"$OUT/compare.log"; }
        rm -f "$OUT/grid-$which/decode_bench.svg"  # at most 8 files come back
        note "grid $which done ($((SECONDS - start)) s)"
      done
      ;;
    build) ;;
    *) note "unknown step $step" ;;
  esac
done
note "total $((SECONDS - start)) s"
