/* The RoPE convention where the library rotates for the caller (S3.1):
 * fd_kv_append_params.rope_style (fd_rope_kv_append) and
 * fd_cache_config.rope_style (fd_tx_write_layer_rope and so the engine's
 * steps and prefill), on the CPU backend. In every case the stored K and the
 * returned Q are the bits fd_rope_apply_style gives for the same inputs
 * (f32, f16, bf16; full and partial rotary_dim; token- and dim-major
 * storage), and an FP8 cache stores the quantised FP32 rotation. Every bad
 * value is FD_ERR_INVALID_ARGUMENT naming the field, with nothing changed;
 * older struct sizes get the split-half default. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cmath>
#include <cstring>
#include <vector>

#include "fd_test.h"

namespace {

std::vector<uint8_t> random_tensor(fd_test_rng *rng, size_t n, int32_t dtype) {
  std::vector<uint8_t> x(n * fd_test_dtype_size(dtype));
  for (size_t i = 0; i < n; ++i) fd_test_store(x.data(), i, dtype, 2.f * fd_test_normal(rng));
  return x;
}

/* x rotated by fd_rope_apply_style (the oracle of every test here). */
std::vector<uint8_t> rotated(std::vector<uint8_t> x, int32_t dtype, uint32_t tokens, uint32_t heads,
                             uint32_t dim, const int32_t *pos, uint32_t rotary, float base,
                             int32_t style) {
  FD_ASSERT_OK(fd_rope_apply_style(dtype, x.data(), tokens, heads, dim, pos, rotary, base, style));
  return x;
}

/* Element (block, head, token, dim) of a packed layer of `layout`. */
size_t packed_at(int32_t layout, uint32_t H, uint32_t B, uint32_t D, int32_t blk, uint32_t h,
                 int32_t t, uint32_t d) {
  const size_t head = ((size_t)blk * H + h) * B * D;
  return layout == FD_LAYOUT_TOKEN_MAJOR ? head + (size_t)t * D + d : head + (size_t)d * B + t;
}

/* Token i's heads of `cache` (a packed layer) equal src[i] ([tokens, H, D]). */
void expect_stored(const uint8_t *cache, const std::vector<uint8_t> &src, int32_t layout, size_t es,
                   uint32_t H, uint32_t B, uint32_t D, uint32_t tokens, const int32_t *blk,
                   const int32_t *off, const char *what) {
  for (uint32_t i = 0; i < tokens; ++i)
    for (uint32_t h = 0; h < H; ++h)
      for (uint32_t d = 0; d < D; ++d) {
        const size_t at = packed_at(layout, H, B, D, blk[i], h, off[i], d);
        const size_t from = ((size_t)i * H + h) * D + d;
        if (memcmp(cache + at * es, src.data() + from * es, es) != 0) {
          print_error("%s: token %u head %u dim %u differs from fd_rope_apply_style\n", what, i, h,
                      d);
          fail();
        }
      }
}

/* fd_rope_kv_append in each style: stored K and q_out are fd_rope_apply_style's
 * bits, V is raw, for every dtype, full and partial rotary_dim and both
 * layouts; the two styles store different K. */
