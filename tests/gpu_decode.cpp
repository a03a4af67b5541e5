/* fd_decode on CUDA against the CPU backend (the paged reference, S2) on fresh
 * random data: every dtype x head_dim x block size x layout (packed, NHD
 * strides, padded dim-major strides) x GQA group 1..32, ragged rows with
 * seq_len 0, 1, block boundaries and the maximum, split and unsplit; outputs
 * poisoned with NaN and checked fully written; stale NaN past every row's end
 * in the cache and unused table slots pointing at NaN blocks; bit-identical
 * reruns; CUDA-graph capture; every error status. The attention variants
 * (soft-cap, sliding window, sinks, combined) and head_dim 96 / 256 against
 * the CPU backend too (issue 16).
 *
 * FD_GPU_TEST_REDUCED=1 runs a small sweep (for compute-sanitizer). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "fd_gpu_test.h"
#include "fd_gpu_graph.h"

namespace {

bool reduced() {
  const char *e = getenv("FD_GPU_TEST_REDUCED");
  return e != nullptr && e[0] == '1';
}

enum Storage { kTokenPacked, kDimPacked, kNhd, kDimPadded, kStorages };

const char *storage_name(int s) {
  static const char *names[] = {"token-major", "dim-major", "NHD strides", "dim-major padded"};
  return names[s];
}

struct Case {
  int32_t dtype = FD_DTYPE_BF16;
  int storage = kTokenPacked;
  uint32_t dim = 128, bs = 16, hkv = 2, group = 4;
  std::vector<int32_t> lens;
  uint32_t mbps = 0;            /* 0: just enough for the longest row */
  int32_t max_seq_len_hint = 0; /* passed through */
  uint64_t seed = 1;
  /* K of position t scaled by 1 + k_ramp * t (k_ramp > 0: later scores
   * larger) or 1 - k_ramp * (len - 1 - t) (< 0: earlier ones larger). */
  float k_ramp = 0.f;
};

/* Host copy of one problem, with the cache laid out as the case says. */
struct Host {
  Case c;
  uint32_t batch = 0, hq = 0, num_blocks = 0, mbps = 0;
  int32_t layout = FD_LAYOUT_TOKEN_MAJOR;
  int64_t sb = 0, sh = 0, st = 0, sd = 0; /* actual element strides */
  bool explicit_strides = false;
  size_t cache_elems = 0;
  std::vector<uint16_t> q, k, v;
  std::vector<int32_t> tables, lens;
};

size_t esize() {
  return 2;
}

Host make_host(const Case &c) {
  Host h;
  h.c = c;
  h.batch = static_cast<uint32_t>(c.lens.size());
  h.hq = c.hkv * c.group;
  uint32_t longest = 0;
  for (int32_t l : c.lens) longest = std::max(longest, static_cast<uint32_t>(l));
  h.mbps = c.mbps ? c.mbps : std::max(1u, (longest + c.bs - 1) / c.bs);
  uint32_t used = 0;
  for (int32_t l : c.lens) used += (static_cast<uint32_t>(l) + c.bs - 1) / c.bs;
  h.num_blocks = used + 3;
  const int64_t H = c.hkv, D = c.dim, B = c.bs, N = h.num_blocks;
  switch (c.storage) {
    case kTokenPacked:
      h.layout = FD_LAYOUT_TOKEN_MAJOR;
      h.sb = H * B * D, h.sh = B * D, h.st = D, h.sd = 1;
      break;
    case kDimPacked:
      h.layout = FD_LAYOUT_DIM_MAJOR;
      h.sb = H * D * B, h.sh = D * B, h.st = 1, h.sd = B;
      break;
    case kNhd:
      h.layout = FD_LAYOUT_TOKEN_MAJOR;
      h.explicit_strides = true;
      h.sb = B * H * D, h.sh = D, h.st = H * D, h.sd = 1;
      break;
    default: /* dim-major with gaps between dims, heads and blocks */
      h.layout = FD_LAYOUT_DIM_MAJOR;
      h.explicit_strides = true;
      h.sd = B + 8, h.sh = D * (B + 8) + 16, h.st = 1, h.sb = H * h.sh + 24;
      break;
  }
  h.cache_elems = static_cast<size_t>(h.sb * N);
  fd_test_rng rng = {c.seed};
  h.q.resize(static_cast<size_t>(h.batch) * h.hq * c.dim);
  for (auto &x : h.q) fd_test_store(&x, 0, c.dtype, 3.0f * fd_test_normal(&rng));
  h.k.resize(h.cache_elems);
  h.v.resize(h.cache_elems);
  for (size_t i = 0; i < h.cache_elems; ++i) {
    fd_test_store(&h.k[i], 0, c.dtype, fd_test_normal(&rng));
    fd_test_store(&h.v[i], 0, c.dtype, fd_test_normal(&rng));
  }
  /* Physical blocks in a seeded random order. */
  std::vector<int32_t> perm(h.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size(); i > 1; --i)
    std::swap(perm[i - 1], perm[static_cast<size_t>(fd_test_range(&rng, 0, (int64_t)i - 1))]);
  h.tables.assign(static_cast<size_t>(h.batch) * h.mbps, -1);
  h.lens = c.lens;
  size_t next = 0;
  const uint16_t nan_bits = 0x7fff; /* NaN in both f16 and bf16 */
  /* The 3 spare blocks hold NaN, and every unused table slot past a row's
   * end points at one of them: the kernel may load those slots early but
   * must never use them (a leak shows up as NaN). */
  const size_t spare0 = used;
  for (size_t i = 0; i < 3; ++i) {
    const size_t at = static_cast<size_t>(perm[spare0 + i]) * static_cast<size_t>(h.sb);
    std::fill(h.k.begin() + static_cast<ptrdiff_t>(at),
              h.k.begin() + static_cast<ptrdiff_t>(at + static_cast<size_t>(h.sb)), nan_bits);
    std::fill(h.v.begin() + static_cast<ptrdiff_t>(at),
              h.v.begin() + static_cast<ptrdiff_t>(at + static_cast<size_t>(h.sb)), nan_bits);
  }
  for (uint32_t r = 0; r < h.batch; ++r) {
    const uint32_t len = static_cast<uint32_t>(c.lens[r]);
    const uint32_t nb = (len + c.bs - 1) / c.bs;
    for (uint32_t b = 0; b < nb; ++b) h.tables[r * h.mbps + b] = perm[next++];
    for (uint32_t b = nb; b < h.mbps; ++b) h.tables[r * h.mbps + b] = perm[spare0 + (r + b) % 3];
    if (c.k_ramp != 0.f)
      for (uint32_t t = 0; t < len; ++t) {
        const float f = c.k_ramp > 0.f ? 1.f + c.k_ramp * static_cast<float>(t)
                                       : 1.f - c.k_ramp * static_cast<float>(len - 1 - t);
        const int64_t blk = h.tables[r * h.mbps + t / c.bs];
        for (uint32_t kv = 0; kv < c.hkv; ++kv)
          for (uint32_t d = 0; d < c.dim; ++d) {
            const size_t at =
                static_cast<size_t>(blk * h.sb + kv * h.sh + (t % c.bs) * h.st + d * h.sd);
            fd_test_store(h.k.data(), at, c.dtype, f * fd_test_load(h.k.data(), at, c.dtype));
          }
      }
    /* Stale NaN in the last block past the row's end must never leak. */
    for (uint32_t t = len; t < nb * c.bs; ++t) {
      const int64_t blk = h.tables[r * h.mbps + t / c.bs];
      for (uint32_t kv = 0; kv < c.hkv; ++kv)
        for (uint32_t d = 0; d < c.dim; ++d) {
          const size_t at =
              static_cast<size_t>(blk * h.sb + kv * h.sh + (t % c.bs) * h.st + d * h.sd);
          h.k[at] = nan_bits;
          h.v[at] = nan_bits;
        }
    }
  }
  return h;
}

fd_decode_params params_for(const Host &h) {
  fd_decode_params p;
  fd_decode_params_init(&p);
  fd_test_decode_dtype(&p, h.c.dtype);
  p.layout = h.layout;
  p.batch = h.batch;
  p.num_q_heads = h.hq;
  p.num_kv_heads = h.c.hkv;
  p.head_dim = h.c.dim;
  p.block_size = h.c.bs;
  p.num_blocks = h.num_blocks;
  p.max_blocks_per_seq = h.mbps;
  if (h.explicit_strides) {
    p.stride_block = h.sb;
    p.stride_head = h.sh;
    p.stride_token = h.st;
    p.stride_dim = h.sd;
  }
  p.max_seq_len_hint = h.c.max_seq_len_hint;
  return p;
}

