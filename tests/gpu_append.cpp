/* fd_kv_append / fd_rope_kv_append on CUDA against the CPU implementation:
 * every dtype x head_dim (64, 128) x rotary_dim (full, partial, not a
 * multiple of 16; interleaved also not a multiple of 8) x storage
 * (token-major, dim-major, NHD strides, padded dim-major), 1..300, 2100 and
 * 4099 tokens (the large-call forms), in-place and separate q_out, in both
 * RoPE styles (split-half, interleaved); V and copies are bit-exact, rotated
 * values within one rounding of the dtype (powf/sincosf last bits). The
 * interleaved style also into FP8 E4M3 (the primitive and a CUDA cache's
 * layer writes, against the CPU's bytes within one code). FD_GPU_TEST_REDUCED=1
 * runs every third case (for compute-sanitizer). Error paths: bad indices in
 * device memory are refused with nothing written; host pointers are refused;
 * an unknown rope_style is refused. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fd_gpu_test.h"
#include "fd_test_fp8_close.h"

namespace {

enum Storage { kToken, kDim, kNhd, kDimPadded };

struct Case {
  int32_t dtype;
  uint32_t dim, rotary, tokens, hq, hkv, bs;
  int storage;
  bool in_place;
  uint64_t seed;
  int32_t style; /* fd_rope_style */
};

struct Buffers {
  std::vector<uint16_t> q, k, v, kc, vc;
  std::vector<int32_t> ids, offs, pos;
  int64_t sb, sh, st, sd;
  int32_t layout;
  uint32_t blocks;
};

Buffers make(const Case &c) {
  Buffers b;
  const int64_t H = c.hkv, D = c.dim, B = c.bs;
  b.blocks = (c.tokens + c.bs - 1) / c.bs + 3;
  switch (c.storage) {
    case kToken:
      b.layout = FD_LAYOUT_TOKEN_MAJOR, b.sb = H * B * D, b.sh = B * D, b.st = D, b.sd = 1;
      break;
    case kDim:
      b.layout = FD_LAYOUT_DIM_MAJOR, b.sb = H * B * D, b.sh = B * D, b.st = 1, b.sd = B;
      break;
    case kNhd:
      b.layout = FD_LAYOUT_TOKEN_MAJOR, b.sb = B * H * D, b.sh = D, b.st = H * D, b.sd = 1;
      break;
    default:
      b.layout = FD_LAYOUT_DIM_MAJOR, b.st = 1, b.sd = B + 8, b.sh = D * (B + 8) + 16;
      b.sb = H * b.sh + 24;
  }
  fd_test_rng rng = {c.seed};
  b.q.resize((size_t)c.tokens * c.hq * c.dim);
  b.k.resize((size_t)c.tokens * c.hkv * c.dim);
  b.v.resize(b.k.size());
  for (auto &x : b.q) fd_test_store(&x, 0, c.dtype, 2.f * fd_test_normal(&rng));
  for (auto &x : b.k) fd_test_store(&x, 0, c.dtype, 2.f * fd_test_normal(&rng));
  for (auto &x : b.v) fd_test_store(&x, 0, c.dtype, fd_test_normal(&rng));
  b.kc.resize((size_t)(b.sb * b.blocks));
  b.vc.resize(b.kc.size());
  for (size_t i = 0; i < b.kc.size(); ++i)
    b.kc[i] = (uint16_t)(i * 7), b.vc[i] = (uint16_t)(i * 13);
  std::vector<int32_t> slots(b.blocks * c.bs);
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = (int32_t)i;
  for (size_t i = slots.size(); i > 1; --i)
    std::swap(slots[i - 1], slots[(size_t)fd_test_range(&rng, 0, (int64_t)i - 1)]);
  for (uint32_t t = 0; t < c.tokens; ++t) {
    b.ids.push_back(slots[t] / (int32_t)c.bs);
    b.offs.push_back(slots[t] % (int32_t)c.bs);
    b.pos.push_back(t == 0 ? 131071 : (int32_t)fd_test_range(&rng, 0, 40000));
  }
  return b;
}

