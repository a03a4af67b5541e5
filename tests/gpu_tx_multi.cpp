/* Multi-token transactions on a CUDA cache (issue 14): the same sequence of
 * fd_tx_begin_multi transactions (a bulk prompt write larger than the
 * preallocated staging, a speculative step ended with fd_tx_commit_keep,
 * plain writes), run on a CUDA cache and on a CPU cache with the same
 * inputs, gives the same views (tokens, block tables, async tables and
 * effective lengths), the same rotated Q (within one rounding of the dtype:
 * fused RoPE at each token's own position) and the same stored K (within
 * one rounding) and V (bit-equal), for both layouts and both 16-bit dtypes.
 * Skips visibly without a device. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "fd_gpu_test.h"

namespace {

const uint32_t kLayers = 2, kHkv = 2, kHq = 8, kDim = 128, kBs = 16, kBlocks = 160, kRot = 64;
const float kBase = 10000.f;

/* One backend's cache and a stream. */
struct Side {
  fd_cache *cache = nullptr;
  bool cuda = false;
  cudaStream_t stream = nullptr;
};

Side make_side(bool cuda, int32_t dtype, int32_t layout) {
  fd_cache_config c;
  fd_cache_config_init(&c);
  c.num_layers = kLayers, c.num_kv_heads = kHkv, c.head_dim = kDim, c.block_size = kBs;
  c.max_blocks = kBlocks, c.dtype = dtype, c.layout = layout;
  if (cuda) c.device.type = FD_DEVICE_CUDA;
  Side s;
  s.cuda = cuda;
  FD_ASSERT_OK(fd_cache_create(&c, &s.cache));
  if (cuda) CUDA_OK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  for (uint64_t id = 1; id <= 3; ++id) FD_ASSERT_OK(fd_cache_add_request(s.cache, id));
  return s;
}

void destroy_side(Side &s) {
  if (s.stream) CUDA_OK(cudaStreamDestroy(s.stream));
  fd_cache_destroy(s.cache);
}

std::vector<uint16_t> random_data(size_t n, int32_t dtype, uint64_t seed) {
  fd_test_rng rng = {seed};
  std::vector<uint16_t> x(n);
  for (auto &e : x) fd_test_store(&e, 0, dtype, fd_test_normal(&rng));
  return x;
}

/* Writes one layer on `s` (RoPE when `q` is not empty) and returns q_out. */
std::vector<uint16_t> write_layer(Side &s, fd_tx tx, uint32_t layer, const std::vector<uint16_t> &q,
                                  const std::vector<uint16_t> &k, const std::vector<uint16_t> &v) {
  std::vector<uint16_t> q_out(q.size(), 0);
  const bool rope = !q.empty();
  if (!s.cuda) {
    if (rope)
      FD_ASSERT_OK(fd_tx_write_layer_rope(s.cache, tx, layer, q.data(), kHq, k.data(), v.data(),
                                          kRot, kBase, q_out.data(), NULL));
    else
      FD_ASSERT_OK(fd_tx_write_layer(s.cache, tx, layer, k.data(), v.data(), NULL));
    return q_out;
  }
  void *dq = nullptr, *dqo = nullptr, *dk = nullptr, *dv = nullptr;
  const size_t kv_bytes = k.size() * 2, q_bytes = std::max<size_t>(q.size() * 2, 2);
  CUDA_OK(cudaMalloc(&dq, q_bytes));
  CUDA_OK(cudaMalloc(&dqo, q_bytes));
  CUDA_OK(cudaMalloc(&dk, kv_bytes));
  CUDA_OK(cudaMalloc(&dv, kv_bytes));
  CUDA_OK(fd_gpu_upload(s.stream, dk, k.data(), kv_bytes));
  CUDA_OK(fd_gpu_upload(s.stream, dv, v.data(), kv_bytes));
  fd_stream st = (fd_stream)s.stream;
  if (rope) {
    CUDA_OK(fd_gpu_upload(s.stream, dq, q.data(), q_bytes));
    FD_ASSERT_OK(fd_tx_write_layer_rope(s.cache, tx, layer, dq, kHq, dk, dv, kRot, kBase, dqo, st));
    CUDA_OK(fd_gpu_download(s.stream, q_out.data(), dqo, q_bytes));
  } else {
    FD_ASSERT_OK(fd_tx_write_layer(s.cache, tx, layer, dk, dv, st));
    CUDA_OK(cudaStreamSynchronize(s.stream));
  }
  CUDA_OK(cudaFree(dq));
  CUDA_OK(cudaFree(dqo));
  CUDA_OK(cudaFree(dk));
  CUDA_OK(cudaFree(dv));
  return q_out;
}

