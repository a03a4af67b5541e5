// Timing probe of the CUDA paged decode: where the time of one call goes.
//
// Builds the decode kernels (kernels/decode_kernel.cuh, decode_merge.cuh) with FD_DECODE_TRACE
// defined (the library never defines it), so thread 0 of every CTA stamps
// %globaltimer at fixed points (see the probe points in decode_device.cuh):
//   attention: 0 entry, 1 after griddepcontrol.wait, 2 seq_len arrived,
//              3 first K/V tile in shared memory, 4 after the main loop,
//              6 warp partials in shared memory, 7 per-head weights done,
//              5 after the output/partial writes (time order 0-4, 6, 7, 5)
//   merge:     0 entry (after its seq_lens load), 1 after griddepcontrol.wait,
//              2 end (before the output stores)
// The launch is filled the way src/cuda/decode_cuda.cpp fills it and goes
// straight to launch_decode_variant<bf16, 128, token-major> (FP8 cases:
// <f16 kernel type, FP8 E4M3, 128, token-major> with bf16 q, as the library
// serves bf16 q over an FP8 cache; the swapped kernel in its regular shape)
// in this translation unit, so no flashdec library is linked (its copies of the
// kernels carry no probes).
//
// Per case: seeded random K/V in a pool whose physical blocks are a seeded
// random permutation, enough buffer sets to exceed 400 MB, warm-up, then a CUDA
// graph of max(sets, 20) launches cycling the sets (rounded to whole cycles).
// Replays without tracing give the time per launch; replays with the trace
// buffers set leave the stamps of the graph's last launch in them (every launch
// writes the same slots, the last one last). Stamps are reported relative to
// the earliest entry stamp of that launch: per point the count of CTAs that
// stamped it and min / median / max / mean over CTAs, per stage the per-CTA
// difference of consecutive points (in time order); each number is the median
// over the traced replays. Every CTA stamps every point it reaches in every
// launch, so a stamp earlier than its CTA's previous point (in time order)
// cannot be of the last launch: such stamps are dropped and counted (0 is
// expected). W0, the earliest return from griddepcontrol.wait,
// marks when the grid saw the previous kernel complete; the points are also
// given as medians after W0, and the graph period minus (W0 -> last stamp) is
// the time from a launch's last stamp to the next launch's W0. A one-thread
// kernel on a second stream spans one more replay and reads the SM clock
// (clock64 over %globaltimer). For the A 1x2048 case a second measurement
// traces two eager stream launches into two buffer pairs (the trace pointers
// swapped by cudaMemcpyToSymbolAsync between them, behind a spin kernel so both
// are queued before the GPU reaches them): the gap between the first launch's
// last stamp and the second one's first, which includes the two small copies.
// The %globaltimer granularity is measured first (one thread reading it in a
// loop) and from the stamps themselves.
//
// Usage: trace_probe [--out DIR]   (writes trace_probe.json, trace_probe.md)
#define FD_DECODE_TRACE 1
#include "decode_dispatch.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "bench_common.cuh"
#include "flashdec.h"

namespace {

using fd_bench::EventTimer;
using fd_bench::median;
using fd_bench::mix64;
using fd_bench::percentile;
using fd_bench::splitmix;
using fd_bench::strprintf;
namespace fdc = fd::cuda;
namespace fdd = fd::cuda::detail;

constexpr int kD = 128;
constexpr int kBlock = 16;
constexpr int kAttnPoints = 8;
constexpr int kMergePoints = 4;  // slots per merge CTA (3 used)
constexpr int kMergeUsed = 3;
constexpr int kTracedReplays = 7;
constexpr int kEagerPairs = 5;
constexpr int kTimedReplays = 15;

// Indexed by probe slot; the kernel reaches the slots in kAttnOrder.
const char *const kAttnNames[kAttnPoints] = {"0 entry",
                                             "1 after griddepcontrol.wait",
                                             "2 seq_len arrived",
                                             "3 first tile in smem",
                                             "4 after main loop",
                                             "5 after partial/out writes",
                                             "6 warp partials in smem",
                                             "7 per-head weights done"};
constexpr int kAttnOrder[kAttnPoints] = {0, 1, 2, 3, 4, 6, 7, 5};
constexpr int kAttnLast = 5;  // the last point in time
const char *const kMergeNames[kMergeUsed] = {"m0 entry (after seq_lens load)",
                                             "m1 after griddepcontrol.wait", "m2 end"};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

// One thread: the first `n` nonzero steps of %globaltimer.
__global__ void timer_steps(unsigned long long *steps, int n) {
  unsigned long long prev = global_ns();
  int k = 0;
  for (long long it = 0; it < (1ll << 24) && k < n; ++it) {
    const unsigned long long t = global_ns();
    if (t != prev) {
      steps[k++] = t - prev;
      prev = t;
    }
  }
  for (; k < n; ++k) steps[k] = 0;
}

// Busy for `ns` nanoseconds, so that what follows is queued before the GPU
// reaches it.
__global__ void spin(unsigned long long ns) {
  const unsigned long long t0 = global_ns();
  while (global_ns() - t0 < ns) {
  }
}

// One thread on another stream while a graph replays: SM clock (clock64
// ticks) over %globaltimer time, for `ns` nanoseconds.
__global__ void clock_probe(unsigned long long ns, unsigned long long *out) {
  const unsigned long long t0 = global_ns();
  const long long c0 = clock64();
  unsigned long long t = t0;
  while (t - t0 < ns) t = global_ns();
  out[0] = t - t0;
  out[1] = static_cast<unsigned long long>(clock64() - c0);
}

// Seeded uniform values in [-scale, scale) as bf16.
__global__ void fill_bf16(uint16_t *dst, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + i);
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
    dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(scale * (2.f * u - 1.f)));
  }
}

