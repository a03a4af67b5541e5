#!/usr/bin/env bash
# Sets up, builds and runs every test suite (CTest: cmocka suites, ABI and
# packaging checks, the example). GPU suites report "Skipped" without a GPU.
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

# A closing line with the CTest counts.
total=$(sed -n 's/.*tests passed, \([0-9]*\) tests\{0,1\} failed out of \([0-9]*\).*/\2/p' "$log" | tail -n 1)
failed=$(sed -n 's/.*tests passed, \([0-9]*\) tests\{0,1\} failed out of \([0-9]*\).*/\1/p' "$log" | tail -n 1)
skipped=$(grep -c '(Skipped)' "$log" || true)
if [ -n "$total" ]; then
  echo "ctest: $((total - failed - skipped)) passed, $failed failed, $skipped skipped"
fi
exit "$status"