std::vector<uint16_t> cpu_reference(const Host &h) {
  std::vector<uint16_t> out(h.q.size(), 0);
  fd_decode_params p = params_for(h);
  p.q = h.q.data();
  p.k_cache = h.k.data();
  p.v_cache = h.v.data();
  p.block_tables = h.tables.data();
  p.seq_lens = h.lens.data();
  p.out = out.data();
  p.device.type = FD_DEVICE_CPU;
  FD_ASSERT_OK(fd_decode(&p));
  return out;
}

/* The same problem in device memory. */
struct Dev {
  void *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr, *ws = nullptr;
  int32_t *tables = nullptr, *lens = nullptr;
  size_t ws_size = 0;
  cudaStream_t stream = nullptr;
  Dev() = default;
  Dev(const Dev &) = delete;
  Dev &operator=(const Dev &) = delete;
  ~Dev() {
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(ws);
    cudaFree(tables), cudaFree(lens);
    if (stream) cudaStreamDestroy(stream);
  }
};

void upload(const Host &h, Dev &d) {
  const size_t qb = h.q.size() * esize(), cb = h.cache_elems * esize();
  CUDA_OK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
  /* Room past q and out: the error tests grow head_dim, and the front end
   * must not see the two extents overlap before the backend check runs. */
  CUDA_OK(cudaMalloc(&d.q, 64 * qb + 65536));
  CUDA_OK(cudaMalloc(&d.out, 64 * qb + 65536));
  CUDA_OK(cudaMalloc(&d.k, cb));
  CUDA_OK(cudaMalloc(&d.v, cb));
  CUDA_OK(
      cudaMalloc(reinterpret_cast<void **>(&d.tables), std::max<size_t>(1, h.tables.size()) * 4));
  CUDA_OK(cudaMalloc(reinterpret_cast<void **>(&d.lens), h.lens.size() * 4));
  /* Every fill and copy of the device buffers goes through fd_gpu_* on
   * d.stream, where fd_decode runs (fd_gpu_test.h says why). */
  CUDA_OK(fd_gpu_upload(d.stream, d.q, h.q.data(), qb));
  CUDA_OK(fd_gpu_upload(d.stream, d.k, h.k.data(), cb));
  CUDA_OK(fd_gpu_upload(d.stream, d.v, h.v.data(), cb));
  CUDA_OK(fd_gpu_upload(d.stream, d.tables, h.tables.data(), h.tables.size() * 4));
  CUDA_OK(fd_gpu_upload(d.stream, d.lens, h.lens.data(), h.lens.size() * 4));
}

fd_decode_params device_params(const Host &h, const Dev &d, int32_t num_splits) {
  fd_decode_params p = params_for(h);
  p.q = d.q;
  p.k_cache = d.k;
  p.v_cache = d.v;
  p.block_tables = d.tables;
  p.seq_lens = d.lens;
  p.out = d.out;
  p.num_splits = num_splits;
  p.device.type = FD_DEVICE_CUDA;
  p.device.ordinal = 0;
  p.stream = reinterpret_cast<fd_stream>(d.stream);
  return p;
}

/* Sizes and attaches a workspace for `p` (fd_decode_workspace_size). */
void attach_workspace(fd_decode_params &p, Dev &d) {
  size_t need = 0;
  FD_ASSERT_OK(fd_decode_workspace_size(&p, &need));
  if (need > d.ws_size) {
    cudaFree(d.ws);
    d.ws = nullptr;
    CUDA_OK(cudaMalloc(&d.ws, need));
    d.ws_size = need;
    /* Poison: the kernels must never read partials they did not write. */
    CUDA_OK(fd_gpu_fill(d.stream, d.ws, 0xff, need));
  }
  p.workspace = need ? d.ws : nullptr;
  p.workspace_size = need;
}

std::vector<uint16_t> run_gpu(const Host &h, Dev &d, fd_decode_params p) {
  const size_t qb = h.q.size() * esize();
  CUDA_OK(fd_gpu_fill(d.stream, d.out, 0xff, qb)); /* NaN in f16 and bf16 */
  FD_ASSERT_OK(fd_decode(&p));
  CUDA_OK(cudaStreamSynchronize(d.stream));
  CUDA_OK(cudaGetLastError());
  std::vector<uint16_t> out(h.q.size());
  CUDA_OK(fd_gpu_download(d.stream, out.data(), d.out, qb));
  return out;
}

/* Worst per-(row, head) relative error; fails on any non-finite output and
 * on a non-zero output of an empty row. */
double compare(const Host &h, const std::vector<uint16_t> &got, const std::vector<uint16_t> &ref) {
  double worst = 0;
  const uint32_t D = h.c.dim;
  for (uint32_t r = 0; r < h.batch; ++r)
    for (uint32_t hd = 0; hd < h.hq; ++hd) {
      double num = 0, den = 0;
      for (uint32_t d = 0; d < D; ++d) {
        const size_t i = (static_cast<size_t>(r) * h.hq + hd) * D + d;
        const double g = fd_test_load(got.data(), i, h.c.dtype);
        const double e = fd_test_load(ref.data(), i, h.c.dtype);
        if (!std::isfinite(g)) {
          print_error("non-finite output at row %u head %u dim %u\n", r, hd, d);
          fail();
        }
        num += (g - e) * (g - e);
        den += e * e;
      }
      if (h.lens[r] == 0) {
        if (num != 0) {
          print_error("row %u (seq_len 0) head %u is not zero\n", r, hd);
          fail();
        }
        continue;
      }
      worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
    }
  return worst;
}

double tolerance(int32_t dtype) {
  return dtype == FD_DTYPE_BF16 ? 5e-3 : 1e-3;
}

/* Checks one case for each split mode (none, automatic, fixed), plus a
 * bit-identical rerun of the automatic mode. */
void check_case(const Case &c) {
  const Host h = make_host(c);
  const std::vector<uint16_t> ref = cpu_reference(h);
  Dev d;
  upload(h, d);
  const int32_t modes[] = {1, 0, 5};
  for (int32_t splits : modes) {
    fd_decode_params p = device_params(h, d, splits);
    attach_workspace(p, d);
    const std::vector<uint16_t> got = run_gpu(h, d, p);
    const double err = compare(h, got, ref);
    if (err > tolerance(c.dtype)) {
      print_error("%s D=%u bs=%u %s group=%u kv=%u batch=%u splits=%d: rel error %.3g > %.3g\n",
                  fd_test_dtype_size(c.dtype) == 2 && c.dtype == FD_DTYPE_F16 ? "f16" : "bf16",
                  c.dim, c.bs, storage_name(c.storage), c.group, c.hkv, h.batch, splits, err,
                  tolerance(c.dtype));
      fail();
    }
    if (splits == 0) {
      const std::vector<uint16_t> again = run_gpu(h, d, p);
      assert_memory_equal(got.data(), again.data(), got.size() * esize());
    }
  }
}

/* Scores that keep rising along a row (each tile's maximum passes the
 * running one by far more than the kernel's rescaling slack, so O is rescaled
 * at every step) and that fall (the first tile holds the maximum and later
 * weights are tiny), in every layout and split mode: the lazy running
 * maximum must give the CPU reference's result either way. */
void test_score_ramps(void **state) {
  (void)state;
  const bool small = reduced();
  int cases = 0;
  for (float ramp : {1.f / 32, -1.f / 32, 1.f / 512})
    for (uint32_t D : {64u, 128u, 256u})
      for (int st = 0; st < kStorages; ++st) {
        if (small && (st == kDimPadded || D == 256)) continue;
        Case c;
        c.dtype = (cases % 2) ? FD_DTYPE_F16 : FD_DTYPE_BF16;
        c.storage = st;
        c.dim = D;
        c.bs = st % 2 ? 32 : 16;
        c.group = D == 256 ? 2 : 8;
        c.lens = std::vector<int32_t>{1, 63, 700, 2048, 1500};
        c.k_ramp = ramp;
        c.seed = 100 + static_cast<uint64_t>(cases);
        check_case(c);
        ++cases;
      }
  print_message("gpu_decode: %d score-ramp cases x 3 split modes passed\n", cases);
}

/* Ragged lengths: empty, one token, exact block boundaries, one past, the
 * maximum, and random ones. */
std::vector<int32_t> ragged_lens(uint32_t bs, uint32_t max_len, fd_test_rng *rng) {
  std::vector<int32_t> lens = {0, 1, static_cast<int32_t>(bs), static_cast<int32_t>(bs + 1),
                               static_cast<int32_t>(max_len)};
  lens.push_back(static_cast<int32_t>(fd_test_range(rng, 2, max_len)));
  lens.push_back(static_cast<int32_t>(fd_test_range(rng, 2, max_len)));
  return lens;
}