// Seeded E4M3 codes of magnitude at most 1 (0x38), either sign: never NaN.
__global__ void fill_fp8(uint8_t *dst, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + i);
    dst[i] = static_cast<uint8_t>((h >> 8) % 0x39u) | static_cast<uint8_t>((h & 1u) << 7);
  }
}

struct Case {
  const char *name;
  int hq, hkv, batch, ctx;
  int splits, tiles_per_split;
  bool eager_pair;  // also trace two eager launches
  bool fp8;         // FP8 E4M3 K/V (bf16 q and out), else bf16 K/V
};

// The FP8 cases are the one-wave lists of issue 15's misses (the plan's
// split counts at 57eb3ef) and A 64 x 4096, whose one wave of 64-tile CTAs
// reads at the copy ceiling.
const Case kCases[] = {
    {"A 1x2048 two-kernel", 32, 8, 1, 2048, 32, 1, true, false},
    {"C 1x32768 two-kernel", 16, 2, 1, 32768, 128, 4, false, false},
    {"A 64x4096 unsplit", 32, 8, 64, 4096, 1, 64, false, false},
    {"C 128x2048 unsplit", 16, 2, 128, 2048, 1, 32, false, false},
    {"FP8 C 64x4096", 16, 2, 64, 4096, 4, 16, false, true},
    {"FP8 C 32x4096", 16, 2, 32, 4096, 8, 8, false, true},
    {"FP8 A 8x8192", 32, 8, 8, 8192, 8, 16, false, true},
    {"FP8 A 1x32768", 32, 8, 1, 32768, 64, 8, false, true},
    {"FP8 A 64x4096 unsplit", 32, 8, 64, 4096, 1, 64, false, true},
};

// Summary of one point (or stage) over CTAs, in microseconds.
struct Stat {
  int n = 0;
  double min = 0, med = 0, max = 0, mean = 0;
};

Stat stat_of(const std::vector<double> &v) {
  Stat s;
  s.n = static_cast<int>(v.size());
  if (v.empty()) return s;
  s.min = *std::min_element(v.begin(), v.end());
  s.max = *std::max_element(v.begin(), v.end());
  s.med = median(v);
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  return s;
}

// Median over replays of each field.
Stat median_stat(const std::vector<Stat> &v) {
  Stat s;
  if (v.empty()) return s;
  std::vector<double> a, b, c, d, e;
  for (const Stat &x : v) {
    a.push_back(x.n), b.push_back(x.min), c.push_back(x.med), d.push_back(x.max);
    e.push_back(x.mean);
  }
  s.n = static_cast<int>(median(a));
  s.min = median(b), s.med = median(c), s.max = median(d), s.mean = median(e);
  return s;
}

// b - a in microseconds, exact: stamps are ~1.7e18 ns, where a double keeps
// only 256 ns, so the difference is taken in integers first.
double ns_diff_us(unsigned long long b, unsigned long long a) {
  return static_cast<double>(static_cast<long long>(b - a)) * 1e-3;
}

// One launch's stamps (0 = not stamped).
struct Snapshot {
  std::vector<unsigned long long> attn, merge;
  int stale = 0;  // stamps dropped by drop_stale
};

// Every launch of the graph writes the same slots, the last one last, so a
// stamp earlier than its CTA's previous point (in time order) is a leftover of
// an earlier launch, or a broken probe; it is dropped and counted.
void drop_stale(Snapshot &s) {
  for (size_t c = 0; c < s.attn.size() / kAttnPoints; ++c) {
    unsigned long long prev = s.attn[c * kAttnPoints + kAttnOrder[0]];
    for (int i = 1; i < kAttnPoints; ++i) {
      unsigned long long &t = s.attn[c * kAttnPoints + kAttnOrder[i]];
      if (t == 0) continue;
      if (t < prev) {
        t = 0;
        ++s.stale;
      } else {
        prev = t;
      }
    }
  }
}

// The earliest attention entry stamp.
unsigned long long origin_of(const Snapshot &s) {
  unsigned long long o = ~0ull;
  for (size_t i = 0; i < s.attn.size(); i += kAttnPoints)
    if (s.attn[i] != 0) o = std::min(o, s.attn[i]);
  return o;
}
unsigned long long last_stamp(const Snapshot &s) {
  unsigned long long e = 0;
  for (unsigned long long t : s.attn) e = std::max(e, t);
  for (unsigned long long t : s.merge) e = std::max(e, t);
  return e;
}
unsigned long long first_stamp_of_point(const Snapshot &s, int point) {
  unsigned long long o = ~0ull;
  for (size_t i = static_cast<size_t>(point); i < s.attn.size(); i += kAttnPoints)
    if (s.attn[i] != 0) o = std::min(o, s.attn[i]);
  return o;
}

// Stages: per-CTA differences between consecutive stamped points (in time
// order), and the whole epilogue.
struct StageDef {
  const char *name;
  bool merge;
  int from, to;
};
const StageDef kStages[] = {
    {"wait: 0 entry -> 1 after griddepcontrol.wait", false, 0, 1},
    {"seq_len load: 1 -> 2", false, 1, 2},
    {"first tile: 2 -> 3 (table + K/V tile 0)", false, 2, 3},
    {"main loop: 3 -> 4", false, 3, 4},
    {"warp partials to smem: 4 -> 6", false, 4, 6},
    {"per-head weights: 6 -> 7", false, 6, 7},
    {"combine + writes: 7 -> 5", false, 7, 5},
    {"epilogue total: 4 -> 5", false, 4, 5},
    {"merge kernel wait: m0 -> m1", true, 0, 1},
    {"merge kernel work: m1 -> m2", true, 1, 2},
};
constexpr int kNumStages = sizeof(kStages) / sizeof(kStages[0]);

