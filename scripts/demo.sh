#!/usr/bin/env bash
# Sets up, builds and runs the decode example (examples/decode_demo.c).
# Arguments go to the example: --steps N, --batch B, --seed S.
#
# usage: ./scripts/demo.sh [--steps N] [--batch B] [--seed S]
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

flashdec_configure
flashdec_build decode_demo
echo "== run $build_dir/examples/decode_demo $*"
"$build_dir/examples/decode_demo" "$@"
