/* FP8 K/V on CUDA (issue 15, docs/semantics.md S1.1).
 *
 * Decode: fd_decode over an FP8 cache (E4M3, and E5M2 on the sweep's bf16 q
 * cases, part of the variants and the TMA staging cases) against a float64
 * reference over the
 * dequantised K/V (stored value x scale): q (3*N(0,1), f16 or bf16, out of
 * the same type), head_dim 64/128, both layouts, block sizes 8/16/32, GQA
 * groups 1/4/8 (and 5/16 with one query token: groups of at most 8 take
 * the swapped-operand step, larger ones the m-tile path), one
 * and three query tokens per row (q_indptr), unsplit,
 * automatic and fixed splits; outputs poisoned with NaN, FP8 NaN in spare
 * blocks, past every row's end and behind unused table slots; worst
 * row-relative error <= 5e-3; bit-identical reruns; bf16 q far outside f16's
 * range (the kernel's power-of-two row scaling); long split rows; a CUDA
 * graph replay; soft-cap, sliding window and sinks (the reference applies
 * them; sinks of -inf and a window past every row against the plain call);
 * TMA staging of the swapped kernel for one-wave lists of
 * short rows (packed and NHD strides) and its deep shape for lists that
 * fill one wave of it, the staging and shape read from a captured graph. It prints the worst error
 * against the unquantised values and, when the CPU backend serves the same FP8 call, against it.
 * Append: fd_kv_append into FP8 stores exactly the host conversion
 * saturate(x / scale) (NaN, +-inf, saturation, subnormals, -0) in both
 * layouts; fd_rope_kv_append and the layer writes of a CUDA FP8 cache (one-
 * and multi-token transactions, changed scales) store the bytes the CPU
 * backend stores.
 *
 * FD_GPU_TEST_REDUCED=1 runs a small sweep (for compute-sanitizer). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "dtype.hpp" /* the host FP8 conversions (src/core) */
#include "fd_gpu_test.h"
#include "fd_gpu_graph.h"
#include "fd_test_fp8_close.h"