struct Analysis {
  Stat attn[kAttnPoints], merge[kMergeUsed], stage[kNumStages];
  double span_us = 0;      // earliest entry -> last stamp
  double attn_end_us = 0;  // latest attention point-5 stamp
  double min_gran_ns = 0;  // smallest nonzero difference between sorted stamps
  // W0: the earliest return from griddepcontrol.wait, i.e. when this grid saw
  // the previous kernel complete; medians of the points after W0.
  double w0_us = 0, attn_w0[kAttnPoints] = {}, merge_w0[kMergeUsed] = {}, attn_max_w0 = 0;
  double end_w0 = 0;  // W0 -> the launch's last stamp
  int stale = 0;
};

Analysis analyze(const Snapshot &s) {
  Analysis a;
  const unsigned long long o = origin_of(s);
  const size_t ctas = s.attn.size() / kAttnPoints;
  const size_t mctas = s.merge.size() / kMergePoints;
  auto rel = [&](unsigned long long t) { return ns_diff_us(t, o); };
  for (int p = 0; p < kAttnPoints; ++p) {
    std::vector<double> v;
    for (size_t c = 0; c < ctas; ++c)
      if (s.attn[c * kAttnPoints + p] != 0) v.push_back(rel(s.attn[c * kAttnPoints + p]));
    a.attn[p] = stat_of(v);
  }
  for (int p = 0; p < kMergeUsed; ++p) {
    std::vector<double> v;
    for (size_t c = 0; c < mctas; ++c)
      if (s.merge[c * kMergePoints + p] != 0) v.push_back(rel(s.merge[c * kMergePoints + p]));
    a.merge[p] = stat_of(v);
  }
  for (int k = 0; k < kNumStages; ++k) {
    const StageDef &d = kStages[k];
    const std::vector<unsigned long long> &buf = d.merge ? s.merge : s.attn;
    const size_t stride = d.merge ? kMergePoints : kAttnPoints;
    std::vector<double> v;
    for (size_t c = 0; c < buf.size() / stride; ++c) {
      const unsigned long long t0 = buf[c * stride + d.from], t1 = buf[c * stride + d.to];
      if (t0 != 0 && t1 != 0) v.push_back(ns_diff_us(t1, t0));
    }
    a.stage[k] = stat_of(v);
  }
  a.span_us = rel(last_stamp(s));
  a.w0_us = a.attn[1].min;
  for (int p = 0; p < kAttnPoints; ++p) a.attn_w0[p] = a.attn[p].med - a.w0_us;
  for (int p = 0; p < kMergeUsed; ++p) a.merge_w0[p] = a.merge[p].med - a.w0_us;
  a.attn_max_w0 = a.attn[kAttnLast].max - a.w0_us;
  a.end_w0 = a.span_us - a.w0_us;
  a.stale = s.stale;
  unsigned long long ae = 0;
  for (size_t c = 0; c < ctas; ++c) ae = std::max(ae, s.attn[c * kAttnPoints + kAttnLast]);
  a.attn_end_us = rel(ae);
  std::vector<unsigned long long> all;
  for (unsigned long long t : s.attn)
    if (t) all.push_back(t);
  for (unsigned long long t : s.merge)
    if (t) all.push_back(t);
  std::sort(all.begin(), all.end());
  unsigned long long g = 0;
  for (size_t i = 1; i < all.size(); ++i) {
    const unsigned long long d = all[i] - all[i - 1];
    if (d != 0 && (g == 0 || d < g)) g = d;
  }
  a.min_gran_ns = static_cast<double>(g);
  return a;
}

Analysis median_analysis(const std::vector<Analysis> &v) {
  Analysis m;
  std::vector<Stat> tmp;
  for (int p = 0; p < kAttnPoints; ++p) {
    tmp.clear();
    for (const Analysis &a : v) tmp.push_back(a.attn[p]);
    m.attn[p] = median_stat(tmp);
  }
  for (int p = 0; p < kMergeUsed; ++p) {
    tmp.clear();
    for (const Analysis &a : v) tmp.push_back(a.merge[p]);
    m.merge[p] = median_stat(tmp);
  }
  for (int k = 0; k < kNumStages; ++k) {
    tmp.clear();
    for (const Analysis &a : v) tmp.push_back(a.stage[k]);
    m.stage[k] = median_stat(tmp);
  }
  std::vector<double> sp, ae, gr;
  for (const Analysis &a : v) sp.push_back(a.span_us), ae.push_back(a.attn_end_us);
  for (const Analysis &a : v) gr.push_back(a.min_gran_ns);
  m.span_us = median(sp);
  m.attn_end_us = median(ae);
  m.min_gran_ns = *std::min_element(gr.begin(), gr.end());
  auto med_of = [&](auto get) {
    std::vector<double> x;
    for (const Analysis &a : v) x.push_back(get(a));
    return median(x);
  };
  m.w0_us = med_of([](const Analysis &a) { return a.w0_us; });
  m.attn_max_w0 = med_of([](const Analysis &a) { return a.attn_max_w0; });
  m.end_w0 = med_of([](const Analysis &a) { return a.end_w0; });
  for (int p = 0; p < kAttnPoints; ++p)
    m.attn_w0[p] = med_of([p](const Analysis &a) { return a.attn_w0[p]; });
  for (int p = 0; p < kMergeUsed; ++p)
    m.merge_w0[p] = med_of([p](const Analysis &a) { return a.merge_w0[p]; });
  int stale = 0;
  for (const Analysis &a : v) stale = std::max(stale, a.stale);
  m.stale = stale;
  return m;
}