fd_kv_append_params params(const Case &c, const Buffers &b) {
  fd_kv_append_params a;
  fd_kv_append_params_init(&a);
  a.dtype = c.dtype, a.layout = b.layout, a.num_tokens = c.tokens, a.num_q_heads = c.hq;
  a.num_kv_heads = c.hkv, a.head_dim = c.dim, a.block_size = c.bs, a.num_blocks = b.blocks;
  a.rotary_dim = c.rotary, a.rope_base = 10000.f, a.rope_style = c.style;
  a.stride_block = b.sb, a.stride_head = b.sh, a.stride_token = b.st, a.stride_dim = b.sd;
  return a;
}

/* Device copies of the host buffers. The appends here run on the legacy
 * default stream (params.stream NULL), and so do these transfers
 * (fd_gpu_test.h), each finished before it returns. */
struct Dev {
  std::vector<void *> ptrs;
  ~Dev() {
    for (void *p : ptrs) cudaFree(p);
  }
  template <class T>
  T *put(const std::vector<T> &h) {
    void *p = nullptr;
    if (cudaMalloc(&p, h.size() * sizeof(T)) != cudaSuccess) return nullptr;
    ptrs.push_back(p);
    if (fd_gpu_upload(nullptr, p, h.data(), h.size() * sizeof(T)) != cudaSuccess) return nullptr;
    return static_cast<T *>(p);
  }
};

template <class T>
std::vector<T> get(const T *d, size_t n) {
  std::vector<T> h(n);
  CUDA_OK(fd_gpu_download(nullptr, h.data(), d, n * sizeof(T)));
  return h;
}

/* Equal bits, or values within one unit in the last place of the dtype. */
void expect_close(const std::vector<uint16_t> &got, const std::vector<uint16_t> &want,
                  int32_t dtype, const char *what, const Case &c, size_t *inexact) {
  const float rel = dtype == FD_DTYPE_BF16 ? 0x1p-7f : 0x1p-10f;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    const float g = fd_test_load(got.data(), i, dtype), w = fd_test_load(want.data(), i, dtype);
    if (std::fabs(g - w) > rel * std::fmax(std::fabs(w), 1e-3f)) {
      print_error("%s[%zu]: gpu %g cpu %g (dtype %d D=%u R=%u tokens=%u storage=%d style=%d)\n",
                  what, i, (double)g, (double)w, dtype, c.dim, c.rotary, c.tokens, c.storage,
                  c.style);
      fail();
    }
    ++*inexact;
  }
}

void check(const Case &c, size_t *inexact) {
  Buffers b = make(c);
  for (int rope = 0; rope < 2; ++rope) {
    /* CPU reference. */
    Buffers h = b;
    std::vector<uint16_t> q_out_cpu(h.q.size(), 0);
    fd_kv_append_params a = params(c, h);
    a.q = h.q.data(), a.q_out = q_out_cpu.data(), a.k = h.k.data(), a.v = h.v.data();
    a.k_cache = h.kc.data(), a.v_cache = h.vc.data();
    a.block_ids = h.ids.data(), a.offsets = h.offs.data(), a.positions = h.pos.data();
    FD_ASSERT_OK(rope ? fd_rope_kv_append(&a) : fd_kv_append(&a));
    /* GPU. */
    Dev d;
    uint16_t *q = d.put(b.q), *k = d.put(b.k), *v = d.put(b.v), *kc = d.put(b.kc),
             *vc = d.put(b.vc);
    std::vector<uint16_t> poison(b.q.size(), 0x7fff);
    uint16_t *q_out = c.in_place ? q : d.put(poison);
    int32_t *ids = d.put(b.ids), *offs = d.put(b.offs), *pos = d.put(b.pos);
    assert_non_null(q_out);
    a = params(c, b);
    a.q = q, a.q_out = q_out, a.k = k, a.v = v, a.k_cache = kc, a.v_cache = vc;
    a.block_ids = ids, a.offsets = offs, a.positions = pos;
    a.device.type = FD_DEVICE_CUDA;
    FD_ASSERT_OK(rope ? fd_rope_kv_append(&a) : fd_kv_append(&a));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint16_t> g_kc = get(kc, b.kc.size()), g_vc = get(vc, b.vc.size());
    assert_memory_equal(g_vc.data(), h.vc.data(), g_vc.size() * 2); /* raw V: exact */
    if (!rope) {
      assert_memory_equal(g_kc.data(), h.kc.data(), g_kc.size() * 2);
      continue;
    }
    expect_close(g_kc, h.kc, c.dtype, "k_cache", c, inexact);
    expect_close(get(q_out, b.q.size()), q_out_cpu, c.dtype, "q_out", c, inexact);
  }
}

