#!/usr/bin/env bash
# Builds libflashdec if needed and runs the Python, Rust and Go binding
# suites, the parity diff (C, Python, Rust, Go) and the binding examples.
#
#   bindings/run-tests.sh                 # builds the library in build-bind/
#   FLASHDEC_LIB_DIR=/path bindings/run-tests.sh   # uses an existing build
#
# The library is installed into $BUILD/prefix first: Go finds it through
# pkg-config there, and the Rust and Go examples also run from that install
# with LD_LIBRARY_PATH unset.
#
# Needs: cmake + ninja + a C/C++ compiler (only without FLASHDEC_LIB_DIR), pkg-config,
# python3 with venv + pip, cargo (offline), and Go (installed from Debian's
# golang-go when missing, announced). Exit status 0 = all passed.
#
# Python runs in venvs under the build folder; nothing goes into the user's
# Python. $BUILD/venv (created once, reused; --system-site-packages, so an
# installed numpy/pytest/cffi/torch is used) gets what the suite misses.
# "python wheel (fresh venv)" builds the package with pip (scikit-build-core from
# PyPI compiles libflashdec into the wheel; CPU-only unless FLASHDEC_WHEEL_CUDA=AUTO
# or ON, to keep CI time sane: the CUDA library is tested through FLASHDEC_LIBRARY)
# and installs it into a new venv with numpy, pytest and cffi from PyPI.
# Lines starting "INSTALL:" say what gets installed where and why.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FLASHDEC_BIND_BUILD:-$ROOT/build-bind}"
# Absolute: Go refuses a relative GOPATH under it, and steps change directory.
case "$BUILD" in /*) ;; *) BUILD="$PWD/$BUILD" ;; esac
JOBS="${JOBS:-2}"
failures=()

section() { printf '\n==== %s ====\n' "$*"; }
run() { # name, command...
  local name="$1"; shift
  section "$name"
  if "$@"; then echo "PASS: $name"; else echo "FAIL: $name"; failures+=("$name"); fi
}

# --- library ---------------------------------------------------------------
if [[ -z "${FLASHDEC_LIB_DIR:-}" ]]; then
  section "build libflashdec ($BUILD)"
  if [[ ! -f "$BUILD/build.ninja" ]]; then
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DFLASHDEC_CUDA=OFF -DFLASHDEC_BUILD_TESTS=OFF \
      -DFLASHDEC_BUILD_BENCH=OFF -DFLASHDEC_BUILD_EXAMPLES=OFF >/dev/null
  fi
  cmake --build "$BUILD" -j"$JOBS" --target flashdec
  FLASHDEC_LIB_DIR="$BUILD"
fi
FLASHDEC_LIB_DIR="$(cd "$FLASHDEC_LIB_DIR" && pwd)"
export FLASHDEC_LIB_DIR
export FLASHDEC_LIBRARY="$FLASHDEC_LIB_DIR/libflashdec.so"
export LD_LIBRARY_PATH="$FLASHDEC_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FLASHDEC_INCLUDE_DIR="$ROOT/include"
[[ -f "$FLASHDEC_LIBRARY" ]] || { echo "no libflashdec.so in $FLASHDEC_LIB_DIR"; exit 2; }
OUT="$BUILD/bindings-out"
mkdir -p "$OUT"

# --- install -----------------------------------------------------------------
# Go builds, and the "installed, no env" example steps run, against the library
# as a user gets it: `cmake --install` into $BUILD/prefix, found through
# pkg-config (flashdec.pc carries the rpath).
PREFIX="$BUILD/prefix"
section "install libflashdec ($PREFIX)"
[[ -f "$FLASHDEC_LIB_DIR/cmake_install.cmake" ]] ||
  { echo "$FLASHDEC_LIB_DIR is not a CMake build tree (cmake --install needs one)"; exit 2; }
rm -rf "$PREFIX"
for component in runtime development; do
  cmake --install "$FLASHDEC_LIB_DIR" --prefix "$PREFIX" --component "$component" >/dev/null
done
PC_DIR="$(dirname "$(find "$PREFIX" -name flashdec.pc | head -n 1)")"
export PKG_CONFIG_PATH="$PC_DIR${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
echo "PKG_CONFIG_PATH=$PKG_CONFIG_PATH: $(pkg-config --libs flashdec)"

# --- toolchains --------------------------------------------------------------
section "toolchains"
BASE_PY="${PYTHON:-python3}"
VENV="$BUILD/venv"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "INSTALL: Python venv $VENV (--system-site-packages) for the binding suites"
  "$BASE_PY" -m venv --system-site-packages "$VENV"
fi
PY="$VENV/bin/python"
py_missing=()
for module in numpy pytest cffi; do
  "$PY" -c "import $module" 2>/dev/null || py_missing+=("$module")
done
if ((${#py_missing[@]})); then
  echo "INSTALL: ${py_missing[*]} into $VENV with pip (the Python suite needs them)"
  "$PY" -m pip install --quiet --disable-pip-version-check "${py_missing[@]}"
fi
# flashdec.transformers' suite (CPU parity with eager, issue 18) needs torch and
# transformers. PyPI's torch is its CUDA build (about 5 GB with the CUDA
# libraries it pulls in; the CPU-only index is not reachable everywhere):
# installed once into this venv, which later runs reuse.
hf_missing=()
"$PY" -c "import torch" 2>/dev/null || hf_missing+=(torch)
"$PY" -c "import transformers" 2>/dev/null || hf_missing+=("transformers==5.17.0")
if ((${#hf_missing[@]})); then
  echo "INSTALL: ${hf_missing[*]} into $VENV with pip (the flashdec.transformers suite needs them)"
  "$PY" -m pip install --quiet --disable-pip-version-check "${hf_missing[@]}"
fi
if ! command -v go >/dev/null 2>&1; then
  echo "INSTALL: Debian package golang-go with apt-get (no go on PATH; the Go binding needs it)"
  apt-get install -y golang-go >/dev/null || { apt-get update >/dev/null && apt-get install -y golang-go >/dev/null; }
fi
export GOFLAGS=-mod=mod GOCACHE="$BUILD/gocache" GOPATH="$BUILD/gopath" GOTOOLCHAIN=local
export CARGO_TARGET_DIR="$BUILD/cargo"
"$PY" --version; cargo --version; go version

# --- generated declarations and coverage ------------------------------------
# The Python ctypes declarations, the layout probe and the Rust -sys crate are
# generated from include/flashdec.h (bindings/tools/gen_bindings.py: pycparser
# and Debian's bindgen, which scripts/setup.sh installs); this fails when a
# checked-in file is stale. Without bindgen the Rust comparison is skipped
# and the script says so.
run "generated bindings current" "$PY" "$ROOT/bindings/tools/gen_bindings.py" --check
run "binding coverage (every header function)" "$PY" "$ROOT/bindings/tools/check_coverage.py"

# --- Python ------------------------------------------------------------------
# The suite from the source tree against the library under test
# (FLASHDEC_LIBRARY); the parity run and the example below use the same.
export PYTHONPATH="$ROOT/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
py_suite() { # python, extra pytest args...
  local py="$1"; shift
  # From $OUT: `python -m pytest` puts the cwd on sys.path; nothing there shadows flashdec.
  (cd "$OUT" && "$py" -m pytest -q -p no:cacheprovider --rootdir "$ROOT/bindings/python" \
    -c "$ROOT/bindings/python/pyproject.toml" "$@" "$ROOT/bindings/python/tests")
}
run "python tests" py_suite "$PY"

# The package as a user gets it: `pip wheel ./bindings/python` compiles
# libflashdec into the wheel (CMake build folder $BUILD/wheel-build, kept, so a
# rerun recompiles only what changed), then a venv made for this run installs
# the wheel and runs the suite with FLASHDEC_LIBRARY, LD_LIBRARY_PATH and
# PYTHONPATH unset (test_package.py checks the library came from the wheel).
py_wheel() (
  unset FLASHDEC_LIBRARY LD_LIBRARY_PATH PYTHONPATH
  local wheels="$OUT/wheelhouse" venv="$BUILD/wheel-venv" cuda="${FLASHDEC_WHEEL_CUDA:-OFF}" wheel
  rm -rf "$wheels" "$venv"
  echo "INSTALL: nothing yet; pip wheel fetches the build backend scikit-build-core from PyPI" \
    "into its isolated build environment (FLASHDEC_CUDA=$cuda, CMake build in $BUILD/wheel-build)"
  CMAKE_ARGS="-DFLASHDEC_CUDA=$cuda" SKBUILD_BUILD_DIR="$BUILD/wheel-build" \
    CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "$PY" -m pip wheel --quiet --disable-pip-version-check \
    --no-deps -w "$wheels" "$ROOT/bindings/python" || return 1
  wheel="$(ls "$wheels"/flashdec-*.whl)"
  echo "INSTALL: fresh venv $venv: $(basename "$wheel") with its dependency numpy, and pytest +" \
    "cffi for the suite, from PyPI"
  "$BASE_PY" -m venv "$venv" || return 1
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel" pytest cffi || return 1
  export FLASHDEC_TEST_WHEEL=1
  "$venv/bin/python" -c \
    'import flashdec; print("installed flashdec", flashdec.version(), "loads", flashdec.library_path())' &&
    py_suite "$venv/bin/python"
)
run "python wheel (fresh venv)" py_wheel

# --- Rust --------------------------------------------------------------------
run "rust tests" bash -c "cd '$ROOT/bindings/rust' && cargo test --offline -q 2>&1"

# --- Go ----------------------------------------------------------------------
run "go tests" bash -c "cd '$ROOT/bindings/go' && go vet ./... && go test -count=1 ./..."

# --- parity ------------------------------------------------------------------
parity() {
  cc -std=c99 -Wall -Wextra -Werror -I"$ROOT/include" "$ROOT/bindings/parity/parity.c" \
    -o "$OUT/parity_c" -L"$FLASHDEC_LIB_DIR" -lflashdec -Wl,-rpath,"$FLASHDEC_LIB_DIR"
  "$OUT/parity_c" >"$OUT/parity_c.txt"
  "$PY" "$ROOT/bindings/parity/parity.py" >"$OUT/parity_python.txt"
  (cd "$ROOT/bindings/rust" && cargo run --offline -q -p flashdec --example parity) >"$OUT/parity_rust.txt"
  (cd "$ROOT/bindings/go" && go run ./cmd/parity) >"$OUT/parity_go.txt"
  local ok=0
  for lang in python rust go; do
    if diff -u "$OUT/parity_c.txt" "$OUT/parity_$lang.txt"; then
      echo "parity C == $lang ($(wc -l <"$OUT/parity_c.txt") lines)"
    else
      ok=1
    fi
  done
  grep -q '^done$' "$OUT/parity_c.txt" || { echo "C parity run did not finish"; ok=1; }
  return $ok
}
run "parity (C, Python, Rust, Go)" parity

# --- examples ----------------------------------------------------------------
run "example python" "$PY" "$ROOT/examples/python/decode_loop.py"
# generate_hf.py: a random-init Llama-shaped model generating through
# flashdec.transformers on the CPU, checked token for token against eager
# (a few seconds). Needs torch and transformers (installed above).
if "$PY" -c "import torch, transformers" 2>/dev/null; then
  run "example python (transformers)" "$PY" "$ROOT/examples/python/generate_hf.py" \
    --device cpu --prompts 4 --max-prompt-len 20 --max-new-tokens 8 --check
  # The Python host-cost benchmark, a few calls of each row (keeps it working).
  run "bench python host cost (smoke)" "$PY" "$ROOT/bench/python_host_cost.py" --calls 4 --reps 1
else
  echo "SKIP: example python (transformers): torch or transformers does not import"
fi
run "example rust" bash -c "cd '$ROOT/examples/rust' && cargo run --offline -q"
run "example go" bash -c "cd '$ROOT/examples/go' && go run ."

# --- installed, no env ---------------------------------------------------------
# The examples as a user runs them after a plain install: LD_LIBRARY_PATH and
# the build-tree variables unset, only PKG_CONFIG_PATH (or FLASHDEC_DIR) set.
# Each program must load the library from $PREFIX through its own rpath.
noenv=(env -u LD_LIBRARY_PATH -u FLASHDEC_LIB_DIR -u FLASHDEC_LIBRARY -u FLASHDEC_INCLUDE_DIR
  -u CGO_CFLAGS -u CGO_LDFLAGS -u PKG_CONFIG_PATH)
loads_from_prefix() { # executable
  local lib
  lib="$(env -u LD_LIBRARY_PATH ldd "$1" | awk '$1 ~ /^libflashdec/ { print $3 }')"
  echo "$1 loads $lib"
  [[ "$lib" == "$PREFIX"/* ]]
}
installed_rust() { # pkg-config | FLASHDEC_DIR
  local found=(PKG_CONFIG_PATH="$PC_DIR")
  [[ "$1" == FLASHDEC_DIR ]] && found=(FLASHDEC_DIR="$PREFIX")
  (cd "$ROOT/examples/rust" &&
    "${noenv[@]}" "${found[@]}" CARGO_TARGET_DIR="$BUILD/cargo-installed" cargo run --offline -q) &&
    loads_from_prefix "$BUILD/cargo-installed/debug/flashdec-decode-loop"
}
installed_go() {
  (cd "$ROOT/examples/go" && "${noenv[@]}" PKG_CONFIG_PATH="$PC_DIR" go run . &&
    "${noenv[@]}" PKG_CONFIG_PATH="$PC_DIR" go build -o "$OUT/go-decode-loop" .) &&
    loads_from_prefix "$OUT/go-decode-loop"
}
run "rust example (installed, pkg-config, no env)" installed_rust pkg-config
run "rust example (installed, FLASHDEC_DIR, no env)" installed_rust FLASHDEC_DIR
run "go example (installed, pkg-config, no env)" installed_go

section "summary"
if ((${#failures[@]})); then
  printf 'FAILED: %s\n' "${failures[@]}"
  exit 1
fi
echo "all binding checks passed"