struct Result {
  Case c;
  int sets = 0, launches = 0, attn_ctas = 0, merge_ctas = 0;
  double kv_mb = 0;
  double graph_us = 0, graph_p10 = 0, graph_p90 = 0, graph_traced_us = 0;
  double span_min = 0, span_max = 0;
  double sm_mhz = 0;  // SM clock during a replay (clock_probe)
  Analysis a;
  Snapshot last;  // stamps of the last traced replay
  bool out_finite = true;
  // Eager pair (medians over kEagerPairs): launch 1's last stamp -> launch 2's
  // first entry / first point-1 stamp, and launch 2's span.
  bool has_pair = false;
  double pair_gap_entry_us = 0, pair_gap_wait_us = 0, pair_first_span_us = 0,
         pair_second_span_us = 0;
};

void set_trace(unsigned long long *attn, unsigned long long *merge) {
  CHECK_CUDA(cudaMemcpyToSymbol(fdd::fd_trace_attn, &attn, sizeof(attn)));
  CHECK_CUDA(cudaMemcpyToSymbol(fdd::fd_trace_merge, &merge, sizeof(merge)));
}

// CTAs of the merge kernel, as launch_decode_variant launches it.
int merge_grid(int batch, int hq, int splits) {
  return splits <= 1 ? 0 : fdd::merge_shape(batch * hq, splits, kD).ctas;
}