/* |a - b| within one rounding of the dtype (relative), plus a small
 * absolute slack for values near zero. */
void assert_close(float a, float b, int32_t dtype, const char *what, size_t i) {
  const float ulp = dtype == FD_DTYPE_BF16 ? 0x1p-7f : 0x1p-10f;
  if (!(std::fabs(a - b) <= ulp * std::fabs(b) + 1e-3f)) {
    print_error("%s[%zu]: GPU %g vs CPU %g\n", what, i, (double)a, (double)b);
    fail();
  }
}

/* The views of the open transaction agree between the backends; the CUDA
 * side's async tables and lengths equal its host tables. */
void assert_same_views(Side &g, fd_tx tg, Side &c, fd_tx tc) {
  fd_tx_info ig, ic;
  ig.struct_size = ic.struct_size = sizeof ig;
  FD_ASSERT_OK(fd_tx_get_info(g.cache, tg, &ig));
  FD_ASSERT_OK(fd_tx_get_info(c.cache, tc, &ic));
  assert_memory_equal(&ig, &ic, sizeof ig);
  const uint32_t t = ig.token_count, n = ig.batch, w = ig.max_blocks_per_seq;
  std::vector<int32_t> a(3 * t), b(3 * t);
  FD_ASSERT_OK(fd_tx_get_tokens(g.cache, tg, t, &a[0], &a[t], &a[2 * t]));
  FD_ASSERT_OK(fd_tx_get_tokens(c.cache, tc, t, &b[0], &b[t], &b[2 * t]));
  assert_true(a == b);
  std::vector<int32_t> tab_g(n * w), tab_c(n * w), tab_d(n * w), len_c(n), len_d(n);
  FD_ASSERT_OK(fd_tx_block_tables(g.cache, tg, w, tab_g.data()));
  FD_ASSERT_OK(fd_tx_block_tables_async(c.cache, tc, w, tab_c.data(), len_c.data(), NULL));
  assert_true(tab_g == tab_c);
  int32_t *dtab = nullptr, *dlen = nullptr;
  CUDA_OK(cudaMalloc((void **)&dtab, tab_d.size() * 4));
  CUDA_OK(cudaMalloc((void **)&dlen, n * 4));
  FD_ASSERT_OK(fd_tx_block_tables_async(g.cache, tg, w, dtab, dlen, (fd_stream)g.stream));
  CUDA_OK(fd_gpu_download(g.stream, tab_d.data(), dtab, tab_d.size() * 4));
  CUDA_OK(fd_gpu_download(g.stream, len_d.data(), dlen, n * 4));
  assert_true(tab_d == tab_c);
  assert_true(len_d == len_c);
  CUDA_OK(cudaFree(dtab));
  CUDA_OK(cudaFree(dlen));
}

/* One transaction on both sides: begin_multi, every layer (RoPE or plain),
 * then commit (keep NULL) or commit_keep. */
void run_tx(Side &g, Side &c, int32_t dtype, const std::vector<uint64_t> &ids,
            const std::vector<uint32_t> &counts, bool rope, const uint32_t *keep, uint64_t seed) {
  fd_tx tg, tc;
  const uint32_t n = (uint32_t)ids.size();
  FD_ASSERT_OK(fd_tx_begin_multi(g.cache, ids.data(), counts.data(), n, &tg));
  FD_ASSERT_OK(fd_tx_begin_multi(c.cache, ids.data(), counts.data(), n, &tc));
  assert_same_views(g, tg, c, tc);
  size_t tokens = 0;
  for (uint32_t k : counts) tokens += k;
  for (uint32_t l = 0; l < kLayers; ++l) {
    const std::vector<uint16_t> q =
        rope ? random_data(tokens * kHq * kDim, dtype, seed * 31 + l) : std::vector<uint16_t>();
    const std::vector<uint16_t> k = random_data(tokens * kHkv * kDim, dtype, seed * 37 + l);
    const std::vector<uint16_t> v = random_data(tokens * kHkv * kDim, dtype, seed * 41 + l);
    const std::vector<uint16_t> qg = write_layer(g, tg, l, q, k, v);
    const std::vector<uint16_t> qc = write_layer(c, tc, l, q, k, v);
    for (size_t i = 0; i < qc.size(); ++i)
      assert_close(fd_test_load(qg.data(), i, dtype), fd_test_load(qc.data(), i, dtype), dtype,
                   "q_out", i);
  }
  if (keep != nullptr) {
    FD_ASSERT_OK(fd_tx_commit_keep(g.cache, tg, keep, n));
    FD_ASSERT_OK(fd_tx_commit_keep(c.cache, tc, keep, n));
  } else {
    FD_ASSERT_OK(fd_tx_commit(g.cache, tg));
    FD_ASSERT_OK(fd_tx_commit(c.cache, tc));
  }
  FD_ASSERT_OK(fd_cache_async_error(g.cache));
}