void test_append_matches_rope_apply_style(void **state) {
  (void)state;
  const uint32_t T = 5, HQ = 4, H = 2, D = 16, B = 4, NB = 4;
  const int32_t blk[T] = {3, 0, 2, 0, 1}, off[T] = {1, 2, 0, 3, 3};
  const int32_t pos[T] = {0, 7, 4096, 1, 131071};
  fd_test_rng rng = {5};
  for (int32_t dtype : {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16})
    for (uint32_t rotary : {D, 10u, 2u})
      for (int32_t layout : {FD_LAYOUT_TOKEN_MAJOR, FD_LAYOUT_DIM_MAJOR}) {
        const size_t es = fd_test_dtype_size(dtype);
        const std::vector<uint8_t> q = random_tensor(&rng, T * HQ * D, dtype);
        const std::vector<uint8_t> k = random_tensor(&rng, T * H * D, dtype);
        const std::vector<uint8_t> v = random_tensor(&rng, T * H * D, dtype);
        std::vector<uint8_t> stored_k[2];
        for (int32_t style : {FD_ROPE_SPLIT_HALF, FD_ROPE_INTERLEAVED}) {
          std::vector<uint8_t> kc(NB * H * B * D * es, 0xab), vc(kc.size(), 0xcd);
          std::vector<uint8_t> q_out(q.size(), 0);
          fd_kv_append_params a;
          fd_kv_append_params_init(&a);
          a.dtype = dtype, a.layout = layout, a.num_tokens = T, a.num_q_heads = HQ;
          a.num_kv_heads = H, a.head_dim = D, a.block_size = B, a.num_blocks = NB;
          a.rotary_dim = rotary, a.rope_base = 10000.f, a.rope_style = style;
          a.q = q.data(), a.q_out = q_out.data(), a.k = k.data(), a.v = v.data();
          a.k_cache = kc.data(), a.v_cache = vc.data();
          a.block_ids = blk, a.offsets = off, a.positions = pos;
          FD_ASSERT_OK(fd_rope_kv_append(&a));
          const std::vector<uint8_t> want_q =
              rotated(q, dtype, T, HQ, D, pos, rotary, 10000.f, style);
          const std::vector<uint8_t> want_k =
              rotated(k, dtype, T, H, D, pos, rotary, 10000.f, style);
          assert_memory_equal(q_out.data(), want_q.data(), q.size());
          expect_stored(kc.data(), want_k, layout, es, H, B, D, T, blk, off, "k_cache");
          expect_stored(vc.data(), v, layout, es, H, B, D, T, blk, off, "v_cache");
          /* In place (q_out == q) gives the same bits. */
          std::vector<uint8_t> q_inplace = q;
          a.q = q_inplace.data(), a.q_out = q_inplace.data();
          FD_ASSERT_OK(fd_rope_kv_append(&a));
          assert_memory_equal(q_inplace.data(), want_q.data(), q.size());
          stored_k[style] = kc;
        }
        if (rotary > 2) assert_true(stored_k[0] != stored_k[1]);
      }
}

/* Into an FP8 cache the interleaved rotation is quantised once from FP32:
 * the bytes fd_kv_append stores for K rotated in f32 by fd_rope_apply_style. */
void test_append_fp8_interleaved(void **state) {
  (void)state;
  const uint32_t T = 3, HQ = 2, H = 2, D = 8, B = 2, NB = 3;
  const int32_t blk[T] = {2, 0, 1}, off[T] = {1, 0, 1}, pos[T] = {3, 500, 77};
  fd_test_rng rng = {8};
  for (int32_t cache_dtype : {FD_DTYPE_FP8_E4M3, FD_DTYPE_FP8_E5M2})
    for (uint32_t rotary : {D, 6u}) {
      const std::vector<uint8_t> q = random_tensor(&rng, T * HQ * D, FD_DTYPE_BF16);
      const std::vector<uint8_t> k = random_tensor(&rng, T * H * D, FD_DTYPE_BF16);
      const std::vector<uint8_t> v = random_tensor(&rng, T * H * D, FD_DTYPE_BF16);
      fd_kv_append_params a;
      fd_kv_append_params_init(&a);
      a.dtype = FD_DTYPE_BF16, a.cache_dtype = cache_dtype, a.k_scale = 0.25f, a.v_scale = 3.f;
      a.num_tokens = T, a.num_q_heads = HQ, a.num_kv_heads = H, a.head_dim = D;
      a.block_size = B, a.num_blocks = NB, a.rotary_dim = rotary, a.rope_base = 10000.f;
      a.rope_style = FD_ROPE_INTERLEAVED;
      std::vector<uint8_t> kc(NB * H * B * D, 0), vc(kc.size(), 0), q_out(q.size(), 0);
      a.q = q.data(), a.q_out = q_out.data(), a.k = k.data(), a.v = v.data();
      a.k_cache = kc.data(), a.v_cache = vc.data();
      a.block_ids = blk, a.offsets = off, a.positions = pos;
      FD_ASSERT_OK(fd_rope_kv_append(&a));
      /* The oracle: K in f32 (exact), rotated, then appended plainly. */
      std::vector<uint8_t> k32(T * H * D * 4);
      for (size_t i = 0; i < T * H * D; ++i)
        fd_test_store(k32.data(), i, FD_DTYPE_F32, fd_test_load(k.data(), i, FD_DTYPE_BF16));
      k32 = rotated(k32, FD_DTYPE_F32, T, H, D, pos, rotary, 10000.f, FD_ROPE_INTERLEAVED);
      std::vector<uint8_t> v32(T * H * D * 4);
      for (size_t i = 0; i < T * H * D; ++i)
        fd_test_store(v32.data(), i, FD_DTYPE_F32, fd_test_load(v.data(), i, FD_DTYPE_BF16));
      std::vector<uint8_t> kw(kc.size(), 0), vw(kc.size(), 0);
      fd_kv_append_params w = a;
      w.dtype = FD_DTYPE_F32, w.k = k32.data(), w.v = v32.data();
      w.k_cache = kw.data(), w.v_cache = vw.data();
      w.q = NULL, w.q_out = NULL, w.positions = NULL;
      FD_ASSERT_OK(fd_kv_append(&w));
      assert_memory_equal(kc.data(), kw.data(), kc.size());
      assert_memory_equal(vc.data(), vw.data(), vc.size());
      const std::vector<uint8_t> want_q =
          rotated(q, FD_DTYPE_BF16, T, HQ, D, pos, rotary, 10000.f, FD_ROPE_INTERLEAVED);
      assert_memory_equal(q_out.data(), want_q.data(), q.size());
    }
}