Result run_case(const Case &cs, cudaStream_t stream) {
  Result res;
  res.c = cs;
  const int B = cs.batch, H = cs.hkv, HQ = cs.hq, bs = kBlock, D = kD;
  const int mbps = (cs.ctx + bs - 1) / bs;
  const int64_t blocks_per_set = static_cast<int64_t>(B) * mbps;
  const int64_t block_elems = static_cast<int64_t>(H) * bs * D;
  const size_t kv_elem = cs.fp8 ? 1 : 2;  // bytes per K/V element
  const double set_bytes =
      2.0 * static_cast<double>(blocks_per_set * block_elems) * static_cast<double>(kv_elem);
  int sets = static_cast<int>(std::ceil(420e6 / set_bytes));
  sets = std::max(1, std::min(sets, 512));
  res.sets = sets;
  res.kv_mb = set_bytes / 1e6;
  const int64_t total_blocks = blocks_per_set * sets;
  const size_t pool = static_cast<size_t>(total_blocks * block_elems);
  const size_t qn = static_cast<size_t>(B) * HQ * D;

  uint16_t *k = nullptr, *v = nullptr, *q = nullptr, *out = nullptr;
  int32_t *tables = nullptr, *lens = nullptr;
  CHECK_CUDA(cudaMalloc(&k, pool * kv_elem));
  CHECK_CUDA(cudaMalloc(&v, pool * kv_elem));
  CHECK_CUDA(cudaMalloc(&q, qn * 2 * sets));
  CHECK_CUDA(cudaMalloc(&out, qn * 2 * sets));
  CHECK_CUDA(cudaMalloc(&tables, static_cast<size_t>(blocks_per_set) * 4 * sets));
  CHECK_CUDA(cudaMalloc(&lens, static_cast<size_t>(B) * 4));
  if (cs.fp8) {
    fill_fp8<<<2048, 256, 0, stream>>>(reinterpret_cast<uint8_t *>(k), pool, 11);
    fill_fp8<<<2048, 256, 0, stream>>>(reinterpret_cast<uint8_t *>(v), pool, 12);
  } else {
    fill_bf16<<<2048, 256, 0, stream>>>(k, pool, 11, 1.f);
    fill_bf16<<<2048, 256, 0, stream>>>(v, pool, 12, 1.f);
  }
  fill_bf16<<<256, 256, 0, stream>>>(q, qn * sets, 13, 3.f);
  CHECK_CUDA(cudaGetLastError());
  std::vector<int32_t> perm(static_cast<size_t>(total_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  uint64_t pseed = 1234;
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[splitmix(pseed) % i]);
  // Every row is full (ctx tokens), so set s row r takes the next mbps ids.
  CHECK_CUDA(cudaMemcpy(tables, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice));
  const std::vector<int32_t> host_lens(static_cast<size_t>(B), cs.ctx);
  CHECK_CUDA(cudaMemcpy(lens, host_lens.data(), host_lens.size() * 4, cudaMemcpyHostToDevice));

  // The case's split count becomes a work list exactly as the library's plan
  // makes one (attention/decode_work.hpp): the probe keeps no copy of the
  // split layout.
  const fd::DecodeWorkList work = fd::make_decode_work_list(
      B, H, HQ / H, fdc::kDecodeTileTokens, cs.ctx, cs.splits, fdc::kDecodeMaxSplits);
  if (work.num_splits != cs.splits || work.tiles_per_split != cs.tiles_per_split) {
    std::fprintf(stderr, "case %s: the work list has %d splits x %d tiles, the case says %d x %d\n",
                 cs.name, work.num_splits, work.tiles_per_split, cs.splits, cs.tiles_per_split);
    std::exit(1);
  }
  float *ws = nullptr;
  if (work.has_partials()) {
    const size_t ws_bytes = static_cast<size_t>(work.partial_slots()) * (D + 2) * 4;
    CHECK_CUDA(cudaMalloc(&ws, ws_bytes));  // 256-byte aligned
  }

  // As src/cuda/decode_cuda.cpp fills it.
  auto launch_for_set = [&](int s) {
    fdc::DecodeLaunch l;
    l.q_dtype = FD_DTYPE_BF16;
    l.kv_dtype = cs.fp8 ? FD_DTYPE_FP8_E4M3 : FD_DTYPE_BF16;
    l.dim_major = false;
    l.head_dim = D;
    l.q = q + qn * s;
    l.k = k;
    l.v = v;
    l.out = out + qn * s;
    l.block_tables = tables + static_cast<size_t>(s) * blocks_per_set;
    l.seq_lens = lens;
    l.stride_block = block_elems;
    l.stride_head = static_cast<int64_t>(bs) * D;
    l.stride_token = D;
    l.stride_dim = 1;
    l.block_size_log2 = 4;
    l.num_blocks = static_cast<int32_t>(total_blocks);
    l.max_blocks_per_seq = mbps;
    l.variant.sm_scale = 1.0f / std::sqrt(static_cast<float>(D));
    l.work = work;
    if (work.has_partials()) {
      l.partial_o = ws;
      l.partial_ml = ws + static_cast<size_t>(work.partial_slots()) * D;
    }
    l.stream = stream;
    return l;
  };
  // The instantiation of the case's element types (FP8: the f16 kernel type
  // with bf16 q, as src/cuda serves bf16 q over an FP8 cache).
  cudaError_t (*const prepare)(bool) =
      cs.fp8 ? fdc::prepare_decode_variant<__half, __nv_fp8_e4m3, kD, false>
             : fdc::prepare_decode_variant<__nv_bfloat16, __nv_bfloat16, kD, false>;
  cudaError_t (*const launch_decode)(const fdc::DecodeLaunch &) =
      cs.fp8 ? fdc::launch_decode_variant<__half, __nv_fp8_e4m3, kD, false>
             : fdc::launch_decode_variant<__nv_bfloat16, __nv_bfloat16, kD, false>;
  CHECK_CUDA(prepare(false));
  auto launch = [&](int s) { CHECK_CUDA(launch_decode(launch_for_set(s))); };

  res.attn_ctas = static_cast<int>(work.size());
  res.merge_ctas = merge_grid(B, HQ, cs.splits);
  const size_t attn_n = static_cast<size_t>(res.attn_ctas) * kAttnPoints;
  const size_t merge_n = static_cast<size_t>(std::max(res.merge_ctas, 1)) * kMergePoints;
  unsigned long long *tr_attn[2], *tr_merge[2];
  for (int i = 0; i < 2; ++i) {
    CHECK_CUDA(cudaMalloc(&tr_attn[i], attn_n * 8));
    CHECK_CUDA(cudaMalloc(&tr_merge[i], merge_n * 8));
  }
  auto read_snapshot = [&](int i) {
    Snapshot s;
    s.attn.resize(attn_n);
    s.merge.resize(res.merge_ctas > 0 ? merge_n : 0);
    CHECK_CUDA(cudaMemcpy(s.attn.data(), tr_attn[i], attn_n * 8, cudaMemcpyDeviceToHost));
    if (!s.merge.empty())
      CHECK_CUDA(cudaMemcpy(s.merge.data(), tr_merge[i], merge_n * 8, cudaMemcpyDeviceToHost));
    return s;
  };
  auto clear_trace = [&](int i) {
    CHECK_CUDA(cudaMemsetAsync(tr_attn[i], 0, attn_n * 8, stream));
    CHECK_CUDA(cudaMemsetAsync(tr_merge[i], 0, merge_n * 8, stream));
  };

  // Warm-up, untraced; outputs poisoned first and checked after.
  set_trace(nullptr, nullptr);
  CHECK_CUDA(cudaMemsetAsync(out, 0xff, qn * 2 * sets, stream));
  int launches = std::max(sets, 20);
  launches = (launches + sets - 1) / sets * sets;
  res.launches = launches;
  for (int i = 0; i < launches; ++i) launch(i % sets);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  {
    std::vector<uint16_t> o(qn * sets);
    CHECK_CUDA(cudaMemcpy(o.data(), out, o.size() * 2, cudaMemcpyDeviceToHost));
    for (uint16_t bits : o) {
      uint32_t u = static_cast<uint32_t>(bits) << 16;
      float f;
      memcpy(&f, &u, 4);
      if (!std::isfinite(f)) res.out_finite = false;
    }
  }

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < launches; ++i) launch(i % sets);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  {
    EventTimer timer(stream);
    for (int i = 0; i < 3; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
    std::vector<double> t;
    for (int i = 0; i < kTimedReplays; ++i)
      t.push_back(timer.time_ms([&] { CHECK_CUDA(cudaGraphLaunch(exec, stream)); }) * 1e3 /
                  launches);
    res.graph_us = median(t);
    res.graph_p10 = percentile(t, 0.1);
    res.graph_p90 = percentile(t, 0.9);

    // SM clock during one more (untraced) replay: a one-thread kernel on a
    // second stream spans it.
    {
      cudaStream_t side;
      CHECK_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
      unsigned long long *d = nullptr, h[2] = {0, 0};
      CHECK_CUDA(cudaMalloc(&d, sizeof(h)));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      clock_probe<<<1, 1, 0, side>>>(
          static_cast<unsigned long long>(res.graph_us * launches * 1e3 * 0.9), d);
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaGraphLaunch(exec, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      CHECK_CUDA(cudaStreamSynchronize(side));
      CHECK_CUDA(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
      res.sm_mhz = h[0] ? static_cast<double>(h[1]) / static_cast<double>(h[0]) * 1e3 : 0;
      CHECK_CUDA(cudaFree(d));
      CHECK_CUDA(cudaStreamDestroy(side));
    }

    // Traced replays: the buffers keep the stamps of the graph's last launch.
    set_trace(tr_attn[0], tr_merge[0]);
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    std::vector<double> tt;
    std::vector<Analysis> runs;
    for (int i = 0; i < kTracedReplays; ++i) {
      clear_trace(0);
      tt.push_back(timer.time_ms([&] { CHECK_CUDA(cudaGraphLaunch(exec, stream)); }) * 1e3 /
                   launches);
      res.last = read_snapshot(0);
      drop_stale(res.last);
      runs.push_back(analyze(res.last));
    }
    res.graph_traced_us = median(tt);
    res.a = median_analysis(runs);
    res.span_min = res.span_max = runs[0].span_us;
    for (const Analysis &a : runs)
      res.span_min = std::min(res.span_min, a.span_us),
      res.span_max = std::max(res.span_max, a.span_us);
  }
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));

  if (cs.eager_pair) {
    // Pinned sources so the symbol copies are stream-ordered and asynchronous.
    unsigned long long **ptrs = nullptr;
    CHECK_CUDA(cudaMallocHost(&ptrs, 4 * sizeof(*ptrs)));
    ptrs[0] = tr_attn[0], ptrs[1] = tr_merge[0], ptrs[2] = tr_attn[1], ptrs[3] = tr_merge[1];
    std::vector<double> gap_entry, gap_wait, span1, span2;
    for (int r = 0; r < kEagerPairs; ++r) {
      clear_trace(0);
      clear_trace(1);
      spin<<<1, 1, 0, stream>>>(100000ull);
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaMemcpyToSymbolAsync(fdd::fd_trace_attn, &ptrs[0], sizeof(ptrs[0]), 0,
                                         cudaMemcpyHostToDevice, stream));
      CHECK_CUDA(cudaMemcpyToSymbolAsync(fdd::fd_trace_merge, &ptrs[1], sizeof(ptrs[1]), 0,
                                         cudaMemcpyHostToDevice, stream));
      launch((2 * r) % sets);
      CHECK_CUDA(cudaMemcpyToSymbolAsync(fdd::fd_trace_attn, &ptrs[2], sizeof(ptrs[2]), 0,
                                         cudaMemcpyHostToDevice, stream));
      CHECK_CUDA(cudaMemcpyToSymbolAsync(fdd::fd_trace_merge, &ptrs[3], sizeof(ptrs[3]), 0,
                                         cudaMemcpyHostToDevice, stream));
      launch((2 * r + 1) % sets);
      CHECK_CUDA(cudaStreamSynchronize(stream));
      Snapshot s1 = read_snapshot(0), s2 = read_snapshot(1);
      drop_stale(s1);
      drop_stale(s2);
      const unsigned long long end1 = last_stamp(s1), o2 = origin_of(s2);
      gap_entry.push_back(ns_diff_us(o2, end1));
      gap_wait.push_back(ns_diff_us(first_stamp_of_point(s2, 1), end1));
      span1.push_back(ns_diff_us(end1, origin_of(s1)));
      span2.push_back(ns_diff_us(last_stamp(s2), o2));
    }
    res.has_pair = true;
    res.pair_gap_entry_us = median(gap_entry);
    res.pair_gap_wait_us = median(gap_wait);
    res.pair_first_span_us = median(span1);
    res.pair_second_span_us = median(span2);
    CHECK_CUDA(cudaFreeHost(ptrs));
  }
  set_trace(nullptr, nullptr);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  for (int i = 0; i < 2; ++i) {
    CHECK_CUDA(cudaFree(tr_attn[i]));
    CHECK_CUDA(cudaFree(tr_merge[i]));
  }
  if (ws) CHECK_CUDA(cudaFree(ws));
  CHECK_CUDA(cudaFree(k));
  CHECK_CUDA(cudaFree(v));
  CHECK_CUDA(cudaFree(q));
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaFree(tables));
  CHECK_CUDA(cudaFree(lens));
  return res;
}