void test_kernels_match_cpu(void **state) {
  (void)state;
  fd_test_rng rng = {11};
  int cases = 0, visited = 0;
  size_t inexact = 0;
  /* FD_GPU_TEST_REDUCED=1 (compute-sanitizer runs): every third case. */
  const char *reduced_env = getenv("FD_GPU_TEST_REDUCED");
  const int stride = reduced_env != nullptr && strcmp(reduced_env, "1") == 0 ? 3 : 1;
  /* Interleaved rotation units cover 8 dims (4 pairs): R = 22 ends in a
   * partial unit and starts the pass-through dims off a 16-byte boundary. */
  for (int32_t style : {FD_ROPE_SPLIT_HALF, FD_ROPE_INTERLEAVED})
    for (int32_t dt : {FD_DTYPE_F16, FD_DTYPE_BF16})
      for (uint32_t D : {64u, 128u})
        for (uint32_t R : {D, D / 2, style == FD_ROPE_INTERLEAVED ? 22u : 24u, 2u})
          for (int st : {kToken, kDim, kNhd, kDimPadded})
            for (uint32_t tokens : {1u, 37u, 300u}) {
              if (visited++ % stride != 0) continue;
              Case c = {dt,   D, R, tokens, 8, 2, 16, st, (cases % 2) == 1, fd_test_next(&rng),
                        style};
              if (tokens == 300) c.hq = 32, c.hkv = 8, c.bs = 32;
              check(c, &inexact);
              ++cases;
            }
  /* Large calls: 2 tokens per CTA from 2048 tokens, 4 from 4096 (4099: the
   * last CTA has 3). */
  for (int32_t style : {FD_ROPE_SPLIT_HALF, FD_ROPE_INTERLEAVED})
    for (int32_t dt : {FD_DTYPE_F16, FD_DTYPE_BF16})
      for (uint32_t R : {128u, 64u, 24u})
        for (int st : {kToken, kDimPadded}) {
          if (visited++ % stride != 0) continue;
          const uint32_t tokens = st == kToken ? 4099 : 2100;
          Case c = {dt, 128, R, tokens, 32, 8, 32, st, (cases % 2) == 1, fd_test_next(&rng), style};
          check(c, &inexact);
          ++cases;
        }
  /* More units than threads: 64 query heads give 704 units for 512 threads,
   * so threads take a second unit, loaded (staged, from 2048 tokens) after
   * their first is stored. */
  for (uint32_t tokens : {37u, 2100u, 4099u}) {
    if (visited++ % stride != 0) continue;
    Case c = {FD_DTYPE_BF16,
              128,
              128,
              tokens,
              64,
              8,
              32,
              kToken,
              (cases % 2) == 1,
              fd_test_next(&rng),
              FD_ROPE_SPLIT_HALF};
    check(c, &inexact);
    ++cases;
  }
  print_message(
      "gpu_append: %d cases (split-half and interleaved) x {plain, fused} match the CPU (%zu "
      "rotated values one rounding apart)\n",
      cases, inexact);
}

/* The interleaved style into FP8 E4M3 (the rotation quantised once from
 * FP32): fd_rope_kv_append on CUDA against the CPU's bytes, V exact. */
