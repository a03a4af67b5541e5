// Append and fused RoPE + append benchmark (docs/benchmarks.md, "Append and fused
// RoPE + append"). Shape A (32 q heads, 8 KV heads, head_dim 128), block 32,
// bf16, token-major, rows placed in a seeded random permutation of slots.
//
//  - 1, 64, 256 tokens (one layer): time per launch under CUDA-graph replay
//    (100 launches per graph, median of 20 replays, twice) and plain stream
//    launches (median of 200), for: raw append, fused RoPE + append, and a
//    separate RoPE pass (Q and K rotated to scratch) followed by raw append.
//  - 8192 tokens: effective bandwidth (K and V read + written, plus Q read
//    and written for the RoPE forms) as a fraction of a 1 GiB device copy
//    (read + written) measured in the same run; buffers rotate among sets
//    larger than L2.
//  - 8192 tokens into an FP8 E4M3 and into an FP8 E5M2 cache (issue 15): the
//    plain and the fused RoPE + append quantising on the store; bytes: K, V
//    read (bf16) and written (FP8), plus Q read and written for the fused
//    form.
//  - 8192 tokens, each launch shape (AppendLaunch's overrides) side by side,
//    each checked to write the same bytes as the automatic one.
//  - Launches per step (32 layers) and the host time of fd_tx_begin, 32 x
//    fd_tx_write_layer_rope and fd_tx_commit on a CUDA cache for batch 1, 64
//    and 256 (median of 300 steps; the GPU work runs asynchronously).
// Before timing, the fused and separate forms are checked to write identical
// bytes. Writes append_bench.json, append_bench.md and append_bench.svg (a bar
// chart of the fraction of copy) to --out.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "append_launch.hpp"
#include "bench_common.cuh"
#include "flashdec.h"
#include "svg_plot.hpp"