struct TimerInfo {
  double min_step_ns = 0, median_step_ns = 0;
  int steps = 0;
};

TimerInfo measure_timer(cudaStream_t stream) {
  constexpr int n = 256;
  unsigned long long *d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, n * 8));
  timer_steps<<<1, 1, 0, stream>>>(d, n);
  CHECK_CUDA(cudaGetLastError());
  std::vector<unsigned long long> h(n);
  CHECK_CUDA(cudaMemcpyAsync(h.data(), d, n * 8, cudaMemcpyDeviceToHost, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaFree(d));
  std::vector<double> v;
  for (unsigned long long x : h)
    if (x) v.push_back(static_cast<double>(x));
  TimerInfo t;
  t.steps = static_cast<int>(v.size());
  if (!v.empty()) {
    t.min_step_ns = *std::min_element(v.begin(), v.end());
    t.median_step_ns = median(v);
  }
  return t;
}

// ---------------------------------------------------------------------------
// Reports.

std::string stat_json(const Stat &s, double after_w0 = NAN) {
  std::string t = strprintf(
      "{\"n\": %d, \"min_us\": %.3f, \"median_us\": %.3f, \"max_us\": %.3f, \"mean_us\": %.3f", s.n,
      s.min, s.med, s.max, s.mean);
  if (s.n > 0 && !std::isnan(after_w0)) t += strprintf(", \"median_after_w0_us\": %.3f", after_w0);
  return t + "}";
}