namespace {

bool reduced() {
  const char *e = getenv("FD_GPU_TEST_REDUCED");
  return e != nullptr && e[0] == '1';
}

constexpr uint8_t kNanCode = 0x7f; /* NaN in E4M3 and in E5M2 */

struct Case {
  int32_t q_dtype = FD_DTYPE_BF16;
  int32_t kv_dtype = FD_DTYPE_FP8_E4M3; /* or FD_DTYPE_FP8_E5M2 */
  bool dim_major = false;
  bool nhd = false; /* token-major [block][token][KV head][dim] (explicit strides) */
  int32_t hint = 0; /* max_seq_len_hint (0: none, the table's length plans) */
  uint32_t dim = 128, bs = 16, hkv = 2, group = 4;
  std::vector<int32_t> lens;
  int32_t q_len = 1;    /* query tokens per row (> 1: q_indptr) */
  float q_amp = 3.f;    /* q = q_amp * N(0,1) */
  float sm_scale = 0.f; /* 0: 1/sqrt(D) */
  uint64_t seed = 1;
  /* Attention variants (docs/semantics.md S2.3): soft-cap, sliding window
   * and sinks (kNoSinks, kSinksNegInf: every sink -inf, kSinksRandom). */
  float softcap = 0.f;
  int32_t window = 0;
  int sinks = 0;
};

constexpr int kNoSinks = 0, kSinksNegInf = 1, kSinksRandom = 2;

struct Host {
  Case c;
  uint32_t batch = 0, hq = 0, num_blocks = 0, mbps = 0;
  int64_t sb = 0, sh = 0, st = 0, sd = 0;
  size_t cache_elems = 0;
  int32_t q_tokens = 0;
  float k_scale = 1.f, v_scale = 1.f, sm_scale = 1.f;
  std::vector<uint8_t> k, v; /* FP8 codes */
  std::vector<float> ko, vo; /* the unquantised (bf16) values */
  std::vector<uint16_t> q;   /* q_dtype bits */
  std::vector<int32_t> tables, lens, indptr;
  std::vector<float> sinks; /* [hq] natural sink logits (c.sinks != kNoSinks) */
};

Host make_host(const Case &c) {
  Host h;
  h.c = c;
  h.batch = static_cast<uint32_t>(c.lens.size());
  h.hq = c.hkv * c.group;
  uint32_t longest = 1, used = 0;
  for (int32_t l : c.lens) {
    longest = std::max(longest, static_cast<uint32_t>(l));
    used += (static_cast<uint32_t>(l) + c.bs - 1) / c.bs;
  }
  h.mbps = (longest + c.bs - 1) / c.bs + 1; /* one spare slot per row */
  h.num_blocks = used + 3;
  const int64_t H = c.hkv, D = c.dim, B = c.bs;
  if (c.dim_major)
    h.sb = H * D * B, h.sh = D * B, h.st = 1, h.sd = B;
  else if (c.nhd)
    h.sb = B * H * D, h.sh = D, h.st = H * D, h.sd = 1;
  else
    h.sb = H * B * D, h.sh = B * D, h.st = D, h.sd = 1;
  h.cache_elems = static_cast<size_t>(h.sb) * h.num_blocks;
  fd_test_rng rng = {c.seed};
  h.ko.resize(h.cache_elems);
  h.vo.resize(h.cache_elems);
  float kmax = 0.f, vmax = 0.f;
  for (size_t i = 0; i < h.cache_elems; ++i) {
    h.ko[i] = fd_test_bf16_to_f32(fd_test_f32_to_bf16(1.5f * fd_test_normal(&rng)));
    h.vo[i] = fd_test_bf16_to_f32(fd_test_f32_to_bf16(fd_test_normal(&rng)));
    kmax = std::max(kmax, std::fabs(h.ko[i]));
    vmax = std::max(vmax, std::fabs(h.vo[i]));
  }
  /* Per-tensor scales as a calibration would pick them (the largest value
   * near the top of the type's range: 448 for E4M3, 57344 for E5M2). */
  const bool e5m2 = c.kv_dtype == FD_DTYPE_FP8_E5M2;
  h.k_scale = kmax / (e5m2 ? 50000.f : 400.f);
  h.v_scale = vmax / (e5m2 ? 40000.f : 320.f);
  h.k.resize(h.cache_elems);
  h.v.resize(h.cache_elems);
  auto encode = e5m2 ? fd::f32_to_fp8_e5m2 : fd::f32_to_fp8_e4m3;
  for (size_t i = 0; i < h.cache_elems; ++i) {
    h.k[i] = encode(h.ko[i] / h.k_scale);
    h.v[i] = encode(h.vo[i] / h.v_scale);
  }
  std::vector<int32_t> perm(h.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size(); i > 1; --i)
    std::swap(perm[i - 1], perm[static_cast<size_t>(fd_test_range(&rng, 0, (int64_t)i - 1))]);
  /* Spare blocks hold FP8 NaN; every unused table slot points at one. */
  for (size_t i = 0; i < 3; ++i) {
    const size_t at = static_cast<size_t>(perm[used + i]) * static_cast<size_t>(h.sb);
    std::fill(h.k.begin() + static_cast<ptrdiff_t>(at),
              h.k.begin() + static_cast<ptrdiff_t>(at + static_cast<size_t>(h.sb)), kNanCode);
    std::fill(h.v.begin() + static_cast<ptrdiff_t>(at),
              h.v.begin() + static_cast<ptrdiff_t>(at + static_cast<size_t>(h.sb)), kNanCode);
  }
  h.tables.assign(static_cast<size_t>(h.batch) * h.mbps, -1);
  h.lens = c.lens;
  size_t next = 0;
  for (uint32_t r = 0; r < h.batch; ++r) {
    const uint32_t len = static_cast<uint32_t>(c.lens[r]);
    const uint32_t nb = (len + c.bs - 1) / c.bs;
    for (uint32_t b = 0; b < nb; ++b) h.tables[r * h.mbps + b] = perm[next++];
    for (uint32_t b = nb; b < h.mbps; ++b) h.tables[r * h.mbps + b] = perm[used + (r + b) % 3];
    /* Stale NaN past the row's end in its last block. */
    for (uint32_t t = len; t < nb * c.bs; ++t) {
      const int64_t blk = h.tables[r * h.mbps + t / c.bs];
      for (uint32_t kv = 0; kv < c.hkv; ++kv)
        for (uint32_t d = 0; d < c.dim; ++d) {
          const size_t at =
              static_cast<size_t>(blk * h.sb + kv * h.sh + (t % c.bs) * h.st + d * h.sd);
          h.k[at] = kNanCode;
          h.v[at] = kNanCode;
        }
    }
  }
  h.indptr.assign(1, 0);
  for (uint32_t r = 0; r < h.batch; ++r) h.indptr.push_back(h.indptr.back() + c.q_len);
  h.q_tokens = h.indptr.back();
  h.q.resize(static_cast<size_t>(h.q_tokens) * h.hq * c.dim);
  for (size_t i = 0; i < h.q.size(); ++i)
    fd_test_store(h.q.data(), i, c.q_dtype, c.q_amp * fd_test_normal(&rng));
  h.sm_scale = c.sm_scale > 0.f ? c.sm_scale : 1.f / std::sqrt(static_cast<float>(c.dim));
  if (c.sinks != kNoSinks)
    for (uint32_t hd = 0; hd < h.hq; ++hd)
      h.sinks.push_back(c.sinks == kSinksNegInf ? -INFINITY : 2.f * fd_test_normal(&rng));
  return h;
}

/* float64 attention over the dequantised cache (dequant) or the unquantised
 * values; out [q_tokens, hq, D]. Query token j of a row of n sees positions
 * < len - n + 1 + j. */
std::vector<double> reference(const Host &h, bool dequant) {
  const uint32_t D = h.c.dim;
  std::vector<double> out(h.q.size(), 0.0);
  const float *fp8 = fd::fp8_table(h.c.kv_dtype); /* the value of each code */
  auto kv_at = [&](uint32_t r, int32_t t, uint32_t kvh, uint32_t d) {
    const int64_t blk = h.tables[r * h.mbps + static_cast<uint32_t>(t) / h.c.bs];
    return static_cast<size_t>(blk * h.sb + kvh * h.sh + (t % static_cast<int32_t>(h.c.bs)) * h.st +
                               d * h.sd);
  };
  for (uint32_t r = 0; r < h.batch; ++r) {
    const int32_t n = h.c.q_len;
    for (int32_t j = 0; j < n; ++j) {
      const int32_t visible = std::max(0, h.lens[r] - n + 1 + j);
      /* A window of w: the last w positions up to the query's own. */
      const int32_t first = h.c.window > 0 ? std::max(0, visible - h.c.window) : 0;
      const int32_t tok = h.indptr[r] + j;
      for (uint32_t hd = 0; hd < h.hq; ++hd) {
        const uint32_t kvh = hd / h.c.group;
        const size_t qo = (static_cast<size_t>(tok) * h.hq + hd) * D;
        std::vector<double> s(static_cast<size_t>(visible));
        double mx = -INFINITY;
        for (int32_t t = first; t < visible; ++t) {
          double dot = 0;
          for (uint32_t d = 0; d < D; ++d) {
            const size_t at = kv_at(r, t, kvh, d);
            const double kval = dequant ? static_cast<double>(fp8[h.k[at]]) * h.k_scale : h.ko[at];
            dot += static_cast<double>(fd_test_load(h.q.data(), qo + d, h.c.q_dtype)) * kval;
          }
          double sc = dot * h.sm_scale;
          if (h.c.softcap > 0.f) sc = h.c.softcap * std::tanh(sc / h.c.softcap);
          s[static_cast<size_t>(t)] = sc;
          mx = std::max(mx, sc);
        }
        const double sink = h.sinks.empty() ? -INFINITY : h.sinks[hd];
        mx = std::max(mx, sink);
        double sum = 0;
        for (int32_t t = first; t < visible; ++t)
          sum += (s[static_cast<size_t>(t)] = std::exp(s[static_cast<size_t>(t)] - mx));
        if (sink > -INFINITY) sum += std::exp(sink - mx);
        for (uint32_t d = 0; d < D && visible > first; ++d) {
          double acc = 0;
          for (int32_t t = first; t < visible; ++t) {
            const size_t at = kv_at(r, t, kvh, d);
            const double vval = dequant ? static_cast<double>(fp8[h.v[at]]) * h.v_scale : h.vo[at];
            acc += s[static_cast<size_t>(t)] * vval;
          }
          out[qo + d] = acc / sum;
        }
      }
    }
  }
  return out;
}

struct Dev {
  void *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr, *ws = nullptr;
  int32_t *tables = nullptr, *lens = nullptr, *indptr = nullptr;
  float *sinks = nullptr;
  size_t ws_size = 0;
  cudaStream_t stream = nullptr;
  Dev() = default;
  Dev(const Dev &) = delete;
  Dev &operator=(const Dev &) = delete;
  ~Dev() {
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(ws);
    cudaFree(tables), cudaFree(lens), cudaFree(indptr), cudaFree(sinks);
    if (stream) cudaStreamDestroy(stream);
  }
};

void upload(const Host &h, Dev &d) {
  const size_t qb = h.q.size() * 2;
  CUDA_OK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
  CUDA_OK(cudaMalloc(&d.q, qb));
  CUDA_OK(cudaMalloc(&d.out, qb));
  CUDA_OK(cudaMalloc(&d.k, h.cache_elems));
  CUDA_OK(cudaMalloc(&d.v, h.cache_elems));
  CUDA_OK(cudaMalloc(reinterpret_cast<void **>(&d.tables), h.tables.size() * 4));
  CUDA_OK(cudaMalloc(reinterpret_cast<void **>(&d.lens), h.lens.size() * 4));
  CUDA_OK(cudaMalloc(reinterpret_cast<void **>(&d.indptr), h.indptr.size() * 4));
  CUDA_OK(fd_gpu_upload(d.stream, d.q, h.q.data(), qb));
  CUDA_OK(fd_gpu_upload(d.stream, d.k, h.k.data(), h.cache_elems));
  CUDA_OK(fd_gpu_upload(d.stream, d.v, h.v.data(), h.cache_elems));
  CUDA_OK(fd_gpu_upload(d.stream, d.tables, h.tables.data(), h.tables.size() * 4));
  CUDA_OK(fd_gpu_upload(d.stream, d.lens, h.lens.data(), h.lens.size() * 4));
  CUDA_OK(fd_gpu_upload(d.stream, d.indptr, h.indptr.data(), h.indptr.size() * 4));
  if (!h.sinks.empty()) {
    CUDA_OK(cudaMalloc(reinterpret_cast<void **>(&d.sinks), h.sinks.size() * 4));
    CUDA_OK(fd_gpu_upload(d.stream, d.sinks, h.sinks.data(), h.sinks.size() * 4));
  }
}

/* Parameters over host (CPU) or device (CUDA) buffers. */
fd_decode_params params_for(const Host &h, const void *q, const void *k, const void *v, void *out,
                            const int32_t *tables, const int32_t *lens, const int32_t *indptr,
                            const float *sinks) {
  fd_decode_params p;
  fd_decode_params_init(&p);
  p.q_dtype = p.out_dtype = h.c.q_dtype;
  p.kv_dtype = h.c.kv_dtype;
  p.layout = h.c.dim_major ? FD_LAYOUT_DIM_MAJOR : FD_LAYOUT_TOKEN_MAJOR;
  p.batch = h.batch;
  p.num_q_heads = h.hq;
  p.num_kv_heads = h.c.hkv;
  p.head_dim = h.c.dim;
  p.block_size = h.c.bs;
  p.num_blocks = h.num_blocks;
  p.max_blocks_per_seq = h.mbps;
  p.k_scale = h.k_scale;
  p.v_scale = h.v_scale;
  p.sm_scale = h.sm_scale;
  p.max_seq_len_hint = h.c.hint;
  p.logit_softcap = h.c.softcap;
  p.sliding_window = h.c.window;
  p.sinks = sinks;
  if (h.c.nhd)
    p.stride_block = h.sb, p.stride_head = h.sh, p.stride_token = h.st, p.stride_dim = h.sd;
  p.q = q;
  p.k_cache = k;
  p.v_cache = v;
  p.out = out;
  p.block_tables = tables;
  p.seq_lens = lens;
  if (h.c.q_len > 1) {
    p.q_indptr = indptr;
    p.max_q_len_hint = h.c.q_len;
  }
  return p;
}

fd_decode_params device_params(const Host &h, Dev &d, int32_t splits) {
  fd_decode_params p = params_for(h, d.q, d.k, d.v, d.out, d.tables, d.lens, d.indptr, d.sinks);
  p.device.type = FD_DEVICE_CUDA;
  p.device.ordinal = 0;
  p.stream = reinterpret_cast<fd_stream>(d.stream);
  p.num_splits = splits;
  size_t need = 0;
  FD_ASSERT_OK(fd_decode_workspace_size(&p, &need));
  if (need > d.ws_size) {
    cudaFree(d.ws);
    d.ws = nullptr;
    CUDA_OK(cudaMalloc(&d.ws, need));
    d.ws_size = need;
    CUDA_OK(fd_gpu_fill(d.stream, d.ws, 0xff, need)); /* never read unwritten partials */
  }
  p.workspace = need ? d.ws : nullptr;
  p.workspace_size = need;
  return p;
}

std::vector<uint16_t> run_gpu(const Host &h, Dev &d, const fd_decode_params &p) {
  const size_t qb = h.q.size() * 2;
  CUDA_OK(fd_gpu_fill(d.stream, d.out, 0xff, qb)); /* NaN in f16 and bf16 */
  FD_ASSERT_OK(fd_decode(&p));
  CUDA_OK(cudaStreamSynchronize(d.stream));
  CUDA_OK(cudaGetLastError());
  std::vector<uint16_t> out(h.q.size());
  CUDA_OK(fd_gpu_download(d.stream, out.data(), d.out, qb));
  return out;
}

/* Worst row-relative error of `got` (q_dtype bits) against `ref`: +inf for
 * a non-finite output (the first one's place is printed) and for a non-zero
 * output of a row that sees nothing. */
double compare(const Host &h, const std::vector<uint16_t> &got, const std::vector<double> &ref) {
  double worst = 0;
  const uint32_t D = h.c.dim;
  for (uint32_t r = 0; r < h.batch; ++r)
    for (int32_t j = 0; j < h.c.q_len; ++j)
      for (uint32_t hd = 0; hd < h.hq; ++hd) {
        const size_t base = (static_cast<size_t>(h.indptr[r] + j) * h.hq + hd) * D;
        double num = 0, den = 0;
        for (uint32_t d = 0; d < D; ++d) {
          const double g = fd_test_load(got.data(), base + d, h.c.q_dtype);
          if (!std::isfinite(g)) {
            print_error("non-finite output at row %u (seq_len %d) token %d head %u dim %u\n", r,
                        h.lens[r], j, hd, d);
            return INFINITY;
          }
          num += (g - ref[base + d]) * (g - ref[base + d]);
          den += ref[base + d] * ref[base + d];
        }
        if (h.lens[r] - h.c.q_len + 1 + j <= 0) {
          if (num != 0) {
            print_error("row %u token %d (no visible key) head %u is not zero\n", r, j, hd);
            return INFINITY;
          }
          continue;
        }
        worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
      }
  return worst;
}

struct Worst {
  double dequant = 0, unquant = 0, cpu = 0;
  int cpu_cases = 0, cpu_refused = 0;
  int failures = 0;  // (case, split mode) pairs over the tolerance: named, failed at the end
};

constexpr double kTolerance = 5e-3;

const char *dtype_str(int32_t d) {
  return d == FD_DTYPE_F16 ? "f16" : "bf16";
}

/* One case: unsplit, automatic and 5 splits against the float64 reference
 * over the dequantised cache, a bit-identical rerun, the CPU backend when it
 * serves the call. */
void check_case(const Case &c, Worst *w) {
  const Host h = make_host(c);
  const std::vector<double> ref = reference(h, true);
  const std::vector<double> ref_unq = reference(h, false);
  Dev d;
  upload(h, d);
  for (int32_t splits : {1, 0, 5}) {
    const fd_decode_params p = device_params(h, d, splits);
    const std::vector<uint16_t> got = run_gpu(h, d, p);
    const double err = compare(h, got, ref);
    w->dequant = std::max(w->dequant, err);
    if (!(err <= kTolerance)) {
      print_error(
          "%s q, %s K/V, D=%u bs=%u %s group=%u kv=%u batch=%u q_len=%d q_amp=%g splits=%d: rel "
          "error %.3g > %.3g\n",
          dtype_str(c.q_dtype), c.kv_dtype == FD_DTYPE_FP8_E5M2 ? "E5M2" : "E4M3", c.dim, c.bs,
          c.dim_major ? "dim-major" : "token-major", c.group, c.hkv, h.batch, c.q_len,
          static_cast<double>(c.q_amp), splits, err, kTolerance);
      ++w->failures;
      continue;
    }
    w->unquant = std::max(w->unquant, compare(h, got, ref_unq));
    if (splits == 0) {
      const std::vector<uint16_t> again = run_gpu(h, d, p);
      assert_memory_equal(got.data(), again.data(), got.size() * 2);
      /* The CPU backend on the same FP8 data, when it serves it. */
      std::vector<uint16_t> cpu(h.q.size(), 0);
      fd_decode_params pc =
          params_for(h, h.q.data(), h.k.data(), h.v.data(), cpu.data(), h.tables.data(),
                     h.lens.data(), h.indptr.data(), h.sinks.empty() ? nullptr : h.sinks.data());
      if (fd_decode(&pc) == FD_OK) {
        std::vector<double> cpu_ref(cpu.size());
        for (size_t i = 0; i < cpu.size(); ++i) cpu_ref[i] = fd_test_load(cpu.data(), i, c.q_dtype);
        w->cpu = std::max(w->cpu, compare(h, got, cpu_ref));
        ++w->cpu_cases;
      } else {
        ++w->cpu_refused;
      }
    }
  }
}

std::vector<int32_t> ragged_lens(uint32_t bs, uint32_t max_len, fd_test_rng *rng) {
  std::vector<int32_t> lens = {0, 1, static_cast<int32_t>(bs), static_cast<int32_t>(bs + 1),
                               static_cast<int32_t>(max_len)};
  lens.push_back(static_cast<int32_t>(fd_test_range(rng, 2, max_len)));
  lens.push_back(static_cast<int32_t>(fd_test_range(rng, 2, max_len)));
  return lens;
}

void report(const char *what, int cases, const Worst &w) {
  if (w.failures > 0) {
    print_error("gpu_fp8: %s: %d (case, split mode) pairs failed of %d x 3\n", what, w.failures,
                cases);
    fail();
  }
  print_message(
      "gpu_fp8: %s: %d cases x 3 split modes passed; worst row-relative error %.3g against "
      "the dequantised cache (<= %.0e), %.3g against the unquantised bf16 values\n",
      what, cases, w.dequant, kTolerance, w.unquant);
  if (w.cpu_cases > 0)
    print_message("gpu_fp8: %s: worst error against the CPU backend %.3g (%d cases)\n", what, w.cpu,
                  w.cpu_cases);
  if (w.cpu_refused > 0)
    print_message(
        "gpu_fp8: %s: the CPU backend refused %d FP8 cases (%s); compared with the "
        "float64 reference only\n",
        what, w.cpu_refused, fd_last_error_message());
}

void test_decode_sweep(void **state) {
  (void)state;
  const bool small = reduced();
  fd_test_rng rng = {7};
  Worst w;
  int cases = 0;
  int e5m2_cases = 0;
  for (int32_t qd : std::initializer_list<int32_t>{FD_DTYPE_BF16, FD_DTYPE_F16,
                                                   -1}) /* -1: bf16 q over E5M2 K/V */
    for (uint32_t D : {64u, 128u})
      for (bool dm : {false, true})
        for (uint32_t bs : {8u, 16u, 32u})
          for (uint32_t g : {1u, 4u, 5u, 8u, 16u})
            for (int32_t q_len : {1, 3}) {
              if (small && (qd == FD_DTYPE_F16 || bs == 32 || g == 1 || q_len == 3)) continue;
              // Groups 5 and 16: one-token rows (the swapped step's partial
              // columns, and the m-tile path above its 8 heads).
              if ((g == 5 || g == 16) && (q_len == 3 || bs == 8)) continue;
              Case c;
              c.q_dtype = qd < 0 ? FD_DTYPE_BF16 : qd;
              if (qd < 0) c.kv_dtype = FD_DTYPE_FP8_E5M2, ++e5m2_cases;
              c.dim = D;
              c.bs = bs;
              c.dim_major = dm;
              c.group = g;
              c.hkv = 2;
              c.q_len = q_len;
              c.lens = ragged_lens(bs, small ? 130 : 300, &rng);
              c.seed = fd_test_next(&rng);
              check_case(c, &w);
              ++cases;
            }
  report("sweep", cases, w);
  if (e5m2_cases > 0) print_message("gpu_fp8: sweep: %d of the cases over E5M2 K/V\n", e5m2_cases);
}

/* bf16 q beyond f16's range (|q| ~ 1e6) and far below its normal range
 * (~1e-8), with sm_scale keeping the logits O(1): the kernel scales each q
 * row by a power of two into f16's range and folds it into the row's logit
 * scale. */
void test_bf16_q_range(void **state) {
  (void)state;
  fd_test_rng rng = {11};
  Worst w;
  int cases = 0;
  for (float amp : {1e6f, 1e-8f})
    for (bool dm : {false, true}) {
      Case c;
      c.q_dtype = FD_DTYPE_BF16;
      c.dim = 128;
      c.bs = 16;
      c.dim_major = dm;
      c.group = 4;
      c.q_amp = amp;
      c.sm_scale = 3.f / (amp * std::sqrt(128.f));
      c.lens = ragged_lens(16, 200, &rng);
      c.seed = fd_test_next(&rng);
      check_case(c, &w);
      ++cases;
    }
  report("bf16 q at 1e6 and 1e-8", cases, w);
}

/* Long rows: split-KV across many CTAs. At 5 splits the 4097-token row of
 * the head_dim 64 case makes items of 13 tiles: the last two-tile stage of
 * that kernel (token-major) covers a tile of the next item, whose keys the
 * item must not attend to (so do the sweep's 5-split lists of 1-tile
 * items). */
void test_long_rows(void **state) {
  (void)state;
  if (reduced()) skip();
  Worst w;
  int cases = 0;
  const struct {
    int32_t qd;
    uint32_t dim, bs, hkv, group;
    std::vector<int32_t> lens;
  } longs[] = {{FD_DTYPE_BF16, 128, 16, 2, 4, {12000, 777, 0}},
               {FD_DTYPE_F16, 64, 32, 2, 8, {9000, 4097}},
               {FD_DTYPE_BF16, 128, 8, 1, 8, {6000}}};
  for (const auto &l : longs)
    for (bool dm : {false, true}) {
      Case c;
      c.q_dtype = l.qd;
      c.dim = l.dim;
      c.bs = l.bs;
      c.hkv = l.hkv;
      c.group = l.group;
      c.lens = l.lens;
      c.dim_major = dm;
      c.seed = 99 + static_cast<uint64_t>(cases);
      check_case(c, &w);
      ++cases;
    }
  report("long rows", cases, w);
}

/* The dynamic shared memory of the attention kernel an automatic-split
 * fd_decode of `c` runs, from a captured graph (its kernel nodes: `kernels`);
 * which kernel shape and staging ran. */
size_t attention_smem(const Case &c, size_t *kernels) {
  const Host h = make_host(c);
  Dev d;
  upload(h, d);
  const fd_decode_params p = device_params(h, d, 1);
  cudaGraph_t graph = fd_capture_decode(d.stream, p);
  const size_t smem = fd_graph_kernel_smem(graph, kernels);
  CUDA_OK(cudaGraphDestroy(graph));
  return smem;
}

/* TMA staging of the swapped FP8 kernel (DecodeWorkList::tma_stages:
 * token-major, one query token, groups of at most 8, a one-wave list of
 * items of at most 4 tiles): rows of at most 256 tokens over a few (row, KV
 * head) units take it, which the attention node's shared memory shows (the
 * stages plus one 8-byte mbarrier each); head_dim 64 and 128, block sizes
 * 8/16/32, packed and NHD strides (the tensor map orders its dims by
 * stride), groups 1/5/8; rows ending inside a block, at a block's end and
 * empty, FP8 NaN past every row's end and in the spare blocks behind
 * unused table slots. Outputs against the float64 reference of the
 * dequantised cache (unsplit, automatic and 5 splits: check_case). Rows of
 * 1000 tokens (16 tiles) take the cp.async staging, and so do dim-major
 * K/V (the swapped kernel's, by its stages' size). Each case over E4M3 and
 * over E5M2 K/V. */
void test_tma_staging(void **state) {
  (void)state;
  const struct {
    uint32_t dim, bs, hkv, group;
    bool nhd, dm;
    int32_t longest;
    bool tma;
  } cases[] = {{128, 16, 2, 8, false, false, 256, true},  {128, 8, 2, 5, true, false, 250, true},
               {64, 32, 4, 8, true, false, 200, true},    {64, 16, 4, 1, false, false, 256, true},
               {128, 16, 2, 8, true, false, 1000, false}, {128, 16, 2, 8, false, true, 256, false},
               {64, 8, 4, 5, false, true, 200, false}};
  fd_test_rng rng = {5};
  Worst w;
  int cases_run = 0;
  for (int32_t kv : {FD_DTYPE_FP8_E4M3, FD_DTYPE_FP8_E5M2})
    for (const auto &k : cases) {
      Case c;
      c.kv_dtype = kv;
      c.dim = k.dim, c.bs = k.bs, c.hkv = k.hkv, c.group = k.group, c.nhd = k.nhd;
      c.dim_major = k.dm;
      c.hint = k.longest; /* (the table holds a spare slot per row: 5 tiles unhinted) */
      c.lens = {k.longest,
                0,
                1,
                static_cast<int32_t>(k.bs),
                static_cast<int32_t>(2 * k.bs + 3),
                static_cast<int32_t>(fd_test_range(&rng, 2, k.longest))};
      c.seed = fd_test_next(&rng);
      check_case(c, &w);
      ++cases_run;
      /* Which staging ran: the captured attention node's shared memory. */
      size_t kernels = 0;
      const size_t smem = attention_smem(c, &kernels);
      /* Config's stages of the swapped kernel (3 / 4 at 4 / 6 CTAs per SM;
       * the m-tile kernel's would be 4 / 6). */
      const size_t stages = k.dim == 128 ? 3 : 4;
      const size_t want = stages * 2 * 64 * k.dim + (k.tma ? 8 * stages : 0);
      if (smem != want) {
        print_error("D=%u bs=%u group=%u %s longest %d: attention smem %zu, want %zu (%s)\n", k.dim,
                    k.bs, k.group, k.dm ? "dim-major" : (k.nhd ? "NHD" : "packed"), k.longest, smem,
                    want, k.tma ? "TMA" : "cp.async");
        fail();
      }
      assert_int_equal(kernels, 1);
    }
  report("TMA staging", cases_run, w);
}

/* The swapped kernel's deep shape (DecodeWorkList::deep_stages: the
 * m-tile FP8 kernel's 4 / 6 stages at 3 / 4 CTAs per SM for head_dim 128 /
 * 64) for a token-major list that fills exactly one wave of it: rows of
 * at most 256 tokens (4 tiles, hinted), as many (row, KV head) units as the
 * device has deep slots (SMs x 3 or 4), staged by TMA (one wave of items of
 * at most 4 tiles). One unit fewer per SM than a full wave, and dim-major
 * K/V, keep the regular shape (3 / 4 stages, 4 / 6 CTAs per SM). Outputs
 * against the float64 reference (check_case: unsplit, automatic and 5
 * splits), rows ending inside a block and empty. */
void test_swap_deep_shape(void **state) {
  (void)state;
  const bool small = reduced(); /* (sanitizers: head_dim 64, token-major, a full wave) */
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  fd_test_rng rng = {23};
  Worst w;
  int cases_run = 0;
  for (uint32_t dim : {64u, 128u})
    for (bool dm : {false, true})
      for (bool full : {true, false}) {
        if (small && (dim != 64 || dm || !full)) continue;
        const uint32_t hkv = dim == 64 ? 4 : 2, per_sm = dim == 64 ? 4 : 3;
        /* full: deep-slots units; else (per_sm - 1) x SMs (one layer short). */
        const uint32_t units = static_cast<uint32_t>(sms) * (full ? per_sm : per_sm - 1);
        Case c;
        c.dim = dim, c.hkv = hkv, c.group = 8, c.dim_major = dm, c.hint = 256;
        c.lens.assign((units + hkv - 1) / hkv, 256);
        c.lens[1] = 0;
        c.lens[2] = static_cast<int32_t>(fd_test_range(&rng, 1, 255));
        c.seed = fd_test_next(&rng);
        if (c.lens.size() * hkv != units) continue; /* (SM counts odd for D = 128) */
        if (full) {
          check_case(c, &w);
          ++cases_run;
        }
        size_t kernels = 0;
        const size_t smem = attention_smem(c, &kernels);
        const size_t stages = full && !dm ? (dim == 128 ? 4 : 6) : (dim == 128 ? 3 : 4);
        const size_t want = stages * 2 * 64 * dim + (dm ? 0 : 8 * stages);
        if (smem != want) {
          print_error("D=%u %s %u units (%s wave): attention smem %zu, want %zu\n", dim,
                      dm ? "dim-major" : "token-major", units, full ? "full" : "short", smem, want);
          fail();
        }
        assert_int_equal(kernels, 1);
      }
  report("swapped deep shape", cases_run, w);
}

/* Attention variants over FP8 K/V (docs/semantics.md S2.3): soft-cap,
 * sliding window and sinks, alone and together, against the float64
 * reference over the dequantised cache with the variant applied
 * (check_case: unsplit, automatic and 5 splits, a bit-identical rerun, the
 * CPU backend): both layouts, head_dim 64 / 128, groups of 4 and 8 (whose
 * plain calls take the swapped step) and 16, one and three query tokens;
 * E4M3 K/V under bf16 q, E5M2 under f16 q. Sinks of -inf and a window longer than every row give
 * the plain result: the same bits where the call runs the plain call's kernel and list, else within
 * the tolerance (the count of such cases is printed). */
void test_variants(void **state) {
  (void)state;
  const bool small = reduced();
  fd_test_rng rng = {31};
  Worst w;
  int cases = 0, same_bits = 0, close = 0;
  constexpr int32_t kLongest = 300; /* rows of up to this many tokens */
  const struct {
    float softcap;
    int32_t window;
    int sinks;
  } variants[] = {{30.f, 0, kNoSinks},    {0.f, 100, kNoSinks},    {0.f, 0, kSinksRandom},
                  {0.f, 0, kSinksNegInf}, {0.f, 100000, kNoSinks}, {20.f, 64, kSinksRandom}};
  for (const auto &var : variants)
    for (uint32_t D : {64u, 128u})
      for (bool dm : {false, true})
        for (uint32_t g : {4u, 8u, 16u})
          for (int32_t q_len : {1, 3}) {
            if (small && (D == 64 || dm || g != 8 || q_len == 3)) continue;
            if (g == 16 && q_len == 3) continue;
            Case c;
            c.q_dtype = (D + g) % 3 ? FD_DTYPE_BF16 : FD_DTYPE_F16;
            /* (f16 q: over E5M2 K/V) */
            if (c.q_dtype == FD_DTYPE_F16) c.kv_dtype = FD_DTYPE_FP8_E5M2;
            c.dim = D, c.dim_major = dm, c.group = g, c.q_len = q_len;
            c.bs = dm ? 16 : (g == 4 ? 8 : 32);
            c.softcap = var.softcap, c.window = var.window, c.sinks = var.sinks;
            c.lens = ragged_lens(c.bs, kLongest, &rng);
            c.seed = fd_test_next(&rng);
            check_case(c, &w);
            ++cases;
            const bool neutral = var.sinks == kSinksNegInf || var.window >= kLongest;
            if (!neutral || w.failures > 0) continue;
            /* The same call without the variant. */
            Case plain = c;
            plain.window = 0, plain.sinks = kNoSinks;
            const Host hv = make_host(c), hp = make_host(plain);
            Dev dv, dp;
            upload(hv, dv);
            upload(hp, dp);
            const std::vector<uint16_t> a = run_gpu(hv, dv, device_params(hv, dv, 0));
            const std::vector<uint16_t> b = run_gpu(hp, dp, device_params(hp, dp, 0));
            if (a == b) {
              ++same_bits;
            } else {
              std::vector<double> bd(b.size());
              for (size_t i = 0; i < b.size(); ++i) bd[i] = fd_test_load(b.data(), i, c.q_dtype);
              const double err = compare(hv, a, bd);
              print_message(
                  "gpu_fp8: variants: D=%u %s group %u q_len %d %s: not the plain bits, "
                  "row-relative %.3g from them\n",
                  D, dm ? "dim-major" : "token-major", g, q_len,
                  var.sinks == kSinksNegInf ? "-inf sinks" : "window past every row", err);
              if (!(err <= kTolerance)) fail();
              ++close;
            }
          }
  report("variants", cases, w);
  print_message(
      "gpu_fp8: variants: neutral variants gave the plain bits in %d cases, within %.0e "
      "in %d\n",
      same_bits, kTolerance, close);
}

/* A CUDA graph of FP8 decode calls replays to the same bits. */
void test_graph_capture(void **state) {
  (void)state;
  fd_test_rng rng = {5};
  Case c;
  c.lens = ragged_lens(16, 700, &rng);
  c.q_len = 2;
  const Host h = make_host(c);
  Dev d;
  upload(h, d);
  const fd_decode_params p = device_params(h, d, 0);
  const std::vector<uint16_t> direct = run_gpu(h, d, p);
  CUDA_OK(fd_gpu_fill(d.stream, d.out, 0xff, h.q.size() * 2));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(d.stream, cudaStreamCaptureModeThreadLocal));
  FD_ASSERT_OK(fd_decode(&p));
  CUDA_OK(cudaStreamEndCapture(d.stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, d.stream));
  CUDA_OK(cudaStreamSynchronize(d.stream));
  std::vector<uint16_t> replay(h.q.size());
  CUDA_OK(fd_gpu_download(d.stream, replay.data(), d.out, replay.size() * 2));
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  assert_memory_equal(direct.data(), replay.data(), direct.size() * 2);
}