/* One fused layer write of random q, k, v (n tokens) into an open
 * transaction; keeps the inputs and the returned Q. */
struct LayerWrite {
  std::vector<uint8_t> q, k, v, q_out;
};

LayerWrite write_random_layer(fd_cache *cache, fd_tx tx, uint32_t layer, uint32_t n, uint32_t hq,
                              uint32_t h, uint32_t d, int32_t dtype, uint32_t rotary, float base,
                              fd_test_rng *rng) {
  LayerWrite w;
  w.q = random_tensor(rng, (size_t)n * hq * d, dtype);
  w.k = random_tensor(rng, (size_t)n * h * d, dtype);
  w.v = random_tensor(rng, (size_t)n * h * d, dtype);
  w.q_out.assign(w.q.size(), 0);
  FD_ASSERT_OK(fd_tx_write_layer_rope(cache, tx, layer, w.q.data(), hq, w.k.data(), w.v.data(),
                                      rotary, base, w.q_out.data(), NULL));
  return w;
}

/* Positions, blocks and offsets of an open transaction's n tokens. */
struct Tokens {
  std::vector<int32_t> pos, blk, off;
};

Tokens tokens_of(fd_cache *cache, fd_tx tx, uint32_t n) {
  Tokens t{std::vector<int32_t>(n), std::vector<int32_t>(n), std::vector<int32_t>(n)};
  FD_ASSERT_OK(fd_tx_get_tokens(cache, tx, n, t.pos.data(), t.blk.data(), t.off.data()));
  return t;
}

fd_cache_config style_config(int32_t style, int32_t dtype, int32_t layout) {
  fd_cache_config c;
  fd_cache_config_init(&c);
  c.num_layers = 2, c.num_kv_heads = 2, c.head_dim = 16, c.block_size = 4, c.max_blocks = 8;
  c.dtype = dtype, c.layout = layout, c.rope_style = style;
  return c;
}

/* A cache with rope_style interleaved: fd_tx_write_layer_rope stores K and
 * returns Q as fd_rope_apply_style(interleaved) (one- and multi-token
 * transactions, full and partial rotary_dim); fd_cache_get_config reports
 * the style. */
