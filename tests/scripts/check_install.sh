#!/usr/bin/env bash
# Packaging check: installs the build tree into a fresh temporary prefix and
# builds tests/consumer against it, the way a downstream project would. Every
# installed program then runs with LD_LIBRARY_PATH unset: the flashdec CLI
# (RUNPATH $ORIGIN/../lib, also from a copy of the prefix), the pkg-config
# consumer (rpath from flashdec.pc), the CMake consumer from its build tree and
# installed into a prefix of its own (CMAKE_INSTALL_RPATH_USE_LINK_PATH).
#
# usage: check_install.sh cmake|pkg-config CMAKE BUILD_DIR SOURCE_DIR WORK_DIR
#                         LIBDIR VERSION C_COMPILER GENERATOR [EXTRA_FLAGS]
#
#   cmake       find_package(flashdec) + flashdec::flashdec
#   pkg-config  cc consumer.c $(pkg-config --cflags --libs flashdec)
# EXTRA_FLAGS go to the consumer's compile and link (the sanitizer build passes
# -fsanitize=... so the consumer loads the instrumented library correctly).
set -euo pipefail
mode=$1
cmake=$2  # the CMake that configured the build (it also builds the consumer)
build_dir=$3
source_dir=$4
work=$5
libdir=$6
version=$7
cc=$8
generator=$9
extra_flags=${10:-}
major=${version%%.*}
minor=${version#*.}
minor=${minor%%.*}
# The SONAME version (docs/abi.md, "Versioning at 0.x"): major.minor while the
# major is 0, the major alone from 1.0 on. Derived here from the version, not
# read from the build, so the check holds CMakeLists.txt to the rule.
if [ "$major" = 0 ]; then soversion=$major.$minor; else soversion=$major; fi
prefix=$work/prefix

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# No variable may help the dynamic loader: what runs must find the library
# through its own RUNPATH.
unset LD_LIBRARY_PATH LD_PRELOAD

# check_loads EXE DIR: EXE resolves libflashdec into DIR (paths compared
# canonical: a RUNPATH of $ORIGIN/../lib resolves to bin/../lib/...).
check_loads() {
  local resolved
  resolved=$(ldd "$1" | awk '$1 ~ /^libflashdec/ { print $3 }')
  if [ -n "$resolved" ] && [ "$(readlink -f "$(dirname "$resolved")")" = "$(readlink -f "$2")" ]; then
    echo "ok: $1 loads $resolved"
  else
    fail "$1 resolves libflashdec to '$resolved', not into $2"
  fi
}

# runpath EXE: its DT_RUNPATH (or DT_RPATH).
runpath() {
  readelf -d "$1" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p'
}

# Exit 77 (CTest: skipped, shown) where a tool this check needs is absent,
# e.g. on a GPU machine image without pkg-config; scripts/setup.sh installs
# both on build machines.
if [ "$mode" = pkg-config ] && ! command -v pkg-config > /dev/null 2>&1; then
  echo "SKIPPED: pkg-config is not installed"
  exit 77
fi

rm -rf "$work"
mkdir -p "$work"
"$cmake" --install "$build_dir" --prefix "$prefix" > "$work/install.log" ||
  { cat "$work/install.log" >&2; fail "cmake --install failed"; }

# Layout: header, real file + SONAME link + development link, package files.
lib=$prefix/$libdir
[ -f "$prefix/include/flashdec.h" ] || fail "include/flashdec.h not installed"
[ -f "$lib/libflashdec.so.$version" ] && [ ! -L "$lib/libflashdec.so.$version" ] ||
  fail "$libdir/libflashdec.so.$version is not a regular file"
[ "$(readlink "$lib/libflashdec.so.$soversion")" = "libflashdec.so.$version" ] ||
  fail "$libdir/libflashdec.so.$soversion does not link to libflashdec.so.$version"
[ "$(readlink "$lib/libflashdec.so")" = "libflashdec.so.$soversion" ] ||
  fail "$libdir/libflashdec.so does not link to libflashdec.so.$soversion"
soname=$(readelf -d "$lib/libflashdec.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libflashdec.so.$soversion" ] || fail "SONAME is '$soname', expected libflashdec.so.$soversion"
# Exactly these three names: no libflashdec.so.$major link left from the old rule.
names=$(cd "$lib" && echo libflashdec.so*)
[ "$names" = "libflashdec.so libflashdec.so.$soversion libflashdec.so.$version" ] ||
  fail "$libdir holds $names, expected libflashdec.so, .so.$soversion and .so.$version"
for f in cmake/flashdec/flashdecConfig.cmake cmake/flashdec/flashdecConfigVersion.cmake \
  cmake/flashdec/flashdecTargets.cmake pkgconfig/flashdec.pc; do
  [ -f "$lib/$f" ] || fail "$libdir/$f not installed"
done
echo "ok: installed layout (SONAME $soname)"

# The package's version file answers find_package(flashdec X.Y.Z) by the same
# rule as the header: while the major is 0 the same major and minor, from 1.0
# on the same major; and the installed version at least the requested one.
version_file=$lib/cmake/flashdec/flashdecConfigVersion.cmake
# find_compatible X.Y.Z: PACKAGE_VERSION_COMPATIBLE of the installed file.
find_compatible() {
  local m n p
  IFS=. read -r m n p <<< "$1"
  {
    echo "set(PACKAGE_FIND_NAME flashdec)"
    echo "set(PACKAGE_FIND_VERSION $1)"
    echo "set(PACKAGE_FIND_VERSION_MAJOR $m)"
    echo "set(PACKAGE_FIND_VERSION_MINOR $n)"
    echo "set(PACKAGE_FIND_VERSION_PATCH $p)"
    echo "set(PACKAGE_FIND_VERSION_COUNT 3)"
    echo "include(\"$version_file\")"
    echo "message(\"\${PACKAGE_VERSION_COMPATIBLE}\")"
  } > "$work/find_version.cmake"
  "$cmake" -P "$work/find_version.cmake" 2>&1
}
if [ "$major" = 0 ]; then
  accepted="$major.$minor.0"
  rejected="$major.$((minor + 1)).0 $((major + 1)).$minor.0"
  if [ "$minor" -gt 0 ]; then rejected="$rejected $major.$((minor - 1)).0"; fi
else
  accepted="$major.0.0 $major.$minor.0"
  rejected="$major.$((minor + 1)).0 $((major + 1)).0.0"
  if [ "$major" -gt 1 ]; then rejected="$rejected $((major - 1)).$minor.0"; fi
fi
for want in $accepted; do
  [ "$(find_compatible "$want")" = TRUE ] || fail "find_package(flashdec $want) does not accept $version"
done
for want in $rejected; do
  [ "$(find_compatible "$want")" = FALSE ] || fail "find_package(flashdec $want) accepts $version"
done
echo "ok: the package version file accepts $accepted and rejects $rejected"

# The CLI is installed with the library and runs from the prefix, and from a
# copy of it (the RUNPATH is relative to the executable).
cli=$prefix/bin/flashdec
[ -x "$cli" ] || fail "bin/flashdec not installed"
# shellcheck disable=SC2016 # the literal $ORIGIN is what the RUNPATH holds
case $(runpath "$cli") in
  *'$ORIGIN/'*) echo "ok: bin/flashdec RUNPATH $(runpath "$cli")" ;;
  *) fail "bin/flashdec has RUNPATH '$(runpath "$cli")', expected \$ORIGIN/..." ;;