void write_json(const std::string &path, const std::vector<Result> &rs, const char *device,
                const TimerInfo &ti) {
  std::string s = strprintf(
      "{\n  \"device\": \"%s\",\n  \"globaltimer_step_ns\": {\"min\": %.0f, \"median\": %.0f, "
      "\"steps\": %d},\n  \"attn_point_order\": [",
      device, ti.min_step_ns, ti.median_step_ns, ti.steps);
  for (int i = 0; i < kAttnPoints; ++i) s += strprintf("%s%d", i ? ", " : "", kAttnOrder[i]);
  s += "],\n  \"cases\": [\n";
  for (size_t i = 0; i < rs.size(); ++i) {
    const Result &r = rs[i];
    s += strprintf(
        "    {\"name\": \"%s\", \"q_heads\": %d, \"kv_heads\": %d, \"batch\": %d, \"ctx\": %d, "
        "\"block_size\": %d, \"splits\": %d, \"tiles_per_split\": %d, "
        "\"kv_MB\": %.1f, \"buffer_sets\": %d, \"launches_per_graph\": %d, \"attn_ctas\": %d, "
        "\"merge_ctas\": %d, \"graph_us\": %.3f, \"graph_p10_us\": %.3f, \"graph_p90_us\": %.3f, "
        "\"graph_traced_us\": %.3f, \"span_us\": %.3f, \"span_min_us\": %.3f, "
        "\"span_max_us\": %.3f, \"attn_end_us\": %.3f, \"stamp_min_step_ns\": %.0f, "
        "\"outputs_finite\": %s, \"sm_MHz\": %.0f, \"w0_us\": %.3f, "
        "\"w0_to_last_stamp_us\": %.3f, \"last_stamp_to_next_w0_us\": %.3f, "
        "\"stale_stamps_dropped\": %d,\n",
        r.c.name, r.c.hq, r.c.hkv, r.c.batch, r.c.ctx, kBlock, r.c.splits, r.c.tiles_per_split,
        r.kv_mb, r.sets, r.launches, r.attn_ctas, r.merge_ctas, r.graph_us, r.graph_p10,
        r.graph_p90, r.graph_traced_us, r.a.span_us, r.span_min, r.span_max, r.a.attn_end_us,
        r.a.min_gran_ns, r.out_finite ? "true" : "false", r.sm_mhz, r.a.w0_us, r.a.end_w0,
        r.graph_us - r.a.end_w0, r.a.stale);
    if (r.has_pair)
      s += strprintf(
          "     \"eager_pair\": {\"gap_end_to_entry_us\": %.3f, \"gap_end_to_wait_us\": %.3f, "
          "\"first_span_us\": %.3f, \"second_span_us\": %.3f},\n",
          r.pair_gap_entry_us, r.pair_gap_wait_us, r.pair_first_span_us, r.pair_second_span_us);
    s += "     \"attn_points\": {";
    for (int j = 0; j < kAttnPoints; ++j) {
      const int p = kAttnOrder[j];
      s += strprintf("%s\"%s\": %s", j ? ", " : "", kAttnNames[p],
                     stat_json(r.a.attn[p], r.a.attn_w0[p]).c_str());
    }
    s += "},\n     \"merge_points\": {";
    for (int p = 0; p < kMergeUsed; ++p)
      s += strprintf("%s\"%s\": %s", p ? ", " : "", kMergeNames[p],
                     stat_json(r.a.merge[p], r.a.merge_w0[p]).c_str());
    s += "},\n     \"stages\": {";
    for (int k = 0; k < kNumStages; ++k)
      s += strprintf("%s\"%s\": %s", k ? ", " : "", kStages[k].name,
                     stat_json(r.a.stage[k]).c_str());
    // Raw stamps of the last traced replay, ns after its earliest entry (-1:
    // not stamped), attention [cta][8] in attn_point_order, merge [cta][3].
    const unsigned long long o = origin_of(r.last);
    auto raw = [&](const std::vector<unsigned long long> &buf, int stride, const int *order,
                   int used) {
      std::string t = "[";
      for (size_t c = 0; c < buf.size() / stride; ++c) {
        t += c ? ",[" : "[";
        for (int j = 0; j < used; ++j) {
          const unsigned long long x = buf[c * stride + (order ? order[j] : j)];
          t += strprintf("%s%lld", j ? "," : "", x ? static_cast<long long>(x - o) : -1ll);
        }
        t += "]";
      }
      return t + "]";
    };
    s += "},\n     \"raw_attn_ns\": " + raw(r.last.attn, kAttnPoints, kAttnOrder, kAttnPoints);
    s += ",\n     \"raw_merge_ns\": " + raw(r.last.merge, kMergePoints, nullptr, kMergeUsed);
    s += strprintf("}%s\n", i + 1 < rs.size() ? "," : "");
  }
  s += "  ]\n}\n";
  fd_bench::write_text(path, s);
}

std::string stat_row(const char *name, const Stat &s, double after_w0 = NAN) {
  const std::string w = std::isnan(after_w0) ? "" : strprintf(" | %.2f", after_w0);
  const std::string e = std::isnan(after_w0) ? "" : " | ";
  if (s.n == 0) return strprintf("| %s | 0 | | | | %s|\n", name, e.c_str());
  return strprintf("| %s | %d | %.2f | %.2f | %.2f | %.2f%s |\n", name, s.n, s.min, s.med, s.max,
                   s.mean, w.c_str());
}

