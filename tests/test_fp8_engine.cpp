/* The engine on an FP8 cache (CPU; S1.1, S8): q, k, v and the attention
 * output in the cache's input_dtype; each layer's output equals the step
 * computed by hand (q rotated by fd_rope_apply, the cache's FP8 bytes
 * dequantised with the layer's scales, the f32 reference), for E4M3 and
 * E5M2 with bf16 and f16 inputs; a scale change between steps applies to
 * the next step (every token is read with the new scales); prefill stores
 * the FP32 rotation of K quantised once; misaligned inputs are refused. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "fd_test.h"
#include "test_cache_support.h"
#include "test_fp8_support.h"

namespace {

constexpr uint32_t kLayers = 2, kKv = 2, kHq = 8, kDim = 32, kBs = 8, kBlocks = 32;

struct Setup {
  int32_t dtype, input;
  fd_cache *cache = NULL;
  fd_engine *engine = NULL;
  fd_test_rng rng = {3};
};

std::vector<uint8_t> random_input(Setup &s, size_t n, float amplitude) {
  std::vector<uint8_t> x(n * fd::dtype_size(s.input));
  for (size_t i = 0; i < n; ++i) f8_store(x.data(), i, s.input, amplitude * fd_test_normal(&s.rng));
  return x;
}

void make(Setup &s, const float *ks, const float *vs) {
  fd_cache_config c;
  fd_cache_config_init(&c);
  c.num_layers = kLayers;
  c.num_kv_heads = kKv;
  c.head_dim = kDim;
  c.block_size = kBs;
  c.max_blocks = kBlocks;
  c.dtype = s.dtype;
  c.input_dtype = s.input;
  c.k_scales = ks;
  c.v_scales = vs;
  FD_ASSERT_OK(fd_cache_create(&c, &s.cache));
  fd_engine_config e;
  fd_engine_config_init(&e);
  e.num_q_heads = kHq;
  e.cpu_threads = 2;
  FD_ASSERT_OK(fd_engine_create(s.cache, &e, &s.engine));
}

/* The attention of one layer computed by hand over the cache's bytes: rows'
 * tables and lengths (the new token included), q already rotated. */
std::vector<float> by_hand(Setup &s, uint32_t layer, const std::vector<int32_t> &tables,
                           uint32_t stride, const std::vector<int32_t> &lens,
                           const std::vector<uint8_t> &q_rot, float k_scale, float v_scale) {
  const uint32_t batch = (uint32_t)lens.size();
  const uint32_t max_len = (uint32_t)*std::max_element(lens.begin(), lens.end());
  void *kb = NULL, *vb = NULL;
  int64_t st[4];
  FD_ASSERT_OK(fd_cache_layer_storage(s.cache, layer, &kb, &vb, st));
  std::vector<float> k((size_t)batch * kKv * max_len * kDim, 0.f), v(k.size(), 0.f);
  for (uint32_t r = 0; r < batch; ++r)
    for (uint32_t h = 0; h < kKv; ++h)
      for (int32_t t = 0; t < lens[r]; ++t)
        for (uint32_t d = 0; d < kDim; ++d) {
          const int64_t at =
              tables[r * stride + t / kBs] * st[0] + h * st[1] + (t % kBs) * st[2] + d * st[3];
          const size_t di = (((size_t)r * kKv + h) * max_len + t) * kDim + d;
          k[di] = f8_value(s.dtype, static_cast<const uint8_t *>(kb)[at]) * k_scale;
          v[di] = f8_value(s.dtype, static_cast<const uint8_t *>(vb)[at]) * v_scale;
        }
  const size_t qn = (size_t)batch * kHq * kDim;
  std::vector<float> q(qn), out(qn);
  for (size_t i = 0; i < qn; ++i) q[i] = f8_load(q_rot.data(), i, s.input);
  fd_reference_params rp;
  fd_reference_params_init(&rp);
  rp.dtype = FD_DTYPE_F32;
  rp.batch = batch;
  rp.num_q_heads = kHq;
  rp.num_kv_heads = kKv;
  rp.head_dim = kDim;
  rp.max_seq_len = max_len;
  rp.q = q.data();
  rp.k = k.data();
  rp.v = v.data();
  rp.seq_lens = lens.data();
  rp.out = out.data();
  FD_ASSERT_OK(fd_reference_attention(&rp));
  return out;
}