/* Combinations the CUDA kernels do not serve: FD_ERR_UNSUPPORTED naming the
 * field. */
void test_refusals(void **state) {
  (void)state;
  fd_test_rng rng = {3};
  Case c;
  c.lens = ragged_lens(16, 64, &rng);
  const Host h = make_host(c);
  Dev d;
  upload(h, d);
  fd_decode_params p = device_params(h, d, 1);
  p.kv_dtype = FD_DTYPE_F32;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_UNSUPPORTED, "kv_dtype");
  /* FP8 K/V: head_dim 64 and 128 only, q and out f16 or bf16 (either FP8
   * type; the message names it). */
  for (int32_t kv : {FD_DTYPE_FP8_E4M3, FD_DTYPE_FP8_E5M2}) {
    p = device_params(h, d, 1);
    p.kv_dtype = kv;
    p.head_dim = 96;
    FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_UNSUPPORTED, "head_dim");
    assert_non_null(
        strstr(fd_last_error_message(), kv == FD_DTYPE_FP8_E5M2 ? "fp8_e5m2" : "fp8_e4m3"));
  }
  p = device_params(h, d, 1);
  p.out_dtype = FD_DTYPE_F16; /* q bf16 */
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_UNSUPPORTED, "out_dtype");
  p = device_params(h, d, 1);
  p.q_dtype = FD_DTYPE_F32;
  p.out_dtype = FD_DTYPE_F32;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_UNSUPPORTED, "q_dtype");
  /* A bf16 cache takes a bf16 q only. */
  p = device_params(h, d, 1);
  p.kv_dtype = FD_DTYPE_BF16;
  p.q_dtype = p.out_dtype = FD_DTYPE_F16;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_UNSUPPORTED, "q_dtype");
}

