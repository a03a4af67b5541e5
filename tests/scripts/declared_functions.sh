#!/usr/bin/env bash
# Prints, sorted, the name of every function that HEADER declares with FD_API.
#
# usage: declared_functions.sh CC HEADER
#
# The compiler strips comments (-fpreprocessed only removes comments, it
# expands nothing), preprocessor lines are dropped, and the rest is split into
# declarations at ';' so a declaration may span lines.
set -euo pipefail
cc=$1
header=$2

"$cc" -w -fpreprocessed -dD -E -P -x c "$header" |
  grep -v '^[[:space:]]*#' |
  tr '\n' ' ' |
  tr ';' '\n' |
  sed -n 's/^[[:space:]]*FD_API[[:space:]][^(]*[^A-Za-z0-9_(]\([A-Za-z_][A-Za-z0-9_]*\)[[:space:]]*(.*/\1/p' |
  sort
