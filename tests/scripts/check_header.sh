#!/usr/bin/env bash
# Header check: include/flashdec.h compiles on its own as strict C99 or C++17
# with every warning an error, includes only <stddef.h> and <stdint.h> (so no
# CUDA and no C++ header), and gives its functions C linkage.
#
# usage: check_header.sh c99|c++17 COMPILER INCLUDE_DIR
set -euo pipefail
mode=$1
compiler=$2
include_dir=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

case $mode in
  c99) flags=(-x c -std=c99 -Wstrict-prototypes -Wmissing-prototypes) ;;
  c++17) flags=(-x c++ -std=c++17 -Wold-style-cast -Wzero-as-null-pointer-constant) ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
flags+=(-Wall -Wextra -pedantic -Werror -Wshadow -Wconversion -Wundef -I"$include_dir")

# Included twice to exercise the include guard; a call and a few types make
# the compiler check the declarations, not just parse them.
cat > "$work/tu.src" <<'SRC'
#include "flashdec.h"
#include "flashdec.h"
int fd_header_probe(void);
int fd_header_probe(void) {
  fd_cache_config config;
  fd_decode_params params;
  fd_tx tx = {0, 0};
  int32_t count = 0;
  (void)config;
  (void)params;
  (void)tx;
  (void)count;
  return fd_status_string(FD_OK)[0] != '\0' && fd_version_number() == FD_VERSION_NUMBER;
}
SRC

if ! "$compiler" "${flags[@]}" -H -c "$work/tu.src" -o "$work/tu.o" 2> "$work/includes"; then
  grep -v '^\.' "$work/includes" >&2
  echo "FAIL: flashdec.h does not compile as $mode with ${flags[*]}" >&2
  exit 1
fi
# -H lists every header opened, one per line, prefixed with dots.
if grep -i 'cuda' "$work/includes"; then
  echo "FAIL: flashdec.h pulls in a CUDA header (above)" >&2
  exit 1
fi
direct=$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*//p' "$include_dir/flashdec.h" | sort | tr '\n' ' ')
if [ "$direct" != "<stddef.h> <stdint.h> " ]; then
  echo "FAIL: flashdec.h includes $direct; only <stddef.h> and <stdint.h> are allowed" >&2
  exit 1
fi
# C linkage: the call references the plain, unmangled name.
if ! nm -u "$work/tu.o" | grep -qw 'fd_status_string'; then
  echo "FAIL: fd_status_string is not referenced with C linkage:" >&2
  nm -u "$work/tu.o" >&2
  exit 1
fi
echo "OK: flashdec.h compiles as $mode with ${flags[*]}; includes only <stddef.h> and <stdint.h>; C linkage"