/* ---- Appends ---------------------------------------------------------- */

/* Inputs with the special values of S1.1 (every 7th element, `specials`):
 * NaN (both signs), +-inf, values past the largest finite code (saturate),
 * subnormal and zero results, -0. Q gets none: its NaN payloads are not
 * part of the FP8 semantics. */
std::vector<uint16_t> special_inputs(size_t n, int32_t dtype, fd_test_rng *rng,
                                     bool specials_too = true) {
  /* ... and midpoints between neighbouring E4M3 codes (1.0625, -3.125, 232,
   * 3 x 2^-10, 2^-10; exact in f16 and bf16): stored at scale 1 they are
   * quotients the bracket cannot decide, so the kernel's exact resolution
   * runs (ties go to the even code). */
  const float specials[] = {NAN,   -NAN,    INFINITY, -INFINITY, 1e5f,     -1e5f,
                            460.f, 449.f,   1e-3f,    -2e-4f,    0.f,      -0.f,
                            3e-6f, 1.0625f, -3.125f,  232.f,     0x3p-10f, 0x1p-10f};
  const int64_t last = int64_t(sizeof specials / sizeof specials[0]) - 1;
  std::vector<uint16_t> x(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = specials_too && (i % 7 == 3) ? specials[fd_test_range(rng, 0, last)]
                                                 : 40.f * fd_test_normal(rng);
    fd_test_store(x.data(), i, dtype, v);
  }
  return x;
}