/* One step of every row, checked layer by layer; returns the worst error. */
double step_and_check(Setup &s, const std::vector<uint64_t> &ids) {
  const uint32_t batch = (uint32_t)ids.size();
  fd_engine_step step;
  memset(&step, 0, sizeof step);
  step.struct_size = sizeof step;
  FD_ASSERT_OK(fd_engine_begin_step(s.engine, ids.data(), batch, &step));
  assert_int_equal(step.outcome, FD_STEP_OPENED);
  fd_tx_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  FD_ASSERT_OK(fd_tx_get_info(s.cache, step.tx, &info));
  const uint32_t stride = info.max_blocks_per_seq;
  std::vector<int32_t> tables((size_t)batch * stride), lens(batch), pos(batch);
  FD_ASSERT_OK(fd_tx_block_tables(s.cache, step.tx, stride, tables.data()));
  FD_ASSERT_OK(fd_tx_get_rows(s.cache, step.tx, batch, NULL, pos.data(), NULL, NULL, lens.data()));
  float ks[kLayers], vs[kLayers];
  FD_ASSERT_OK(fd_cache_get_kv_scales(s.cache, ks, vs));
  double worst = 0;
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    const std::vector<uint8_t> q = random_input(s, (size_t)batch * kHq * kDim, 3.f);
    const std::vector<uint8_t> k = random_input(s, (size_t)batch * kKv * kDim, 1.f);
    const std::vector<uint8_t> v = random_input(s, (size_t)batch * kKv * kDim, 1.f);
    std::vector<uint8_t> out(q.size(), 0xee);
    FD_ASSERT_OK(fd_engine_step_layer(s.engine, step.tx, layer, q.data(), k.data(), v.data(),
                                      out.data(), NULL));
    std::vector<uint8_t> q_rot = q;
    FD_ASSERT_OK(fd_rope_apply(s.input, q_rot.data(), batch, kHq, kDim, pos.data(), kDim, 10000.f));
    const std::vector<float> want =
        by_hand(s, layer, tables, stride, lens, q_rot, ks[layer], vs[layer]);
    std::vector<float> got(want.size());
    for (size_t i = 0; i < got.size(); ++i) got[i] = f8_load(out.data(), i, s.input);
    worst = std::max(worst, f8_worst_row_error(got, want, kDim));
  }
  FD_ASSERT_OK(fd_engine_commit_step(s.engine, step.tx));
  return worst;
}

void test_engine_steps(void **state) {
  (void)state;
  for (int32_t dtype : {FD_DTYPE_FP8_E4M3, FD_DTYPE_FP8_E5M2})
    for (int32_t input : {FD_DTYPE_BF16, FD_DTYPE_F16}) {
      Setup s;
      s.dtype = dtype;
      s.input = input;
      const float ks[kLayers] = {4.f / f8_max(dtype), 0.5f},
                  vs[kLayers] = {0.03f, 4.f / f8_max(dtype)};
      make(s, ks, vs);
      const std::vector<uint64_t> ids = {1, 2, 3};
      for (uint64_t id : ids) {
        FD_ASSERT_OK(fd_engine_add_request(s.engine, id));
        FD_ASSERT_OK(fd_engine_admit(s.engine, id));
      }
      /* Contexts of 0, 5 and 13 prompt tokens. */
      const uint32_t prompt[3] = {0, 5, 13};
      for (int i = 0; i < 3; ++i) {
        if (prompt[i] == 0) continue;
        const size_t n = (size_t)kLayers * prompt[i] * kKv * kDim;
        const std::vector<uint8_t> k = random_input(s, n, 1.f), v = random_input(s, n, 1.f);
        FD_ASSERT_OK(
            fd_engine_prefill_request_tokens(s.engine, ids[i], prompt[i], k.data(), v.data()));
      }
      double worst = 0;
      for (int step = 0; step < 3; ++step) worst = std::max(worst, step_and_check(s, ids));
      /* New scales between steps: the next step reads every token with them. */
      const float ks2[kLayers] = {ks[0] * 2.f, ks[1] * 0.5f},
                  vs2[kLayers] = {vs[0] * 0.25f, vs[1] * 3.f};
      FD_ASSERT_OK(fd_cache_set_kv_scales(s.cache, ks2, vs2));
      for (int step = 0; step < 2; ++step) worst = std::max(worst, step_and_check(s, ids));
      print_message(
          "engine step, cache %s, input %s: worst row-relative error %.3g vs the step "
          "by hand\n",
          fd::dtype_name(dtype), fd::dtype_name(input), worst);
      assert_true(worst <= 5e-3);
      FD_ASSERT_OK(fd_engine_validate(s.engine));
      fd_engine_destroy(s.engine);
      fd_cache_destroy(s.cache);
    }
}