esac
check_loads "$cli" "$lib"
"$cli" --help > "$work/cli-help.log" 2>&1 ||
  { cat "$work/cli-help.log" >&2; fail "$cli --help failed"; }
cp -a "$prefix" "$work/moved"
check_loads "$work/moved/bin/flashdec" "$work/moved/$libdir"
"$work/moved/bin/flashdec" --help > /dev/null 2>&1 || fail "bin/flashdec --help from a moved prefix failed"
echo "ok: bin/flashdec --help runs from the prefix and from a moved copy"
rm -rf "$work/moved"

case $mode in
  cmake)
    # Only the temporary prefix may satisfy find_package.
    "$cmake" -S "$source_dir/tests/consumer" -B "$work/build" -G "$generator" \
      -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
      -DCMAKE_C_FLAGS="$extra_flags" -DCMAKE_EXE_LINKER_FLAGS="$extra_flags" > "$work/configure.log" ||
      { cat "$work/configure.log" >&2; fail "configuring the consumer failed"; }
    grep "consumer: flashdec" "$work/configure.log"
    grep -q "consumer: flashdec $version from $lib/cmake/flashdec" "$work/configure.log" ||
      fail "find_package did not pick the package from $prefix"
    "$cmake" --build "$work/build" > "$work/build.log" ||
      { cat "$work/build.log" >&2; fail "building the consumer failed"; }
    # From the build tree: CMake's build RPATH points at the installed library.
    check_loads "$work/build/consumer" "$lib"
    "$work/build/consumer"
    # Installed into a prefix of its own: its install RPATH must.
    "$cmake" --install "$work/build" --prefix "$work/app" > "$work/app-install.log" ||
      { cat "$work/app-install.log" >&2; fail "installing the consumer failed"; }
    exe=$work/app/bin/consumer
    ;;
  pkg-config)
    export PKG_CONFIG_PATH=$lib/pkgconfig
    [ "$(pkg-config --modversion flashdec)" = "$version" ] || fail "pkg-config --modversion"
    flags=$(pkg-config --cflags --libs flashdec)
    echo "pkg-config --cflags --libs flashdec: $flags"
    case " $flags " in
      *" -Wl,-rpath,"*) ;;
      *) fail "pkg-config --libs flashdec carries no -Wl,-rpath" ;;
    esac
    exe=$work/consumer
    # shellcheck disable=SC2086 # the flags are a word list by design
    "$cc" -std=c99 -Wall -Wextra -pedantic -Werror $extra_flags \
      "$source_dir/tests/consumer/consumer.c" -o "$exe" $flags ||
      fail "compiling the consumer with pkg-config flags failed"
    ;;
  *) fail "unknown mode $mode" ;;
esac

# The program must load the installed copy, not the build tree's, with
# LD_LIBRARY_PATH unset.
check_loads "$exe" "$lib"
"$exe"
