#!/usr/bin/env bash
# scripts/sass_loops.py on a small hand-written cuobjdump listing: a
# function with one loop (a backward branch) holding 2 copies and 1 mma out
# of 5 instructions, a forward branch that is no loop, and a second
# function that the name filter leaves out; then a name that matches
# nothing must fail.
#   usage: check_sass_loops.sh PYTHON REPO_ROOT
set -uo pipefail
python=$1 root=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/k.sass" <<'SASS'
	code for sm_90
		Function : _Z6kernelv
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/              @P0 BRA 0x60 ;
        /*0020*/                   LDGSTS.E.BYPASS.128 [R2], desc[UR4][R4.64] ;
        /*0030*/                   LDGSTS.E.BYPASS.128 [R2+0x10], desc[UR4][R6.64] ;
        /*0040*/                   HMMA.16816.F32 R8, R12, R16, R8 ;
        /*0050*/              @!P1 BRA 0x20 ;
        /*0060*/                   EXIT ;
		Function : _Z5otherv
        /*0000*/                   EXIT ;
SASS
out=$("$python" "$root/scripts/sass_loops.py" "$tmp/k.sass" kernel --ops) || {
  echo "check_sass_loops: the script failed on a valid listing"; exit 1; }
expect_lines=(
  "_Z6kernelv: 7 instructions"
  "  loop 0x20-0x50: 4 instructions, 2 LDGSTS, 1 HMMA/HGMMA"
  "    LDGSTS 2, HMMA 1, BRA 1"
)
for line in "${expect_lines[@]}"; do
  grep -qxF "$line" <<<"$out" || {
    echo "check_sass_loops: missing line '$line' in:"; echo "$out"; exit 1; }
done
[ "$(grep -c "loop " <<<"$out")" -eq 1 ] || {
  echo "check_sass_loops: expected exactly one loop in:"; echo "$out"; exit 1; }
grep -q "_Z5otherv" <<<"$out" && { echo "check_sass_loops: the filter kept _Z5otherv"; exit 1; }
if "$python" "$root/scripts/sass_loops.py" "$tmp/k.sass" nosuchkernel >/dev/null 2>&1; then
  echo "check_sass_loops: a name that matches nothing did not fail"; exit 1
fi
echo "check_sass_loops: loops, counts and the name filter as expected"
