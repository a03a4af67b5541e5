#!/usr/bin/env bash
# GPU check for the CUDA backend, meant for a machine with an NVIDIA GPU
# (sm_90): configure and build with CUDA, run the test suites, a benchmark,
# then compute-sanitizer over GPU suites. Logs and the benchmark's results go
# to $OUT (default ./gpu-out), at most 8 files: summary.log, build.log,
# ctest.log, bench.log, sanitizer.log and the benchmark's own files.
#
# MODE picks what is checked:
#   decode (default)  every ctest suite (the "gpu" label first), the decode
#                     benchmark (bench/decode_bench: JSON, Markdown, SVG; with
#                     its --prefill cases unless PREFILL=0), torch SDPA on the
#                     same prefill shapes (bench/prefill_sdpa.py: its JSON and
#                     the comparison table go to bench.log), then memcheck,
#                     racecheck and initcheck over a reduced gpu_decode.
#                     FP8=1 (issue 15): decode_bench --kv fp8 (FP8 K/V beside
#                     16-bit K/V on the grid's shapes and batches; PREFILL
#                     defaults to 0), then append_bench (its output, table
#                     and JSON in bench.log), and gpu_fp8 under the
#                     sanitizers too.
#                     VARIANTS=1 (issue 16): then also decode_bench
#                     --variants (soft-cap, sinks, sliding window beside
#                     their plain twins; head_dim 256 / 96 against copy):
#                     its output, table and JSON in bench.log, its table in
#                     summary.log. PREV_GRID=path (a decode_bench.json of
#                     an earlier run, e.g. docs/perf/h200-grid-*.json): the
#                     plain run is compared with it per case
#                     (scripts/compare_decode_grids.py; another run, so
#                     machine noise included).
#   append            the GPU-resident cache and the append kernels: gpu_append,
#                     gpu_cache_step and the CPU suites of the append primitives
#                     (test_kv_append, test_kv_append_cache), the append
#                     benchmark (bench/append_bench: JSON, Markdown), then
#                     memcheck, racecheck and initcheck over both GPU suites
#                     (reduced). Sized for a 7-minute run: about 2.5 minutes
#                     of build, tests and benchmark, then at most 6 x 45 s.
#   reliability       issue 11: build everything, every ctest suite (GPU
#                     suites verbose, the rest in parallel), then every GPU
#                     suite (tests/gpu_*, gpu_stream_order and the allocation
#                     failure injection gpu_inject_alloc_failures included)
#                     several at once (CONCURRENT_ROUNDS rounds of
#                     CONCURRENT_COPIES copies of each, reduced), then every
#                     GPU suite under memcheck, racecheck, initcheck and
#                     synccheck (reduced, SANITIZER_JOBS runs at once, which
#                     also runs them concurrently). No benchmark. Writes
#                     runs.tsv: one line per run (kind, tool or round, suite,
#                     errors, hazards, rc, PASS/FAIL, seconds), plus
#                     concurrent.log and sanitizer.log. Sized for about 8
#                     minutes on an H200.
# The benchmark runs before the sanitizers so its results come back even if
# they run long.
#
# cmocka: when it is not installed, .deps/*.deb (apt-get download libcmocka0
# libcmocka-dev; carry .deps) are unpacked to /tmp/cm and used; or set
# CMOCKA_ROOT to a prefix holding include/cmocka.h and lib/libcmocka.so.
#
# Environment: MODE, OUT, BUILD_DIR (build-gpu), JOBS, FP8=1, VARIANTS=1, PREV_GRID,
# SKIP_SANITIZER=1,
# SKIP_BENCH=1, BENCH_ARGS (decode mode, e.g. "--quick", "--explore", "--verify"
# or "--filter A,B"), PREFILL=0 (decode mode: no --prefill cases, no torch
# SDPA), GPU_ONLY=1 (decode mode: ctest runs only the "gpu" label),
# BUILD_TARGETS (e.g. "gpu_decode decode_bench": build only these; implies
# GPU_ONLY; append mode builds only its own targets unless this is set),
# SANITIZER_TIMEOUT (seconds per compute-sanitizer run: 240 decode, 45 append),
# SANITIZER_TOOLS (space-separated compute-sanitizer tools, default
# "memcheck racecheck initcheck", reliability: plus synccheck; e.g. "memcheck"
# for a quick run), SANITIZER_JOBS (reliability: runs at once, default 12),
# CONCURRENT_ROUNDS (default 2), CONCURRENT_COPIES (default 2),
# SKIP_CONCURRENT=1.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
MODE=${1:-${MODE:-decode}}  # ./scripts/gpu-check.sh reliability, or MODE=reliability
OUT=${OUT:-$PWD/gpu-out}
BUILD_DIR=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}

