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
# What runs (4 files to $OUT: compare.log, host.jsonl, grid-new.json and
# grid-prev.json; build and run logs stay in /tmp), ROUNDS times (default 3),
# the builds alternating:
#   host   bench/host_step_bench (engine step host time, fd_decode host time
#          per call, the bare-launch floor; plan and run host times on 0.2+):
#          host.jsonl, one line per run
#   grid   bench/decode_bench over the docs/benchmarks.md grid (GRID_ARGS,
#          e.g. "--filter A"): per case the median over the rounds in
#          grid-new.json / grid-prev.json (decode_bench.json's format), and
#          the comparison in compare.log
# STEPS picks them (default "host grid"; "build" only builds).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-out}
BUILD_DIR=${BUILD_DIR:-build-gpu}
PREV_TAR=${PREV_TAR:?set PREV_TAR to a git archive tarball with prefix prev/}
STEPS=${STEPS:-host grid}
ROUNDS=${ROUNDS:-3}
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
    >/tmp/build-new.log 2>&1 &&
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
      for round in $(seq "$ROUNDS"); do
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
      # ROUNDS rounds, the builds alternating (new, prev, new, ...); per case
      # the median over rounds (scripts/compare_decode_grids.py).
      read -ra grid_args <<<"${GRID_ARGS:-}"
      for round in $(seq "$ROUNDS"); do
        for which in new prev; do
          bin="$BUILD_DIR/bench/decode_bench"
          [ "$which" = prev ] && bin=build-prev/bench/decode_bench
          dir=/tmp/grid-$which-$round
          mkdir -p "$dir"
          "$bin" --out "$dir" "${grid_args[@]}" >"$dir/log" 2>&1 ||
            { note "decode_bench ($which, round $round) FAILED"; tail -20 "$dir/log" >>"$OUT/compare.log"; }
          note "grid $which round $round done ($((SECONDS - start)) s)"
        done
      done
      for which in new prev; do
        python3 scripts/compare_decode_grids.py merge "$OUT/grid-$which.json" \
          /tmp/grid-"$which"-*/decode_bench.json
      done
      python3 scripts/compare_decode_grids.py compare "$OUT/grid-new.json" "$OUT/grid-prev.json" |
        tee -a "$OUT/compare.log"
      ;;
    build) ;;
    *) note "unknown step $step" ;;
  esac
done
note "total $((SECONDS - start)) s"