/* A case of one head shape and storage; the caller sets the lengths. */
Case shape_case(int32_t dtype, uint32_t dim, uint32_t bs, uint32_t hkv, uint32_t group,
                int storage) {
  Case c;
  c.dtype = dtype;
  c.dim = dim;
  c.bs = bs;
  c.hkv = hkv;
  c.group = group;
  c.storage = storage;
  return c;
}

/* One sweep case: ragged rows up to 320 tokens (130 reduced), `group` q
 * heads per KV head (one KV head for groups of 16 and more). */
void check_sweep_case(int32_t dtype, uint32_t dim, uint32_t bs, int storage, uint32_t group,
                      bool small, fd_test_rng *rng) {
  Case c = shape_case(dtype, dim, bs, group >= 16 ? 1 : 2, group, storage);
  const uint32_t max_len = small ? 130 : 320;
  c.lens = ragged_lens(bs, max_len, rng);
  c.mbps = (max_len + bs - 1) / bs;
  c.seed = fd_test_next(rng);
  check_case(c);
}

void test_sweep(void **state) {
  (void)state;
  const bool small = reduced();
  fd_test_rng rng = {42};
  const int32_t dtypes[] = {FD_DTYPE_F16, FD_DTYPE_BF16};
  const uint32_t dims[] = {64, 128};
  const uint32_t sizes[] = {8, 16, 32};
  const uint32_t groups[] = {1, 2, 4, 8, 16, 32};
  int cases = 0;
  for (int32_t dt : dtypes)
    for (uint32_t D : dims)
      for (uint32_t bs : sizes)
        for (int st = 0; st < kStorages; ++st)
          for (uint32_t g : groups) {
            if (small && (dt == FD_DTYPE_F16 || bs == 8 || (g != 1 && g != 4 && g != 32) ||
                          st == kDimPadded))
              continue;
            check_sweep_case(dt, D, bs, st, g, small, &rng);
            ++cases;
          }
  print_message("gpu_decode: %d sweep cases x 3 split modes passed\n", cases);
}

/* Long rows (split-KV across many CTAs), a hint above the real lengths and
 * a max_blocks_per_seq with spare slots. */
void test_long_rows(void **state) {
  (void)state;
  if (reduced()) skip();
  struct {
    int32_t dtype;
    uint32_t dim, bs, hkv, group;
    std::vector<int32_t> lens;
    int32_t hint;
  } cases[] = {
      {FD_DTYPE_BF16, 128, 16, 8, 4, {32768}, 0},
      {FD_DTYPE_F16, 128, 32, 2, 8, {20000, 777, 0}, 0},
      {FD_DTYPE_BF16, 64, 8, 4, 8, {9000, 8191}, 9010},
      {FD_DTYPE_BF16, 128, 16, 1, 32, {5000}, 0},
  };
  for (const auto &k : cases) {
    for (int st : {kTokenPacked, kDimPacked}) {
      Case c = shape_case(k.dtype, k.dim, k.bs, k.hkv, k.group, st);
      c.lens = k.lens;
      c.max_seq_len_hint = k.hint;
      int32_t longest = *std::max_element(k.lens.begin(), k.lens.end());
      c.mbps = static_cast<uint32_t>(longest) / k.bs + 2;
      check_case(c);
    }
  }
}

/* More (row, KV head) units than resident CTAs, where the automatic split
 * choice may take a lead-unit list (whole waves of unsplit units, the rest
 * cut finer; decode_work.hpp): the first case is the shape of C 256 x 1024,
 * which takes one on the H200 (docs/perf/h200-kernel2-926fc20-2026-12-01.md);
 * on other GPUs these shapes check whatever list the choice takes. The
 * layout itself is tested on the CPU (unit_decode_work). Ragged rows (empty,
 * one token, block boundaries, the hint) land in lead and tail units; each
 * case also runs unsplit, with 5 splits and a second time bit for bit. */
void test_lead_units(void **state) {
  (void)state;
  const bool small = reduced();
  struct {
    int32_t dtype;
    uint32_t dim, bs, hkv, group, batch;
    int storage;
  } cases[] = {
      {FD_DTYPE_BF16, 128, 16, 2, 8, 256, kTokenPacked},
      {FD_DTYPE_BF16, 128, 16, 2, 8, 320, kTokenPacked},
      {FD_DTYPE_F16, 128, 32, 2, 8, 250, kDimPacked},
      {FD_DTYPE_BF16, 64, 16, 4, 8, 200, kTokenPacked},
  };
  fd_test_rng rng = {1717};
  for (const auto &k : cases) {
    const int32_t hint = small ? 256 : 1024;
    Case c = shape_case(k.dtype, k.dim, k.bs, k.hkv, k.group, k.storage);
    c.lens = ragged_lens(k.bs, static_cast<uint32_t>(hint), &rng);
    while (c.lens.size() < k.batch)
      c.lens.push_back(static_cast<int32_t>(
          c.lens.size() % 3 == 0 ? hint : fd_test_range(&rng, 0, static_cast<uint32_t>(hint))));
    c.max_seq_len_hint = hint;
    c.mbps = static_cast<uint32_t>(hint) / k.bs + 1;
    c.seed = fd_test_next(&rng);
    check_case(c);
  }
}

/* fd_decode(p) captured into a CUDA graph on d's stream, its output (the
 * first `out_bytes`) poisoned first. */
cudaGraph_t capture_decode(Dev &d, const fd_decode_params &p, size_t out_bytes) {
  CUDA_OK(fd_gpu_fill(d.stream, d.out, 0xff, out_bytes));
  return fd_capture_decode(d.stream, p);
}

/* Captures fd_decode(p) into a CUDA graph and returns the largest dynamic
 * shared memory of its kernel nodes (the attention kernel's: the merge
 * kernel takes a few KB) and in *kernels their number, replaying the graph
 * once and returning its output in *out (`elems` elements, poisoned
 * first). */
size_t captured_smem(Dev &d, const fd_decode_params &p, size_t elems, std::vector<uint16_t> *out,
                     size_t *kernels) {
  cudaGraph_t graph = capture_decode(d, p, elems * esize());
  cudaGraphExec_t exec = nullptr;
  const size_t smem = fd_graph_kernel_smem(graph, kernels);
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, d.stream));
  out->assign(elems, 0);
  CUDA_OK(fd_gpu_download(d.stream, out->data(), d.out, elems * esize()));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return smem;
}

/* The deep CTA shape of head_dim 128 over 16-bit K/V (3 stages of 64-token
 * K and V tiles, 96 KB, at 2 CTAs per SM instead of 2 stages, 64 KB, at 3;
 * DecodeWorkList::deep_stages): a token-major plain call whose list has at
 * most 2 items per SM, each of at least 4 tiles, takes it; 2-tile items, a
 * soft-cap and dim-major K/V take the regular shape (one plan, either
 * shape: a run with a variant takes the regular one). With automatic splits,
 * one to four (row, KV head) units per SM of rows up to 4096 tokens (one or
 * two waves) run unsplit in it (one kernel, no merge). The shape is read from a captured
 * graph's attention node; every output is checked against the CPU backend
 * (ragged rows: empty, one token, block boundaries, the hint), and again
 * bit for bit. */