# What each mode runs. tests_timeout / bench_timeout: seconds for the whole
# ctest run / the benchmark, 0 for no limit; bench_tail: lines of the
# benchmark's output echoed at the end.
case "$MODE" in
  decode)
    default_targets=""
    tests_regex=""
    tests_timeout=0
    bench=decode_bench
    read -ra bench_args <<<"${BENCH_ARGS:-}"
    if [ "${FP8:-0}" = 1 ]; then
      bench_args+=(--kv fp8)
      PREFILL=${PREFILL:-0}
    fi
    [ "${PREFILL:-1}" = 1 ] && bench_args+=(--prefill)
    bench_timeout=0
    bench_tail=12
    sanitizer_suites=(gpu_decode)
    [ "${FP8:-0}" = 1 ] && sanitizer_suites+=(gpu_fp8) && bench_tail=70
    sanitizer_timeout=${SANITIZER_TIMEOUT:-240}
    ;;
  append)
    default_targets="gpu_append gpu_cache_step test_kv_append test_kv_append_cache append_bench"
    tests_regex='^(gpu_append|gpu_cache_step|test_kv_append|test_kv_append_cache)$'
    tests_timeout=240
    bench=append_bench
    bench_args=()
    bench_timeout=120
    bench_tail=40
    sanitizer_suites=(gpu_cache_step gpu_append)
    sanitizer_timeout=${SANITIZER_TIMEOUT:-45}
    ;;
  reliability)
    default_targets=""
    tests_regex=""
    tests_timeout=0
    bench=""
    bench_args=()
    # Every GPU suite, the longest under the sanitizers first (found after
    # the build: tests/gpu_*.c|cpp).
    sanitizer_suites=()
    sanitizer_timeout=${SANITIZER_TIMEOUT:-180}
    default_tools="memcheck racecheck initcheck synccheck"
    ;;
  *)
    echo "gpu-check.sh: MODE must be decode, append or reliability, not '$MODE'" >&2
    exit 2
    ;;
esac

read -ra sanitizer_tools <<<"${SANITIZER_TOOLS:-${default_tools:-memcheck racecheck initcheck}}"
for tool in "${sanitizer_tools[@]}"; do
  case "$tool" in
    memcheck | racecheck | initcheck | synccheck) ;;
    *)
      echo "gpu-check.sh: SANITIZER_TOOLS: unknown tool '$tool'" >&2
      exit 2
      ;;
  esac
done

mkdir -p "$OUT"
status=0
note() { echo "== $*" | tee -a "$OUT/summary.log"; }

cmocka_args=()
if [ -n "${CMOCKA_ROOT:-}" ]; then
  cmocka_args=(-DCMOCKA_ROOT="$CMOCKA_ROOT")
  export LD_LIBRARY_PATH=$CMOCKA_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