/* Prefill rotates K in FP32 and quantises it once, at each token's
 * position; the step tensors are aligned to the input type. */
void test_prefill_bytes_and_alignment(void **state) {
  (void)state;
  Setup s;
  s.dtype = FD_DTYPE_FP8_E4M3;
  s.input = FD_DTYPE_BF16;
  const float ks[kLayers] = {0.02f, 0.5f}, vs[kLayers] = {1.f, 0.125f};
  make(s, ks, vs);
  FD_ASSERT_OK(fd_engine_add_request(s.engine, 9));
  FD_ASSERT_OK(fd_engine_admit(s.engine, 9));
  const uint32_t n = 11;
  const size_t per_layer = (size_t)n * kKv * kDim;
  const std::vector<uint8_t> k = random_input(s, kLayers * per_layer, 2.f);
  const std::vector<uint8_t> v = random_input(s, kLayers * per_layer, 2.f);
  FD_ASSERT_OK(fd_engine_prefill_request_tokens(s.engine, 9, n, k.data(), v.data()));
  const std::vector<int32_t> table = cs_table(s.cache, 9);
  std::vector<int32_t> pos(n);
  for (uint32_t t = 0; t < n; ++t) pos[t] = (int32_t)t;
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    std::vector<float> kf(per_layer);
    for (size_t i = 0; i < per_layer; ++i)
      kf[i] = f8_load(k.data(), layer * per_layer + i, s.input);
    FD_ASSERT_OK(fd_rope_apply(FD_DTYPE_F32, kf.data(), n, kKv, kDim, pos.data(), kDim, 10000.f));
    void *kb = NULL, *vb = NULL;
    int64_t st[4];
    FD_ASSERT_OK(fd_cache_layer_storage(s.cache, layer, &kb, &vb, st));
    for (uint32_t t = 0; t < n; ++t)
      for (uint32_t h = 0; h < kKv; ++h)
        for (uint32_t d = 0; d < kDim; ++d) {
          const int64_t at = table[t / kBs] * st[0] + h * st[1] + (t % kBs) * st[2] + d * st[3];
          const size_t i = ((size_t)t * kKv + h) * kDim + d;
          assert_int_equal(static_cast<const uint8_t *>(kb)[at],
                           fd::f32_to_fp8_e4m3(kf[i] / ks[layer]));
          assert_int_equal(
              static_cast<const uint8_t *>(vb)[at],
              fd::f32_to_fp8_e4m3(f8_load(v.data(), layer * per_layer + i, s.input) / vs[layer]));
        }
  }
  /* A misaligned (odd) bf16 pointer is refused; the step is aborted. */
  const uint64_t id = 9;
  fd_engine_step step;
  memset(&step, 0, sizeof step);
  step.struct_size = sizeof step;
  FD_ASSERT_OK(fd_engine_begin_step(s.engine, &id, 1, &step));
  std::vector<uint8_t> q = random_input(s, kHq * kDim + 1, 1.f),
                       kv = random_input(s, kKv * kDim, 1.f);
  std::vector<uint8_t> out(q.size());
  FD_ASSERT_FAILS(fd_engine_step_layer(s.engine, step.tx, 0, q.data() + 1, kv.data(), kv.data(),
                                       out.data(), NULL),
                  FD_ERR_INVALID_ARGUMENT, "must be aligned to 2 bytes");
  assert_int_equal(cs_seq_len(s.cache, 9), (int32_t)n);
  fd_engine_destroy(s.engine);
  fd_cache_destroy(s.cache);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_engine_steps),
      cmocka_unit_test(test_prefill_bytes_and_alignment),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
