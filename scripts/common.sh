# Shared by demo.sh and test.sh (sourced): configure and build FlashDec.
#
# Environment (all optional):
#   FLASHDEC_BUILD_DIR  build directory, relative to the repository (default: build)
#   FLASHDEC_CUDA       AUTO (default), ON or OFF
#   FLASHDEC_SANITIZE   OFF (default) or ON: AddressSanitizer + UBSan
#   FLASHDEC_TSAN       OFF (default) or ON: ThreadSanitizer (CPU-only builds)
#   FLASHDEC_JOBS       parallel jobs (default: number of cores)

flashdec_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$flashdec_root"
build_dir=${FLASHDEC_BUILD_DIR:-build}
cuda_mode=${FLASHDEC_CUDA:-AUTO}
sanitize=${FLASHDEC_SANITIZE:-OFF}
tsan=${FLASHDEC_TSAN:-OFF}
jobs=${FLASHDEC_JOBS:-$(nproc 2> /dev/null || echo 2)}

# Sanitizer builds: leaks are errors, UB stops the test, and a huge allocation
# returns NULL as the real allocator would (tests check that
# FD_ERR_OUT_OF_MEMORY comes back) instead of aborting the process.
if [ "$sanitize" = "ON" ]; then
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1:strict_string_checks=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fi
# ThreadSanitizer builds: any report fails the test (exit code 66).
if [ "$tsan" = "ON" ]; then
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:exitcode=66:second_deadlock_stack=1}
fi

# shellcheck source=setup.sh
source "$flashdec_root/scripts/setup.sh"

flashdec_configure() {
  echo "== configure $build_dir (FLASHDEC_CUDA=$cuda_mode, FLASHDEC_SANITIZE=$sanitize, FLASHDEC_TSAN=$tsan)"
  mkdir -p "$build_dir"
  local log=$build_dir/configure.log
  cmake -S . -B "$build_dir" -G Ninja -DFLASHDEC_CUDA="$cuda_mode" -DFLASHDEC_SANITIZE="$sanitize" \
    -DFLASHDEC_TSAN="$tsan" \
    > "$log" 2>&1 || {
    cat "$log" >&2
    echo "FAIL: configure failed" >&2
    return 1
  }
  grep -E '^-- (flashdec|The CUDA compiler)' "$log" || true
  cuda_enabled=$(sed -n 's/^FLASHDEC_CUDA_ENABLED:INTERNAL=//p' "$build_dir/CMakeCache.txt")
  echo "CUDA backend: ${cuda_enabled:-OFF}"
  # AUTO must not quietly fall back to a CPU-only build when a toolkit exists.
  if [ "$cuda_mode" = "AUTO" ] && command -v nvcc > /dev/null 2>&1 && [ "$cuda_enabled" != "ON" ]; then
    echo "FAIL: nvcc is installed ($(command -v nvcc)) but the CUDA backend is OFF;" \
      "see the CMake output above (or set FLASHDEC_CUDA=OFF to build without it)" >&2
    return 1
  fi
}

flashdec_build() {  # [targets...]
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  echo "== build in $build_dir: ${*:-all targets} ($jobs jobs)"
  cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
}
