#!/usr/bin/env bash
# Checks that the C, C++ and CUDA sources (bindings excluded: they follow
# their languages' own formatters) match .clang-format. Prints the files that
# do not; `clang-format -i FILE` fixes one.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format > /dev/null 2>&1; then
  echo "check-format: clang-format not installed; skipped"
  exit 0
fi
bad=0
while IFS= read -r f; do
  if ! clang-format --dry-run --Werror "$f" > /dev/null 2>&1; then
    echo "not formatted: $f"
    bad=1
  fi
done < <(git ls-files '*.c' '*.cpp' '*.h' '*.hpp' '*.cu' '*.cuh' | grep -v '^bindings/')
if [ "$bad" = 1 ]; then
  echo "check-format: FAILED (run clang-format -i on the files above)"
  exit 1
fi
echo "check-format: all sources match .clang-format ($(clang-format --version | head -1))"