namespace {

using fd_bench::EventTimer;
using fd_bench::hash64;
using fd_bench::strprintf;
using fd_bench::upper_median;  // this benchmark's medians (see bench_common.cuh)

constexpr int HQ = 32, HKV = 8, D = 128, BS = 32;

// One set of buffers for `tokens` tokens of one layer.
struct Set {
  int tokens = 0;
  uint16_t *q = nullptr, *q_out = nullptr, *k = nullptr, *v = nullptr, *k_rot = nullptr;
  uint16_t *kc = nullptr, *vc = nullptr;
  uint8_t *kc8 = nullptr, *vc8 = nullptr;  // FP8 caches of the same geometry
  int32_t *idx = nullptr;                  // block ids, offsets, positions
  int blocks = 0;
};

Set make_set(int tokens, uint64_t seed) {
  Set s;
  s.tokens = tokens;
  s.blocks = (tokens + BS - 1) / BS + 1;
  const size_t qn = size_t(tokens) * HQ * D, kn = size_t(tokens) * HKV * D;
  const size_t cn = size_t(s.blocks) * HKV * BS * D;
  std::vector<uint16_t> h(std::max(qn, cn));
  for (size_t i = 0; i < h.size(); ++i)
    h[i] = uint16_t(0x3c00u ^ (hash64(seed + i) & 0x03ffu));  // ~1..2
  CHECK_CUDA(cudaMalloc(&s.q, qn * 2));
  CHECK_CUDA(cudaMalloc(&s.q_out, qn * 2));
  CHECK_CUDA(cudaMalloc(&s.k, kn * 2));
  CHECK_CUDA(cudaMalloc(&s.v, kn * 2));
  CHECK_CUDA(cudaMalloc(&s.k_rot, kn * 2));
  CHECK_CUDA(cudaMalloc(&s.kc, cn * 2));
  CHECK_CUDA(cudaMalloc(&s.vc, cn * 2));
  CHECK_CUDA(cudaMemcpy(s.q, h.data(), qn * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(s.k, h.data() + 7, kn * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(s.v, h.data() + 11, kn * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(s.kc, 0, cn * 2));
  CHECK_CUDA(cudaMemset(s.vc, 0, cn * 2));
  CHECK_CUDA(cudaMalloc(&s.kc8, cn));
  CHECK_CUDA(cudaMalloc(&s.vc8, cn));
  CHECK_CUDA(cudaMemset(s.kc8, 0, cn));
  CHECK_CUDA(cudaMemset(s.vc8, 0, cn));
  std::vector<int32_t> slots(size_t(s.blocks) * BS), idx(3 * size_t(tokens));
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = int32_t(i);
  for (size_t i = slots.size(); i > 1; --i) std::swap(slots[i - 1], slots[hash64(seed ^ i) % i]);
  for (int t = 0; t < tokens; ++t) {
    idx[t] = slots[t] / BS;
    idx[tokens + t] = slots[t] % BS;
    idx[2 * tokens + t] = int32_t(hash64(seed * 3 + t) % 8192);
  }
  CHECK_CUDA(cudaMalloc(&s.idx, idx.size() * 4));
  CHECK_CUDA(cudaMemcpy(s.idx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
  return s;
}

void free_set(Set &s) {
  for (void *p : {(void *)s.q, (void *)s.q_out, (void *)s.k, (void *)s.v, (void *)s.k_rot,
                  (void *)s.kc, (void *)s.vc, (void *)s.kc8, (void *)s.vc8, (void *)s.idx})
    cudaFree(p);
}

enum Mode { kAppend, kFused, kSeparate, kAppendFp8, kFusedFp8, kAppendE5m2, kFusedE5m2 };
const char *mode_name(int m) {
  switch (m) {
    case kAppend: return "append";
    case kFused: return "fused_rope_append";
    case kSeparate: return "rope_then_append";
    case kAppendFp8: return "append_fp8";
    case kFusedFp8: return "fused_rope_append_fp8";
    case kAppendE5m2: return "append_fp8_e5m2";
    default: return "fused_rope_append_fp8_e5m2";
  }
}
bool is_e5m2(int m) {
  return m == kAppendE5m2 || m == kFusedE5m2;
}
bool is_fp8(int m) {
  return m == kAppendFp8 || m == kFusedFp8 || is_e5m2(m);
}
bool has_q(int m) {
  return m != kAppend && m != kAppendFp8 && m != kAppendE5m2;
}
// Bytes a launch of `mode` moves for `tokens` tokens: K, V read (bf16) and
// written (bf16 or FP8), Q read and written for the RoPE forms.
double mode_bytes(int mode, int tokens) {
  const double kv = double(tokens) * HKV * D * 2 * (2 + (is_fp8(mode) ? 1 : 2));
  return kv + (has_q(mode) ? double(tokens) * HQ * D * 2 * 2 : 0.0);
}

fd::cuda::AppendLaunch base(const Set &s, cudaStream_t stream) {
  fd::cuda::AppendLaunch a;
  a.dtype = FD_DTYPE_BF16;
  a.num_tokens = s.tokens;
  a.num_kv_heads = HKV;
  a.head_dim = D;
  a.rope_base = 10000.f;
  a.k = s.k;
  a.v = s.v;
  a.k_dst = s.kc;
  a.v_dst = s.vc;
  a.stride_block = int64_t(HKV) * BS * D;
  a.stride_head = int64_t(BS) * D;
  a.stride_token = D;
  a.stride_dim = 1;
  a.block_ids = s.idx;
  a.offsets = s.idx + s.tokens;
  a.positions = s.idx + 2 * s.tokens;
  a.stream = stream;
  return a;
}

// A launch shape (AppendLaunch's benchmark-only overrides; all 0: automatic).
struct Shape {
  const char *name;
  int tokens_per_group;
};
const Shape kAuto = {"automatic", 0};

// Enqueues one "launch" of a mode (two kernels for the separate form).
void enqueue(int mode, const Set &s, cudaStream_t stream, const Shape &shape = kAuto) {
  fd::cuda::AppendLaunch a = base(s, stream);
  a.tokens_per_group = shape.tokens_per_group;
  if (is_fp8(mode)) {
    a.cache_dtype = is_e5m2(mode) ? FD_DTYPE_FP8_E5M2 : FD_DTYPE_FP8_E4M3;
    a.k_scale = 0.011f;
    a.v_scale = 0.009f;
    a.k_dst = s.kc8;
    a.v_dst = s.vc8;
  }
  if (!has_q(mode)) {
    CHECK_CUDA(fd::cuda::launch_append(a));
    return;
  }
  a.num_q_heads = HQ;
  a.rotary_dim = D;
  a.q = s.q;
  a.q_out = s.q_out;
  if (mode != kSeparate) {
    CHECK_CUDA(fd::cuda::launch_append(a));
    return;
  }
  // Separate: rotate Q -> q_out and K -> k_rot (contiguous), then append.
  fd::cuda::AppendLaunch r = a;
  r.v = nullptr;
  r.k_dst = s.k_rot;
  r.block_ids = nullptr;
  CHECK_CUDA(fd::cuda::launch_append(r));
  fd::cuda::AppendLaunch w = base(s, stream);
  w.tokens_per_group = shape.tokens_per_group;
  w.k = s.k_rot;
  CHECK_CUDA(fd::cuda::launch_append(w));
}

struct Timing {
  double graph_us[2];  // median per launch, two series
  double stream_us;
};

Timing time_mode(int mode, const std::vector<Set> &sets, int launches, cudaStream_t stream,
                 const Shape &shape = kAuto) {
  EventTimer timer(stream);
  for (int i = 0; i < 5; ++i) enqueue(mode, sets[i % sets.size()], stream, shape);
  cudaGraph_t graph;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < launches; ++i) enqueue(mode, sets[i % sets.size()], stream, shape);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  Timing t;
  for (int series = 0; series < 2; ++series) {
    std::vector<double> v;
    for (int r = 0; r < 20; ++r) {
      const float ms = timer.time_ms([&] { CHECK_CUDA(cudaGraphLaunch(exec, stream)); });
      v.push_back(1000.0 * ms / launches);
    }
    t.graph_us[series] = upper_median(v);
  }
  std::vector<double> v;
  for (int r = 0; r < 200; ++r)
    v.push_back(1000.0 *
                timer.time_ms([&] { enqueue(mode, sets[r % sets.size()], stream, shape); }));
  t.stream_us = upper_median(v);
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  return t;
}

// Fused and separate forms write the same bytes (K cache, V cache, q_out).
bool check_fused_equals_separate(const Set &s, cudaStream_t stream) {
  const size_t cn = size_t(s.blocks) * HKV * BS * D, qn = size_t(s.tokens) * HQ * D;
  std::vector<uint16_t> a(cn), b(cn), qa(qn), qb(qn);
  enqueue(kFused, s, stream);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaMemcpy(a.data(), s.kc, cn * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(qa.data(), s.q_out, qn * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemset(s.kc, 0, cn * 2));
  CHECK_CUDA(cudaMemset(s.q_out, 0, qn * 2));
  enqueue(kSeparate, s, stream);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaMemcpy(b.data(), s.kc, cn * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(qb.data(), s.q_out, qn * 2, cudaMemcpyDeviceToHost));
  size_t nonzero = 0;
  for (uint16_t x : a) nonzero += x != 0;
  return a == b && qa == qb && nonzero >= size_t(s.tokens) * HKV * D / 2;
}

// A launch shape writes the same bytes as the automatic one (K cache, V
// cache, q_out), for the plain and the fused form.
bool check_shape(const Set &s, const Shape &shape, cudaStream_t stream) {
  const size_t cn = size_t(s.blocks) * HKV * BS * D, qn = size_t(s.tokens) * HQ * D;
  bool same = true;
  for (int mode : {kAppend, kFused}) {
    std::vector<uint16_t> out[2][3];
    for (int pass = 0; pass < 2; ++pass) {
      CHECK_CUDA(cudaMemset(s.kc, 0, cn * 2));
      CHECK_CUDA(cudaMemset(s.vc, 0, cn * 2));
      CHECK_CUDA(cudaMemset(s.q_out, 0, qn * 2));
      enqueue(mode, s, stream, pass == 0 ? kAuto : shape);
      CHECK_CUDA(cudaStreamSynchronize(stream));
      const uint16_t *src[3] = {s.kc, s.vc, s.q_out};
      for (int b = 0; b < 3; ++b) {
        out[pass][b].resize(b == 2 ? qn : cn);
        CHECK_CUDA(cudaMemcpy(out[pass][b].data(), src[b], out[pass][b].size() * 2,
                              cudaMemcpyDeviceToHost));
      }
    }
    for (int b = 0; b < 3; ++b) same = same && out[0][b] == out[1][b];
  }
  return same;
}

// The copy ceiling: upper median of the rates of 6 timed 1 GiB copies after
// one warm-up.
double copy_ceiling_gbps(cudaStream_t stream) {
  std::vector<double> rates;
  for (double ms : fd_bench::time_copies_ms(stream, 1, 6)) rates.push_back(fd_bench::copy_gbps(ms));
  return upper_median(rates);
}

__global__ void empty_kernel(fd::cuda::AppendLaunch) {}

// Host time of one bare launch with the append kernel's parameter block: the
// part of a layer write that is the CUDA launch itself.
double bare_launch_us(cudaStream_t stream) {
  fd::cuda::AppendLaunch a;
  std::vector<double> v;
  for (int r = 0; r < 50; ++r) {
    CHECK_CUDA(cudaStreamSynchronize(stream));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 32; ++i) empty_kernel<<<256, 256, 0, stream>>>(a);
    const auto t1 = std::chrono::steady_clock::now();
    v.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 32);
  }
  CHECK_CUDA(cudaGetLastError());
  return upper_median(v);
}

struct HostCost {
  int batch;
  double begin_us, writes_us, commit_us, step_us, per_write_us;
};

// Host time of one step (begin, 32 x write_layer_rope, commit) on a CUDA
// cache; the stream is drained between steps, outside the timed region.
HostCost host_cost(int batch, cudaStream_t stream) {
  const int layers = 32, steps = 300, context = 100;
  fd_cache_config c;
  fd_cache_config_init(&c);
  c.num_layers = layers, c.num_kv_heads = HKV, c.head_dim = D, c.block_size = BS;
  c.dtype = FD_DTYPE_BF16;
  c.max_blocks = uint32_t(batch) * ((context + steps + 10) / BS + 2);
  c.device.type = FD_DEVICE_CUDA;
  fd_cache *cache;
  CHECK_FD(fd_cache_create(&c, &cache));
  std::vector<uint64_t> ids(batch);
  for (int i = 0; i < batch; ++i) {
    ids[i] = uint64_t(i + 1);
    CHECK_FD(fd_cache_add_request(cache, ids[i]));
  }
  void *q, *k, *v, *qo;
  CHECK_CUDA(cudaMalloc(&q, size_t(batch) * HQ * D * 2));
  CHECK_CUDA(cudaMalloc(&qo, size_t(batch) * HQ * D * 2));
  CHECK_CUDA(cudaMalloc(&k, size_t(batch) * HKV * D * 2));
  CHECK_CUDA(cudaMalloc(&v, size_t(batch) * HKV * D * 2));
  CHECK_CUDA(cudaMemset(q, 0, size_t(batch) * HQ * D * 2));
  CHECK_CUDA(cudaMemset(k, 0, size_t(batch) * HKV * D * 2));
  CHECK_CUDA(cudaMemset(v, 0, size_t(batch) * HKV * D * 2));
  using clk = std::chrono::steady_clock;
  auto us = [](clk::time_point a, clk::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  std::vector<double> tb, tw, tc, ts;
  for (int step = 0; step < steps + 20; ++step) {
    CHECK_CUDA(cudaStreamSynchronize(stream));
    fd_tx tx;
    const auto t0 = clk::now();
    CHECK_FD(fd_tx_begin(cache, ids.data(), uint32_t(batch), &tx));
    const auto t1 = clk::now();
    for (int l = 0; l < layers; ++l)
      CHECK_FD(fd_tx_write_layer_rope(cache, tx, uint32_t(l), q, HQ, k, v, D, 10000.f, qo,
                                      reinterpret_cast<fd_stream>(stream)));
    const auto t2 = clk::now();
    CHECK_FD(fd_tx_commit(cache, tx));
    const auto t3 = clk::now();
    if (step < 20) continue;  // warm-up
    tb.push_back(us(t0, t1)), tw.push_back(us(t1, t2)), tc.push_back(us(t2, t3));
    ts.push_back(us(t0, t3));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_FD(fd_cache_async_error(cache));
  fd_cache_destroy(cache);
  for (void *p : {q, qo, k, v}) cudaFree(p);
  HostCost h;
  h.batch = batch;
  h.begin_us = upper_median(tb), h.writes_us = upper_median(tw), h.commit_us = upper_median(tc);
  h.step_us = upper_median(ts), h.per_write_us = h.writes_us / layers;
  return h;
}

}  // namespace

int main(int argc, char **argv) {
  std::string out_dir = ".";
  const int parsed = fd_bench::parse_out_only(
      argc, argv,
      "Times KV append and fused RoPE + append (docs/benchmarks.md) on CUDA device 0 and\n"
      "writes append_bench.json, append_bench.md and append_bench.svg to DIR (default .).\n",
      &out_dir);
  if (parsed >= 0) return parsed;
  cudaDeviceProp prop;
  cudaStream_t stream;
  if (!fd_bench::open_device(&prop, &stream)) return 77;
  const double copy = copy_ceiling_gbps(stream);
  printf("device %s, copy ceiling %.0f GB/s (1 GiB D2D, read + write)\n", prop.name, copy);

  std::string json = fd_bench::json_header(prop.name, copy) +
                     "  \"shape\": \"A q32/kv8/d128, block 32, bf16, token-major\",\n"
                     "  \"kernels\": [\n";
  std::string md = "# Append and fused RoPE + append on " + std::string(prop.name) + "\n\n";
  md += strprintf(
      "Copy ceiling: %.0f GB/s. Shape A (32 q / 8 kv heads, head_dim 128), block 32, bf16, "
      "token-major.\n\n",
      copy);
  md +=
      "| tokens | form | graph us/launch (series 1, 2) | stream us | effective GB/s | fraction of "
      "copy |\n|---|---|---|---|---|---|\n";
  bool first = true, ok = true;
  double fp8_fused_frac = 0, e5m2_fused_frac = 0;  // fused RoPE + append into FP8, 8192 tokens
  std::string shapes_md, shapes_json;
  // The chart (append_bench.svg): fraction of copy per token count and form.
  fd_plot::BarChart chart;
  chart.title = "KV append and fused RoPE + append: effective bandwidth as a fraction of copy";
  chart.note = strprintf(
      "%s; copy ceiling %.0f GB/s (1 GiB D2D, read + write); shape A, block 32, bf16; CUDA-graph "
      "median per launch",
      prop.name, copy);
  chart.x = {
      "effective bandwidth / copy bandwidth (fraction; bytes = K, V read + written, q for "
      "RoPE)",
      0, 1.0};
  chart.groups = {{"append", "#1f77b4"},
                  {"fused RoPE + append", "#2e7d32"},
                  {"RoPE then append", "#ef6c00"},
                  {"append into FP8", "#7b1fa2"},
                  {"fused RoPE + append into FP8", "#00838f"},
                  {"append into FP8 E5M2", "#ad1457"},
                  {"fused RoPE + append into FP8 E5M2", "#5d4037"}};
  chart.marks = {{0.7, "0.7 target (8192 tokens)"}};
  chart.value_decimals = 3;
  for (int tokens : {1, 64, 256, 8192}) {
    // Enough sets to exceed L2 several times for the large case.
    const size_t set_bytes = size_t(tokens) * (2 * HQ + 5 * HKV) * D * 2;
    const int nsets = int(std::min<size_t>(64, std::max<size_t>(2, (400u << 20) / set_bytes + 1)));
    std::vector<Set> sets;
    for (int i = 0; i < nsets; ++i) sets.push_back(make_set(tokens, 1000u * tokens + i));
    if (!check_fused_equals_separate(sets[0], stream)) {
      printf("CHECK FAILED: fused and separate forms differ for %d tokens\n", tokens);
      ok = false;
    }
    const int launches = tokens >= 8192 ? 20 : 100;
    if (tokens == 8192) {
      // Launch shapes of the large call, side by side.
      const Shape shapes[] = {
          {"1 token per CTA", 1}, {"2 tokens per CTA", 2}, {"4 tokens per CTA", 4}, kAuto};
      shapes_md +=
          "\nLaunch shapes at 8192 tokens (graph us per launch, series 1 / 2; fraction of "
          "copy):\n\n| shape | append | fused RoPE + append | RoPE then append | same bytes as "
          "automatic |\n|---|---|---|---|---|\n";
      for (const Shape &shape : shapes) {
        const bool same = check_shape(sets[0], shape, stream);
        ok = ok && same;
        shapes_md += strprintf("| %s |", shape.name);
        for (int mode : {kAppend, kFused, kSeparate}) {
          const Timing t = time_mode(mode, sets, launches, stream, shape);
          const double bytes = double(tokens) * HKV * D * 2 * 4 +
                               (mode == kAppend ? 0.0 : double(tokens) * HQ * D * 2 * 2);
          const double frac = bytes / (t.graph_us[0] * 1e3) / copy;
          shapes_md += strprintf(" %.2f / %.2f (%.3f) |", t.graph_us[0], t.graph_us[1], frac);
          shapes_json += strprintf(
              "%s    {\"shape\": \"%s\", \"tokens_per_group\": %d, "
              "\"form\": \"%s\", \"graph_us_per_launch\": [%.3f, %.3f], "
              "\"fraction_of_copy\": %.3f, \"same_bytes\": %s}",
              shapes_json.empty() ? "" : ",\n", shape.name, shape.tokens_per_group, mode_name(mode),
              t.graph_us[0], t.graph_us[1], frac, same ? "true" : "false");
          printf("shape %-45s %-18s graph %.2f / %.2f us (%.3f of copy)%s\n", shape.name,
                 mode_name(mode), t.graph_us[0], t.graph_us[1], frac, same ? "" : " DIFFERS");
        }
        shapes_md += strprintf(" %s |\n", same ? "yes" : "NO");
      }
    }
    std::vector<int> modes = {kAppend, kFused, kSeparate};
    if (tokens == 8192) modes.insert(modes.end(), {kAppendFp8, kFusedFp8, kAppendE5m2, kFusedE5m2});
    for (int mode : modes) {
      const Timing t = time_mode(mode, sets, launches, stream);
      const double bytes = mode_bytes(mode, tokens);
      const double gbps = bytes / (t.graph_us[0] * 1e3);
      if (mode == kFusedFp8) fp8_fused_frac = gbps / copy;
      if (mode == kFusedE5m2) e5m2_fused_frac = gbps / copy;
      json += strprintf(
          "%s    {\"tokens\": %d, \"form\": \"%s\", \"graph_us_per_launch\": [%.3f, %.3f], "
          "\"stream_us\": %.3f, \"effective_GBps\": %.1f, \"fraction_of_copy\": %.3f}",
          first ? "" : ",\n", tokens, mode_name(mode), t.graph_us[0], t.graph_us[1], t.stream_us,
          gbps, gbps / copy);
      first = false;
      chart.bars.push_back({strprintf("%d tokens, %s", tokens, mode_name(mode)), gbps / copy,
                            static_cast<size_t>(mode)});
      md += strprintf("| %d | %s | %.2f, %.2f | %.2f | %.0f | %.3f |\n", tokens, mode_name(mode),
                      t.graph_us[0], t.graph_us[1], t.stream_us, gbps, gbps / copy);
      printf("%5d tokens %-18s graph %.2f / %.2f us  stream %.2f us  %.0f GB/s (%.3f of copy)\n",
             tokens, mode_name(mode), t.graph_us[0], t.graph_us[1], t.stream_us, gbps, gbps / copy);
    }
    for (Set &s : sets) free_set(s);
  }
  json += "\n  ],\n  \"shapes_8192\": [\n" + shapes_json;
  md += strprintf(
      "\nFused RoPE + append into FP8 E4M3 at 8192 tokens (bytes: K, V read as bf16 and written "
      "as FP8, Q read and written): %.3f of copy (target >= 0.75: %s).\n",
      fp8_fused_frac, fp8_fused_frac >= 0.75 ? "met" : "NOT met");
  md += strprintf("Into FP8 E5M2: %.3f of copy (target >= 0.75: %s).\n", e5m2_fused_frac,
                  e5m2_fused_frac >= 0.75 ? "met" : "NOT met");
  printf("fused RoPE + append into FP8, 8192 tokens: %.3f of copy (E5M2 %.3f; target >= 0.75)\n",
         fp8_fused_frac, e5m2_fused_frac);
  md += shapes_md;
  json +=
      "\n  ],\n  \"launches_per_step_32_layers\": {\"fused\": 32, \"separate\": 64, "
      "\"row_uploads\": 1, \"table_exports\": 1},\n  \"host_cost\": [\n";
  md +=
      "\nLaunches per step (32 layers): fused 32 kernels; separate RoPE + append 64 kernels; "
      "plus one row upload per transaction (first write) and one block-table export "
      "(fd_tx_block_tables_async: 2 copies).\n\n";
  const double bare = bare_launch_us(stream);
  json.insert(json.rfind("\"host_cost\""), strprintf("\"bare_launch_us\": %.2f,\n  ", bare));
  md += strprintf(
      "A bare kernel launch with the same parameter block costs %.2f us of host time; "
      "the last column subtracts 32 of them.\n\n",
      bare);
  printf("bare launch %.2f us\n", bare);
  md +=
      "| batch | begin us | 32 writes us | per write us | commit us | step us | step without "
      "launches us |\n|---|---|---|---|---|---|---|\n";
  first = true;
  for (int batch : {1, 64, 256}) {
    const HostCost h = host_cost(batch, stream);
    json += strprintf(
        "%s    {\"batch\": %d, \"layers\": 32, \"begin_us\": %.2f, \"writes_us\": %.2f, "
        "\"per_write_us\": %.2f, \"commit_us\": %.2f, \"step_us\": %.2f}",
        first ? "" : ",\n", batch, h.begin_us, h.writes_us, h.per_write_us, h.commit_us, h.step_us);
    first = false;
    md += strprintf("| %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", batch, h.begin_us,
                    h.writes_us, h.per_write_us, h.commit_us, h.step_us, h.step_us - 32 * bare);
    printf(
        "host cost batch %3d: begin %.2f us, 32 writes %.2f us (%.2f each), commit %.2f us, "
        "step %.2f us\n",
        batch, h.begin_us, h.writes_us, h.per_write_us, h.commit_us, h.step_us);
  }
  json += "\n  ],\n  \"fused_equals_separate\": " + std::string(ok ? "true" : "false") + "\n}\n";
  fd_bench::write_text(out_dir + "/append_bench.json", json);
  fd_bench::write_text(out_dir + "/append_bench.md", md);
  std::string error;
  if (!fd_plot::write_file(out_dir + "/append_bench.svg", fd_plot::render(chart), &error))
    fprintf(stderr, "append_bench: %s\n", error.c_str());
  CHECK_CUDA(cudaStreamDestroy(stream));
  return ok ? 0 : 1;
}