void test_interleaved_fp8_append(void **state) {
  (void)state;
  fd_test_rng rng = {23};
  int cases = 0;
  size_t inexact = 0;
  for (int32_t dt : {FD_DTYPE_F16, FD_DTYPE_BF16})
    for (int st : {kToken, kDim})
      for (uint32_t D : {64u, 128u})
        for (uint32_t R : {D, 22u})
          for (uint32_t tokens : {1u, 37u, 300u}) {
            const Case c = {
                dt, D, R, tokens, 8, 2, 16, st, false, fd_test_next(&rng), FD_ROPE_INTERLEAVED};
            const Buffers b = make(c);
            std::vector<uint8_t> kc(b.kc.size(), 0x11), vc(b.kc.size(), 0x22);
            std::vector<uint16_t> q_out_cpu(b.q.size(), 0);
            fd_kv_append_params a = params(c, b);
            a.cache_dtype = FD_DTYPE_FP8_E4M3, a.k_scale = 0.5f, a.v_scale = 2.f;
            a.q = b.q.data(), a.q_out = q_out_cpu.data(), a.k = b.k.data(), a.v = b.v.data();
            a.k_cache = kc.data(), a.v_cache = vc.data();
            a.block_ids = b.ids.data(), a.offsets = b.offs.data(), a.positions = b.pos.data();
            FD_ASSERT_OK(fd_rope_kv_append(&a));
            Dev d;
            uint16_t *q = d.put(b.q), *k = d.put(b.k), *v = d.put(b.v);
            uint8_t *gkc = d.put(std::vector<uint8_t>(kc.size(), 0x11));
            uint8_t *gvc = d.put(std::vector<uint8_t>(kc.size(), 0x22));
            uint16_t *q_out = d.put(std::vector<uint16_t>(b.q.size(), 0x7fff));
            int32_t *ids = d.put(b.ids), *offs = d.put(b.offs), *pos = d.put(b.pos);
            assert_non_null(pos);
            a.q = q, a.q_out = q_out, a.k = k, a.v = v, a.k_cache = gkc, a.v_cache = gvc;
            a.block_ids = ids, a.offsets = offs, a.positions = pos;
            a.device.type = FD_DEVICE_CUDA;
            FD_ASSERT_OK(fd_rope_kv_append(&a));
            CUDA_OK(cudaDeviceSynchronize());
            const std::vector<uint8_t> g_vc = get(gvc, vc.size());
            assert_memory_equal(g_vc.data(), vc.data(), vc.size());
            inexact += expect_fp8_close(get(gkc, kc.size()), kc, "k_cache (fp8)");
            expect_close(get(q_out, b.q.size()), q_out_cpu, dt, "q_out", c, &inexact);
            ++cases;
          }
  print_message(
      "gpu_append: %d interleaved FP8 E4M3 appends match the CPU (%zu values one "
      "rounding apart)\n",
      cases, inexact);
}

/* Layer writes of CUDA caches with rope_style interleaved (bf16, and FP8
 * E4M3 from bf16 inputs; both layouts; full and partial rotary_dim;
 * multi-token transactions) store what CPU caches with the same style store
 * for the same calls, and return the same rotated Q, within one rounding. */