void test_deep_stages(void **state) {
  (void)state;
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr size_t kDeep = 3 * 2 * 64 * 128 * 2, kRegular = 2 * 2 * 64 * 128 * 2;
  fd_test_rng rng = {2027};
  const uint32_t per_sm = static_cast<uint32_t>(sms); /* rows: 2 KV heads each */
  const struct {
    int32_t dtype;
    int storage;
    uint32_t rows;
    int32_t hint, splits;  // 4096 in 4 splits: 16 tiles per item; 512 in 4: 2; 0: automatic
    float softcap;
    bool deep;
  } cases[] = {
      {FD_DTYPE_BF16, kTokenPacked, 8, 4096, 4, 0.f, true},
      {FD_DTYPE_F16, kNhd, 8, 4096, 4, 0.f, true},
      {FD_DTYPE_BF16, kTokenPacked, 8, 512, 4, 0.f, false},
      {FD_DTYPE_BF16, kTokenPacked, 8, 4096, 4, 30.f, false},
      {FD_DTYPE_F16, kDimPacked, 8, 4096, 4, 0.f, false},
      {FD_DTYPE_BF16, kTokenPacked, per_sm, 1024, 0, 0.f, true},
      {FD_DTYPE_F16, kNhd, 2 * per_sm, 512, 0, 0.f, true},
  };
  for (const auto &k : cases) {
    Case c = shape_case(k.dtype, 128, 16, 2, 8, k.storage);
    c.lens = ragged_lens(16, static_cast<uint32_t>(k.hint), &rng);
    c.lens.push_back(k.hint - 1);
    while (c.lens.size() < k.rows)
      c.lens.push_back(static_cast<int32_t>(fd_test_range(&rng, 0, static_cast<uint32_t>(k.hint))));
    c.max_seq_len_hint = k.hint;
    c.mbps = static_cast<uint32_t>(k.hint) / 16 + 1;
    c.seed = fd_test_next(&rng);
    const Host h = make_host(c);
    fd_decode_params cp = params_for(h);
    cp.logit_softcap = k.softcap;
    std::vector<uint16_t> ref(h.q.size(), 0);
    cp.q = h.q.data(), cp.k_cache = h.k.data(), cp.v_cache = h.v.data();
    cp.block_tables = h.tables.data(), cp.seq_lens = h.lens.data(), cp.out = ref.data();
    FD_ASSERT_OK(fd_decode(&cp));
    Dev d;
    upload(h, d);
    fd_decode_params p = device_params(h, d, k.splits);
    p.logit_softcap = k.softcap;
    attach_workspace(p, d);
    /* 8 rows x 2 KV heads x 4 splits: 64 items, within 2 per SM on any GPU
     * of 32 SMs or more; automatic: 2 or 4 units per SM, unsplit. */
    const bool deep = k.deep && (k.splits == 0 || 8 * 2 * k.splits <= 2 * sms);
    std::vector<uint16_t> got, again;
    size_t kernels = 0;
    const size_t smem = captured_smem(d, p, h.q.size(), &got, &kernels);
    if (smem != (deep ? kDeep : kRegular)) {
      print_error("%s %s rows %u hint %d splits %d softcap %g: attention smem %zu, want %zu\n",
                  k.dtype == FD_DTYPE_F16 ? "f16" : "bf16", storage_name(k.storage), k.rows, k.hint,
                  k.splits, static_cast<double>(k.softcap), smem, deep ? kDeep : kRegular);
      fail();
    }
    if (k.splits == 0) assert_int_equal(kernels, 1); /* unsplit: no merge */
    assert_true(compare(h, got, ref) <= tolerance(k.dtype));
    captured_smem(d, p, h.q.size(), &again, &kernels);
    assert_memory_equal(got.data(), again.data(), got.size() * esize());
  }
}

/* An out that is only element-aligned (2 bytes past an 8-byte boundary):
 * the kernels fall back from 8-byte to element stores, unsplit and split,
 * and write exactly the output elements. */
void test_unaligned_out(void **state) {
  (void)state;
  Case c;
  c.lens = {700, 33, 0};
  c.group = 4;
  c.hkv = 2;
  const Host h = make_host(c);
  const std::vector<uint16_t> ref = cpu_reference(h);
  Dev d;
  upload(h, d);
  const size_t qb = h.q.size() * esize();
  for (const int32_t splits : {1, 3}) {
    fd_decode_params p = device_params(h, d, splits);
    attach_workspace(p, d);
    p.out = static_cast<uint8_t *>(d.out) + esize();
    CUDA_OK(fd_gpu_fill(d.stream, d.out, 0xff, qb + 2 * esize()));
    FD_ASSERT_OK(fd_decode(&p));
    std::vector<uint16_t> all(h.q.size() + 2);
    CUDA_OK(fd_gpu_download(d.stream, all.data(), d.out, qb + 2 * esize()));
    assert_int_equal(all.front(), 0xffff); /* nothing before out */
    assert_int_equal(all.back(), 0xffff);  /* nothing past its end */
    const std::vector<uint16_t> got(all.begin() + 1, all.end() - 1);
    assert_true(compare(h, got, ref) <= tolerance(c.dtype));
  }
}

/* fd_decode captured into a CUDA graph gives the eager bits: automatic
 * splits, and 4 splits (attention then merge kernel: two nodes). */
void test_graph_capture(void **state) {
  (void)state;
  Case c;
  c.lens = {3000, 5, 0, 1500};
  c.group = 4;
  c.hkv = 2;
  const Host h = make_host(c);
  Dev d;
  upload(h, d);
  const struct {
    int32_t splits;
    size_t nodes; /* 0: not checked */
  } modes[] = {{0, 0}, {4, 2}};
  for (const auto &m : modes) {
    fd_decode_params p = device_params(h, d, m.splits);
    attach_workspace(p, d);
    const std::vector<uint16_t> eager = run_gpu(h, d, p);
    const size_t qb = h.q.size() * esize();
    cudaGraph_t graph = capture_decode(d, p, qb);
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    size_t nodes = 0;
    CUDA_OK(cudaGraphGetNodes(graph, nullptr, &nodes));
    assert_true(nodes >= 1);
    if (m.nodes) assert_int_equal(nodes, m.nodes);
    for (int i = 0; i < 3; ++i) CUDA_OK(cudaGraphLaunch(exec, d.stream));
    std::vector<uint16_t> replay(h.q.size());
    CUDA_OK(fd_gpu_download(d.stream, replay.data(), d.out, qb));
    assert_memory_equal(eager.data(), replay.data(), qb);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

/* Runs fd_decode with `p` (the output poisoned first) and returns its
 * `elems` output elements. */
std::vector<uint16_t> run_elems(Dev &d, fd_decode_params p, size_t elems) {
  CUDA_OK(fd_gpu_fill(d.stream, d.out, 0xff, elems * esize()));
  FD_ASSERT_OK(fd_decode(&p));
  CUDA_OK(cudaStreamSynchronize(d.stream));
  CUDA_OK(cudaGetLastError());
  std::vector<uint16_t> got(elems);
  CUDA_OK(fd_gpu_download(d.stream, got.data(), d.out, elems * esize()));
  return got;
}

/* Worst row-relative error of `got` against `ref` over `rows` query rows of
 * `dim` elements (an all-zero reference row: the absolute error); fails on
 * any non-finite output. */
double worst_row_error(const std::vector<uint16_t> &got, const std::vector<uint16_t> &ref,
                       size_t rows, uint32_t dim, int32_t dtype, int32_t splits) {
  double worst = 0;
  for (size_t t = 0; t < rows; ++t) {
    double num = 0, den = 0;
    for (uint32_t e = 0; e < dim; ++e) {
      const double g = fd_test_load(got.data(), t * dim + e, dtype);
      const double w = fd_test_load(ref.data(), t * dim + e, dtype);
      if (!std::isfinite(g)) {
        print_error("non-finite output at query row %zu dim %u (splits %d)\n", t, e, splits);
        fail();
      }
      num += (g - w) * (g - w), den += w * w;
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

/* Runs `plan` with `p` captured in a CUDA graph (the output poisoned
 * first) and returns the replay's `elems` output elements. */
std::vector<uint16_t> replay_captured(Dev &d, const fd_decode_plan *plan, const fd_decode_params &p,
                                      size_t elems) {
  const size_t bytes = elems * esize();
  CUDA_OK(fd_gpu_fill(d.stream, d.out, 0xff, bytes));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(d.stream, cudaStreamCaptureModeGlobal));
  const fd_status st = fd_decode_run(plan, &p);
  CUDA_OK(cudaStreamEndCapture(d.stream, &graph));
  FD_ASSERT_OK(st);
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, d.stream));
  std::vector<uint16_t> replay(elems);
  CUDA_OK(fd_gpu_download(d.stream, replay.data(), d.out, bytes));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return replay;
}

void expect_untouched(const Host &h, const Dev &d);

struct MultiShape {
  uint32_t hkv, group;
  int storage;
  int32_t dtype;
  std::vector<int32_t> lens, q_lens;
  uint32_t dim = 128;
  int32_t extra_hint = 0; /* max_q_len_hint above the longest row's q_len */
  uint64_t seed = 99;
  uint32_t bs = 16;
};

/* One multi-token case: the CUDA kernel against the CPU backend on the same
 * fresh random data, no / automatic / 5 splits, outputs poisoned with NaN;
 * with automatic splits also a bit-identical rerun and a captured plan run.
 * `check_refusal`: the checked path refuses a row with more query tokens
 * than cached ones (the case's last row must have as many of both). */
void check_multi_token(const MultiShape &sh, bool check_refusal) {
  Case c;
  c.hkv = sh.hkv, c.group = sh.group, c.storage = sh.storage, c.dtype = sh.dtype;
  c.dim = sh.dim;
  c.bs = sh.bs;
  c.lens = sh.lens;
  c.seed = sh.seed;
  const Host h = make_host(c);
  std::vector<int32_t> indptr(1, 0);
  int32_t max_q = 0;
  for (int32_t n : sh.q_lens) indptr.push_back(indptr.back() + n), max_q = std::max(max_q, n);
  const size_t tokens = static_cast<size_t>(indptr.back());
  const size_t q_elems = tokens * h.hq * c.dim, qb = q_elems * esize();
  std::vector<uint16_t> q(q_elems);
  fd_test_rng rng = {sh.seed ^ 0x5bd1e995u};
  for (auto &x : q) fd_test_store(&x, 0, c.dtype, 3.0f * fd_test_normal(&rng));
  /* CPU backend: the reference. */
  std::vector<uint16_t> ref(q_elems, 0xffff);
  fd_decode_params cp = params_for(h);
  cp.q = q.data(), cp.q_indptr = indptr.data(), cp.out = ref.data();
  cp.k_cache = h.k.data(), cp.v_cache = h.v.data();
  cp.block_tables = h.tables.data(), cp.seq_lens = h.lens.data();
  FD_ASSERT_OK(fd_decode(&cp));

  Dev d;
  upload(h, d);
  /* upload sized q and out for one token per row: room for every token. */
  cudaFree(d.q), cudaFree(d.out);
  d.q = d.out = nullptr;
  CUDA_OK(cudaMalloc(&d.q, qb));
  CUDA_OK(cudaMalloc(&d.out, qb));
  CUDA_OK(fd_gpu_upload(d.stream, d.q, q.data(), qb));
  int32_t *dev_indptr = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void **>(&dev_indptr), indptr.size() * 4));
  CUDA_OK(fd_gpu_upload(d.stream, dev_indptr, indptr.data(), indptr.size() * 4));
  auto run = [&](const fd_decode_params &p) { return run_elems(d, p, q_elems); };
  for (int32_t splits : {1, 0, 5}) {
    fd_decode_params p = device_params(h, d, splits);
    p.q_indptr = dev_indptr;
    p.max_q_len_hint = max_q + sh.extra_hint;
    attach_workspace(p, d);
    const std::vector<uint16_t> got = run(p);
    const double worst = worst_row_error(got, ref, tokens * h.hq, c.dim, c.dtype, splits);
    if (worst > tolerance(c.dtype)) {
      print_error(
          "multi-token %s D=%u %s hkv %u group %u max_q %d splits %d: rel error %.3g "
          "vs the CPU\n",
          c.dtype == FD_DTYPE_F16 ? "f16" : "bf16", c.dim, storage_name(c.storage), c.hkv, c.group,
          max_q, splits, worst);
      fail();
    }
    if (splits == 0) {
      assert_memory_equal(got.data(), run(p).data(), qb); /* deterministic */
      /* A plan's run, captured in a graph, gives the same bits. */
      fd_decode_plan *plan = nullptr;
      FD_ASSERT_OK(fd_decode_plan_create(&p, nullptr, &plan));
      assert_memory_equal(got.data(), replay_captured(d, plan, p, q_elems).data(), qb);
      fd_decode_plan_destroy(plan);
      /* The checked path refuses a row with more query tokens than K/V. */
      if (check_refusal) {
        const uint32_t last = h.batch - 1;
        std::vector<int32_t> bad = indptr;
        bad.back() += 1;
        p.flags = FD_DECODE_CHECK_INDICES;
        p.max_q_len_hint = max_q + 1;
        CUDA_OK(fd_gpu_upload(d.stream, dev_indptr, bad.data(), bad.size() * 4));
        CUDA_OK(fd_gpu_fill(d.stream, d.out, 0xff, qb));
        char msg[96];
        snprintf(msg, sizeof msg, "row %u has %d query tokens but seq_lens[%u] = %d", last,
                 sh.q_lens[last] + 1, last, h.lens[last]);
        FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_INVALID_ARGUMENT, msg);
        std::vector<uint8_t> untouched(qb);
        CUDA_OK(fd_gpu_download(d.stream, untouched.data(), d.out, qb));
        for (uint8_t b : untouched) assert_int_equal(b, 0xff);
        CUDA_OK(fd_gpu_upload(d.stream, dev_indptr, indptr.data(), indptr.size() * 4));
      }
    }
  }
  cudaFree(dev_indptr);
}

