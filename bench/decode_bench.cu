// Decode-kernel benchmark (docs/benchmarks.md, "Decode kernel grid").
//
// For every case: seeded random data on the GPU (q = 3*N(0,1), K/V N(0,1)),
// physical blocks in a seeded random permutation, enough K/V buffer sets to
// exceed 400 MB, a correctness check of fd_decode against an FP32 GPU
// reference (output poisoned with NaN first), then timing: CUDA-graph replays
// of many launches cycling the sets (median of replays / launches, twice) and
// plain stream launches (median of 50). The copy ceiling (1 GiB device-to-
// device copy, bytes read + written) is measured in the same run. Writes
// decode_bench.json, decode_bench.md and decode_bench.svg to --out.
//
// Usage: decode_bench [--out DIR] [--quick] [--explore] [--verify] [--prefill]
//                     [--kv fp8|fp8_e5m2] [--plan-lengths] [--contiguous-blocks] [--splits N]
//                     [--filter A,B,...]
// --kv fp8 (issue 15): instead of the grid, every shape and batch of the grid
// with FP8 E4M3 K/V (bf16 q, block 16, token-major; shape A also dim-major
// and f16 q), each beside the same case with bf16 K/V run just before it:
// time, fraction of copy counting FP8 bytes, and FP8 time / bf16 time.
// --kv fp8_e5m2: the same with FP8 E5M2 K/V.
// --variants (issue 16): instead of the grid, the attention variants and the
// new head dims, each variant case beside its plain twin in the same run:
// soft-cap and sinks on the grid's large cases (target <= 3% slower), a
// 4096-token sliding window over 32768-token rows against plain 4096-token
// rows (batch 64: within 15%; batch 1: <= 1.15x), head_dim 256 (32/8 and
// 16/8 heads) and 96 (32/32) at batch 32 and 64 (>= 0.95 of copy).
// --prefill adds the multi-token cases of issue 14 (chunked prefill: causal
// chunks timed in TFLOP/s over the visible (query, key) pairs; a mixed batch
// of decode rows and prefill chunks against the two parts run separately).
// --plan-lengths: every case planned by fd_decode_plan_create with its rows'
// lengths (as an engine step plans; case names end in "lens") and run by
// fd_decode_run, instead of fd_decode planning from max_seq_len_hint.
// (or `flashdec bench ...`: the CLI links this file's fd_decode_bench_main).
// --filter keeps the cases whose name contains one of the comma-separated
// substrings, '_' standing for a space (for short iteration runs; the
// targets are then partial).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "bench_common.cuh"
#include "decode_bench.hpp"
#include "flashdec.h"
#include "svg_plot.hpp"

namespace {

using fd_bench::EventTimer;
using fd_bench::median;
using fd_bench::mix64;
using fd_bench::percentile;
using fd_bench::splitmix;

// ---------------------------------------------------------------------------
// Device helpers: random fill, FP32 reference.

__device__ float to_f32(uint16_t bits, bool bf16) {
  if (bf16) return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  return __half2float(__ushort_as_half(bits));
}

// Element i of a seeded N(0, scale^2) sequence (Box-Muller).
__device__ float normal_at(uint64_t seed, size_t i, float scale) {
  const uint64_t a = mix64(seed ^ (i * 0x9e3779b97f4a7c15ull));
  const uint64_t b = mix64(a + 0x632be59bd9b4e019ull);
  const float u1 = fmaxf((a >> 40) * (1.0f / 16777216.0f), 1e-7f);
  const float u2 = (b >> 40) * (1.0f / 16777216.0f);
  return scale * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

__global__ void fill_normal(uint16_t *dst, size_t n, uint64_t seed, float scale, bool bf16) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float x = normal_at(seed, i, scale);
    dst[i] =
        bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
  }
}

// The conversion's name for an FP8 K/V type (FD_DTYPE_FP8_E4M3 / _E5M2).
__host__ __device__ __nv_fp8_interpretation_t fp8_kind(int32_t fp8) {
  return fp8 == FD_DTYPE_FP8_E5M2 ? __NV_E5M2 : __NV_E4M3;
}

// FP8 codes (of type `fp8`) of scale * N(0,1) / kv_scale (the cache's
// stored values).
__global__ void fill_fp8(uint8_t *dst, size_t n, uint64_t seed, float scale, float kv_scale,
                         int32_t fp8) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] =
        __nv_cvt_float_to_fp8(normal_at(seed, i, scale) / kv_scale, __NV_SATFINITE, fp8_kind(fp8));
}

// Element i of a K/V pool: 16-bit (bf16 / f16 as q; fp8 0) or FP8 of type
// `fp8` times its scale.
__device__ float kv_f32(const void *base, int64_t i, int32_t fp8, float scale, bool bf16) {
  if (fp8 != 0) {
    const __half_raw h =
        __nv_cvt_fp8_to_halfraw(static_cast<const uint8_t *>(base)[i], fp8_kind(fp8));
    return __half2float(__half(h)) * scale;
  }
  return to_f32(static_cast<const uint16_t *>(base)[i], bf16);
}

struct RefArgs {
  const uint16_t *q;
  const void *k, *v;
  int32_t kv_fp8;  // FD_DTYPE_FP8_E4M3 / _E5M2, or 0 (16-bit K/V)
  float k_scale, v_scale;
  const int32_t *tables;
  const int32_t *tok_row;  // [query token] its row
  const int32_t *tok_len;  // [query token] keys it sees (causal)
  const float *sinks;      // [hq] sink logits, or null
  float *scores;           // [batch * hq, max_len]
  float *out;              // [batch * hq, D]
  int64_t sb, sh, st, sd;
  int hq, hkv, dim, bs, mbps, max_len;
  float scale;
  float softcap;  // 0: none
  int window;     // 0: none
  bool bf16;
};

// One CTA per (query token, q head): scores, max, exp and sum, then P V, all
// FP32. Query token j of a row of q_len tokens and seq_len keys sees
// seq_len - q_len + j + 1 of them (causal).
__global__ void reference_kernel(RefArgs a) {
  __shared__ float red[256];
  const int rh = blockIdx.x, token = rh / a.hq, h = rh % a.hq, kvh = h / (a.hq / a.hkv);
  const int row = a.tok_row[token], len = a.tok_len[token];
  // Sliding window: the token (at position len - 1) sees len - window .. len - 1.
  const int lo = a.window > 0 && len > a.window ? len - a.window : 0;
  const uint16_t *q = a.q + static_cast<int64_t>(rh) * a.dim;
  float *sc = a.scores + static_cast<int64_t>(rh) * a.max_len;
  auto at = [&](int t, int d) {
    const int64_t blk = a.tables[static_cast<int64_t>(row) * a.mbps + t / a.bs];
    return blk * a.sb + kvh * a.sh + (t % a.bs) * a.st + d * a.sd;
  };
  const float sink = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
  float mx = sink;
  for (int t = lo + threadIdx.x; t < len; t += blockDim.x) {
    float s = 0.f;
    for (int d = 0; d < a.dim; ++d)
      s += to_f32(q[d], a.bf16) * kv_f32(a.k, at(t, d), a.kv_fp8, a.k_scale, a.bf16);
    s *= a.scale;
    if (a.softcap > 0.f) s = a.softcap * tanhf(s / a.softcap);
    sc[t] = s;
    mx = fmaxf(mx, s);
  }
  red[threadIdx.x] = mx;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + w]);
    __syncthreads();
  }
  mx = red[0];
  __syncthreads();
  float sum = 0.f;
  for (int t = lo + threadIdx.x; t < len; t += blockDim.x) {
    const float p = expf(sc[t] - mx);
    sc[t] = p;
    sum += p;
  }
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  sum = red[0] + (sink > -INFINITY ? expf(sink - mx) : 0.f);
  __syncthreads();
  // Two token halves per dim, then combine.
  const int d = threadIdx.x % a.dim, part = threadIdx.x / a.dim, parts = blockDim.x / a.dim;
  float acc = 0.f;
  for (int t = lo + part; t < len && part < parts; t += parts)
    acc += sc[t] * kv_f32(a.v, at(t, d), a.kv_fp8, a.v_scale, a.bf16);
  red[threadIdx.x] = acc;
  __syncthreads();
  if (part == 0) {
    float total = 0.f;
    for (int p = 0; p < parts; ++p) total += red[p * a.dim + d];
    a.out[static_cast<int64_t>(rh) * a.dim + d] = len > 0 ? total / sum : 0.f;
  }
}