void test_interleaved_cache_writes(void **state) {
  (void)state;
  const uint32_t L = 2, H = 2, HQ = 8, D = 128, BS = 16, MB = 32;
  const float ks[2] = {0.5f, 0.25f}, vs[2] = {1.f, 2.f};
  size_t inexact = 0;
  for (int32_t cache_dtype : {FD_DTYPE_BF16, FD_DTYPE_FP8_E4M3})
    for (int32_t layout : {FD_LAYOUT_TOKEN_MAJOR, FD_LAYOUT_DIM_MAJOR}) {
      const bool fp8 = cache_dtype == FD_DTYPE_FP8_E4M3;
      fd_cache *caches[2] = {nullptr, nullptr};
      for (int dev = 0; dev < 2; ++dev) {
        fd_cache_config c;
        fd_cache_config_init(&c);
        c.num_layers = L, c.num_kv_heads = H, c.head_dim = D, c.block_size = BS;
        c.max_blocks = MB, c.dtype = cache_dtype, c.layout = layout;
        c.rope_style = FD_ROPE_INTERLEAVED;
        if (fp8) c.input_dtype = FD_DTYPE_BF16, c.k_scales = ks, c.v_scales = vs;
        c.device.type = dev == 0 ? FD_DEVICE_CPU : FD_DEVICE_CUDA;
        FD_ASSERT_OK(fd_cache_create(&c, &caches[dev]));
      }
      const uint64_t ids[3] = {1, 2, 3};
      for (int dev = 0; dev < 2; ++dev)
        for (uint64_t id : ids) FD_ASSERT_OK(fd_cache_add_request(caches[dev], id));
      fd_test_rng rng = {29};
      const uint32_t counts[3][3] = {{3, 1, 5}, {1, 1, 1}, {2, 9, 1}};
      for (int step = 0; step < 3; ++step) {
        const uint32_t n = counts[step][0] + counts[step][1] + counts[step][2];
        fd_tx tx[2];
        for (int dev = 0; dev < 2; ++dev)
          FD_ASSERT_OK(fd_tx_begin_multi(caches[dev], ids, counts[step], 3, &tx[dev]));
        for (uint32_t l = 0; l < L; ++l) {
          const uint32_t R = l == 0 ? D : 64;
          const Case c = {FD_DTYPE_BF16, D, R, n, HQ, H, BS, kToken, false, 0, FD_ROPE_INTERLEAVED};
          std::vector<uint16_t> q(size_t(n) * HQ * D), k(size_t(n) * H * D), v(k.size());
          for (auto &x : q) fd_test_store(&x, 0, FD_DTYPE_BF16, 2.f * fd_test_normal(&rng));
          for (auto &x : k) fd_test_store(&x, 0, FD_DTYPE_BF16, 2.f * fd_test_normal(&rng));
          for (auto &x : v) fd_test_store(&x, 0, FD_DTYPE_BF16, fd_test_normal(&rng));
          std::vector<uint16_t> hq_out(q.size(), 0);
          FD_ASSERT_OK(fd_tx_write_layer_rope(caches[0], tx[0], l, q.data(), HQ, k.data(), v.data(),
                                              R, 10000.f, hq_out.data(), nullptr));
          Dev d;
          uint16_t *dq = d.put(q), *dk = d.put(k), *dv = d.put(v);
          uint16_t *dq_out = d.put(std::vector<uint16_t>(q.size(), 0x7fff));
          assert_non_null(dq_out);
          FD_ASSERT_OK(fd_tx_write_layer_rope(caches[1], tx[1], l, dq, HQ, dk, dv, R, 10000.f,
                                              dq_out, nullptr));
          CUDA_OK(cudaDeviceSynchronize());
          expect_close(get(dq_out, q.size()), hq_out, FD_DTYPE_BF16, "cache q_out", c, &inexact);
        }
        for (int dev = 0; dev < 2; ++dev) FD_ASSERT_OK(fd_tx_commit(caches[dev], tx[dev]));
      }
      FD_ASSERT_OK(fd_cache_async_error(caches[1]));
      /* Every stored element of every layer. */
      const size_t elems = size_t(MB) * H * BS * D;
      const Case c = {FD_DTYPE_BF16, D, D, 0, HQ, H, BS, kToken, false, 0, FD_ROPE_INTERLEAVED};
      for (uint32_t l = 0; l < L; ++l) {
        void *hk, *hv, *gk, *gv;
        int64_t hs[4], gs[4];
        FD_ASSERT_OK(fd_cache_layer_storage(caches[0], l, &hk, &hv, hs));
        FD_ASSERT_OK(fd_cache_layer_storage(caches[1], l, &gk, &gv, gs));
        if (fp8) {
          const uint8_t *hk8 = static_cast<const uint8_t *>(hk);
          const uint8_t *hv8 = static_cast<const uint8_t *>(hv);
          const std::vector<uint8_t> gv8 = get(static_cast<const uint8_t *>(gv), elems);
          assert_memory_equal(gv8.data(), hv8, elems);
          inexact += expect_fp8_close(get(static_cast<const uint8_t *>(gk), elems),
                                      std::vector<uint8_t>(hk8, hk8 + elems), "cache K (fp8)");
        } else {
          const uint16_t *hk16 = static_cast<const uint16_t *>(hk);
          const uint16_t *hv16 = static_cast<const uint16_t *>(hv);
          const std::vector<uint16_t> gv16 = get(static_cast<const uint16_t *>(gv), elems);
          assert_memory_equal(gv16.data(), hv16, elems * 2);
          expect_close(get(static_cast<const uint16_t *>(gk), elems),
                       std::vector<uint16_t>(hk16, hk16 + elems), FD_DTYPE_BF16, "cache K", c,
                       &inexact);
        }
      }
      for (fd_cache *x : caches) fd_cache_destroy(x);
    }
  print_message(
      "gpu_append: interleaved CUDA caches (bf16, FP8 E4M3) store what CPU caches "
      "store (%zu values one rounding apart)\n",
      inexact);
}

