#!/usr/bin/env bash
# libFuzzer over the C API against the reference model (tests/fuzz/fuzz_api.cpp):
# builds the fuzz target with clang, ASan and UBSan in build-fuzz/ (CPU only),
# replays the seed corpus (tests/fuzz/corpus), then fuzzes for
# FLASHDEC_FUZZ_SECONDS seconds on a work corpus in build-fuzz/corpus (seeded
# from tests/fuzz/corpus; the repository's corpus is never written).
# A crash or model disagreement fails the script and names the reproducer,
# saved under build-fuzz/artifacts/.
#
# usage: ./scripts/fuzz.sh            replay the seeds, then fuzz
#        ./scripts/fuzz.sh --replay   replay the seed corpus only (seconds)
#        ./scripts/fuzz.sh -- ARGS    extra libFuzzer arguments (e.g. -jobs=4)
# Environment:
#   FLASHDEC_FUZZ_SECONDS  fuzzing time (default 60)
#   FLASHDEC_JOBS          build jobs (default: number of cores)
#   FLASHDEC_FUZZ_MAX_LEN  largest input in bytes (default 512: about 250 operations;
#                          longer inputs reach deeper states, fewer per second)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build_dir=build-fuzz
seconds=${FLASHDEC_FUZZ_SECONDS:-60}
jobs=${FLASHDEC_JOBS:-$(nproc 2> /dev/null || echo 2)}
max_len=${FLASHDEC_FUZZ_MAX_LEN:-512}
mode=fuzz
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --replay) mode=replay ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--replay] [-- libFuzzer args]" >&2; exit 2 ;;
  esac
  shift
done

# As scripts/common.sh for sanitizer builds: leaks are errors, UB stops the
# run, a huge allocation returns NULL (the library must report
# FD_ERR_OUT_OF_MEMORY) instead of aborting.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# Base tools (cmake, ninja, cmocka for the test suites' configure step).
# shellcheck source=setup.sh
source "$root/scripts/setup.sh"

# clang, clang++ and libFuzzer's runtime: a probe program must link.
fuzz_probe() {
  command -v clang > /dev/null 2>&1 && command -v clang++ > /dev/null 2>&1 || return 1
  local dir
  dir=$(mktemp -d)
  printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
    'extern "C" int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }' \
    > "$dir/probe.cpp"
  local ok=0
  clang++ -fsanitize=fuzzer,address,undefined "$dir/probe.cpp" -o "$dir/probe" > "$dir/log" 2>&1 || ok=1
  [ $ok = 0 ] || cat "$dir/log" >&2
  rm -rf "$dir"
  return $ok
}
if ! fuzz_probe; then
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo > /dev/null 2>&1 || { echo "fuzz: clang with libFuzzer is missing; install clang as root" >&2; exit 1; }
    sudo=(sudo)
  fi
  echo "fuzz: installing clang and its runtime libraries (libFuzzer)"
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang > /dev/null
  v=$(clang --version | sed -n 's/.*clang version \([0-9]*\)\..*/\1/p' | head -n 1)
  # Debian 12 ships libFuzzer in libclang-rt-N-dev, older releases in libclang-common-N-dev.
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "libclang-rt-$v-dev" > /dev/null 2>&1 ||
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "libclang-common-$v-dev" > /dev/null
  fuzz_probe || { echo "fuzz: clang++ -fsanitize=fuzzer still does not link" >&2; exit 1; }
fi
echo "fuzz: $(clang++ --version | head -n 1)"

echo "== configure $build_dir (clang, FLASHDEC_SANITIZE=ON, FLASHDEC_FUZZ=ON, CPU only)"
mkdir -p "$build_dir"
CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DFLASHDEC_CUDA=OFF -DFLASHDEC_SANITIZE=ON \
  -DFLASHDEC_FUZZ=ON -DFLASHDEC_BUILD_BENCH=OFF -DFLASHDEC_BUILD_EXAMPLES=OFF \
  > "$build_dir/configure.log" 2>&1 || {
  cat "$build_dir/configure.log" >&2
  echo "FAIL: configure failed" >&2
  exit 1
}
echo "== build fuzz_api ($jobs jobs)"
cmake --build "$build_dir" -j "$jobs" --target fuzz_api
bin=$build_dir/tests/fuzz/fuzz_api
artifacts=$build_dir/artifacts
mkdir -p "$artifacts"

how_to_rerun() {  # reproducer
  echo "reproducer: $1" >&2
  echo "rerun it:   $bin $1" >&2
  echo "trace it:   FD_FUZZ_TRACE=1 $bin $1" >&2
}

# Every seed once (also a quick regression check of the corpus).
seeds=(tests/fuzz/corpus/*)
echo "== replay ${#seeds[@]} seed inputs from tests/fuzz/corpus"
if ! "$bin" -artifact_prefix="$artifacts/" "${seeds[@]}" > "$build_dir/replay.log" 2>&1; then
  tail -n 60 "$build_dir/replay.log" >&2
  failed=$(sed -n 's/^Running: //p' "$build_dir/replay.log" | tail -n 1)
  echo "FAIL: a seed input fails" >&2
  how_to_rerun "$failed"
  exit 1
fi
echo "replay: ${#seeds[@]} inputs pass"
[ "$mode" = replay ] && exit 0

work=$build_dir/corpus
mkdir -p "$work"
cp -n tests/fuzz/corpus/* "$work/"
before=$(find "$artifacts" -type f | wc -l)
log=$build_dir/fuzz.log
echo "== fuzz for ${seconds}s (work corpus $work, artifacts $artifacts/, log $log)"
status=0
"$bin" -max_total_time="$seconds" -max_len="$max_len" -timeout=30 -rss_limit_mb=4096 \
  -print_final_stats=1 -artifact_prefix="$artifacts/" "${extra[@]}" "$work" > "$log" 2>&1 || status=$?
grep -E '^#[0-9]+[[:space:]]+(INITED|pulse|DONE)' "$log" | tail -n 4 || true
done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true)
execs=$(sed -n 's/^stat::number_of_executed_units: //p' "$log" | tail -n 1)
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
cov=$(echo "$done_line" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
ft=$(echo "$done_line" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
if [ "$status" -ne 0 ]; then
  tail -n 80 "$log" >&2
  repro=$(find "$artifacts" -type f -newer "$build_dir/replay.log" -printf '%T@ %p\n' | sort -n |
    tail -n 1 | cut -d' ' -f2-)
  echo "FAIL: libFuzzer exit status $status (crash, sanitizer report or model disagreement)" >&2
  [ -n "$repro" ] && how_to_rerun "$repro"
  exit 1
fi
after=$(find "$artifacts" -type f | wc -l)
if [ "$after" -ne "$before" ]; then
  echo "FAIL: new artifacts in $artifacts/ although libFuzzer exited 0" >&2
  exit 1
fi
echo "fuzz: ${execs:-?} executions in ${seconds}s (${rate:-?} exec/s), cov ${cov:-?}, ft ${ft:-?}," \
  "corpus $(find "$work" -type f | wc -l) inputs"