void test_cache_interleaved(void **state) {
  (void)state;
  const uint32_t HQ = 4, H = 2, D = 16, B = 4;
  fd_test_rng rng = {13};
  for (int32_t dtype : {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16})
    for (int32_t layout : {FD_LAYOUT_TOKEN_MAJOR, FD_LAYOUT_DIM_MAJOR}) {
      const size_t es = fd_test_dtype_size(dtype);
      fd_cache_config c = style_config(FD_ROPE_INTERLEAVED, dtype, layout);
      fd_cache *cache = NULL;
      FD_ASSERT_OK(fd_cache_create(&c, &cache));
      fd_cache_config got;
      memset(&got, 0x5a, sizeof got);
      got.struct_size = sizeof got;
      FD_ASSERT_OK(fd_cache_get_config(cache, &got));
      assert_int_equal(got.rope_style, FD_ROPE_INTERLEAVED);
      assert_int_equal(got.reserved2, 0);
      const uint64_t ids[2] = {1, 2};
      for (uint64_t id : ids) FD_ASSERT_OK(fd_cache_add_request(cache, id));
      const uint32_t counts[3][2] = {{3, 1}, {1, 1}, {2, 5}};
      for (int step = 0; step < 3; ++step) {
        const uint32_t n = counts[step][0] + counts[step][1];
        fd_tx tx;
        FD_ASSERT_OK(fd_tx_begin_multi(cache, ids, counts[step], 2, &tx));
        const Tokens tk = tokens_of(cache, tx, n);
        const int32_t *pos = tk.pos.data(), *blk = tk.blk.data(), *off = tk.off.data();
        for (uint32_t l = 0; l < 2; ++l) {
          const uint32_t rotary = l == 0 ? D : 6;
          const LayerWrite w =
              write_random_layer(cache, tx, l, n, HQ, H, D, dtype, rotary, 500.f, &rng);
          const std::vector<uint8_t> want_q =
              rotated(w.q, dtype, n, HQ, D, pos, rotary, 500.f, FD_ROPE_INTERLEAVED);
          const std::vector<uint8_t> want_k =
              rotated(w.k, dtype, n, H, D, pos, rotary, 500.f, FD_ROPE_INTERLEAVED);
          assert_memory_equal(w.q_out.data(), want_q.data(), w.q.size());
          void *kp = NULL, *vp = NULL;
          int64_t strides[4];
          FD_ASSERT_OK(fd_cache_layer_storage(cache, l, &kp, &vp, strides));
          expect_stored(static_cast<const uint8_t *>(kp), want_k, layout, es, H, B, D, n, blk, off,
                        "cache K");
          expect_stored(static_cast<const uint8_t *>(vp), w.v, layout, es, H, B, D, n, blk, off,
                        "cache V");
        }
        FD_ASSERT_OK(fd_tx_commit(cache, tx));
      }
      FD_ASSERT_OK(fd_cache_validate(cache));
      fd_cache_destroy(cache);
    }
}

/* An FP8 interleaved cache stores what fd_rope_kv_append(interleaved) into
 * FP8 stores with the layer's scales. */
