#!/usr/bin/env bash
# Installs what building and testing FlashDec needs, only what is missing:
# a C/C++ compiler, CMake >= 3.25, Ninja, pkg-config, cmocka, Doxygen and
# binutils. Debian/Ubuntu (apt-get); run as root or with sudo available.
# Also puts an installed CUDA toolkit's nvcc on PATH for the caller when it is
# not there yet (scripts/common.sh sources this file to keep that PATH).
#
# usage: ./scripts/setup.sh
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
fi

flashdec_have() { command -v "$1" > /dev/null 2>&1; }

# cmake >= 3.25 present?
flashdec_cmake_ok() {
  flashdec_have cmake || return 1
  local v
  v=$(cmake --version | sed -n 's/^cmake version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  set -- $v
  [ "${1:-0}" -gt 3 ] || { [ "${1:-0}" -eq 3 ] && [ "${2:-0}" -ge 25 ]; }
}

# Debian packages of the tools that are missing, one per line.
flashdec_missing() {
  flashdec_cmake_ok || echo cmake
  flashdec_have ninja || echo ninja-build
  flashdec_have g++ || echo g++
  flashdec_have cc || echo gcc
  flashdec_have pkg-config || echo pkg-config
  flashdec_have doxygen || echo doxygen
  { flashdec_have nm && flashdec_have readelf; } || echo binutils
  [ -f /usr/include/cmocka.h ] || echo libcmocka-dev
  # The flashdec CLI: argument parsing (CLI11) and JSON (nlohmann-json), both
  # header-only; rsvg-convert renders its SVG plots in the plot tests.
  [ -f /usr/include/CLI/CLI.hpp ] || echo libcli11-dev
  [ -f /usr/include/nlohmann/json.hpp ] || echo nlohmann-json3-dev
  flashdec_have rsvg-convert || echo librsvg2-bin
  # bindgen regenerates the Rust -sys declarations from the header; the
  # bindings' CI check compares its output with the checked-in file.
  flashdec_have bindgen || echo bindgen
  # bindings/run-tests.sh runs the Python suites in venvs under the build folder.
  if flashdec_have python3 && ! python3 -c 'import ensurepip, venv' > /dev/null 2>&1; then
    echo python3-venv
  fi
}

flashdec_setup() {
  local missing=()
  mapfile -t missing < <(flashdec_missing)
  if [ ${#missing[@]} -gt 0 ]; then
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
      if flashdec_have sudo; then
        sudo=(sudo)
      else
        echo "setup: missing ${missing[*]}; run as root or install them with apt-get" >&2
        return 1
      fi
    fi
    flashdec_have apt-get || {
      echo "setup: missing ${missing[*]} and apt-get is not available; install them by hand" >&2
      return 1
    }
    echo "setup: installing ${missing[*]}"
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "${missing[@]}" > /dev/null
    mapfile -t missing < <(flashdec_missing | grep -vx cmake)
    if [ ${#missing[@]} -gt 0 ]; then
      echo "setup: still missing after apt-get install: ${missing[*]}" >&2
      return 1
    fi
  fi
  if ! flashdec_cmake_ok; then
    # An older distribution: take CMake from PyPI instead.
    echo "setup: CMake $(cmake --version | head -n 1) is older than 3.25; installing it with pip"
    python3 -m pip install --quiet --user 'cmake>=3.25' && export PATH="$HOME/.local/bin:$PATH"
    flashdec_cmake_ok || { echo "setup: no CMake >= 3.25 available" >&2; return 1; }
  fi

  # A CUDA toolkit installed in the usual place but not on PATH.
  if ! flashdec_have nvcc && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  if flashdec_have nvcc; then
    echo "setup: nvcc found ($(command -v nvcc))"
  else
    echo "setup: no nvcc (FLASHDEC_CUDA=AUTO builds the CPU backend only)"
  fi
}

flashdec_setup
