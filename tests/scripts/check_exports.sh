#!/usr/bin/env bash
# ABI check: the dynamic symbols that libflashdec.so defines are exactly the
# functions include/flashdec.h declares with FD_API, and the library carries
# no CUDA runtime dependency (it links cudart statically and hides it).
#
# usage: check_exports.sh CC LIBRARY HEADER
#
# The only tolerated non-fd_ entry is the version node of src/flashdec.map
# (an absolute symbol such as FLASHDEC_0.2 that names the symbol version; it is
# not something a program can link to). A library with a SONAME
# libflashdec.so.V must have the node FLASHDEC_V, and V must follow the
# header's version rule: major.minor while FD_VERSION_MAJOR is 0, else the
# major alone (checked where the header defines FD_VERSION_MAJOR).
set -euo pipefail
cc=$1
lib=$2
header=$3
here=$(cd "$(dirname "$0")" && pwd)

declared=$("$here/declared_functions.sh" "$cc" "$header")
if [ -z "$declared" ]; then
  echo "FAIL: no FD_API declaration found in $header" >&2
  exit 1
fi

# nm prints "ADDRESS TYPE NAME[@@VERSION]" for defined dynamic symbols.
symbols=$(nm -D --defined-only "$lib" | awk 'NF == 3 { print $2, $3 }')
exported=$(echo "$symbols" | awk '$1 != "A" { sub(/@.*/, "", $2); print $2 }' | sort -u)
version_nodes=$(echo "$symbols" | awk '$1 == "A" { print $2 }')
status=0

for node in $version_nodes; do
  if ! [[ $node =~ ^FLASHDEC_[0-9]+(\.[0-9]+)?$ ]]; then
    echo "FAIL: unexpected absolute symbol '$node' in $lib" >&2
    status=1
  fi
done

# SONAME and version node follow the header's version.
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
case $soname in
  libflashdec.so.*)
    soversion=${soname#libflashdec.so.}
    major=$(sed -n 's/^#define FD_VERSION_MAJOR \([0-9][0-9]*\).*/\1/p' "$header")
    minor=$(sed -n 's/^#define FD_VERSION_MINOR \([0-9][0-9]*\).*/\1/p' "$header")
    if [ -n "$major" ] && [ -n "$minor" ]; then
      if [ "$major" = 0 ]; then expected=$major.$minor; else expected=$major; fi
      if [ "$soversion" != "$expected" ]; then
        echo "FAIL: SONAME $soname, expected libflashdec.so.$expected for header $major.$minor" >&2
        status=1
      fi
    fi
    if [ "$version_nodes" != "FLASHDEC_$soversion" ]; then
      echo "FAIL: version node(s) '${version_nodes//$'\n'/ }' of $soname, expected FLASHDEC_$soversion" >&2
      status=1
    fi
    ;;
esac

not_exported=$(comm -23 <(echo "$declared") <(echo "$exported"))
not_declared=$(comm -13 <(echo "$declared") <(echo "$exported"))
if [ -n "$not_exported" ]; then
  echo "FAIL: declared in $(basename "$header") but not exported by $(basename "$lib"):" >&2
  echo "$not_exported" | sed 's/^/  /' >&2
  status=1
fi
if [ -n "$not_declared" ]; then
  echo "FAIL: exported by $(basename "$lib") but not declared in $(basename "$header"):" >&2
  echo "$not_declared" | sed 's/^/  /' >&2
  status=1
fi

# Every export is a function (the header declares no variables).
non_functions=$(echo "$symbols" | awk '$1 != "A" && $1 != "T" { print $2 }')
if [ -n "$non_functions" ]; then
  echo "FAIL: exported symbols that are not functions:" >&2
  echo "$non_functions" | sed 's/^/  /' >&2
  status=1
fi

# Static, hidden CUDA runtime: no libcudart dependency and no cuda* symbol
# defined or expected from elsewhere.
if readelf -d "$lib" | grep -i 'NEEDED.*cuda'; then
  echo "FAIL: $(basename "$lib") depends on a shared CUDA library (above)" >&2
  status=1
fi
cuda_symbols=$(nm -D "$lib" | awk '{ sub(/@.*/, "", $NF); print $NF }' | grep -v '^fd_' |
  grep -i 'cuda' || true)
if [ -n "$cuda_symbols" ]; then
  echo "FAIL: CUDA runtime symbols in the dynamic symbol table:" >&2
  echo "$cuda_symbols" | sed 's/^/  /' >&2
  status=1
fi

if [ $status -eq 0 ]; then
  echo "OK: $(echo "$exported" | wc -l) exported functions match the FD_API declarations;" \
    "no CUDA runtime symbol or dependency${soname:+; SONAME $soname}"
fi
exit $status