void test_cache_fp8_interleaved(void **state) {
  (void)state;
  const uint32_t HQ = 4, H = 2, D = 16, B = 4, NB = 8;
  const float ks[2] = {0.5f, 0.125f}, vs[2] = {2.f, 0.75f};
  fd_cache_config c = style_config(FD_ROPE_INTERLEAVED, FD_DTYPE_FP8_E4M3, FD_LAYOUT_TOKEN_MAJOR);
  c.input_dtype = FD_DTYPE_BF16, c.k_scales = ks, c.v_scales = vs;
  fd_cache *cache = NULL;
  FD_ASSERT_OK(fd_cache_create(&c, &cache));
  const uint64_t ids[2] = {4, 9};
  for (uint64_t id : ids) FD_ASSERT_OK(fd_cache_add_request(cache, id));
  fd_test_rng rng = {21};
  const uint32_t counts[2] = {2, 3}, n = 5;
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin_multi(cache, ids, counts, 2, &tx));
  const Tokens tk = tokens_of(cache, tx, n);
  const int32_t *blk = tk.blk.data(), *off = tk.off.data();
  for (uint32_t l = 0; l < 2; ++l) {
    const uint32_t rotary = l == 0 ? D : 10;
    const LayerWrite w =
        write_random_layer(cache, tx, l, n, HQ, H, D, FD_DTYPE_BF16, rotary, 10000.f, &rng);
    const std::vector<uint8_t> &q = w.q, &k = w.k, &v = w.v, &q_out = w.q_out;
    /* The primitive on zeroed FP8 blocks, then the written slots compared. */
    std::vector<uint8_t> kc(NB * H * B * D, 0), vc(kc.size(), 0), q_ref(q.size(), 0);
    fd_kv_append_params a;
    fd_kv_append_params_init(&a);
    a.dtype = FD_DTYPE_BF16, a.cache_dtype = FD_DTYPE_FP8_E4M3, a.k_scale = ks[l];
    a.v_scale = vs[l], a.num_tokens = n, a.num_q_heads = HQ, a.num_kv_heads = H;
    a.head_dim = D, a.block_size = B, a.num_blocks = NB, a.rotary_dim = rotary;
    a.rope_base = 10000.f, a.rope_style = FD_ROPE_INTERLEAVED;
    a.q = q.data(), a.q_out = q_ref.data(), a.k = k.data(), a.v = v.data();
    a.k_cache = kc.data(), a.v_cache = vc.data();
    a.block_ids = blk, a.offsets = off, a.positions = tk.pos.data();
    FD_ASSERT_OK(fd_rope_kv_append(&a));
    assert_memory_equal(q_out.data(), q_ref.data(), q.size());
    void *kp = NULL, *vp = NULL;
    int64_t strides[4];
    FD_ASSERT_OK(fd_cache_layer_storage(cache, l, &kp, &vp, strides));
    for (uint32_t i = 0; i < n; ++i)
      for (uint32_t h = 0; h < H; ++h) {
        const size_t at = packed_at(FD_LAYOUT_TOKEN_MAJOR, H, B, D, blk[i], h, off[i], 0);
        assert_memory_equal(static_cast<const uint8_t *>(kp) + at, kc.data() + at, D);
        assert_memory_equal(static_cast<const uint8_t *>(vp) + at, vc.data() + at, D);
      }
  }
  FD_ASSERT_OK(fd_tx_commit(cache, tx));
  fd_cache_destroy(cache);
}

/* The engine takes the cache's style: on an interleaved f32 cache with a
 * partial rotary_dim, prefill and a step store K rotated by
 * fd_rope_apply_style(interleaved) at each token's position, and the step's
 * output is the reference attention over interleaved-rotated Q and K. */
