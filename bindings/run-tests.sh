#!/usr/bin/env bash
# Builds libflashdec if needed and runs the Python, Rust and Go binding
# suites, the parity diff (C, Python, Rust, Go) and the binding examples.
#
#   bindings/run-tests.sh                 # builds the library in build-bind/
#   FLASHDEC_LIB_DIR=/path bindings/run-tests.sh   # uses an existing build
#
# Needs: cmake + ninja + a C/C++ compiler (only without FLASHDEC_LIB_DIR),
# python3 with pip (installs numpy, pytest, cffi), cargo (offline), and Go
# (installed from Debian's golang-go when missing). Exit status 0 = all passed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FLASHDEC_BIND_BUILD:-$ROOT/build-bind}"
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

# --- toolchains --------------------------------------------------------------
section "toolchains"
PY="${PYTHON:-python3}"
# wheel: older setuptools (< 70.1) build wheels through it; with
# --no-build-isolation below nothing else is fetched, so the install is offline.
"$PY" -m pip install --quiet --disable-pip-version-check numpy pytest cffi wheel
if ! command -v go >/dev/null 2>&1; then
  apt-get install -y golang-go >/dev/null || { apt-get update >/dev/null && apt-get install -y golang-go >/dev/null; }
fi
export GOFLAGS=-mod=mod GOCACHE="$BUILD/gocache" GOPATH="$BUILD/gopath" GOTOOLCHAIN=local
export CGO_CFLAGS="-I$ROOT/include"
export CGO_LDFLAGS="-L$FLASHDEC_LIB_DIR -Wl,-rpath,$FLASHDEC_LIB_DIR"
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
# Installed into a throwaway target dir so the suite tests the installed
# package (pyproject + setuptools, offline) rather than the source tree.
py_install() {
  # Build from a copy: setuptools writes build/ next to pyproject.toml.
  rm -rf "$OUT/pysite" "$OUT/pysrc"
  mkdir -p "$OUT/pysrc"
  cp -r "$ROOT/bindings/python/pyproject.toml" "$ROOT/bindings/python/flashdec" "$OUT/pysrc/"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    --target "$OUT/pysite" "$OUT/pysrc"
}
run "python install (pip, offline)" py_install
export PYTHONPATH="$OUT/pysite${PYTHONPATH:+:$PYTHONPATH}"
# Run from $OUT so `python -m pytest` (which puts the cwd on sys.path) imports
# the installed package, not the source tree.
run "python tests" bash -c "cd '$OUT' && '$PY' -m pytest -q -p no:cacheprovider \
  --rootdir '$ROOT/bindings/python' -c '$ROOT/bindings/python/pyproject.toml' '$ROOT/bindings/python/tests'"

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
run "example rust" bash -c "cd '$ROOT/examples/rust' && cargo run --offline -q"
run "example go" bash -c "cd '$ROOT/examples/go' && go run ."

section "summary"
if ((${#failures[@]})); then
  printf 'FAILED: %s\n' "${failures[@]}"
  exit 1
fi
echo "all binding checks passed"