// ---------------------------------------------------------------------------
// Host side.

struct Shape {
  const char *name;
  int hq, hkv, dim;
};
const Shape kShapes[] = {
    {"A", 32, 8, 128}, {"B", 32, 32, 128}, {"C", 16, 2, 128}, {"D", 32, 4, 64}};
// --variants: the new head dims (Gemma: 256, Phi-3: 96).
const Shape kWideShapes[] = {
    {"G 32/8 D256", 32, 8, 256}, {"G 16/8 D256", 16, 8, 256}, {"P 32/32 D96", 32, 32, 96}};

struct BatchCtx {
  int batch, ctx;  // ctx 0: ragged
};
const BatchCtx kGrid[] = {{1, 32768}, {1, 2048},   {8, 8192},   {32, 4096},
                          {64, 4096}, {128, 2048}, {256, 1024}, {64, 0}};

struct Spec {
  Shape shape;
  BatchCtx bc;
  int32_t dtype;
  int bs;
  int32_t layout;
  int32_t num_splits = 0;  // 0: automatic
  int q_len = 1;           // query tokens per row (speculative verify: --verify)
  // --prefill cases: per-row lengths and query tokens (both or neither; the
  // batch is their size), and what the case is in the prefill table.
  std::vector<int32_t> row_lens = {};
  std::vector<int32_t> row_q_lens = {};
  const char *tag = "";
  // --kv fp8 / fp8_e5m2: FD_DTYPE_FP8_E4M3 / _E5M2 K/V (q and out of
  // `dtype`); 0: K/V of `dtype`.
  int32_t kv_fp8 = 0;
  // --plan-lengths: planned by fd_decode_plan_create with the rows' lengths
  // (as an engine step plans) and run by fd_decode_run, instead of fd_decode.
  bool plan_lengths = false;
  // --contiguous-blocks: each row's blocks consecutive in the pool instead of
  // a random permutation (what paging costs against dense K/V).
  bool contiguous = false;
  // --variants: the attention variant (S2.3) and the case it is compared with.
  float softcap = 0.f;
  int32_t window = 0;
  bool sinks = false;
  bool has_twin = false;  // compared with the plain case of the same shape and twin_bc
  BatchCtx twin_bc = {0, 0};
  int twin = -1;  // index of that case among the results (-1: not run)
};

// Query tokens of row r and whether the case passes q_indptr.
int row_q_len(const Spec &s, int r) {
  return s.row_q_lens.empty() ? s.q_len : s.row_q_lens[static_cast<size_t>(r)];
}
int max_q_len(const Spec &s) {
  return s.row_q_lens.empty() ? s.q_len
                              : *std::max_element(s.row_q_lens.begin(), s.row_q_lens.end());
}
bool uses_indptr(const Spec &s) {
  if (s.row_q_lens.empty()) return s.q_len > 1;
  return *std::max_element(s.row_q_lens.begin(), s.row_q_lens.end()) > 1;
}

struct Result {
  Spec spec;
  std::vector<int32_t> lens;
  int splits = 0;
  int sets = 0, launches_per_graph = 0;
  double kv_bytes = 0, eff_bytes = 0;
  double median_us = 0, p10_us = 0, p90_us = 0, repeat_median_us = 0, stream_median_us = 0;
  double eff_gbps = 0, fraction = 0, rel_error = 0;
  double flops = 0, tflops = 0;  // causal: 4 * head_dim per visible (query, key) pair and q head
  bool ok = true;
  double bf16_us = 0;  // --kv fp8: the same case with 16-bit K/V, run just before
  double twin_us = 0;  // --variants: the plain case it is compared with
};

// The copy ceiling: median of 10 timed 1 GiB copies after 3 warm-ups.
double measure_copy_gbps(cudaStream_t stream) {
  return fd_bench::copy_gbps(median(fd_bench::time_copies_ms(stream, 3, 10)));
}

std::string dtype_str(int32_t d) {
  return d == FD_DTYPE_F16 ? "fp16" : "bf16";
}
std::string layout_str(int32_t l) {
  return l == FD_LAYOUT_DIM_MAJOR ? "dim" : "token";
}
std::string ctx_str(const BatchCtx &bc) {
  return bc.ctx ? std::to_string(bc.ctx) : std::string("ragged");
}