void test_engine_on_interleaved_cache(void **state) {
  (void)state;
  const uint32_t L = 2, H = 2, HQ = 4, D = 8, B = 4, R = 6;
  fd_cache_config c = style_config(FD_ROPE_INTERLEAVED, FD_DTYPE_F32, FD_LAYOUT_TOKEN_MAJOR);
  c.num_layers = L, c.num_kv_heads = H, c.head_dim = D, c.block_size = B, c.max_blocks = 16;
  fd_cache *cache = NULL;
  FD_ASSERT_OK(fd_cache_create(&c, &cache));
  fd_engine_config ec;
  fd_engine_config_init(&ec);
  ec.num_q_heads = HQ, ec.rotary_dim = R, ec.rope_base = 100.f, ec.cpu_threads = 1;
  fd_engine *e = NULL;
  FD_ASSERT_OK(fd_engine_create(cache, &ec, &e));
  const uint64_t id = 3;
  FD_ASSERT_OK(fd_engine_add_request(e, id));
  FD_ASSERT_OK(fd_engine_admit(e, id));
  fd_test_rng rng = {31};
  auto randv = [&](size_t n) {
    std::vector<float> x(n);
    for (float &f : x) f = fd_test_normal(&rng);
    return x;
  };
  /* Rotated K and raw V of every token so far, per layer ([t, H, D]). */
  std::vector<float> hist_k[L], hist_v[L];
  const uint32_t P = 5;
  const std::vector<float> pk = randv(L * P * H * D), pv = randv(L * P * H * D);
  FD_ASSERT_OK(fd_engine_prefill_request_tokens(e, id, P, pk.data(), pv.data()));
  std::vector<int32_t> ppos(P);
  for (uint32_t t = 0; t < P; ++t) ppos[t] = (int32_t)t;
  int32_t table[4], seq_len = 0;
  FD_ASSERT_OK(fd_cache_export(cache, &id, 1, 4, table, &seq_len));
  assert_int_equal(seq_len, (int32_t)P);
  for (uint32_t l = 0; l < L; ++l) {
    std::vector<float> kl(pk.begin() + l * P * H * D, pk.begin() + (l + 1) * P * H * D);
    FD_ASSERT_OK(fd_rope_apply_style(FD_DTYPE_F32, kl.data(), P, H, D, ppos.data(), R, 100.f,
                                     FD_ROPE_INTERLEAVED));
    /* Prefill stored exactly these bits (token t at block t / B, offset t % B). */
    void *kp = NULL, *vp = NULL;
    int64_t strides[4];
    FD_ASSERT_OK(fd_cache_layer_storage(cache, l, &kp, &vp, strides));
    for (uint32_t t = 0; t < P; ++t)
      for (uint32_t h = 0; h < H; ++h)
        assert_memory_equal(
            static_cast<const float *>(kp) +
                packed_at(FD_LAYOUT_TOKEN_MAJOR, H, B, D, table[t / B], h, (int32_t)(t % B), 0),
            kl.data() + (t * H + h) * D, D * sizeof(float));
    hist_k[l] = kl;
    hist_v[l].assign(pv.begin() + l * P * H * D, pv.begin() + (l + 1) * P * H * D);
  }
  for (int step = 0; step < 3; ++step) {
    fd_engine_step st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    FD_ASSERT_OK(fd_engine_begin_step(e, &id, 1, &st));
    assert_int_equal(st.outcome, FD_STEP_OPENED);
    int32_t pos = -1, blk = -1, off = -1;
    FD_ASSERT_OK(fd_tx_get_rows(cache, st.tx, 1, NULL, &pos, &blk, &off, NULL));
    assert_int_equal(pos, (int32_t)(P + step));
    for (uint32_t l = 0; l < L; ++l) {
      std::vector<float> q = randv(HQ * D), k = randv(H * D), v = randv(H * D);
      std::vector<float> out(HQ * D, 0.f);
      FD_ASSERT_OK(
          fd_engine_step_layer(e, st.tx, l, q.data(), k.data(), v.data(), out.data(), NULL));
      FD_ASSERT_OK(fd_rope_apply_style(FD_DTYPE_F32, k.data(), 1, H, D, &pos, R, 100.f,
                                       FD_ROPE_INTERLEAVED));
      FD_ASSERT_OK(fd_rope_apply_style(FD_DTYPE_F32, q.data(), 1, HQ, D, &pos, R, 100.f,
                                       FD_ROPE_INTERLEAVED));
      hist_k[l].insert(hist_k[l].end(), k.begin(), k.end());
      hist_v[l].insert(hist_v[l].end(), v.begin(), v.end());
      /* Every stored K of this layer, prefill and steps, equals the history. */
      void *kp = NULL, *vp = NULL;
      int64_t strides[4];
      FD_ASSERT_OK(fd_cache_layer_storage(cache, l, &kp, &vp, strides));
      const float *stored = static_cast<const float *>(kp);
      const uint32_t len = P + step + 1;
      for (uint32_t h = 0; h < H; ++h)
        assert_memory_equal(stored + packed_at(FD_LAYOUT_TOKEN_MAJOR, H, B, D, blk, h, off, 0),
                            k.data() + h * D, D * sizeof(float));
      /* The output: dense reference over the rotated history. */
      std::vector<float> kd(H * len * D), vd(H * len * D), ref(HQ * D);
      for (uint32_t t = 0; t < len; ++t)
        for (uint32_t h = 0; h < H; ++h)
          for (uint32_t d = 0; d < D; ++d) {
            kd[(h * len + t) * D + d] = hist_k[l][(t * H + h) * D + d];
            vd[(h * len + t) * D + d] = hist_v[l][(t * H + h) * D + d];
          }
      const int32_t sl = (int32_t)len;
      FD_ASSERT_OK(fd_reference_attention_dense(FD_DTYPE_F32, 1, HQ, H, D, len, q.data(), kd.data(),
                                                vd.data(), &sl, 0.f, ref.data()));
      for (uint32_t i = 0; i < HQ * D; ++i)
        if (!(std::fabs(ref[i] - out[i]) <= 1e-4f)) {
          print_error("step %d layer %u out[%u] = %g, reference %g\n", step, l, i, (double)out[i],
                      (double)ref[i]);
          fail();
        }
    }
    FD_ASSERT_OK(fd_engine_commit_step(e, st.tx));
  }
  FD_ASSERT_OK(fd_engine_validate(e));
  fd_engine_destroy(e);
  fd_cache_destroy(cache);
}