/* Several query tokens per row (S2.2, speculative verification): q_len up to
 * 8 with groups of 4, 8 and 32 (query rows up to 64 per KV head: one CTA
 * holds them all), both layouts, rows shorter than the longest. */
void test_multi_token(void **state) {
  (void)state;
  const MultiShape shapes[] = {
      {2, 4, kTokenPacked, FD_DTYPE_BF16, {900, 37, 4100, 8}, {8, 2, 4, 8}},
      {2, 8, kDimPacked, FD_DTYPE_F16, {513, 2000, 9}, {8, 3, 1}},
      {8, 4, kNhd, FD_DTYPE_BF16, {64, 65, 700}, {2, 2, 2}},
      {1, 32, kTokenPacked, FD_DTYPE_F16, {300, 2}, {2, 2}},
  };
  for (const MultiShape &sh : shapes) check_multi_token(sh, &sh == &shapes[0]);
}

/* Prompt chunks (issue 14): more query rows per KV head than one CTA holds,
 * so a row's query tokens are cut into query tiles, one CTA each, walking
 * only the keys their last token sees. q_len 1, 17, 100, 300 and 1000; rows
 * with no cache before the chunk (seq_len == q_len); decode rows (q_len 1)
 * beside long chunks; GQA groups 1, 4 and 8; both layouts (and NHD strides);
 * bf16 and f16; head_dim 64 and 128; a max_q_len_hint above every row's
 * q_len (tiles past a row's tokens stay empty). */
void test_prefill_chunks(void **state) {
  (void)state;
  std::vector<MultiShape> shapes;
  if (reduced()) {
    /* Small enough for compute-sanitizer: 100 tokens x group 4 = 400 rows. */
    shapes.push_back({2, 4, kTokenPacked, FD_DTYPE_BF16, {100, 1, 150}, {100, 1, 17}, 64});
    shapes.push_back({1, 8, kDimPacked, FD_DTYPE_F16, {90, 40}, {17, 40}, 128});
  } else {
    shapes.push_back(
        {2, 4, kTokenPacked, FD_DTYPE_BF16, {1000, 1, 4100, 37}, {1000, 1, 300, 17}, 128});
    shapes.push_back({4, 1, kDimPacked, FD_DTYPE_F16, {100, 2000, 650}, {100, 1, 300}, 64});
    shapes.push_back({2, 8, kNhd, FD_DTYPE_BF16, {1000, 300, 5}, {17, 300, 1}, 64});
    shapes.push_back({1, 8, kDimPacked, FD_DTYPE_F16, {1500, 100}, {1000, 100}, 128});
    shapes.push_back({2, 1, kTokenPacked, FD_DTYPE_F16, {3000, 300}, {300, 300}, 128, 37});
    shapes.push_back({2, 4, kDimPadded, FD_DTYPE_BF16, {17, 700, 1}, {17, 100, 1}, 64});
  }
  uint64_t seed = 7;
  for (MultiShape &sh : shapes) {
    sh.seed = seed++;
    check_multi_token(sh, false);
  }
  print_message("gpu_decode: %zu prompt-chunk cases x 3 split modes passed\n", shapes.size());
}

/* The cases the Hopper kernel (kernels/decode_sm90.cu) takes on a compute
 * capability 9.0 device: 16-bit q = K/V, token-major (packed and NHD
 * strides), head_dim 64 and 128, no attention variant. Block sizes 8 and 32;
 * GQA groups 1, 5 and 16 (query tiles of 64 rows, of 60 rows with padding
 * rows, and of one row per KV head and token); chunks longer than one query
 * tile over long caches and rows of one token beside them. Elsewhere the
 * mma.sync kernel serves the same cases. */
void test_multi_token_hopper(void **state) {
  (void)state;
  int major = 0, minor = 0;
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  std::vector<MultiShape> shapes;
  shapes.push_back(
      {4, 2, kTokenPacked, FD_DTYPE_BF16, {257, 64, 1200, 5}, {40, 64, 33, 1}, 128, 0, 31, 8});
  shapes.push_back({2, 16, kNhd, FD_DTYPE_F16, {129, 500}, {4, 3}, 64, 0, 32, 32});
  shapes.push_back({2, 5, kTokenPacked, FD_DTYPE_F16, {300, 77}, {150, 77}, 128, 3, 33, 16});
  if (!reduced()) {
    shapes.push_back({1, 1, kTokenPacked, FD_DTYPE_BF16, {4109}, {700}, 128, 0, 34, 32});
    shapes.push_back({8, 4, kNhd, FD_DTYPE_BF16, {2048, 4096}, {8, 2048}, 64, 0, 35, 16});
  }
  for (const MultiShape &sh : shapes) check_multi_token(sh, false);
  print_message("gpu_decode: %zu multi-token cases of the %s kernel x 3 split modes passed\n",
                shapes.size(), major == 9 && minor == 0 ? "sm90 (wgmma)" : "mma.sync");
}