Result run_case(const Spec &spec, cudaStream_t stream, double copy_gbps) {
  Result res;
  res.spec = spec;
  const Shape &sh = spec.shape;
  const int B = spec.row_lens.empty() ? spec.bc.batch : static_cast<int>(spec.row_lens.size());
  const int bs = spec.bs, D = sh.dim, H = sh.hkv, HQ = sh.hq;
  const bool bf16 = spec.dtype == FD_DTYPE_BF16;
  // Lengths: per row, uniform, or ragged from [128, 8192] with seed 0.
  uint64_t seed = 0;
  for (int r = 0; r < B; ++r)
    res.lens.push_back(!spec.row_lens.empty() ? spec.row_lens[static_cast<size_t>(r)]
                       : spec.bc.ctx
                           ? spec.bc.ctx
                           : 128 + static_cast<int32_t>(splitmix(seed) % (8192 - 128 + 1)));
  const int max_len = !spec.row_lens.empty()
                          ? *std::max_element(spec.row_lens.begin(), spec.row_lens.end())
                      : spec.bc.ctx ? spec.bc.ctx
                                    : 8192;
  // Query tokens: row r's are indptr[r] .. indptr[r + 1] - 1; per token its
  // row and the keys it sees (the reference's causal limits).
  std::vector<int32_t> host_indptr(1, 0), tok_row, tok_len;
  int QL = 1;  // the longest row's query tokens (max_q_len_hint)
  for (int r = 0; r < B; ++r) {
    const int n = row_q_len(spec, r);
    QL = std::max(QL, n);
    host_indptr.push_back(host_indptr.back() + n);
    for (int j = 0; j < n; ++j) {
      tok_row.push_back(r);
      tok_len.push_back(res.lens[static_cast<size_t>(r)] - n + j + 1);
      res.flops += 4.0 * D * HQ * tok_len.back();
    }
  }
  const int64_t q_tokens = host_indptr.back();
  const int mbps = (max_len + bs - 1) / bs;
  int64_t blocks_per_set = 0, tokens = 0;
  // Bytes count the tokens attended: with a window, the last `window` of a
  // (one-query) row.
  for (int32_t l : res.lens)
    blocks_per_set += (l + bs - 1) / bs,
        tokens += spec.window > 0 ? std::min<int32_t>(l, spec.window) : l;
  const double elem = spec.kv_fp8 ? 1.0 : 2.0;  // K/V bytes per element
  const int64_t block_elems = static_cast<int64_t>(H) * bs * D;
  const double set_bytes = 2.0 * static_cast<double>(blocks_per_set * block_elems) * elem;
  int sets = static_cast<int>(std::ceil(420e6 / set_bytes));
  sets = std::max(1, std::min(sets, 512));
  res.sets = sets;
  const int64_t total_blocks = blocks_per_set * sets;
  res.kv_bytes = static_cast<double>(tokens) * H * D * 2 * elem;
  const double qo_bytes = 2.0 * static_cast<double>(q_tokens) * HQ * D * 2.0;
  res.eff_bytes = res.kv_bytes + qo_bytes;

  // Buffers: one K/V pool, per-set q/out/tables, shared lens and workspace.
  void *k = nullptr, *v = nullptr;
  uint16_t *q = nullptr, *out = nullptr;
  int32_t *tables = nullptr, *lens = nullptr;
  const size_t pool = static_cast<size_t>(total_blocks * block_elems);
  const size_t qn = static_cast<size_t>(q_tokens) * HQ * D;
  CHECK_CUDA(cudaMalloc(&k, pool * static_cast<size_t>(elem)));
  CHECK_CUDA(cudaMalloc(&v, pool * static_cast<size_t>(elem)));
  CHECK_CUDA(cudaMalloc(&q, qn * 2 * sets));
  CHECK_CUDA(cudaMalloc(&out, qn * 2 * sets));
  CHECK_CUDA(cudaMalloc(&tables, static_cast<size_t>(B) * mbps * 4 * sets));
  CHECK_CUDA(cudaMalloc(&lens, static_cast<size_t>(B) * 4));
  // FP8: N(0,1) stored with scale 1/112 (|x| up to 4 uses E4M3's range;
  // E5M2, whose precision does not depend on the scale, takes the same).
  const float kv_scale = spec.kv_fp8 ? 1.f / 112.f : 1.f;
  if (spec.kv_fp8) {
    fill_fp8<<<2048, 256, 0, stream>>>(static_cast<uint8_t *>(k), pool, 11, 1.f, kv_scale,
                                       spec.kv_fp8);
    fill_fp8<<<2048, 256, 0, stream>>>(static_cast<uint8_t *>(v), pool, 12, 1.f, kv_scale,
                                       spec.kv_fp8);
  } else {
    fill_normal<<<2048, 256, 0, stream>>>(static_cast<uint16_t *>(k), pool, 11, 1.f, bf16);
    fill_normal<<<2048, 256, 0, stream>>>(static_cast<uint16_t *>(v), pool, 12, 1.f, bf16);
  }
  fill_normal<<<256, 256, 0, stream>>>(q, qn * sets, 13, 3.f, bf16);
  CHECK_CUDA(cudaGetLastError());
  // Physical blocks: a seeded random permutation of the whole pool.
  std::vector<int32_t> perm(static_cast<size_t>(total_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  uint64_t pseed = 1234;
  if (!spec.contiguous)
    for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[splitmix(pseed) % i]);
  std::vector<int32_t> host_tables(static_cast<size_t>(B) * mbps * sets, -1);
  size_t next = 0;
  for (int s = 0; s < sets; ++s)
    for (int r = 0; r < B; ++r)
      for (int b = 0; b < (res.lens[r] + bs - 1) / bs; ++b)
        host_tables[(static_cast<size_t>(s) * B + r) * mbps + b] = perm[next++];
  CHECK_CUDA(
      cudaMemcpy(tables, host_tables.data(), host_tables.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(lens, res.lens.data(), res.lens.size() * 4, cudaMemcpyHostToDevice));

  fd_decode_params base;
  fd_decode_params_init(&base);
  base.q_dtype = base.kv_dtype = base.out_dtype = spec.dtype;
  if (spec.kv_fp8) {
    base.kv_dtype = spec.kv_fp8;
    base.k_scale = base.v_scale = kv_scale;
  }
  base.layout = spec.layout;
  base.batch = static_cast<uint32_t>(B);
  base.num_q_heads = static_cast<uint32_t>(HQ);
  base.num_kv_heads = static_cast<uint32_t>(H);
  base.head_dim = static_cast<uint32_t>(D);
  base.block_size = static_cast<uint32_t>(bs);
  base.num_blocks = static_cast<uint32_t>(total_blocks);
  base.max_blocks_per_seq = static_cast<uint32_t>(mbps);
  base.k_cache = k;
  base.v_cache = v;
  base.seq_lens = lens;
  base.max_seq_len_hint = max_len;
  base.num_splits = spec.num_splits;
  base.logit_softcap = spec.softcap;
  base.sliding_window = spec.window;
  float *sinks = nullptr;
  if (spec.sinks) {
    // Seeded sink logits around the scores' scale (N(0, 2^2)).
    std::vector<float> host_sinks(static_cast<size_t>(HQ));
    uint64_t sseed = 77;
    for (float &x : host_sinks)
      x = 4.f * static_cast<float>(splitmix(sseed) >> 40) / 16777216.f - 2.f;
    CHECK_CUDA(cudaMalloc(&sinks, host_sinks.size() * 4));
    CHECK_CUDA(cudaMemcpy(sinks, host_sinks.data(), host_sinks.size() * 4, cudaMemcpyHostToDevice));
    base.sinks = sinks;
  }
  base.device.type = FD_DEVICE_CUDA;
  base.stream = reinterpret_cast<fd_stream>(stream);
  base.q = q;
  base.out = out;
  base.block_tables = tables;
  int32_t *indptr = nullptr;
  if (uses_indptr(spec)) {
    CHECK_CUDA(cudaMalloc(&indptr, host_indptr.size() * 4));
    CHECK_CUDA(
        cudaMemcpy(indptr, host_indptr.data(), host_indptr.size() * 4, cudaMemcpyHostToDevice));
    base.q_indptr = indptr;
    base.max_q_len_hint = QL;
  }
  size_t ws_bytes = 0;
  fd_decode_plan *plan = nullptr;
  if (spec.plan_lengths) {
    // Planned without a workspace: the plan splits as it sees fit and says
    // what every run needs.
    CHECK_FD(fd_decode_plan_create(&base, res.lens.data(), &plan));
    CHECK_FD(fd_decode_plan_workspace_size(plan, &ws_bytes));
  } else {
    CHECK_FD(fd_decode_workspace_size(&base, &ws_bytes));
  }
  auto decode = [&](const fd_decode_params &p) {
    return plan != nullptr ? fd_decode_run(plan, &p) : fd_decode(&p);
  };
  void *ws = nullptr;
  if (ws_bytes) CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
  base.workspace = ws;
  base.workspace_size = ws_bytes;
  res.splits =
      ws_bytes ? static_cast<int>(ws_bytes / (static_cast<size_t>(B) * QL * HQ * (D + 2) * 4)) : 1;
  auto params_for_set = [&](int s) {
    fd_decode_params p = base;
    p.q = q + qn * s;
    p.out = out + qn * s;
    p.block_tables = tables + static_cast<size_t>(s) * B * mbps;
    return p;
  };

  // Correctness of set 0 against the FP32 reference.
  {
    float *ref = nullptr, *scores = nullptr;
    int32_t *dev_tok = nullptr;
    CHECK_CUDA(cudaMalloc(&ref, qn * 4));
    CHECK_CUDA(cudaMalloc(&scores, static_cast<size_t>(q_tokens) * HQ * max_len * 4));
    CHECK_CUDA(cudaMalloc(&dev_tok, static_cast<size_t>(q_tokens) * 2 * 4));
    CHECK_CUDA(cudaMemcpy(dev_tok, tok_row.data(), tok_row.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(
        cudaMemcpy(dev_tok + q_tokens, tok_len.data(), tok_len.size() * 4, cudaMemcpyHostToDevice));
    RefArgs a;
    a.q = q, a.k = k, a.v = v, a.tables = tables, a.scores = scores, a.out = ref;
    a.kv_fp8 = spec.kv_fp8, a.k_scale = a.v_scale = kv_scale;
    a.tok_row = dev_tok, a.tok_len = dev_tok + q_tokens;
    if (spec.layout == FD_LAYOUT_TOKEN_MAJOR)
      a.sb = block_elems, a.sh = static_cast<int64_t>(bs) * D, a.st = D, a.sd = 1;
    else
      a.sb = block_elems, a.sh = static_cast<int64_t>(bs) * D, a.st = 1, a.sd = bs;
    a.hq = HQ, a.hkv = H, a.dim = D, a.bs = bs, a.mbps = mbps, a.max_len = max_len;
    a.scale = 1.0f / std::sqrt(static_cast<float>(D));
    a.sinks = sinks;
    a.softcap = spec.softcap;
    a.window = spec.window;
    a.bf16 = bf16;
    reference_kernel<<<static_cast<unsigned>(q_tokens * HQ), 256, 0, stream>>>(a);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemsetAsync(out, 0xff, qn * 2, stream));
    fd_decode_params p = params_for_set(0);
    CHECK_FD(decode(p));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    std::vector<float> r(qn);
    std::vector<uint16_t> o(qn);
    CHECK_CUDA(cudaMemcpy(r.data(), ref, qn * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(o.data(), out, qn * 2, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int64_t rh = 0; rh < q_tokens * HQ; ++rh) {
      double num = 0, den = 0;
      for (int d = 0; d < D; ++d) {
        const uint16_t bits = o[static_cast<size_t>(rh) * D + d];
        float g;
        if (bf16) {
          uint32_t u = static_cast<uint32_t>(bits) << 16;
          memcpy(&g, &u, 4);
        } else {
          __half_raw hr;
          hr.x = bits;
          g = __half2float(__half(hr));
        }
        if (!std::isfinite(g)) res.ok = false;
        const double e = r[static_cast<size_t>(rh) * D + d];
        num += (g - e) * (g - e);
        den += e * e;
      }
      worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
    }
    res.rel_error = worst;
    // FP8 K/V (against the dequantised values): the f16 P of the PV mma.
    if (!(worst <= (bf16 || spec.kv_fp8 ? 5e-3 : 1e-3))) res.ok = false;
    CHECK_CUDA(cudaFree(ref));
    CHECK_CUDA(cudaFree(scores));
    CHECK_CUDA(cudaFree(dev_tok));
  }

  {
    EventTimer timer(stream);
    // Plain stream launches: the host call and the kernel, GPU idle before.
    {
      std::vector<double> t;
      for (int i = 0; i < 60; ++i) {
        fd_decode_params p = params_for_set(i % sets);
        CHECK_CUDA(cudaStreamSynchronize(stream));
        const float ms = timer.time_ms([&] { CHECK_FD(decode(p)); });
        if (i >= 10) t.push_back(ms * 1e3);
      }
      res.stream_median_us = median(t);
    }
    // CUDA graph of many launches cycling through the sets.
    {
      int launches = std::max(sets, 20);
      launches = (launches + sets - 1) / sets * sets;
      res.launches_per_graph = launches;
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < launches; ++i) {
        fd_decode_params p = params_for_set(i % sets);
        CHECK_FD(decode(p));
      }
      CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
      CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      for (int i = 0; i < 3; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
      std::vector<double> rounds[2];
      for (int round = 0; round < 2; ++round)
        for (int i = 0; i < 10; ++i) {
          const float ms = timer.time_ms([&] { CHECK_CUDA(cudaGraphLaunch(exec, stream)); });
          rounds[round].push_back(ms * 1e3 / launches);
        }
      res.median_us = median(rounds[0]);
      res.p10_us = percentile(rounds[0], 0.1);
      res.p90_us = percentile(rounds[0], 0.9);
      res.repeat_median_us = median(rounds[1]);
      CHECK_CUDA(cudaGraphExecDestroy(exec));
      CHECK_CUDA(cudaGraphDestroy(graph));
    }
  }
  res.eff_gbps = res.eff_bytes / (res.median_us * 1e-6) / 1e9;
  res.tflops = res.flops / (res.median_us * 1e-6) / 1e12;
  res.fraction = res.eff_gbps / copy_gbps;
  CHECK_CUDA(cudaFree(k));
  CHECK_CUDA(cudaFree(v));
  CHECK_CUDA(cudaFree(q));
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaFree(tables));
  CHECK_CUDA(cudaFree(lens));
  if (ws) CHECK_CUDA(cudaFree(ws));
  fd_decode_plan_destroy(plan);
  if (indptr) CHECK_CUDA(cudaFree(indptr));
  if (sinks) CHECK_CUDA(cudaFree(sinks));
  return res;
}

// The JSON `kv_dtype` of a case.
const char *kv_dtype_str(const Spec &s) {
  if (s.kv_fp8 == 0) return "as dtype";
  return s.kv_fp8 == FD_DTYPE_FP8_E5M2 ? "fp8_e5m2" : "fp8_e4m3";
}

std::string case_name(const Result &r) {
  const Spec &s = r.spec;
  char buf[160];
  if (s.tag[0] != '\0') {
    snprintf(buf, sizeof buf, "%s %s %s bs%d %s", s.shape.name, s.tag, dtype_str(s.dtype).c_str(),
             s.bs, layout_str(s.layout).c_str());
    return buf;
  }
  std::string variant;
  if (s.softcap > 0.f) variant += " softcap" + std::to_string(static_cast<int>(s.softcap));
  if (s.window > 0) variant += " window" + std::to_string(s.window);
  if (s.sinks) variant += " sinks";
  snprintf(buf, sizeof buf, "%s %dx%s %s%s bs%d %s%s%s%s", s.shape.name, s.bc.batch,
           ctx_str(s.bc).c_str(), dtype_str(s.dtype).c_str(),
           s.kv_fp8 ? (s.kv_fp8 == FD_DTYPE_FP8_E5M2 ? " kv-e5m2" : " kv-fp8") : "", s.bs,
           layout_str(s.layout).c_str(),
           s.num_splits ? (" splits=" + std::to_string(s.num_splits)).c_str() : "",
           s.q_len > 1 ? (" q" + std::to_string(s.q_len)).c_str() : "",
           (variant + (s.plan_lengths ? " lens" : "") + (s.contiguous ? " contig" : "")).c_str());
  return buf;
}

void write_json(const std::string &path, const std::vector<Result> &rs, double copy_gbps,
                const char *device) {
  FILE *f = fopen(path.c_str(), "w");
  if (!f) return;
  fprintf(f, "%s  \"cases\": [\n", fd_bench::json_header(device, copy_gbps).c_str());
  for (size_t i = 0; i < rs.size(); ++i) {
    const Result &r = rs[i];
    const auto mm = std::minmax_element(r.lens.begin(), r.lens.end());
    const double mean =
        std::accumulate(r.lens.begin(), r.lens.end(), 0.0) / static_cast<double>(r.lens.size());
    fprintf(f,
            "    {\"shape\": \"%s\", \"q_heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, "
            "\"batch\": %d, \"q_len\": %d, \"context\": \"%s\", \"seq_lens\": {\"min\": %d, "
            "\"max\": %d, "
            "\"mean\": %.1f, \"sum\": %.0f}, \"dtype\": \"%s\", \"block_size\": %d, "
            "\"layout\": \"%s\", \"splits\": %d, \"buffer_sets\": %d, \"launches_per_graph\": %d, "
            "\"kv_MB\": %.2f, \"median_us\": %.3f, \"p10_us\": %.3f, \"p90_us\": %.3f, "
            "\"repeat_median_us\": %.3f, \"stream_median_us\": %.3f, \"effective_GBps\": %.1f, "
            "\"fraction_of_copy\": %.4f, \"causal_flops\": %.4e, \"TFLOPs\": %.2f, "
            "\"case\": \"%s\", \"rel_error\": %.3e, \"correct\": %s, \"kv_dtype\": \"%s\", "
            "\"bf16_kv_median_us\": %.3f, \"ratio_to_bf16_kv\": %.4f, \"logit_softcap\": %g, "
            "\"sliding_window\": %d, \"sinks\": %s, \"twin_median_us\": %.3f}%s\n",
            r.spec.shape.name, r.spec.shape.hq, r.spec.shape.hkv, r.spec.shape.dim, r.spec.bc.batch,
            max_q_len(r.spec), ctx_str(r.spec.bc).c_str(), *mm.first, *mm.second, mean,
            std::accumulate(r.lens.begin(), r.lens.end(), 0.0), dtype_str(r.spec.dtype).c_str(),
            r.spec.bs, layout_str(r.spec.layout).c_str(), r.splits, r.sets, r.launches_per_graph,
            r.kv_bytes / 1e6, r.median_us, r.p10_us, r.p90_us, r.repeat_median_us,
            r.stream_median_us, r.eff_gbps, r.fraction, r.flops, r.tflops, case_name(r).c_str(),
            r.rel_error, r.ok ? "true" : "false", kv_dtype_str(r.spec), r.bf16_us,
            r.bf16_us > 0 ? r.median_us / r.bf16_us : 0.0, static_cast<double>(r.spec.softcap),
            r.spec.window, r.spec.sinks ? "true" : "false", r.twin_us,
            i + 1 < rs.size() ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  fclose(f);
}

void write_markdown(const std::string &path, const std::vector<Result> &rs, double copy_gbps,
                    const char *device, const std::string &summary) {
  FILE *f = fopen(path.c_str(), "w");
  if (!f) return;
  fprintf(f,
          "# Decode kernel benchmark\n\nDevice: %s. Copy ceiling (1 GiB D2D, read + write): "
          "%.0f GB/s.\n\n",
          device, copy_gbps);
  fprintf(f, "%s\n", summary.c_str());
  fprintf(f,
          "| case | splits | KV MB | graph median us | p10 | p90 | repeat | stream us | GB/s | "
          "of copy | TFLOP/s | rel err |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Result &r : rs)
    fprintf(f,
            "| %s | %d | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f | %.3f | %.1f | %.1e%s |\n",
            case_name(r).c_str(), r.splits, r.kv_bytes / 1e6, r.median_us, r.p10_us, r.p90_us,
            r.repeat_median_us, r.stream_median_us, r.eff_gbps, r.fraction, r.tflops, r.rel_error,
            r.ok ? "" : " FAIL");
  fclose(f);
}

// Horizontal bar chart of fraction-of-copy per case (src/cli/svg_plot: the
// same axes, legend and layout as the tools' other plots).
void write_svg(const std::string &path, const std::vector<Result> &rs, double copy_gbps,
               const char *device) {
  fd_plot::BarChart c;
  c.title = "fd_decode effective bandwidth as a fraction of device copy bandwidth";
  char note[256];
  snprintf(note, sizeof note,
           "%s; copy ceiling %.0f GB/s (1 GiB D2D, read + write); CUDA-graph median per launch",
           device, copy_gbps);
  c.note = note;
  c.x = {"effective bandwidth / copy bandwidth (fraction; bytes = K + V + Q + output)", 0, 1.2};
  c.groups = {{"KV < 16 MB (launch-bound)", "#9bb7d4"},
              {">= 0.9 of copy", "#2e7d32"},
              {"< 0.9 of copy", "#ef6c00"},
              {"correctness FAILED", "#b71c1c"}};
  c.marks = {{0.6, "0.6 floor"}, {0.9, "0.9 target"}, {1.0, "copy"}};
  for (const Result &r : rs) {
    const size_t group = !r.ok ? 3 : r.kv_bytes < 16e6 ? 0 : (r.fraction >= 0.9 ? 1 : 2);
    c.bars.push_back({case_name(r), r.fraction, group});
  }
  std::string error;
  if (!fd_plot::write_file(path, fd_plot::render(c), &error))
    fprintf(stderr, "decode_bench: %s\n", error.c_str());
}

// The targets of the issue, checked over this run.
std::string summarize(const std::vector<Result> &rs, bool *all_ok) {
  std::vector<double> big, ragged, small_us;
  double min_16 = 1e9, min_b1 = 1e9, worst_pair = 0;
  int failures = 0;
  for (const Result &r : rs) {
    if (!r.ok) ++failures;
    if (r.spec.num_splits != 0) continue;  // exploration rows are not part of the grid
    if (r.spec.tag[0] != '\0') continue;   // --prefill rows: summarize_prefill
    if (r.spec.kv_fp8) continue;           // --kv fp8 rows: summarize_fp8
    if (r.spec.softcap > 0.f || r.spec.window > 0 || r.spec.sinks || r.spec.shape.dim == 96 ||
        r.spec.shape.dim == 256 || r.spec.has_twin)
      continue;  // --variants rows: summarize_variants
    if (r.kv_bytes >= 64e6) big.push_back(r.fraction);
    if (r.spec.bc.ctx == 0) ragged.push_back(r.fraction);
    if (r.kv_bytes >= 16e6) min_16 = std::min(min_16, r.fraction);
    if (r.kv_bytes < 16e6) small_us.push_back(r.median_us);
    if (r.spec.bc.batch == 1 && r.spec.bc.ctx == 32768) min_b1 = std::min(min_b1, r.fraction);
    if (r.spec.bs == 16 && r.kv_bytes >= 64e6)
      for (const Result &o : rs)
        if (o.spec.bs == 32 && o.spec.num_splits == 0 && o.spec.shape.name == r.spec.shape.name &&
            o.spec.bc.batch == r.spec.bc.batch && o.spec.bc.ctx == r.spec.bc.ctx &&
            o.spec.dtype == r.spec.dtype && o.spec.layout == r.spec.layout)
          worst_pair = std::max(worst_pair, std::fabs(r.median_us / o.median_us - 1.0));
  }
  const double med_big = big.empty() ? 0 : median(big);
  const double min_ragged = ragged.empty() ? 0 : *std::min_element(ragged.begin(), ragged.end());
  const double med_small = small_us.empty() ? 0 : median(small_us);
  char buf[2048];
  const bool t1 = med_big >= 0.90, t2 = min_ragged >= 0.85, t3 = min_b1 >= 0.75,
             t4 = min_16 >= 0.60, t5 = med_small <= 10.0, t6 = worst_pair <= 0.05;
  snprintf(buf, sizeof buf,
           "| target | measured | met |\n|---|---|---|\n"
           "| median fraction, cases >= 64 MB KV (%zu cases) >= 0.90 | %.3f | %s |\n"
           "| ragged (min of %zu) >= 0.85 | %.3f | %s |\n"
           "| batch 1 x 32768 (min) >= 0.75 | %.3f | %s |\n"
           "| no case >= 16 MB below 0.60 (min) | %.3f | %s |\n"
           "| cases < 16 MB: median time <= 10 us (%zu cases) | %.2f us | %s |\n"
           "| block 16 vs 32 on >= 64 MB cases within 5%% (worst) | %.1f%% | %s |\n"
           "| correctness failures | %d | %s |\n",
           big.size(), med_big, t1 ? "yes" : "NO", ragged.size(), min_ragged, t2 ? "yes" : "NO",
           min_b1, t3 ? "yes" : "NO", min_16, t4 ? "yes" : "NO", small_us.size(), med_small,
           t5 ? "yes" : "NO", worst_pair * 100, t6 ? "yes" : "NO", failures,
           failures == 0 ? "yes" : "NO");
  *all_ok = failures == 0;
  return buf;
}

// The --prefill cases (shape A, bf16, block 16, token-major; docs/benchmarks.md,
// "Multi-token queries"): causal chunks with and without a cached prefix, and
// a mixed batch against its two parts.
std::vector<Spec> prefill_specs(int32_t fixed_splits) {
  std::vector<Spec> specs;
  auto add = [&](const char *tag, std::vector<int32_t> lens, std::vector<int32_t> q_lens) {
    Spec s{kShapes[0],
           BatchCtx{static_cast<int>(lens.size()), lens[0]},
           FD_DTYPE_BF16,
           16,
           FD_LAYOUT_TOKEN_MAJOR,
           fixed_splits};
    s.row_lens = lens;
    s.row_q_lens = q_lens;
    s.tag = tag;
    specs.push_back(s);
  };
  add("prefill 4096 new, no cache", {4096}, {4096});
  add("prefill 2048 new over 8192", {10240}, {2048});
  std::vector<int32_t> lens(32, 4096), q_lens(32, 1);
  add("mixed: decode part 32x4096", lens, q_lens);
  add("mixed: prefill part 2x512 over 4096", {4608, 4608}, {512, 512});
  lens.insert(lens.end(), {4608, 4608});
  q_lens.insert(q_lens.end(), {512, 512});
  add("mixed: 32x4096 decode + 2x512 over 4096 in one call", lens, q_lens);
  return specs;
}

// The --prefill table: time and causal TFLOP/s of each case, the mixed batch
// against the sum of its parts run separately.
std::string summarize_prefill(const std::vector<Result> &rs) {
  std::string out = "| prefill case | ms | TFLOP/s (causal) | splits |\n|---|---|---|---|\n";
  double parts = 0, mixed = 0;
  char buf[512];
  for (const Result &r : rs) {
    if (r.spec.tag[0] == '\0') continue;
    snprintf(buf, sizeof buf, "| %s | %.4f | %.1f | %d |\n", case_name(r).c_str(),
             r.median_us * 1e-3, r.tflops, r.splits);
    out += buf;
    if (strstr(r.spec.tag, " part ")) parts += r.median_us;
    if (strstr(r.spec.tag, "one call")) mixed = r.median_us;
  }
  if (parts > 0 && mixed > 0) {
    snprintf(buf, sizeof buf,
             "\nMixed batch in one call: %.1f us; its two parts run separately: %.1f us "
             "(one call / separate = %.3f).\n",
             mixed, parts, mixed / parts);
    out += buf;
  }
  return out;
}

// The --kv fp8 table and targets (issue 15): each FP8 case beside the same
// case with bf16 (or f16) K/V from the same run. Big: >= 64 MB of 16-bit
// K/V (time <= 0.55x, >= 0.90 of copy counting FP8 bytes); small (< 16 MB of
// 16-bit K/V) and long-context (batch 1 x 32768): no slower.
std::string summarize_fp8(const std::vector<Result> &rs) {
  std::string table =
      "| case | 16-bit K/V us | FP8 us | FP8 / 16-bit | FP8 fraction of copy | splits |\n"
      "|---|---|---|---|---|---|\n";
  std::vector<double> big_ratio, big_frac;
  double worst_small = 0, worst_long = 0;
  int big_met = 0, small_n = 0, long_n = 0;
  char buf[512];
  for (const Result &r : rs) {
    if (!r.spec.kv_fp8 || r.bf16_us <= 0) continue;
    const double ratio = r.median_us / r.bf16_us;
    const double kv16 = 2 * r.kv_bytes;  // the 16-bit case's K/V bytes
    snprintf(buf, sizeof buf, "| %s | %.2f | %.2f | %.3f | %.3f | %d |\n", case_name(r).c_str(),
             r.bf16_us, r.median_us, ratio, r.fraction, r.splits);
    table += buf;
    if (kv16 >= 64e6) {
      big_ratio.push_back(ratio);
      big_frac.push_back(r.fraction);
      big_met += ratio <= 0.55 && r.fraction >= 0.90;
    }
    if (kv16 < 16e6) worst_small = std::max(worst_small, ratio), ++small_n;
    if (r.spec.bc.batch == 1 && r.spec.bc.ctx == 32768)
      worst_long = std::max(worst_long, ratio), ++long_n;
  }
  const double worst_ratio =
      big_ratio.empty() ? 0 : *std::max_element(big_ratio.begin(), big_ratio.end());
  const double min_frac =
      big_frac.empty() ? 0 : *std::min_element(big_frac.begin(), big_frac.end());
  snprintf(
      buf, sizeof buf,
      "| FP8 target | measured | met |\n|---|---|---|\n"
      "| >= 64 MB 16-bit K/V (%zu cases): FP8 time <= 0.55x (worst; median %.3f) | %.3f | %s |\n"
      "| >= 64 MB: >= 0.90 of copy counting FP8 bytes (min; median %.3f) | %.3f | %s |\n"
      "| >= 64 MB: both met | %d of %zu | %s |\n"
      "| < 16 MB 16-bit K/V (%d cases): no slower (worst ratio) | %.3f | %s |\n"
      "| batch 1 x 32768 (%d cases): no slower (worst ratio) | %.3f | %s |\n\n",
      big_ratio.size(), big_ratio.empty() ? 0 : median(big_ratio), worst_ratio,
      worst_ratio <= 0.55 ? "yes" : "NO", big_frac.empty() ? 0 : median(big_frac), min_frac,
      min_frac >= 0.90 ? "yes" : "NO", big_met, big_ratio.size(),
      big_met == static_cast<int>(big_ratio.size()) ? "yes" : "NO", small_n, worst_small,
      worst_small <= 1.0 ? "yes" : "NO", long_n, worst_long, worst_long <= 1.0 ? "yes" : "NO");
  return std::string(buf) + table;
}

// The --variants cases (issue 16): each variant case follows the plain case
// it is compared with (Spec::twin).
std::vector<Spec> variant_specs(int32_t fixed_splits) {
  std::vector<Spec> specs;
  auto plain = [&](const Shape &sh, BatchCtx bc) {
    specs.push_back({sh, bc, FD_DTYPE_BF16, 16, FD_LAYOUT_TOKEN_MAJOR, fixed_splits});
    return static_cast<int>(specs.size()) - 1;
  };
  auto variant = [&](int twin, BatchCtx bc, float softcap, int32_t window, bool sinks) {
    Spec s = specs[static_cast<size_t>(twin)];
    s.bc = bc;
    s.softcap = softcap, s.window = window, s.sinks = sinks;
    s.has_twin = true;
    s.twin_bc = specs[static_cast<size_t>(twin)].bc;
    specs.push_back(s);
  };
  // Soft-cap (Gemma 2's 50, and 30) and sinks on the grid's large cases.
  const struct {
    int shape;
    BatchCtx bc;
  } large[] = {{0, {64, 4096}}, {0, {8, 8192}},  {0, {128, 2048}}, {0, {64, 0}},
               {1, {64, 4096}}, {2, {64, 4096}}, {3, {128, 2048}}};
  for (const auto &l : large) {
    const int t = plain(kShapes[l.shape], l.bc);
    variant(t, l.bc, 50.f, 0, false);
    variant(t, l.bc, 0.f, 0, true);
    variant(t, l.bc, 30.f, 0, true);
  }
  // A 4096-token window over 32768-token rows against plain 4096-token rows.
  for (int batch : {64, 1}) {
    const int t = plain(kShapes[0], {batch, 4096});
    variant(t, {batch, 32768}, 0.f, 4096, false);
  }
  {
    const int t = plain(kShapes[3], {64, 4096});
    variant(t, {64, 32768}, 0.f, 4096, false);
  }
  // The new head dims against the copy ceiling.
  for (const Shape &sh : kWideShapes)
    for (int batch : {32, 64}) plain(sh, {batch, 4096});
  return specs;
}

// The --variants table and targets.
std::string summarize_variants(const std::vector<Result> &rs) {
  std::string table =
      "| case | plain case | plain us | variant us | ratio | target | met |\n"
      "|---|---|---|---|---|---|---|\n";
  char buf[768];
  int met = 0, n = 0;
  for (const Result &r : rs) {
    const Spec &s = r.spec;
    if (!s.has_twin || s.twin < 0 || r.twin_us <= 0) continue;
    const double ratio = r.median_us / r.twin_us;
    // Soft-cap / sinks: <= 3% slower; window over 32768 vs plain 4096:
    // within 15% at batch 64, <= 1.15x at batch 1.
    const double limit = s.window > 0 ? 1.15 : 1.03;
    const bool ok = ratio <= limit;
    met += ok, ++n;
    snprintf(buf, sizeof buf, "| %s | %s | %.2f | %.2f | %.3f | <= %.2f | %s |\n",
             case_name(r).c_str(), case_name(rs[static_cast<size_t>(s.twin)]).c_str(), r.twin_us,
             r.median_us, ratio, limit, ok ? "yes" : "NO");
    table += buf;
  }
  table += "\n| head-dim case | us | fraction of copy | target | met |\n|---|---|---|---|---|\n";
  for (const Result &r : rs) {
    const int dim = r.spec.shape.dim;
    if (dim != 96 && dim != 256) continue;
    const bool ok = r.fraction >= 0.95;
    met += ok, ++n;
    snprintf(buf, sizeof buf, "| %s | %.2f | %.3f | >= 0.95 | %s |\n", case_name(r).c_str(),
             r.median_us, r.fraction, ok ? "yes" : "NO");
    table += buf;
  }
  snprintf(buf, sizeof buf, "\nVariant targets met: %d of %d.\n", met, n);
  return table + buf;
}

void usage(FILE *to, const char *program) {
  fprintf(to,
          "usage: %s [--out DIR] [--quick] [--explore] [--verify] [--prefill] [--kv fp8|fp8_e5m2]\n"
          "       [--variants] [--plan-lengths] [--contiguous-blocks] [--splits N]\n"
          "       [--filter A,B,...]\n",
          program);
}

}  // namespace

int fd_decode_bench_main(int argc, char **argv) {
  std::string out_dir = ".";
  bool quick = false, explore = false, verify = false, prefill = false;
  int32_t fp8 = 0;  // --kv: the FP8 K/V type
  bool plan_lengths = false, contiguous = false;
  bool variants = false;
  int32_t fixed_splits = 0;
  std::vector<std::string> filters;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout, argv[0]);
      printf(
          "Times fd_decode on CUDA device 0 over the docs/benchmarks.md grid and writes\n"
          "decode_bench.json, decode_bench.md and decode_bench.svg to DIR (default .).\n"
          "  --quick      bf16, blocks 16 and 32, token-major only\n"
          "  --explore    add fixed split counts (1..128) for a few cases\n"
          "  --verify     instead of the grid, speculative verification: 2, 4 and 8 query\n"
          "               tokens per row (q_indptr), 64 x 4096, every shape, bf16, block 16\n"
          "  --prefill    add chunked prefill (shape A, bf16: 4096 causal tokens with no\n"
          "               cache, 2048 over 8192 cached; TFLOP/s over the visible pairs) and\n"
          "               a mixed batch (32 decode rows of 4096 + 2 chunks of 512 over\n"
          "               4096) against its two parts run separately\n"
          "  --kv fp8     instead of the grid, FP8 E4M3 K/V on every shape and batch of the\n"
          "               grid (bf16 q, block 16, token-major; A also dim-major and f16 q),\n"
          "               each beside the same case with 16-bit K/V: time, fraction of copy\n"
          "               counting FP8 bytes, FP8 time / 16-bit time\n"
          "  --kv fp8_e5m2  the same with FP8 E5M2 K/V\n"
          "  --variants   instead of the grid, the attention variants beside their plain\n"
          "               twins (soft-cap, sinks on large cases; a 4096 window over 32768\n"
          "               rows vs plain 4096 rows) and head_dim 256 / 96 against copy\n"
          "  --plan-lengths  plan each case with its rows' lengths (fd_decode_plan_create,\n"
          "               then fd_decode_run) instead of fd_decode's hint planning\n"
          "  --contiguous-blocks  each row's blocks consecutive in the pool instead of a\n"
          "               random permutation (paging's cost against dense K/V)\n"
          "  --splits N   run the grid with num_splits N instead of automatic\n"
          "  --filter L   keep cases whose name contains one of the comma-separated\n"
          "               substrings ('_' stands for a space), e.g. --filter A_64x\n"
          "Exit status: 0 every case correct (the targets table tells whether they\n"
          "were met), 1 a correctness failure or a failed CUDA call, 2 bad arguments,\n"
          "77 no CUDA device.\n");
      return 0;
    }
    if (!strcmp(argv[i], "--out") && i + 1 < argc)
      out_dir = argv[++i];
    else if (!strcmp(argv[i], "--quick"))
      quick = true;
    else if (!strcmp(argv[i], "--explore"))
      explore = true;
    else if (!strcmp(argv[i], "--verify"))
      verify = true;
    else if (!strcmp(argv[i], "--prefill"))
      prefill = true;
    else if (!strcmp(argv[i], "--variants"))
      variants = true;
    else if (!strcmp(argv[i], "--kv") && i + 1 < argc && !strcmp(argv[i + 1], "fp8"))
      fp8 = FD_DTYPE_FP8_E4M3, ++i;
    else if (!strcmp(argv[i], "--kv") && i + 1 < argc && !strcmp(argv[i + 1], "fp8_e5m2"))
      fp8 = FD_DTYPE_FP8_E5M2, ++i;
    else if (!strcmp(argv[i], "--plan-lengths"))
      plan_lengths = true;
    else if (!strcmp(argv[i], "--contiguous-blocks"))
      contiguous = true;
    else if (!strcmp(argv[i], "--splits") && i + 1 < argc)
      fixed_splits = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--filter") && i + 1 < argc) {
      std::string list = argv[++i];
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        if (comma > at) {
          std::string f = list.substr(at, comma - at);
          std::replace(f.begin(), f.end(), '_', ' ');
          filters.push_back(f);
        }
        at = comma + 1;
      }
    } else {
      usage(stderr, argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop;
  cudaStream_t stream;
  if (!fd_bench::open_device(&prop, &stream)) return 77;
  const double copy0 = measure_copy_gbps(stream);
  printf("device %s, %d SMs, L2 %d MB; copy ceiling %.0f GB/s\n", prop.name,
         prop.multiProcessorCount, prop.l2CacheSize >> 20, copy0);

  std::vector<Spec> specs;
  for (const Shape &sh : kShapes)
    for (const BatchCtx &bc : kGrid) {
      const bool a = sh.name[0] == 'A';
      for (int32_t dt : {FD_DTYPE_BF16, FD_DTYPE_F16})
        for (int bs : {8, 16, 32})
          for (int32_t lay : {FD_LAYOUT_TOKEN_MAJOR, FD_LAYOUT_DIM_MAJOR}) {
            if (!a && (dt == FD_DTYPE_F16 || bs == 8 || lay == FD_LAYOUT_DIM_MAJOR)) continue;
            if (quick && (dt == FD_DTYPE_F16 || bs == 8 || lay == FD_LAYOUT_DIM_MAJOR)) continue;
            specs.push_back({sh, bc, dt, bs, lay, fixed_splits});
          }
    }
  if (verify) {
    specs.clear();
    for (const Shape &sh : kShapes)
      for (int q_len : {1, 2, 4, 8}) {
        Spec s{sh, BatchCtx{64, 4096}, FD_DTYPE_BF16, 16, FD_LAYOUT_TOKEN_MAJOR, fixed_splits};
        s.q_len = q_len;
        specs.push_back(s);
      }
  }
  if (fp8) {
    // Each FP8 case right after its 16-bit twin (paired below).
    specs.clear();
    for (const Shape &sh : kShapes)
      for (const BatchCtx &bc : kGrid) {
        const bool a = sh.name[0] == 'A';
        const struct {
          int32_t dtype, layout;
        } kinds[] = {{FD_DTYPE_BF16, FD_LAYOUT_TOKEN_MAJOR},
                     {FD_DTYPE_BF16, FD_LAYOUT_DIM_MAJOR},
                     {FD_DTYPE_F16, FD_LAYOUT_TOKEN_MAJOR}};
        for (const auto &k : kinds) {
          if (!a && (k.dtype != FD_DTYPE_BF16 || k.layout != FD_LAYOUT_TOKEN_MAJOR)) continue;
          Spec s{sh, bc, k.dtype, 16, k.layout, fixed_splits};
          specs.push_back(s);
          s.kv_fp8 = fp8;
          specs.push_back(s);
        }
      }
  }
  if (variants) specs = variant_specs(fixed_splits);
  if (prefill)
    for (const Spec &s : prefill_specs(fixed_splits)) specs.push_back(s);
  if (explore) {
    for (int splits : {1, 2, 4, 8, 16})
      for (const BatchCtx &bc : {BatchCtx{64, 0}, BatchCtx{64, 4096}, BatchCtx{1, 32768}})
        specs.push_back({kShapes[0], bc, FD_DTYPE_BF16, 16, FD_LAYOUT_TOKEN_MAJOR, splits});
    // Batch 1: how many splits the small and the long row want.
    for (int splits : {8, 16, 32, 64, 128})
      for (int sh : {0, 1, 2})
        for (const BatchCtx &bc : {BatchCtx{1, 2048}, BatchCtx{1, 32768}})
          specs.push_back({kShapes[sh], bc, FD_DTYPE_BF16, 16, FD_LAYOUT_TOKEN_MAJOR, splits});
    // Few KV heads (C, D): ragged and batch-8 split counts.
    for (int splits : {2, 4, 8, 16})
      for (int sh : {2, 3})
        for (const BatchCtx &bc : {BatchCtx{64, 0}, BatchCtx{8, 8192}})
          specs.push_back({kShapes[sh], bc, FD_DTYPE_BF16, 16, FD_LAYOUT_TOKEN_MAJOR, splits});
  }
  for (Spec &s : specs) s.plan_lengths = plan_lengths, s.contiguous = contiguous;
  if (!filters.empty()) {
    std::vector<Spec> kept;
    for (const Spec &s : specs) {
      Result probe;
      probe.spec = s;
      const std::string name = case_name(probe);
      for (const std::string &f : filters)
        if (name.find(f) != std::string::npos) {
          kept.push_back(s);
          break;
        }
    }
    specs = kept;
  }

  std::vector<Result> results;
  for (const Spec &s : specs) {
    Result r = run_case(s, stream, copy0);
    printf(
        "%-44s splits %3d sets %3d  %9.2f us (rep %9.2f, stream %9.2f)  %7.0f GB/s  %.3f  "
        "%6.1f TFLOP/s  err %.1e%s\n",
        case_name(r).c_str(), r.splits, r.sets, r.median_us, r.repeat_median_us, r.stream_median_us,
        r.eff_gbps, r.fraction, r.tflops, r.rel_error, r.ok ? "" : "  FAIL");
    fflush(stdout);
    if (r.spec.kv_fp8 && !results.empty() && !results.back().spec.kv_fp8)
      r.bf16_us = results.back().median_us;  // its 16-bit twin
    results.push_back(r);
    // --variants: the plain twin ran earlier (unless filtered out).
    Result &added = results.back();
    if (added.spec.has_twin)
      for (size_t i = 0; i + 1 < results.size(); ++i) {
        const Spec &o = results[i].spec;
        if (!o.has_twin && !strcmp(o.shape.name, added.spec.shape.name) &&
            o.bc.batch == added.spec.twin_bc.batch && o.bc.ctx == added.spec.twin_bc.ctx) {
          added.spec.twin = static_cast<int>(i);
          added.twin_us = results[i].median_us;
        }
      }
  }
  const double copy1 = measure_copy_gbps(stream);
  // One ceiling for the whole run: the larger (stricter) of the two readings.
  const double copy = std::max(copy0, copy1);
  for (Result &r : results) r.fraction = r.eff_gbps / copy;
  printf("copy ceiling: %.0f GB/s at start, %.0f GB/s at end; using %.0f\n", copy0, copy1, copy);
  bool ok = true;
  std::string summary = summarize(results, &ok);
  if (fp8) summary = summarize_fp8(results) + "\n" + summary;
  if (variants) summary = summarize_variants(results) + "\n" + summary;
  if (prefill) summary += "\n" + summarize_prefill(results);
  printf("\n%s\n", summary.c_str());
  write_json(out_dir + "/decode_bench.json", results, copy, prop.name);
  write_markdown(out_dir + "/decode_bench.md", results, copy, prop.name, summary);
  write_svg(out_dir + "/decode_bench.svg", results, copy, prop.name);
  CHECK_CUDA(cudaStreamDestroy(stream));
  return ok ? 0 : 1;
}
