#!/usr/bin/env bash
# Nsight Compute profile of one kernel launch of a benchmark, for kernel work
# on a GPU machine (docs/kernel-design.md lists what earlier profiles showed).
#
#   scripts/gpu-profile.sh NAME KERNEL_REGEX SKIP -- COMMAND [ARGS...]
#
# Profiles launch number SKIP (0: the first) among the launches whose
# demangled name matches KERNEL_REGEX while COMMAND runs (a benchmark from
# BUILD_DIR, e.g. "build-gpu/bench/decode_bench --variants --filter
# D256_64x4096"), twice: once with the throughput, occupancy, scheduler and
# warp-state sections, once with per-line stall sampling. Writes two files to
# $OUT (default ./gpu-out): NAME.txt (the report) and NAME-lines.txt (the
# source lines with the most stall samples, with their share and reasons).
# Several profiles fit one device call: run the script once per kernel.
#
# Example (the FP8 append kernel's first launch, then the head_dim 256
# decode kernel after the benchmark's warm-up and checks):
#   scripts/gpu-profile.sh append-fp8 'append_kernel<.*\(bool\)1' 0 -- \
#     build-gpu/bench/append_bench --out /tmp/ab
#   scripts/gpu-profile.sh d256 'decode_kernel<.*256' 40 -- \
#     build-gpu/bench/decode_bench --variants --filter D256_64x4096 --out /tmp/db
#
# The profiler locks clocks to base (durations run longer than the
# benchmark's); read ratios, not times. Environment: OUT, NCU (the ncu
# binary), TIMEOUT (seconds per pass, default 150).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
if [ $# -lt 5 ] || [ "$4" != "--" ]; then
  sed -n '2,25p' "$0" >&2
  exit 2
fi
name=$1 regex=$2 skip=$3
shift 4
OUT=${OUT:-$PWD/gpu-out}
TIMEOUT=${TIMEOUT:-150}
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
mkdir -p "$OUT"
select=(--kernel-name-base demangled --kernel-name "regex:$regex" --launch-skip "$skip"
  --launch-count 1)

timeout "$TIMEOUT" "$NCU" "${select[@]}" --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section SchedulerStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis "$@" >"$OUT/$name.txt" 2>&1
rc=$?
echo "gpu-profile $name: report rc=$rc ($OUT/$name.txt)"
grep -q "No kernels were profiled" "$OUT/$name.txt" &&
  { echo "gpu-profile $name: no launch matched '$regex' (skip $skip)"; exit 1; }

csv=/tmp/gpu-profile-$name.csv
timeout "$TIMEOUT" "$NCU" "${select[@]}" --section SourceCounters --page source --csv \
  "$@" >"$csv" 2>&1
echo "gpu-profile $name: source pass rc=$?"
python3 scripts/ncu_lines.py "$csv" >"$OUT/$name-lines.txt" 2>&1
echo "gpu-profile $name: $(head -1 "$OUT/$name-lines.txt")"
exit "$rc"