elif ! ls /usr/include/cmocka.h >/dev/null 2>&1 && ls .deps/*.deb >/dev/null 2>&1; then
  for f in .deps/*.deb; do dpkg -x "$f" /tmp/cm; done
  cmocka_args=(-DCMOCKA_INCLUDE_DIR=/tmp/cm/usr/include
               -DCMOCKA_LIBRARY=/tmp/cm/usr/lib/x86_64-linux-gnu/libcmocka.so.0)
  export LD_LIBRARY_PATH=/tmp/cm/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

note "mode: $MODE"
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
read -ra build_targets <<<"${BUILD_TARGETS:-$default_targets}"
targets=()
[ ${#build_targets[@]} -gt 0 ] && targets=(--target "${build_targets[@]}")
[ -n "${BUILD_TARGETS:-}" ] && GPU_ONLY=1
if cmake --build "$BUILD_DIR" -j "$JOBS" "${targets[@]}" -- -k 0 >>"$OUT/build.log" 2>&1; then
  note "build ok in $((SECONDS - start)) s"
else
  status=1
  note "BUILD FAILED for some targets (see build.log): $(grep -c FAILED "$OUT/build.log") failures"
  grep -B2 -A6 -E "error|FAILED" "$OUT/build.log" | head -40
  for s in "${sanitizer_suites[@]}"; do [ -x "$BUILD_DIR/tests/$s" ] || exit 1; done
fi

# GPU suites verbose (their summary lines go to summary.log), the rest only
# on failure.
start=$SECONDS
if [ -n "$tests_regex" ]; then
  (cd "$BUILD_DIR" && timeout "$tests_timeout" ctest -R "$tests_regex" -V) >"$OUT/ctest.log" 2>&1 || status=1
elif [ "${GPU_ONLY:-0}" = 1 ]; then
  (cd "$BUILD_DIR" && ctest -L gpu -V) >"$OUT/ctest.log" 2>&1 || status=1
else
  # Both parts run even if the first fails.
  (cd "$BUILD_DIR" && { ctest -L gpu -V; a=$?; ctest -LE gpu -j "$JOBS" --output-on-failure; b=$?
    [ $a -eq 0 ] && [ $b -eq 0 ]; }) >"$OUT/ctest.log" 2>&1 || status=1
fi
note "ctest: $(grep -E '% tests passed|tests failed' "$OUT/ctest.log" | tr '\n' ' ') ($((SECONDS - start)) s)"
grep -E "SKIPPED|FAILED|\[  PASSED|sweep cases|gpu_append:|test_kv_append:|rel error|inject: .*total|intact" "$OUT/ctest.log" |
  head -24 | tee -a "$OUT/summary.log"

if [ "$MODE" = reliability ]; then
  # Every GPU suite that was built, the longest under the sanitizers first.
  for s in gpu_decode gpu_engine_step gpu_inject_alloc_failures gpu_cache_step gpu_append \
    gpu_stream_order $(find tests -maxdepth 1 -name 'gpu_*.c*' -printf '%f\n' | sed 's/\.[^.]*$//'); do
    [ -x "$BUILD_DIR/tests/$s" ] || continue
    case " ${sanitizer_suites[*]} " in *" $s "*) continue ;; esac
    sanitizer_suites+=("$s")
  done
  note "GPU suites: ${sanitizer_suites[*]}"
  : >"$OUT/runs.tsv"
  # One line per run, in runs.tsv and summary.log.
  record() { printf '%s\n' "$*" | tr ' ' '\t' >>"$OUT/runs.tsv"; note "$*"; }
  if [ "${SKIP_CONCURRENT:-0}" != 1 ]; then
    : >"$OUT/concurrent.log"
    conc_dir=$(mktemp -d)
    for round in $(seq 1 "${CONCURRENT_ROUNDS:-2}"); do
      start=$SECONDS
      pids=()
      names=()
      for s in "${sanitizer_suites[@]}"; do
        for c in $(seq 1 "${CONCURRENT_COPIES:-2}"); do
          name="$s.$c"
          (
            t0=$SECONDS
            FD_GPU_TEST_REDUCED=1 CMOCKA_MESSAGE_OUTPUT=stdout timeout 300 "$BUILD_DIR/tests/$s" \
              >"$conc_dir/$name.log" 2>&1
            echo "$? $((SECONDS - t0))" >"$conc_dir/$name.rc"
          ) &
          pids+=($!)
          names+=("$name")
        done
      done
      wait "${pids[@]}"
      failed=0
      for name in "${names[@]}"; do
        read -r rc secs <"$conc_dir/$name.rc"
        verdict=PASS
        [ "$rc" -ne 0 ] && verdict=FAIL && failed=$((failed + 1)) && status=1
        { echo "### round $round: $name (rc=$rc, ${secs} s, ${#names[@]} processes at once)"
          cat "$conc_dir/$name.log"; } >>"$OUT/concurrent.log"
        record "concurrent round$round ${name%.*} errors=- hazards=- rc=$rc $verdict ${secs}s"
      done
      note "concurrent round $round: ${#names[@]} processes at once, $failed failed ($((SECONDS - start)) s)"
    done
    rm -rf "$conc_dir"
  fi
fi

if [ "${SKIP_BENCH:-0}" != 1 ] && [ -n "$bench" ]; then
  start=$SECONDS
  timeout "$bench_timeout" "$BUILD_DIR/bench/$bench" --out "$OUT" "${bench_args[@]}" >"$OUT/bench.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  note "$bench rc=$rc in $((SECONDS - start)) s"
  tail -"$bench_tail" "$OUT/bench.log"
  if [ "$MODE" = decode ] && [ "${FP8:-0}" = 1 ] && [ -x "$BUILD_DIR/bench/append_bench" ]; then
    # The append benchmark (FP8 fused RoPE + append at 8192 tokens): its
    # output, table and JSON to bench.log (the file count stays at 8).
    start=$SECONDS
    app_dir=$(mktemp -d)
    timeout 180 "$BUILD_DIR/bench/append_bench" --out "$app_dir" >"$app_dir/log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && status=1
    { echo "### append_bench (rc=$rc)"; cat "$app_dir/log" "$app_dir/append_bench.md"
      echo "### append_bench.json"; cat "$app_dir/append_bench.json" 2>/dev/null; } >>"$OUT/bench.log"
    note "append_bench rc=$rc in $((SECONDS - start)) s"
    grep -E "8192 tokens|FP8" "$app_dir/log" | tee -a "$OUT/summary.log"
    rm -rf "$app_dir"
  fi
  if [ "$MODE" = decode ] && [ -n "${PREV_GRID:-}" ] && [ -f "$OUT/decode_bench.json" ]; then
    note "plain grid against $PREV_GRID (time new / old):"
    python3 scripts/compare_decode_grids.py compare "$OUT/decode_bench.json" "$PREV_GRID" 2>&1 |
      tee -a "$OUT/summary.log" "$OUT/bench.log"
  fi
  if [ "$MODE" = decode ] && [ "${VARIANTS:-0}" = 1 ]; then
    # The attention variants and the new head dims (issue 16): output, table
    # and JSON to bench.log (the file count stays at 8).
    start=$SECONDS
    var_dir=$(mktemp -d)
    timeout 300 "$BUILD_DIR/bench/decode_bench" --variants --out "$var_dir" >"$var_dir/log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && status=1
    { echo "### decode_bench --variants (rc=$rc)"; cat "$var_dir/log"
      echo "### decode_bench --variants: decode_bench.json"; cat "$var_dir/decode_bench.json" 2>/dev/null
    } >>"$OUT/bench.log"
    note "decode_bench --variants rc=$rc in $((SECONDS - start)) s"
    sed -n '/^| case | plain case/,/^Variant targets met/p' "$var_dir/log" | tee -a "$OUT/summary.log"
    rm -rf "$var_dir"
  fi
  if [ "$MODE" = decode ] && [ "${PREFILL:-1}" = 1 ]; then
    # torch SDPA (cuDNN, flash) on the prefill shapes, beside decode_bench's
    # numbers; exit 77: no torch or no GPU, not a failure.
    start=$SECONDS
    sdpa_dir=$(mktemp -d)
    timeout 300 python3 bench/prefill_sdpa.py --compare "$OUT/decode_bench.json" \
      >"$sdpa_dir/sdpa.json" 2>"$sdpa_dir/table"
    rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 77 ] && status=1
    { echo "### bench/prefill_sdpa.py (rc=$rc)"; cat "$sdpa_dir/table" "$sdpa_dir/sdpa.json"; } \
      >>"$OUT/bench.log"
    note "prefill_sdpa.py rc=$rc in $((SECONDS - start)) s"
    tee -a "$OUT/summary.log" <"$sdpa_dir/table"
    rm -rf "$sdpa_dir"
  fi
fi
if [ "${SKIP_SANITIZER:-0}" != 1 ] && [ "$MODE" = reliability ]; then
  # Every (suite, tool) pair, SANITIZER_JOBS at once.
  : >"$OUT/sanitizer.log"
  san_dir=$(mktemp -d)
  run_sanitizer() {  # tool suite
    local tool=$1 suite=$2 t0=$SECONDS
    local extra=(--report-api-errors no)
    [ "$tool" = memcheck ] && extra+=(--leak-check full)
    FD_GPU_TEST_REDUCED=1 CMOCKA_MESSAGE_OUTPUT=stdout timeout "$sanitizer_timeout" \
      compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 3 "$BUILD_DIR/tests/$suite" \
      >"$san_dir/$tool.$suite.log" 2>&1
    echo "$? $((SECONDS - t0))" >"$san_dir/$tool.$suite.rc"
  }
  start=$SECONDS
  for suite in "${sanitizer_suites[@]}"; do
    for tool in "${sanitizer_tools[@]}"; do
      while [ "$(jobs -rp | wc -l)" -ge "${SANITIZER_JOBS:-12}" ]; do wait -n; done
      run_sanitizer "$tool" "$suite" &
    done
  done
  wait
  for suite in "${sanitizer_suites[@]}"; do
    for tool in "${sanitizer_tools[@]}"; do
      log="$san_dir/$tool.$suite.log"
      read -r rc secs <"$san_dir/$tool.$suite.rc"
      errors=$(grep -oE 'ERROR SUMMARY: [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
      hazards=$(grep -oE 'RACECHECK SUMMARY: [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
      # racecheck reports hazards (RACECHECK SUMMARY), the others errors.
      found=$errors
      [ "$tool" = racecheck ] && found=$hazards
      verdict=PASS
      [ "$rc" -ne 0 ] || [ "${found:-x}" != 0 ] && verdict=FAIL
      [ "$rc" -eq 124 ] && verdict=TIMEOUT
      [ "$verdict" != PASS ] && status=1
      { echo "### compute-sanitizer --tool $tool $suite (rc=$rc, ${secs} s)"; cat "$log"; } \
        >>"$OUT/sanitizer.log"
      record "sanitizer $tool $suite errors=${errors:-?} hazards=${hazards:--} rc=$rc $verdict ${secs}s"
    done
  done
  note "sanitizers: ${#sanitizer_suites[@]} suites x ${#sanitizer_tools[@]} tools in $((SECONDS - start)) s"
  rm -rf "$san_dir"
elif [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  : >"$OUT/sanitizer.log"
  run_log=$(mktemp)
  for suite in "${sanitizer_suites[@]}"; do
    for tool in "${sanitizer_tools[@]}"; do
      start=$SECONDS
      # API errors are not memory errors: gpu_cache_step provokes a failing
      # cudaMalloc on purpose (out-of-memory at cache creation must be a
      # status), which every tool would report as an error.
      extra=(--report-api-errors no)
      [ "$tool" = memcheck ] && extra+=(--leak-check full)
      FD_GPU_TEST_REDUCED=1 CMOCKA_MESSAGE_OUTPUT=stdout timeout "$sanitizer_timeout" \
        compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 3 "$BUILD_DIR/tests/$suite" \
        >"$run_log" 2>&1
      rc=$?
      [ $rc -ne 0 ] && status=1
      { echo "### compute-sanitizer --tool $tool $suite (rc=$rc)"; cat "$run_log"; } >>"$OUT/sanitizer.log"
      summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$run_log" | tr '\n' ' ')
      [ $rc -eq 124 ] && summary="TIMED OUT after $sanitizer_timeout s $summary"
      note "compute-sanitizer $tool $suite: rc=$rc, ${summary:-no summary} ($((SECONDS - start)) s)"
    done
  done
  rm -f "$run_log"
fi

note "overall status $status"
exit $status
