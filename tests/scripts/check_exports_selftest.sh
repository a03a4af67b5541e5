#!/usr/bin/env bash
# Shows that check_exports.sh can fail. It builds small shared libraries with a
# known symbol table and checks that the script accepts the matching header
# and rejects each kind of mismatch, naming the offending symbol.
#
# usage: check_exports_selftest.sh CC VERSION_SCRIPT
set -euo pipefail
cc=$1
map=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A header in the style of flashdec.h; fd_beta's declaration spans lines.
cat > "$work/good.h" <<'H'
/* FD_API in a comment is not a declaration: FD_API int fd_comment(void); */
#ifndef FD_API
#define FD_API
#endif
FD_API int fd_alpha(void);
FD_API const char *
fd_beta(int x);
H
cat > "$work/lib.c" <<'C'
#define FD_API __attribute__((visibility("default")))
#include "good.h"
FD_API int fd_alpha(void) { return 1; }
FD_API const char *fd_beta(int x) { return x ? "b" : ""; }
int fd_internal_helper(void) { return 2; } /* hidden by visibility */
#ifdef LEAK_OTHER
FD_API int other_leak(void) { return 3; }
#endif
#ifdef LEAK_DATA
FD_API int fd_gamma = 4;
#endif
C

build() {  # OUTPUT [FLAGS...]
  local out=$1
  shift
  "$cc" -shared -fPIC -fvisibility=hidden -I"$work" "$@" -o "$work/$out" "$work/lib.c"
}
build good.so -Wl,--version-script="$map"
build leak_other.so -DLEAK_OTHER  # no version script: other_leak stays visible
build leak_data.so -DLEAK_DATA -Wl,--version-script="$map"
# SONAME libflashdec.so.<V>: the node of the map must be FLASHDEC_<V>.
node=$(sed -n 's/^\(FLASHDEC_[0-9.]*\) {.*/\1/p' "$map")
build soname_good.so -Wl,--version-script="$map" -Wl,-soname,"libflashdec.so.${node#FLASHDEC_}"
build soname_other.so -Wl,--version-script="$map" -Wl,-soname,libflashdec.so.99

# Doctored headers.
printf 'FD_API int fd_phantom(void);\n' | cat "$work/good.h" - > "$work/extra.h"
grep -v 'fd_beta' "$work/good.h" | grep -v '^const char \*$' > "$work/missing.h"

expect_failure() {  # NAME LIBRARY HEADER WORD: the check fails and names WORD
  local name=$1 lib=$2 header=$3 word=$4
  if "$here/check_exports.sh" "$cc" "$work/$lib" "$work/$header" > "$work/out" 2>&1; then
    echo "FAIL ($name): check_exports.sh accepted it:" >&2
    cat "$work/out" >&2
    exit 1
  fi
  if ! grep -q "$word" "$work/out"; then
    echo "FAIL ($name): the report does not name $word:" >&2
    cat "$work/out" >&2
    exit 1
  fi
  echo "ok: $name rejected, naming $word"
}

"$here/check_exports.sh" "$cc" "$work/good.so" "$work/good.h"
[ "$("$here/declared_functions.sh" "$cc" "$work/good.h" | tr '\n' ' ')" = "fd_alpha fd_beta " ]
echo "ok: matching library and header accepted; the split declaration is parsed"
expect_failure "declared, not exported" good.so extra.h fd_phantom
expect_failure "exported, not declared" good.so missing.h fd_beta
expect_failure "non-fd_ export" leak_other.so good.h other_leak
expect_failure "data export" leak_data.so good.h fd_gamma
"$here/check_exports.sh" "$cc" "$work/soname_good.so" "$work/good.h"
echo "ok: SONAME libflashdec.so.${node#FLASHDEC_} with node $node accepted"
expect_failure "node not the SONAME's" soname_other.so good.h "expected FLASHDEC_99"
printf '#define FD_VERSION_MAJOR 0\n#define FD_VERSION_MINOR 99\n' | cat "$work/good.h" - > "$work/v099.h"
expect_failure "SONAME not the header's" soname_good.so v099.h "expected libflashdec.so.0.99"