/* Bad styles and reserved fields: FD_ERR_INVALID_ARGUMENT naming the field,
 * nothing written; the plain append ignores rope_style (as rotary_dim). */
void test_append_errors(void **state) {
  (void)state;
  const uint32_t T = 2, HQ = 2, H = 1, D = 8, B = 2, NB = 2;
  const int32_t blk[T] = {1, 0}, off[T] = {0, 1}, pos[T] = {2, 9};
  fd_test_rng rng = {2};
  const std::vector<uint8_t> q = random_tensor(&rng, T * HQ * D, FD_DTYPE_BF16);
  const std::vector<uint8_t> k = random_tensor(&rng, T * H * D, FD_DTYPE_BF16);
  const std::vector<uint8_t> v = random_tensor(&rng, T * H * D, FD_DTYPE_BF16);
  std::vector<uint8_t> kc(NB * H * B * D * 2, 0x11), vc(kc.size(), 0x22), q_out(q.size(), 0x33);
  const std::vector<uint8_t> kc0 = kc, vc0 = vc, q_out0 = q_out;
  fd_kv_append_params a;
  fd_kv_append_params_init(&a);
  assert_int_equal(a.rope_style, FD_ROPE_SPLIT_HALF);
  assert_int_equal(a.reserved2, 0);
  a.dtype = FD_DTYPE_BF16, a.num_tokens = T, a.num_q_heads = HQ, a.num_kv_heads = H;
  a.head_dim = D, a.block_size = B, a.num_blocks = NB, a.rotary_dim = D;
  a.q = q.data(), a.q_out = q_out.data(), a.k = k.data(), a.v = v.data();
  a.k_cache = kc.data(), a.v_cache = vc.data();
  a.block_ids = blk, a.offsets = off, a.positions = pos;
  auto unchanged = [&] {
    assert_memory_equal(kc.data(), kc0.data(), kc.size());
    assert_memory_equal(vc.data(), vc0.data(), vc.size());
    assert_memory_equal(q_out.data(), q_out0.data(), q_out.size());
  };
  for (int32_t style : {2, -1, 0x7fffffff}) {
    fd_kv_append_params b = a;
    b.rope_style = style;
    FD_ASSERT_FAILS(fd_rope_kv_append(&b), FD_ERR_INVALID_ARGUMENT, "params->rope_style");
    assert_non_null(strstr(fd_last_error_message(), "is not an fd_rope_style"));
    unchanged();
  }
  fd_kv_append_params b = a;
  b.reserved2 = 1;
  FD_ASSERT_FAILS(fd_rope_kv_append(&b), FD_ERR_INVALID_ARGUMENT, "params->reserved2 must be 0");
  FD_ASSERT_FAILS(fd_kv_append(&b), FD_ERR_INVALID_ARGUMENT, "params->reserved2 must be 0");
  unchanged();
  /* An older struct (through reserved1) cannot carry a style: split-half,
   * whatever lies past its struct_size. */
  b = a;
  b.struct_size = offsetof(fd_kv_append_params, rope_style);
  b.rope_style = 7, b.reserved2 = 9;
  FD_ASSERT_OK(fd_rope_kv_append(&b));
  const std::vector<uint8_t> want_q =
      rotated(q, FD_DTYPE_BF16, T, HQ, D, pos, D, 10000.f, FD_ROPE_SPLIT_HALF);
  assert_memory_equal(q_out.data(), want_q.data(), q.size());
  /* The plain append does not rotate and does not read rope_style. */
  b = a;
  b.rope_style = 7;
  FD_ASSERT_OK(fd_kv_append(&b));
}