/* Every committed token of every request: K within one rounding, V equal,
 * and the same block tables and lengths on both sides. */
void assert_same_storage(Side &g, Side &c, int32_t dtype) {
  const uint64_t ids[3] = {1, 2, 3};
  uint32_t w = 0;
  FD_ASSERT_OK(fd_cache_max_blocks_per_seq(c.cache, ids, 3, &w));
  std::vector<int32_t> tg(3 * w), tc(3 * w), lg(3), lc(3);
  FD_ASSERT_OK(fd_cache_export(g.cache, ids, 3, w, tg.data(), lg.data()));
  FD_ASSERT_OK(fd_cache_export(c.cache, ids, 3, w, tc.data(), lc.data()));
  assert_true(tg == tc);
  assert_true(lg == lc);
  for (uint32_t l = 0; l < kLayers; ++l) {
    void *gk, *gv, *ck, *cv;
    int64_t gs[4], cs[4];
    FD_ASSERT_OK(fd_cache_layer_storage(g.cache, l, &gk, &gv, gs));
    FD_ASSERT_OK(fd_cache_layer_storage(c.cache, l, &ck, &cv, cs));
    assert_memory_equal(gs, cs, sizeof gs);
    const size_t elems = (size_t)kBlocks * kHkv * kBs * kDim;
    std::vector<uint16_t> hk(elems), hv(elems);
    CUDA_OK(fd_gpu_download(g.stream, hk.data(), gk, elems * 2));
    CUDA_OK(fd_gpu_download(g.stream, hv.data(), gv, elems * 2));
    for (uint32_t r = 0; r < 3; ++r)
      for (int32_t p = 0; p < lc[r]; ++p) {
        const int32_t b = tc[r * w + (uint32_t)p / kBs];
        for (uint32_t h = 0; h < kHkv; ++h)
          for (uint32_t d = 0; d < kDim; ++d) {
            const size_t i = (size_t)((int64_t)b * cs[0] + (int64_t)h * cs[1] +
                                      (int64_t)(p % (int32_t)kBs) * cs[2] + (int64_t)d * cs[3]);
            assert_close(fd_test_load(hk.data(), i, dtype), fd_test_load(ck, i, dtype), dtype, "K",
                         i);
            assert_true(hv[i] == ((const uint16_t *)cv)[i]);
          }
      }
  }
}

void multi_token_matches_cpu(void **) {
  const int32_t dtypes[2] = {FD_DTYPE_BF16, FD_DTYPE_F16};
  for (int32_t dtype : dtypes)
    for (int32_t layout = 0; layout < 2; ++layout) {
      Side g = make_side(true, dtype, layout), c = make_side(false, dtype, layout);
      /* A bulk prompt write of 1500 + 37 + 16 tokens: more than the 1365
       * tokens of the preallocated staging. */
      run_tx(g, c, dtype, {1, 2, 3}, {1500, 37, 16}, true, nullptr, 1);
      /* A speculative step: 4, 1 and 3 drafts, keep 2, 1 and 0. */
      const uint32_t keep[3] = {2, 1, 0};
      run_tx(g, c, dtype, {3, 1, 2}, {4, 1, 3}, true, keep, 2);
      /* Plain writes over the dropped slots. */
      run_tx(g, c, dtype, {2, 3}, {20, 3}, false, nullptr, 3);
      assert_same_storage(g, c, dtype);
      FD_ASSERT_OK(fd_cache_validate(g.cache));
      destroy_side(g);
      destroy_side(c);
    }
}

}  // namespace

int main(void) {
  if (!fd_gpu_test_device_present()) return FD_GPU_TEST_SKIPPED;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(multi_token_matches_cpu),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