struct AppendSetup {
  uint32_t tokens = 37, hkv = 2, hq = 8, dim = 128, bs = 16, blocks = 8;
  bool dim_major = false;
  int32_t dtype = FD_DTYPE_BF16;
};

/* Equal bits, or values within one unit in the last place of the dtype, of
 * at least `floor`: a rotation whose cos/sin differ from the CPU's by an
 * FP32 ulp moves its result by up to about (|x| + |y|) 2^-23 (1e-4 for this
 * test's inputs of 40 N(0, 1)), whatever the result's size (cancellation). */
size_t expect_ulp_close(const std::vector<uint16_t> &got, const std::vector<uint16_t> &want,
                        int32_t dtype, const char *what, float floor) {
  const float rel = dtype == FD_DTYPE_BF16 ? 0x1p-7f : 0x1p-10f;
  size_t inexact = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    const float g = fd_test_load(got.data(), i, dtype), w = fd_test_load(want.data(), i, dtype);
    if (!(std::fabs(g - w) <= rel * std::fmax(std::fabs(w), floor))) {
      print_error("%s[%zu]: gpu %g cpu %g\n", what, i, (double)g, (double)w);
      fail();
    }
    ++inexact;
  }
  return inexact;
}

void test_append_bytes(void **state) {
  (void)state;
  fd_test_rng rng = {21};
  int checked = 0;
  size_t inexact = 0;
  /* 37 tokens: one token per CTA, loads held in registers; 2100 and 4099
   * (the last CTA short): 2 and 4 tokens per CTA, loads staged in shared
   * memory, 4-token CTAs with their cache slots computed once; 4100: more
   * units than threads. */
  for (uint32_t tokens : {37u, 2100u, 4099u, 4100u})
    for (int32_t dt : {FD_DTYPE_BF16, FD_DTYPE_F16})
      for (bool dm : {false, true})
        for (uint32_t D : {64u, 128u})
          for (bool rope : {false, true}) {
            if (tokens > 37 && (dm || D == 64) && reduced()) continue;
            /* 4100 tokens: 64 query heads, more units than threads (a
             * thread's second unit holds K or V runs to quantise). */
            if (tokens == 4100 && (dm || D == 64 || !rope)) continue;
            AppendSetup s;
            s.tokens = tokens;
            if (tokens == 4100) s.hq = 64, s.hkv = 8;
            s.blocks = tokens / s.bs + 2;
            s.dtype = dt;
            s.dim_major = dm;
            s.dim = D;
            const size_t kvn = size_t(s.tokens) * s.hkv * s.dim,
                         qn = size_t(s.tokens) * s.hq * s.dim;
            const size_t cache = size_t(s.blocks) * s.hkv * s.bs * s.dim;
            std::vector<uint16_t> k = special_inputs(kvn, dt, &rng),
                                  v = special_inputs(kvn, dt, &rng);
            std::vector<uint16_t> q = special_inputs(qn, dt, &rng, false);
            std::vector<int32_t> ids(s.tokens), offs(s.tokens), pos(s.tokens);
            std::vector<int32_t> slots(size_t(s.blocks) * s.bs);
            std::iota(slots.begin(), slots.end(), 0);
            for (size_t i = slots.size(); i > 1; --i)
              std::swap(slots[i - 1], slots[size_t(fd_test_range(&rng, 0, int64_t(i) - 1))]);
            for (uint32_t t = 0; t < s.tokens; ++t) {
              ids[t] = slots[t] / int32_t(s.bs);
              offs[t] = slots[t] % int32_t(s.bs);
              pos[t] = int32_t(fd_test_range(&rng, 0, 5000));
            }
            fd_kv_append_params p;
            fd_kv_append_params_init(&p);
            p.dtype = dt;
            p.cache_dtype = FD_DTYPE_FP8_E4M3;
            p.k_scale = 0.37f;
            p.v_scale = D == 64 ? 1.f : 1.9f;  // 1: the midpoints reach the resolution
            p.layout = dm ? FD_LAYOUT_DIM_MAJOR : FD_LAYOUT_TOKEN_MAJOR;
            p.num_tokens = s.tokens;
            p.num_kv_heads = s.hkv;
            p.head_dim = s.dim;
            p.block_size = s.bs;
            p.num_blocks = s.blocks;
            if (rope) {
              p.num_q_heads = s.hq;
              p.rotary_dim = s.dim;
            }
            /* Host run (CPU backend), then the same on the device. */
            std::vector<uint8_t> hk(cache, 0x5a), hv(cache, 0x5a);
            std::vector<uint16_t> hq_out(qn, 0);
            p.k = k.data(), p.v = v.data(), p.k_cache = hk.data(), p.v_cache = hv.data();
            p.block_ids = ids.data(), p.offsets = offs.data(), p.positions = pos.data();
            p.q = q.data(), p.q_out = hq_out.data();
            const fd_status cpu = rope ? fd_rope_kv_append(&p) : fd_kv_append(&p);
            cudaStream_t stream;
            CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
            void *dk, *dv, *dq, *dqo, *dkc, *dvc, *didx;
            CUDA_OK(cudaMalloc(&dk, kvn * 2));
            CUDA_OK(cudaMalloc(&dv, kvn * 2));
            CUDA_OK(cudaMalloc(&dq, qn * 2));
            CUDA_OK(cudaMalloc(&dqo, qn * 2));
            CUDA_OK(cudaMalloc(&dkc, cache));
            CUDA_OK(cudaMalloc(&dvc, cache));
            CUDA_OK(cudaMalloc(&didx, 3 * s.tokens * 4));
            CUDA_OK(fd_gpu_upload(stream, dk, k.data(), kvn * 2));
            CUDA_OK(fd_gpu_upload(stream, dv, v.data(), kvn * 2));
            CUDA_OK(fd_gpu_upload(stream, dq, q.data(), qn * 2));
            CUDA_OK(fd_gpu_fill(stream, dkc, 0x5a, cache));
            CUDA_OK(fd_gpu_fill(stream, dvc, 0x5a, cache));
            CUDA_OK(fd_gpu_fill(stream, dqo, 0, qn * 2));
            int32_t *idx = static_cast<int32_t *>(didx);
            CUDA_OK(fd_gpu_upload(stream, idx, ids.data(), s.tokens * 4));
            CUDA_OK(fd_gpu_upload(stream, idx + s.tokens, offs.data(), s.tokens * 4));
            CUDA_OK(fd_gpu_upload(stream, idx + 2 * s.tokens, pos.data(), s.tokens * 4));
            p.k = dk, p.v = dv, p.k_cache = dkc, p.v_cache = dvc;
            p.block_ids = idx, p.offsets = idx + s.tokens, p.positions = idx + 2 * s.tokens;
            p.q = dq, p.q_out = dqo;
            p.device.type = FD_DEVICE_CUDA;
            p.stream = reinterpret_cast<fd_stream>(stream);
            FD_ASSERT_OK(rope ? fd_rope_kv_append(&p) : fd_kv_append(&p));
            std::vector<uint8_t> gk(cache), gv(cache);
            std::vector<uint16_t> gq(qn);
            CUDA_OK(fd_gpu_download(stream, gk.data(), dkc, cache));
            CUDA_OK(fd_gpu_download(stream, gv.data(), dvc, cache));
            CUDA_OK(fd_gpu_download(stream, gq.data(), dqo, qn * 2));
            for (void *x : {dk, dv, dq, dqo, dkc, dvc, didx}) CUDA_OK(cudaFree(x));
            CUDA_OK(cudaStreamDestroy(stream));
            /* The host conversion, element by element (plain append; V of the
             * fused form). */
            const int64_t sb = int64_t(s.hkv) * s.bs * s.dim, sh = int64_t(s.bs) * s.dim;
            const int64_t st = dm ? 1 : s.dim, sd = dm ? s.bs : 1;
            for (uint32_t t = 0; t < s.tokens; ++t)
              for (uint32_t hh = 0; hh < s.hkv; ++hh)
                for (uint32_t d = 0; d < s.dim; ++d) {
                  const size_t src = (size_t(t) * s.hkv + hh) * s.dim + d;
                  const size_t at = size_t(ids[t] * sb + hh * sh + offs[t] * st + d * sd);
                  const uint8_t ev =
                      fd::f32_to_fp8_e4m3(fd_test_load(v.data(), src, dt) / p.v_scale);
                  if (gv[at] != ev) {
                    print_error(
                        "V byte (token %u head %u dim %u): 0x%02x, host conversion 0x%02x\n", t, hh,
                        d, gv[at], ev);
                    fail();
                  }
                  if (rope) continue;
                  const uint8_t ek =
                      fd::f32_to_fp8_e4m3(fd_test_load(k.data(), src, dt) / p.k_scale);
                  if (gk[at] != ek) {
                    print_error(
                        "K byte (token %u head %u dim %u): 0x%02x, host conversion 0x%02x\n", t, hh,
                        d, gk[at], ek);
                    fail();
                  }
                }
            if (cpu == FD_OK) {
              /* Every byte as the CPU backend stores it (untouched slots too);
               * a rotated K and q_out within one code / ulp (the device's
               * cos/sin may differ from the CPU's by an FP32 ulp, as in
               * gpu_append). */
              assert_memory_equal(hv.data(), gv.data(), cache);
              if (rope) {
                inexact += expect_fp8_close(gk, hk, "k_cache");
                inexact += expect_ulp_close(gq, hq_out, dt, "q_out", 0.1f);
              } else {
                assert_memory_equal(hk.data(), gk.data(), cache);
              }
              ++checked;
            } else {
              print_message(
                  "gpu_fp8: the CPU backend refused %s FP8 append (%s): host conversion "
                  "only\n",
                  rope ? "the fused RoPE" : "the plain", fd_last_error_message());
            }
          }
  print_message(
      "gpu_fp8: FP8 appends stored the host conversion; %d of 16 configurations also "
      "equal to the CPU backend (%zu rotated K codes / q_out elements one step apart)\n",
      checked, inexact);
}