void test_errors(void **state) {
  (void)state;
  const Case c = {FD_DTYPE_BF16, 64, 64, 9, 4, 2, 8, kToken, false, 5, FD_ROPE_SPLIT_HALF};
  Buffers b = make(c);
  b.ids[4] = (int32_t)b.blocks; /* out of range, in device memory */
  Dev d;
  uint16_t *q = d.put(b.q), *k = d.put(b.k), *v = d.put(b.v), *kc = d.put(b.kc), *vc = d.put(b.vc);
  uint16_t *q_out = d.put(b.q);
  int32_t *ids = d.put(b.ids), *offs = d.put(b.offs), *pos = d.put(b.pos);
  fd_kv_append_params a = params(c, b);
  a.q = q, a.q_out = q_out, a.k = k, a.v = v, a.k_cache = kc, a.v_cache = vc;
  a.block_ids = ids, a.offsets = offs, a.positions = pos;
  a.device.type = FD_DEVICE_CUDA;
  FD_ASSERT_FAILS(fd_rope_kv_append(&a), FD_ERR_INVALID_ARGUMENT, "block_ids[4] = ");
  FD_ASSERT_FAILS(fd_kv_append(&a), FD_ERR_INVALID_ARGUMENT, "block_ids[4] = ");
  b.ids[4] = 0;
  b.pos[6] = -3;
  CUDA_OK(fd_gpu_upload(nullptr, ids, b.ids.data(), b.ids.size() * 4));
  CUDA_OK(fd_gpu_upload(nullptr, pos, b.pos.data(), b.pos.size() * 4));
  FD_ASSERT_FAILS(fd_rope_kv_append(&a), FD_ERR_INVALID_ARGUMENT, "positions[6] = -3");
  b.offs[2] = 8;
  CUDA_OK(fd_gpu_upload(nullptr, offs, b.offs.data(), b.offs.size() * 4));
  FD_ASSERT_FAILS(fd_kv_append(&a), FD_ERR_INVALID_ARGUMENT, "offsets[2] = 8");
  b.offs[2] = 0;
  CUDA_OK(fd_gpu_upload(nullptr, offs, b.offs.data(), b.offs.size() * 4));
  b.pos[6] = 0;
  CUDA_OK(fd_gpu_upload(nullptr, pos, b.pos.data(), b.pos.size() * 4));
  a.rope_style = 2;
  FD_ASSERT_FAILS(fd_rope_kv_append(&a), FD_ERR_INVALID_ARGUMENT, "params->rope_style 2");
  a.rope_style = FD_ROPE_INTERLEAVED;
  a.reserved2 = 1;
  FD_ASSERT_FAILS(fd_rope_kv_append(&a), FD_ERR_INVALID_ARGUMENT, "params->reserved2");
  a.reserved2 = 0;
  CUDA_OK(cudaDeviceSynchronize());
  /* Nothing was written. */
  assert_memory_equal(get(kc, b.kc.size()).data(), b.kc.data(), b.kc.size() * 2);
  assert_memory_equal(get(vc, b.vc.size()).data(), b.vc.data(), b.vc.size() * 2);
  assert_memory_equal(get(q_out, b.q.size()).data(), b.q.data(), b.q.size() * 2);
  /* Host memory on the CUDA path, f32 and an absent device ordinal. */
  a.k = b.k.data();
  FD_ASSERT_FAILS(fd_kv_append(&a), FD_ERR_INVALID_ARGUMENT, "params->k is not device memory");
  a.k = k;
  a.dtype = FD_DTYPE_F32;
  FD_ASSERT_FAILS(fd_kv_append(&a), FD_ERR_UNSUPPORTED, "f32");
  a.dtype = FD_DTYPE_BF16;
  a.device.ordinal = 64;
  FD_ASSERT_FAILS(fd_kv_append(&a), FD_ERR_NO_DEVICE, "CUDA device 64");
}

}  // namespace

int main(void) {
  if (!fd_gpu_test_device_present()) return FD_GPU_TEST_SKIPPED;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kernels_match_cpu),
      cmocka_unit_test(test_interleaved_fp8_append),
      cmocka_unit_test(test_interleaved_cache_writes),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