/* Attention variants (S2.3) and head_dim 96 / 256 on CUDA (issue 16): the
 * kernel against the CPU backend on the same fresh random data. */
enum Sinks { kNoSinks, kSinksNegInf, kSinksZero, kSinksLarge, kSinksRandom };

struct VariantCase {
  MultiShape shape; /* rows and query tokens (all 1: q_indptr NULL) */
  float softcap = 0.f;
  int32_t window = 0;
  int sinks = kNoSinks;
};

const char *sinks_name(int s) {
  static const char *names[] = {"none", "-inf", "0", "large", "random"};
  return names[s];
}

/* One variant case: no / automatic / 5 splits, outputs poisoned with NaN,
 * within tolerance of the CPU backend; with automatic splits a bit-identical
 * rerun and a captured plan run; sinks of -inf give the bits of no sinks.
 * K and V of every block wholly before a row's window (what its earliest
 * query token cannot see) hold NaN: the kernel must never read them. */
void check_variant(const VariantCase &vc) {
  const MultiShape &sh = vc.shape;
  Case c;
  c.hkv = sh.hkv, c.group = sh.group, c.storage = sh.storage, c.dtype = sh.dtype;
  c.dim = sh.dim;
  c.lens = sh.lens;
  c.seed = sh.seed;
  Host h = make_host(c);
  const bool multi = *std::max_element(sh.q_lens.begin(), sh.q_lens.end()) > 1;
  if (vc.window > 0) {
    const uint16_t nan_bits = 0x7fff;
    for (uint32_t r = 0; r < h.batch; ++r) {
      const int64_t first = std::max<int64_t>(0, int64_t{h.lens[r]} - sh.q_lens[r] - vc.window + 1);
      for (int64_t b = 0; (b + 1) * c.bs <= first; ++b) {
        const int64_t blk = h.tables[r * h.mbps + b];
        for (uint32_t kv = 0; kv < c.hkv; ++kv)
          for (uint32_t t = 0; t < c.bs; ++t)
            for (uint32_t d = 0; d < c.dim; ++d) {
              const size_t at = static_cast<size_t>(blk * h.sb + kv * h.sh + t * h.st + d * h.sd);
              h.k[at] = nan_bits;
              h.v[at] = nan_bits;
            }
      }
    }
  }
  std::vector<int32_t> indptr(1, 0);
  int32_t max_q = 0;
  for (int32_t n : sh.q_lens) indptr.push_back(indptr.back() + n), max_q = std::max(max_q, n);
  const size_t tokens = static_cast<size_t>(indptr.back());
  const size_t q_elems = tokens * h.hq * c.dim, qb = q_elems * esize();
  std::vector<uint16_t> q(q_elems);
  fd_test_rng rng = {sh.seed ^ 0x9e3779b9u};
  for (auto &x : q) fd_test_store(&x, 0, c.dtype, 3.0f * fd_test_normal(&rng));
  std::vector<float> sinks(h.hq);
  for (float &s : sinks) {
    switch (vc.sinks) {
      case kSinksNegInf: s = -INFINITY; break;
      case kSinksZero: s = 0.f; break;
      case kSinksLarge: s = 12.f; break;
      default: s = 3.f * fd_test_normal(&rng); break;
    }
  }
  auto with_variant = [&](fd_decode_params p, const float *sink_ptr) {
    p.logit_softcap = vc.softcap;
    p.sliding_window = vc.window;
    p.sinks = vc.sinks == kNoSinks ? nullptr : sink_ptr;
    if (multi) p.max_q_len_hint = max_q;
    return p;
  };
  /* CPU backend: the reference. */
  std::vector<uint16_t> ref(q_elems, 0xffff);
  fd_decode_params cp = with_variant(params_for(h), sinks.data());
  cp.q = q.data(), cp.q_indptr = multi ? indptr.data() : nullptr, cp.out = ref.data();
  cp.k_cache = h.k.data(), cp.v_cache = h.v.data();
  cp.block_tables = h.tables.data(), cp.seq_lens = h.lens.data();
  FD_ASSERT_OK(fd_decode(&cp));

  Dev d;
  upload(h, d);
  cudaFree(d.q), cudaFree(d.out);
  d.q = d.out = nullptr;
  CUDA_OK(cudaMalloc(&d.q, qb));
  CUDA_OK(cudaMalloc(&d.out, qb));
  CUDA_OK(fd_gpu_upload(d.stream, d.q, q.data(), qb));
  int32_t *dev_indptr = nullptr;
  float *dev_sinks = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void **>(&dev_indptr), indptr.size() * 4));
  CUDA_OK(fd_gpu_upload(d.stream, dev_indptr, indptr.data(), indptr.size() * 4));
  CUDA_OK(cudaMalloc(reinterpret_cast<void **>(&dev_sinks), sinks.size() * 4));
  CUDA_OK(fd_gpu_upload(d.stream, dev_sinks, sinks.data(), sinks.size() * 4));
  auto run = [&](const fd_decode_params &p) { return run_elems(d, p, q_elems); };
  for (int32_t splits : {1, 0, 5}) {
    fd_decode_params p = with_variant(device_params(h, d, splits), dev_sinks);
    p.q_indptr = multi ? dev_indptr : nullptr;
    attach_workspace(p, d);
    const std::vector<uint16_t> got = run(p);
    const double worst = worst_row_error(got, ref, tokens * h.hq, c.dim, c.dtype, splits);
    if (worst > tolerance(c.dtype)) {
      print_error(
          "variant %s D=%u %s hkv %u group %u max_q %d softcap %g window %d sinks %s splits %d: "
          "rel error %.3g vs the CPU\n",
          c.dtype == FD_DTYPE_F16 ? "f16" : "bf16", c.dim, storage_name(c.storage), c.hkv, c.group,
          max_q, static_cast<double>(vc.softcap), vc.window, sinks_name(vc.sinks), splits, worst);
      fail();
    }
    if (vc.sinks == kSinksNegInf) {
      /* -inf sinks: the bits of no sinks. */
      fd_decode_params none = p;
      none.sinks = nullptr;
      assert_memory_equal(got.data(), run(none).data(), qb);
    }
    if (splits == 0) {
      assert_memory_equal(got.data(), run(p).data(), qb); /* deterministic */
      fd_decode_plan *plan = nullptr;
      FD_ASSERT_OK(fd_decode_plan_create(&p, h.lens.data(), &plan));
      size_t need = 0;
      FD_ASSERT_OK(fd_decode_plan_workspace_size(plan, &need));
      fd_decode_params pr = p;
      if (need > d.ws_size) {
        cudaFree(d.ws);
        CUDA_OK(cudaMalloc(&d.ws, need));
        d.ws_size = need;
      }
      pr.workspace = need ? d.ws : nullptr;
      pr.workspace_size = need;
      /* The plan's own (exact-length) layout, eager, then captured. */
      CUDA_OK(fd_gpu_fill(d.stream, d.out, 0xff, qb));
      FD_ASSERT_OK(fd_decode_run(plan, &pr));
      std::vector<uint16_t> eager(q_elems);
      CUDA_OK(fd_gpu_download(d.stream, eager.data(), d.out, qb));
      assert_memory_equal(eager.data(), replay_captured(d, plan, pr, q_elems).data(), qb);
      fd_decode_plan_destroy(plan);
    }
  }
  cudaFree(dev_indptr);
  cudaFree(dev_sinks);
}

/* check_variant on each case, seeds from `seed` on (reduced: the first). */
void check_variants(std::vector<VariantCase> cases, uint64_t seed) {
  for (VariantCase &vc : cases) {
    vc.shape.seed = seed++;
    check_variant(vc);
    if (reduced()) break;
  }
}

VariantCase variant_case(uint32_t hkv, uint32_t group, int storage, int32_t dtype, uint32_t dim,
                         std::vector<int32_t> lens, std::vector<int32_t> q_lens, float softcap,
                         int32_t window, int sinks) {
  VariantCase vc;
  vc.shape.hkv = hkv, vc.shape.group = group, vc.shape.storage = storage;
  vc.shape.dtype = dtype, vc.shape.dim = dim;
  vc.shape.lens = std::move(lens);
  vc.shape.q_lens = std::move(q_lens);
  vc.softcap = softcap, vc.window = window, vc.sinks = sinks;
  return vc;
}

/* Soft-caps of 20, 30 and 50, with one and several query tokens, both
 * layouts, f16 and bf16, head_dim 64 / 128. */