/* Layer writes of a CUDA FP8 cache (fd_tx_write_layer / _rope, one-token and
 * multi-token transactions, scales changed between steps) store the bytes a
 * CPU FP8 cache stores for the same calls. */
void test_cache_writes(void **state) {
  (void)state;
  for (bool dm : {false, true}) {
    const uint32_t L = 2, H = 2, HQ = 8, D = 64, BS = 8;
    fd_cache *caches[2] = {nullptr, nullptr};
    const float ks0[2] = {0.05f, 0.2f}, vs0[2] = {0.03f, 0.5f};
    const float ks1[2] = {0.5f, 0.02f}, vs1[2] = {0.1f, 0.07f};
    for (int dev = 0; dev < 2; ++dev) {
      fd_cache_config c;
      fd_cache_config_init(&c);
      c.num_layers = L, c.num_kv_heads = H, c.head_dim = D, c.block_size = BS;
      c.max_blocks = 32;
      c.dtype = FD_DTYPE_FP8_E4M3;
      c.input_dtype = FD_DTYPE_BF16;
      c.layout = dm ? FD_LAYOUT_DIM_MAJOR : FD_LAYOUT_TOKEN_MAJOR;
      c.k_scales = ks0;
      c.v_scales = vs0;
      c.device.type = dev == 0 ? FD_DEVICE_CPU : FD_DEVICE_CUDA;
      const fd_status st = fd_cache_create(&c, &caches[dev]);
      if (st != FD_OK) {
        print_message("gpu_fp8: SKIPPED cache writes: an FP8 %s cache is refused (%s)\n",
                      dev == 0 ? "CPU" : "CUDA", fd_last_error_message());
        if (caches[0]) fd_cache_destroy(caches[0]);
        if (dev == 1) fail(); /* the CUDA cache must be served */
        return;
      }
    }
    fd_test_rng rng = {17};
    const uint64_t ids[3] = {1, 2, 3};
    for (int dev = 0; dev < 2; ++dev)
      for (uint64_t id : ids) FD_ASSERT_OK(fd_cache_add_request(caches[dev], id));
    const uint32_t counts[3][3] = {{3, 1, 5}, {1, 1, 1}, {2, 9, 1}};
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int step = 0; step < 3; ++step) {
      if (step == 2)
        for (int dev = 0; dev < 2; ++dev)
          FD_ASSERT_OK(fd_cache_set_kv_scales(caches[dev], ks1, vs1));
      const uint32_t n = counts[step][0] + counts[step][1] + counts[step][2];
      const size_t kvn = size_t(n) * H * D, qn = size_t(n) * HQ * D;
      std::vector<uint16_t> k = special_inputs(kvn, FD_DTYPE_BF16, &rng);
      std::vector<uint16_t> v = special_inputs(kvn, FD_DTYPE_BF16, &rng);
      std::vector<uint16_t> q = special_inputs(qn, FD_DTYPE_BF16, &rng, false);
      void *dk, *dv, *dq, *dqo;
      CUDA_OK(cudaMalloc(&dk, kvn * 2));
      CUDA_OK(cudaMalloc(&dv, kvn * 2));
      CUDA_OK(cudaMalloc(&dq, qn * 2));
      CUDA_OK(cudaMalloc(&dqo, qn * 2));
      CUDA_OK(fd_gpu_upload(stream, dk, k.data(), kvn * 2));
      CUDA_OK(fd_gpu_upload(stream, dv, v.data(), kvn * 2));
      CUDA_OK(fd_gpu_upload(stream, dq, q.data(), qn * 2));
      std::vector<uint16_t> hqo(qn), gqo(qn);
      for (int dev = 0; dev < 2; ++dev) {
        fd_tx tx;
        if (step == 1)
          FD_ASSERT_OK(fd_tx_begin(caches[dev], ids, 3, &tx));
        else
          FD_ASSERT_OK(fd_tx_begin_multi(caches[dev], ids, counts[step], 3, &tx));
        const fd_stream s = dev == 0 ? nullptr : reinterpret_cast<fd_stream>(stream);
        FD_ASSERT_OK(
            fd_tx_write_layer(caches[dev], tx, 0, dev ? dk : k.data(), dev ? dv : v.data(), s));
        FD_ASSERT_OK(fd_tx_write_layer_rope(caches[dev], tx, 1, dev ? dq : q.data(), HQ,
                                            dev ? dk : k.data(), dev ? dv : v.data(), D, 10000.f,
                                            dev ? dqo : hqo.data(), s));
        FD_ASSERT_OK(fd_tx_commit(caches[dev], tx));
      }
      CUDA_OK(cudaStreamSynchronize(stream));
      CUDA_OK(fd_gpu_download(stream, gqo.data(), dqo, qn * 2));
      expect_ulp_close(gqo, hqo, FD_DTYPE_BF16, "q_out", 1e-3f);
      for (void *x : {dk, dv, dq, dqo}) CUDA_OK(cudaFree(x));
    }
    FD_ASSERT_OK(fd_cache_async_error(caches[1]));
    /* Every stored byte of every layer. */
    const size_t layer_bytes = size_t(32) * H * BS * D;
    for (uint32_t l = 0; l < L; ++l) {
      void *hk, *hv, *gk, *gv;
      int64_t hs[4], gs[4];
      FD_ASSERT_OK(fd_cache_layer_storage(caches[0], l, &hk, &hv, hs));
      FD_ASSERT_OK(fd_cache_layer_storage(caches[1], l, &gk, &gv, gs));
      std::vector<uint8_t> bk(layer_bytes), bv(layer_bytes);
      CUDA_OK(fd_gpu_download(stream, bk.data(), gk, layer_bytes));
      CUDA_OK(fd_gpu_download(stream, bv.data(), gv, layer_bytes));
      /* V exact; K exact for the plain writes (layer 0), within one code
       * for the rotated ones (layer 1). */
      assert_memory_equal(hv, bv.data(), layer_bytes);
      const uint8_t *hk8 = static_cast<const uint8_t *>(hk);
      if (l == 0)
        assert_memory_equal(hk8, bk.data(), layer_bytes);
      else
        expect_fp8_close(bk, std::vector<uint8_t>(hk8, hk8 + layer_bytes), "layer 1 K");
    }
    CUDA_OK(cudaStreamDestroy(stream));
    fd_cache_destroy(caches[0]);
    fd_cache_destroy(caches[1]);
  }
  print_message(
      "gpu_fp8: CUDA FP8 cache layer writes equal the CPU cache's bytes (both layouts)\n");
}

}  // namespace

int main(void) {
  if (!fd_gpu_test_device_present()) return FD_GPU_TEST_SKIPPED;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_sweep),    cmocka_unit_test(test_bf16_q_range),
      cmocka_unit_test(test_long_rows),       cmocka_unit_test(test_variants),
      cmocka_unit_test(test_graph_capture),   cmocka_unit_test(test_tma_staging),
      cmocka_unit_test(test_swap_deep_shape), cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_append_bytes),    cmocka_unit_test(test_cache_writes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
