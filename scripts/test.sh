#!/usr/bin/env bash
# Sets up, builds and runs every test suite (CTest: cmocka suites, ABI and
# packaging checks, the example; then the language bindings' suites). GPU
# suites report "Skipped" without a GPU.
#
# usage: ./scripts/test.sh [extra ctest arguments, e.g. -L abi or -R cache]
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

flashdec_configure
flashdec_build
echo "== ctest in $build_dir"
log=$build_dir/ctest.log
set +e
(cd "$build_dir" && ctest --output-on-failure -j "$jobs" "$@") 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

# One line per cmocka suite, from the full log of this run.
echo "== cmocka suites"
awk '
  /^[0-9]+\/[0-9]+ Testing: / { suite = $3 }
  /^\[  PASSED  \]/ { passed[suite] = $4 }
  /^\[  FAILED  \] [0-9]+ test\(s\)/ { failed[suite] = $4 }
  END {
    for (s in passed) printf "  %-32s %3d passed, %d failed\n", s, passed[s], failed[s] + 0
    for (s in failed) if (!(s in passed)) printf "  %-32s %3d passed, %d failed\n", s, 0, failed[s]
  }' "$build_dir/Testing/Temporary/LastTest.log" | sort

# Why suites were skipped (GPU suites print "SKIPPED: ..." and exit 77).
if grep -q '^SKIPPED' "$build_dir/Testing/Temporary/LastTest.log"; then
  echo "== skipped"
  awk '/^[0-9]+\/[0-9]+ Testing: / { suite = $3 } /^SKIPPED/ { print "  " suite ": " $0 }' \
    "$build_dir/Testing/Temporary/LastTest.log"
fi

# The language bindings' suites (Python, Rust, Go and the parity diff) run
# against this build's library. They load it from another runtime, which an
# ASan-instrumented library does not allow, and their Rust part needs cargo.
bindings_status=0
if [ -x bindings/run-tests.sh ] || [ -f bindings/run-tests.sh ]; then
  if [ "$sanitize" = "ON" ] || [ "$tsan" = "ON" ]; then
    echo "== bindings: not run in the sanitizer build"
  elif ! command -v cargo > /dev/null 2>&1 || ! command -v python3 > /dev/null 2>&1; then
    echo "== bindings: SKIPPED (they need cargo and python3 on PATH)"
  else
    echo "== bindings: bindings/run-tests.sh against $build_dir"
    FLASHDEC_LIB_DIR=$build_dir FLASHDEC_BIND_BUILD=$flashdec_root/$build_dir/bindings \
      JOBS=$jobs bash bindings/run-tests.sh > "$build_dir/bindings.log" 2>&1 || bindings_status=$?
    # INSTALL lines: what run-tests.sh installed (venvs under the build folder) and why.
    grep -E '^(PASS|FAIL|INSTALL): ' "$build_dir/bindings.log" | sed 's/^/  /'
    if [ "$bindings_status" -ne 0 ]; then
      tail -n 40 "$build_dir/bindings.log"
      echo "FAIL: binding suites (full log: $build_dir/bindings.log)" >&2
    fi
  fi
fi

# A closing line with the CTest counts.
total=$(sed -n 's/.*tests passed, \([0-9]*\) tests\{0,1\} failed out of \([0-9]*\).*/\2/p' "$log" | tail -n 1)
failed=$(sed -n 's/.*tests passed, \([0-9]*\) tests\{0,1\} failed out of \([0-9]*\).*/\1/p' "$log" | tail -n 1)
skipped=$(grep -c '(Skipped)' "$log" || true)
if [ -n "$total" ]; then
  echo "ctest: $((total - failed - skipped)) passed, $failed failed, $skipped skipped"
fi
[ "$status" -ne 0 ] || status=$bindings_status
exit "$status"