void test_softcap(void **state) {
  (void)state;
  const std::vector<int32_t> one = {1, 1, 1, 1};
  std::vector<VariantCase> cases = {
      variant_case(2, 4, kTokenPacked, FD_DTYPE_BF16, 128, {900, 37, 0, 4100}, one, 20.f, 0, 0),
      variant_case(2, 8, kDimPacked, FD_DTYPE_F16, 64, {513, 2000, 1, 64}, one, 30.f, 0, 0),
      variant_case(4, 2, kNhd, FD_DTYPE_F16, 128, {700, 65, 300}, {8, 2, 1}, 50.f, 0, 0),
      variant_case(2, 4, kDimPadded, FD_DTYPE_BF16, 64, {1000, 17}, {300, 17}, 20.f, 0, 0),
  };
  check_variants(cases, 101);
}

/* Sliding windows 1, block-1, block, block+1, shorter and longer than the
 * rows, with one and several query tokens (causal + window per query row)
 * and prompt chunks (query tiles), both layouts and strides. */
void test_sliding_window(void **state) {
  (void)state;
  std::vector<VariantCase> cases;
  const int storages[] = {kTokenPacked, kDimPacked, kNhd, kDimPadded};
  const int32_t windows[] = {1, 15, 16, 17, 100, 1000, 5000};
  int i = 0;
  for (int32_t w : windows) {
    const int st = storages[i % 4];
    const int32_t dt = i % 2 ? FD_DTYPE_F16 : FD_DTYPE_BF16;
    const uint32_t dim = i % 3 == 0 ? 64 : 128;
    cases.push_back(
        variant_case(2, 4, st, dt, dim, {3000, 37, 0, 1, 700, 16}, {1, 1, 1, 1, 1, 1}, 0.f, w, 0));
    cases.push_back(variant_case(2, 4, st, dt, dim, {3000, 37, 700, 16}, {8, 3, 1, 16}, 0.f, w, 0));
    ++i;
  }
  /* Prompt chunks: query tiles, each starting at its own first key tile. */
  cases.push_back(
      variant_case(2, 4, kTokenPacked, FD_DTYPE_BF16, 128, {1000, 4100}, {1000, 300}, 0.f, 200, 0));
  cases.push_back(
      variant_case(1, 8, kDimPacked, FD_DTYPE_F16, 64, {1500, 100}, {1000, 100}, 0.f, 64, 0));
  uint64_t seed = 201;
  int n = 0;
  for (VariantCase &vc : cases) {
    if (reduced() && n % 5 != 0) {
      ++n;
      continue;
    }
    vc.shape.seed = seed++;
    check_variant(vc);
    ++n;
  }
  print_message("gpu_decode: %d sliding-window cases x 3 split modes passed\n", n);
}

/* Attention sinks: -inf (the bits of none), 0, large and random, unsplit
 * (epilogue) and split (merge kernel), one and several query tokens. */
void test_sinks(void **state) {
  (void)state;
  uint64_t seed = 301;
  for (int sinks : {kSinksNegInf, kSinksZero, kSinksLarge, kSinksRandom}) {
    std::vector<VariantCase> cases = {
        variant_case(2, 4, kTokenPacked, FD_DTYPE_BF16, 128, {3000, 37, 0, 900}, {1, 1, 1, 1}, 0.f,
                     0, sinks),
        variant_case(2, 8, kDimPacked, FD_DTYPE_F16, 64, {513, 2000, 9}, {8, 3, 1}, 0.f, 0, sinks),
    };
    for (VariantCase &vc : cases) {
      vc.shape.seed = seed++;
      check_variant(vc);
    }
    if (reduced()) break;
  }
}

/* Soft-cap, window and sinks together, and the new head dims with them. */
void test_variants_combined(void **state) {
  (void)state;
  std::vector<VariantCase> cases = {
      variant_case(2, 4, kTokenPacked, FD_DTYPE_BF16, 128, {3000, 37, 700}, {1, 1, 1}, 30.f, 256,
                   kSinksRandom),
      variant_case(2, 4, kDimPacked, FD_DTYPE_F16, 64, {3000, 37, 700}, {8, 4, 1}, 50.f, 100,
                   kSinksRandom),
      variant_case(2, 8, kTokenPacked, FD_DTYPE_BF16, 256, {2000, 300}, {4, 1}, 30.f, 1024,
                   kSinksRandom),
      variant_case(4, 2, kNhd, FD_DTYPE_F16, 96, {1500, 33}, {1, 1}, 20.f, 500, kSinksRandom),
      variant_case(2, 4, kTokenPacked, FD_DTYPE_BF16, 256, {1200, 90}, {600, 90}, 50.f, 300,
                   kSinksRandom),
  };
  check_variants(cases, 401);
}

/* head_dim 96 (Phi-3) and 256 (Gemma): the sweep's block sizes, storages
 * and groups, long rows (split-KV), several query tokens and prompt chunks. */
void test_head_dims(void **state) {
  (void)state;
  const bool small = reduced();
  fd_test_rng rng = {77};
  int cases = 0;
  /* Per head dim: every block size x storage, the dtype and the group
   * (1, 4, 8, 32) varying with them. */
  const uint32_t groups[] = {1, 4, 8, 32};
  for (uint32_t D : {96u, 256u})
    for (uint32_t bs : {8u, 16u, 32u})
      for (int st = 0; st < kStorages; ++st) {
        const int32_t dt = (bs + st) % 2 ? FD_DTYPE_F16 : FD_DTYPE_BF16;
        const uint32_t g = groups[(bs / 8 + st) % 4];
        if (small && (bs != 16 || st >= kNhd)) continue;
        check_sweep_case(dt, D, bs, st, g, small, &rng);
        ++cases;
      }
  if (!small) {
    for (uint32_t D : {96u, 256u})
      for (int st : {kTokenPacked, kDimPacked}) {
        Case c;
        c.dtype = D == 96 ? FD_DTYPE_F16 : FD_DTYPE_BF16;
        c.dim = D;
        c.bs = 16;
        c.hkv = 2;
        c.group = 8;
        c.lens = {9000, 33, 4096};
        c.storage = st;
        check_case(c);
        ++cases;
      }
    uint64_t seed = 501;
    for (uint32_t D : {96u, 256u}) {
      MultiShape verify = {2, 4, kTokenPacked, FD_DTYPE_BF16, {900, 37, 4100}, {8, 2, 4}, D};
      MultiShape chunk = {2, 4, kDimPacked, FD_DTYPE_F16, {1000, 1, 300}, {1000, 1, 17}, D};
      verify.seed = seed++;
      chunk.seed = seed++;
      check_multi_token(verify, false);
      check_multi_token(chunk, false);
      cases += 2;
    }
  }
  print_message("gpu_decode: %d head_dim 96/256 cases passed\n", cases);
}

/* Runs `plan` with `p` and returns the output (poisoned first). */
std::vector<uint16_t> run_plan(const Host &h, Dev &d, const fd_decode_plan *plan,
                               const fd_decode_params &p) {
  const size_t qb = h.q.size() * esize();
  CUDA_OK(fd_gpu_fill(d.stream, d.out, 0xff, qb));
  FD_ASSERT_OK(fd_decode_run(plan, &p));
  CUDA_OK(cudaStreamSynchronize(d.stream));
  std::vector<uint16_t> out(h.q.size());
  CUDA_OK(fd_gpu_download(d.stream, out.data(), d.out, qb));
  return out;
}

/* Plan / run on CUDA (S2.1): a plan made from the same params gives
 * fd_decode's bits; one made from the exact host lengths (a different split
 * layout) is within tolerance of the CPU; a plan made for shorter rows than
 * the device holds still attends every token (the last split takes the
 * rest); a captured run replays to the eager bits; a run whose shape differs
 * from its plan is refused and writes nothing. */