void test_cache_errors(void **state) {
  (void)state;
  fd_cache_config c;
  fd_cache_config_init(&c);
  assert_int_equal(c.rope_style, FD_ROPE_SPLIT_HALF);
  assert_int_equal(c.reserved2, 0);
  c = style_config(FD_ROPE_INTERLEAVED, FD_DTYPE_BF16, FD_LAYOUT_TOKEN_MAJOR);
  fd_cache *const sentinel = reinterpret_cast<fd_cache *>(0x10);
  for (int32_t style : {2, -1, 0x7fffffff}) {
    fd_cache_config b = c;
    b.rope_style = style;
    fd_cache *out = sentinel;
    FD_ASSERT_FAILS(fd_cache_create(&b, &out), FD_ERR_INVALID_ARGUMENT, "config.rope_style");
    assert_non_null(strstr(fd_last_error_message(), "is not an fd_rope_style"));
    assert_ptr_equal(out, sentinel);
  }
  fd_cache_config b = c;
  b.reserved2 = 3;
  fd_cache *out = sentinel;
  FD_ASSERT_FAILS(fd_cache_create(&b, &out), FD_ERR_INVALID_ARGUMENT,
                  "config.reserved2 must be 0, got 3");
  assert_ptr_equal(out, sentinel);
  /* An older struct (through v_scales) gets the split-half default, and
   * reading the config back into it leaves the bytes past it alone. */
  b = c;
  b.struct_size = offsetof(fd_cache_config, rope_style);
  b.rope_style = 5, b.reserved2 = 5;
  fd_cache *cache = NULL;
  FD_ASSERT_OK(fd_cache_create(&b, &cache));
  fd_cache_config got;
  memset(&got, 0x7e, sizeof got);
  got.struct_size = offsetof(fd_cache_config, rope_style);
  FD_ASSERT_OK(fd_cache_get_config(cache, &got));
  assert_int_equal(got.rope_style, 0x7e7e7e7e);
  got.struct_size = sizeof got;
  FD_ASSERT_OK(fd_cache_get_config(cache, &got));
  assert_int_equal(got.rope_style, FD_ROPE_SPLIT_HALF);
  /* Its writes are split-half (positions 0, 1, 2). */
  const uint64_t id = 1;
  const uint32_t three = 3;
  FD_ASSERT_OK(fd_cache_add_request(cache, id));
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin_multi(cache, &id, &three, 1, &tx));
  fd_test_rng rng = {4};
  const std::vector<uint8_t> q = random_tensor(&rng, 3 * 2 * 16, FD_DTYPE_BF16);
  const std::vector<uint8_t> k = random_tensor(&rng, 3 * 2 * 16, FD_DTYPE_BF16);
  std::vector<uint8_t> q_out(q.size(), 0);
  FD_ASSERT_OK(fd_tx_write_layer_rope(cache, tx, 0, q.data(), 2, k.data(), k.data(), 16, 10000.f,
                                      q_out.data(), NULL));
  const int32_t pos[3] = {0, 1, 2};
  const std::vector<uint8_t> want =
      rotated(q, FD_DTYPE_BF16, 3, 2, 16, pos, 16, 10000.f, FD_ROPE_SPLIT_HALF);
  assert_memory_equal(q_out.data(), want.data(), q.size());
  FD_ASSERT_OK(fd_tx_abort(cache, tx));
  fd_cache_destroy(cache);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_append_matches_rope_apply_style),
      cmocka_unit_test(test_append_fp8_interleaved),
      cmocka_unit_test(test_cache_interleaved),
      cmocka_unit_test(test_cache_fp8_interleaved),
      cmocka_unit_test(test_engine_on_interleaved_cache),
      cmocka_unit_test(test_append_errors),
      cmocka_unit_test(test_cache_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