std::string markdown(const std::vector<Result> &rs, const char *device, const TimerInfo &ti) {
  std::string s = strprintf(
      "# Decode timing probe (%s)\n\n"
      "`bench/trace_probe`: decode kernels built with FD_DECODE_TRACE, bf16 (FP8 cases: FP8 "
      "E4M3 K/V, bf16 q and out), head_dim 128, "
      "block 16, token-major, uniform lengths. Per case: CUDA graph of `launches` launches "
      "cycling `sets` K/V buffer sets (> 400 MB); `graph us` = median per-launch time of %d "
      "replays without tracing, `traced us` with tracing on. Stamps (%%globaltimer, thread 0 "
      "of each CTA) are of the graph's last launch, in us after its earliest attention entry "
      "stamp; each number is the median over %d traced replays. `n` = CTAs that stamped the "
      "point. Attention points are listed in time order (0-4, 6, 7, 5): 6 = warp partials in "
      "shared memory, 7 = per-head weights done, 5 = after the output/partial writes. Stages "
      "are per-CTA differences of consecutive points.\n\n"
      "%%globaltimer: smallest step seen by one polling thread %.0f ns, median step %.0f ns "
      "(%d steps).\n\n",
      device, kTimedReplays, kTracedReplays, ti.min_step_ns, ti.median_step_ns, ti.steps);
  for (const Result &r : rs) {
    s += strprintf(
        "## %s\n\n%d q / %d kv heads, batch %d x %d tokens, %d splits x %d tiles, %d attention "
        "CTAs, %d merge CTAs; KV %.1f MB per set, %d sets, %d launches per graph. Graph %.2f us "
        "per launch (p10 %.2f, p90 %.2f), traced %.2f us. Span of the last launch (earliest "
        "entry to last stamp) %.2f us (replays %.2f-%.2f), last attention stamp %.2f us. "
        "Smallest nonzero step between stamps %.0f ns. Outputs finite: %s. SM "
        "clock during a replay %.0f MHz.\n\n"
        "W0 (earliest return from griddepcontrol.wait: the previous kernel complete) at %.2f "
        "us; W0 -> last stamp %.2f us; graph period - that = %.2f us (last stamp -> the next "
        "launch's W0: stores after the last stamp, grid completion, flush, wait release). "
        "Out-of-order stamps dropped (expected 0): %d.\n\n",
        r.c.name, r.c.hq, r.c.hkv, r.c.batch, r.c.ctx, r.c.splits, r.c.tiles_per_split, r.attn_ctas,
        r.merge_ctas, r.kv_mb, r.sets, r.launches, r.graph_us, r.graph_p10, r.graph_p90,
        r.graph_traced_us, r.a.span_us, r.span_min, r.span_max, r.a.attn_end_us, r.a.min_gran_ns,
        r.out_finite ? "yes" : "NO", r.sm_mhz, r.a.w0_us, r.a.end_w0, r.graph_us - r.a.end_w0,
        r.a.stale);
    s += "| point (us after earliest entry) | n | min | median | max | mean | median after W0 |\n"
         "|---|---|---|---|---|---|---|\n";
    for (int p : kAttnOrder) s += stat_row(kAttnNames[p], r.a.attn[p], r.a.attn_w0[p]);
    if (r.merge_ctas > 0)
      for (int p = 0; p < kMergeUsed; ++p)
        s += stat_row(kMergeNames[p], r.a.merge[p], r.a.merge_w0[p]);
    s += "\n| stage (per CTA, us) | n | min | median | max | mean |\n"
         "|---|---|---|---|---|---|\n";
    for (int k = 0; k < kNumStages; ++k)
      if (r.a.stage[k].n > 0) s += stat_row(kStages[k].name, r.a.stage[k]);
    if (r.has_pair)
      s += strprintf(
          "\nEager pair (two stream launches, trace pointers swapped by two 8-byte "
          "cudaMemcpyToSymbolAsync between them; median of %d): first launch span %.2f us, "
          "second %.2f us; first launch's last stamp -> second's earliest entry %.2f us, -> "
          "second's earliest point-1 stamp %.2f us.\n",
          kEagerPairs, r.pair_first_span_us, r.pair_second_span_us, r.pair_gap_entry_us,
          r.pair_gap_wait_us);
    s += "\n";
  }
  return s;
}

}  // namespace

int main(int argc, char **argv) {
  std::string out_dir = ".";
  const int parsed = fd_bench::parse_out_only(
      argc, argv,
      "Stamps the decode kernels' probe points on CUDA device 0 and writes\n"
      "trace_probe.json and trace_probe.md to DIR (default .).\n",
      &out_dir);
  if (parsed >= 0) return parsed;
  cudaDeviceProp prop;
  cudaStream_t stream;
  if (!fd_bench::open_device(&prop, &stream)) return 77;

  const TimerInfo ti = measure_timer(stream);
  printf("%s, %d SMs; %%globaltimer step: min %.0f ns, median %.0f ns (%d steps)\n", prop.name,
         prop.multiProcessorCount, ti.min_step_ns, ti.median_step_ns, ti.steps);
  std::vector<Result> rs;
  for (const Case &c : kCases) {
    rs.push_back(run_case(c, stream));
    const Result &r = rs.back();
    // After W0 (the previous kernel complete), medians over CTAs.
    printf(
        "%-21s graph %6.2f us, %4.0f MHz | after W0: seq_len %5.2f tile0 %5.2f loop %6.2f "
        "partials %6.2f weights %6.2f writes %6.2f (max %6.2f)",
        r.c.name, r.graph_us, r.sm_mhz, r.a.attn_w0[2], r.a.attn_w0[3], r.a.attn_w0[4],
        r.a.attn_w0[6], r.a.attn_w0[7], r.a.attn_w0[kAttnLast], r.a.attn_max_w0);
    if (r.merge_ctas > 0)
      printf(" merge wait %5.2f merge end %5.2f", r.a.merge_w0[1], r.a.merge[2].max - r.a.w0_us);
    printf(" | last stamp %6.2f, to next W0 %5.2f", r.a.end_w0, r.graph_us - r.a.end_w0);
    if (r.has_pair) printf(" | eager gap %5.2f", r.pair_gap_entry_us);
    printf("%s\n", r.out_finite ? "" : "  CHECK FAILED");
  }
  write_json(out_dir + "/trace_probe.json", rs, prop.name, ti);
  fd_bench::write_text(out_dir + "/trace_probe.md", markdown(rs, prop.name, ti));
  CHECK_CUDA(cudaStreamDestroy(stream));
  bool ok = true;
  for (const Result &r : rs) ok = ok && r.out_finite;
  return ok ? 0 : 1;
}