void test_plan_run(void **state) {
  (void)state;
  Case c;
  c.lens = {3000, 5, 0, 1500, 777};
  c.group = 4;
  c.hkv = 2;
  c.mbps = 512; /* hint (capacity 8192) far above the longest row */
  const Host h = make_host(c);
  const std::vector<uint16_t> ref = cpu_reference(h);
  Dev d;
  upload(h, d);
  fd_decode_params p = device_params(h, d, 0);
  attach_workspace(p, d);
  const std::vector<uint16_t> eager = run_gpu(h, d, p);
  const size_t qb = h.q.size() * esize();

  fd_decode_plan *same = nullptr;
  FD_ASSERT_OK(fd_decode_plan_create(&p, nullptr, &same));
  assert_memory_equal(eager.data(), run_plan(h, d, same, p).data(), qb);

  /* Exact lengths and a plan that asks for its own workspace. */
  fd_decode_params planned = p;
  planned.workspace = nullptr, planned.workspace_size = 0;
  const std::vector<int32_t> short_lens(h.lens.size(), 64);
  for (const std::vector<int32_t> *lens : {&h.lens, &short_lens}) {
    fd_decode_plan *plan = nullptr;
    FD_ASSERT_OK(fd_decode_plan_create(&planned, lens->data(), &plan));
    size_t need = 0;
    FD_ASSERT_OK(fd_decode_plan_workspace_size(plan, &need));
    fd_decode_params run = p;
    if (need > d.ws_size) {
      cudaFree(d.ws);
      CUDA_OK(cudaMalloc(&d.ws, need));
      d.ws_size = need;
      CUDA_OK(fd_gpu_fill(d.stream, d.ws, 0xff, need));
    }
    run.workspace = need ? d.ws : nullptr;
    run.workspace_size = need;
    const std::vector<uint16_t> got = run_plan(h, d, plan, run);
    assert_true(compare(h, got, ref) <= tolerance(c.dtype));
    if (lens == &h.lens) {
      /* Captured: the run is launches only. */
      CUDA_OK(fd_gpu_fill(d.stream, d.out, 0xff, qb));
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      CUDA_OK(cudaStreamBeginCapture(d.stream, cudaStreamCaptureModeGlobal));
      const fd_status st = fd_decode_run(plan, &run);
      CUDA_OK(cudaStreamEndCapture(d.stream, &graph));
      FD_ASSERT_OK(st);
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      for (int i = 0; i < 2; ++i) CUDA_OK(cudaGraphLaunch(exec, d.stream));
      std::vector<uint16_t> replay(h.q.size());
      CUDA_OK(fd_gpu_download(d.stream, replay.data(), d.out, qb));
      assert_memory_equal(got.data(), replay.data(), qb);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
    /* Too little workspace for the plan: refused, nothing written. */
    if (need > 0) {
      run.workspace_size = need - 1;
      CUDA_OK(fd_gpu_fill(d.stream, d.out, 0xff, qb));
      FD_ASSERT_FAILS(fd_decode_run(plan, &run), FD_ERR_INVALID_ARGUMENT, "workspace_size");
      expect_untouched(h, d);
    }
    fd_decode_plan_destroy(plan);
  }

  fd_decode_params other = p;
  other.batch = p.batch - 1;
  CUDA_OK(fd_gpu_fill(d.stream, d.out, 0xff, qb));
  FD_ASSERT_FAILS(fd_decode_run(same, &other), FD_ERR_INVALID_ARGUMENT,
                  "params batch 4 differs from the plan's 5");
  expect_untouched(h, d);
  fd_decode_plan_destroy(same);
}

/* Every refusal leaves the output untouched (still poisoned). */
void expect_untouched(const Host &h, const Dev &d) {
  const size_t qb = h.q.size() * esize();
  std::vector<uint8_t> out(qb);
  CUDA_OK(fd_gpu_download(d.stream, out.data(), d.out, qb));
  for (uint8_t b : out) assert_int_equal(b, 0xff);
}

void test_errors(void **state) {
  (void)state;
  Case c;
  c.lens = {400, 17}; /* long enough that 4 splits fit */
  c.group = 2;
  c.hkv = 2;
  c.dim = 64;
  const Host h = make_host(c);
  Dev d;
  upload(h, d);
  CUDA_OK(fd_gpu_fill(d.stream, d.out, 0xff, h.q.size() * esize()));
  fd_decode_params base = device_params(h, d, 1);
  size_t bytes = 12345;
  fd_decode_params p;

  p = base, p.head_dim = 80;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_UNSUPPORTED, "head_dim");
  FD_ASSERT_FAILS(fd_decode_workspace_size(&p, &bytes), FD_ERR_UNSUPPORTED, "head_dim");
  assert_int_equal(bytes, 12345);
  /* head_dim 96 and 256 are served for 16-bit K/V only. */
  p = base, p.head_dim = 256, p.kv_dtype = FD_DTYPE_FP8_E4M3;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_UNSUPPORTED, "head_dim 256 is not supported with kv_dtype");
  p = base, p.block_size = 64, p.max_blocks_per_seq = 1;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_UNSUPPORTED, "block_size");
  p = base, p.num_kv_heads = 1, p.num_q_heads = 64;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_UNSUPPORTED, "group");
  p = base, fd_test_decode_dtype(&p, FD_DTYPE_F32);
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_UNSUPPORTED, "f32");
  p = base, p.k_cache = static_cast<const uint8_t *>(d.k) + 2;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_UNSUPPORTED, "aligned");
  p = base, p.q = static_cast<const uint8_t *>(d.q) + 2;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_UNSUPPORTED, "q must be 4-byte aligned");
  /* NHD-like strides that break 16-byte rows. */
  p = base, p.stride_block = h.sb + 4, p.stride_head = h.sh, p.stride_token = h.st,
  p.stride_dim = 1;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_UNSUPPORTED, "stride_block");
  /* An explicit split count needs its workspace. */
  p = base, p.num_splits = 4;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_INVALID_ARGUMENT, "workspace");
  p = base, p.device.ordinal = 1000;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_NO_DEVICE, "");
  expect_untouched(h, d);

  /* FD_DECODE_CHECK_INDICES validates device-resident indices. The bad
   * values go on d.stream, where the check reads them: a pageable cudaMemcpy
   * on the legacy default stream was not ordered before that read and the
   * check saw the old, valid lengths when other GPU work ran (issue 11). */
  const int32_t bad_len[2] = {400, 100000};
  CUDA_OK(fd_gpu_upload(d.stream, d.lens, bad_len, sizeof bad_len));
  p = base, p.flags = FD_DECODE_CHECK_INDICES;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_INVALID_ARGUMENT, "seq_lens[1]");
  CUDA_OK(fd_gpu_upload(d.stream, d.lens, h.lens.data(), 8));
  const int32_t bad_id = static_cast<int32_t>(h.num_blocks);
  CUDA_OK(fd_gpu_upload(d.stream, d.tables + 1, &bad_id, 4));
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_INVALID_ARGUMENT, "block_tables[0][1]");
  expect_untouched(h, d);
  CUDA_OK(fd_gpu_upload(d.stream, d.tables, h.tables.data(), h.tables.size() * 4));
  /* A row longer than the hint: the split plan would cover only the hint. */
  p = base, p.flags = FD_DECODE_CHECK_INDICES, p.max_seq_len_hint = h.lens[0] - 1;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_INVALID_ARGUMENT, "exceeds max_seq_len_hint");
  expect_untouched(h, d);
  CUDA_OK(fd_gpu_upload(d.stream, d.tables, h.tables.data(), h.tables.size() * 4));
  /* A NaN sink (device memory) is refused on the checked path, naming it. */
  {
    std::vector<float> sinks(h.hq, 0.f);
    sinks[1] = NAN;
    float *dev_sinks = nullptr;
    CUDA_OK(cudaMalloc(reinterpret_cast<void **>(&dev_sinks), sinks.size() * 4));
    CUDA_OK(fd_gpu_upload(d.stream, dev_sinks, sinks.data(), sinks.size() * 4));
    p = base, p.flags = FD_DECODE_CHECK_INDICES, p.sinks = dev_sinks;
    FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_INVALID_ARGUMENT, "sinks[1] is NaN");
    expect_untouched(h, d);
    cudaFree(dev_sinks);
  }
  /* The checked path succeeds on valid indices. */
  p = base, p.flags = FD_DECODE_CHECK_INDICES;
  const std::vector<uint16_t> ref = cpu_reference(h);
  const std::vector<uint16_t> got = run_gpu(h, d, p);
  assert_true(compare(h, got, ref) <= tolerance(c.dtype));
}

}  // namespace

int main(void) {
  if (!fd_gpu_test_device_present()) return FD_GPU_TEST_SKIPPED;
  // One suite per line.
  // clang-format off
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_graph_capture),
      cmocka_unit_test(test_unaligned_out),
      cmocka_unit_test(test_sweep),
      cmocka_unit_test(test_long_rows),
      cmocka_unit_test(test_score_ramps),
      cmocka_unit_test(test_plan_run),
      cmocka_unit_test(test_multi_token),
      cmocka_unit_test(test_prefill_chunks),
      cmocka_unit_test(test_multi_token_hopper),
      cmocka_unit_test(test_softcap),
      cmocka_unit_test(test_sliding_window),
      cmocka_unit_test(test_sinks),
      cmocka_unit_test(test_variants_combined),
      cmocka_unit_test(test_head_dims),
      cmocka_unit_test(test_lead_units),
      cmocka_unit_test(test_deep_stages),
  };
  // clang-format on
  return cmocka_run_group_tests(tests, NULL, NULL);
}
