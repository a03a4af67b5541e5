/* Stream ordering of a CUDA cache's creation (issue 11, bug 6): with work
 * still pending on the legacy default stream, a cache is created and tokens
 * are written and committed on a cudaStreamNonBlocking stream; every token
 * must read back intact. Creation used to clear the storage with cudaMemset
 * on the legacy default stream and return without waiting: the fill ran
 * behind the pending work, after the writes on the other stream, and wiped
 * them (0 of 20 tokens intact in the Python reproduction).
 *
 * The pending work is a chain of large cudaMemsetAsync on a scratch buffer
 * (the suites are host code, so no spin kernel), sized from a timed sample
 * to keep the default stream busy for about 150 ms (FD_GPU_TEST_REDUCED=1,
 * for compute-sanitizer: 64 MiB fills, about 40 ms). The test reports whether
 * the default stream was still busy once every write had been enqueued (the
 * condition under which the old code lost the data); the data check is what
 * passes or fails. Also: an engine created on such a cache, prefilled and
 * stepped on a non-blocking stream, reads back its tokens the same way. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fd_gpu_test.h"

namespace {

const uint32_t kLayers = 2, kHeads = 2, kDim = 128, kBlockSize = 16, kBlocks = 32;
const uint32_t kRequests = 4, kSteps = 5; /* 20 tokens */

bool reduced() {
  const char *e = getenv("FD_GPU_TEST_REDUCED");
  return e != nullptr && e[0] == '1';
}

int load_ms() {
  return reduced() ? 40 : 150;
}

/* Keeps the legacy default stream busy: large fills of a scratch buffer,
 * enough of them for about `target_ms`. */
struct DefaultStreamLoad {
  void *scratch = nullptr;
  size_t bytes = (reduced() ? size_t{64} : size_t{256}) << 20;
  int fills_per_ms = 1;

  DefaultStreamLoad() {
    CUDA_OK(cudaMalloc(&scratch, bytes));
    /* Time a sample on the default stream itself. */
    cudaEvent_t a = nullptr, b = nullptr;
    CUDA_OK(cudaEventCreate(&a));
    CUDA_OK(cudaEventCreate(&b));
    CUDA_OK(cudaEventRecord(a, nullptr));
    for (int i = 0; i < 8; ++i) CUDA_OK(cudaMemsetAsync(scratch, i, bytes, nullptr));
    CUDA_OK(cudaEventRecord(b, nullptr));
    CUDA_OK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    fills_per_ms = ms > 0 ? static_cast<int>(8.0f / ms) + 1 : 64;
  }
  ~DefaultStreamLoad() { cudaFree(scratch); }
  /* Enqueues the load and returns at once. */
  void start(int target_ms) {
    const int n = std::min(fills_per_ms * target_ms, 20000);
    for (int i = 0; i < n; ++i) CUDA_OK(cudaMemsetAsync(scratch, i & 0xff, bytes, nullptr));
  }
};

/* Deterministic, distinct, never zero: every token's K and V of every layer
 * can be told apart from the cleared storage and from each other. */
uint16_t value(uint32_t which, uint32_t layer, uint64_t request, uint32_t position, uint32_t head,
               uint32_t dim) {
  const uint32_t x = (((which * 7 + layer) * 131 + static_cast<uint32_t>(request)) * 257 +
                      position * 17 + head * 3) *
                         1031 +
                     dim;
  return static_cast<uint16_t>(0x3c00 | (x & 0x03ff)) ^ static_cast<uint16_t>(which << 15);
}

/* Host copy of one layer's K (which 0) or V (which 1) input for one step:
 * [kRequests, kHeads, kDim]. */
std::vector<uint16_t> step_input(uint32_t which, uint32_t layer, uint32_t position) {
  std::vector<uint16_t> x(size_t{kRequests} * kHeads * kDim);
  for (uint32_t r = 0; r < kRequests; ++r)
    for (uint32_t h = 0; h < kHeads; ++h)
      for (uint32_t d = 0; d < kDim; ++d)
        x[(size_t{r} * kHeads + h) * kDim + d] = value(which, layer, r + 1, position, h, d);
  return x;
}

fd_cache_config cache_config(int32_t layout) {
  fd_cache_config c;
  fd_cache_config_init(&c);
  c.num_layers = kLayers, c.num_kv_heads = kHeads, c.head_dim = kDim;
  c.block_size = kBlockSize, c.max_blocks = kBlocks, c.dtype = FD_DTYPE_BF16;
  c.layout = layout;
  c.device.type = FD_DEVICE_CUDA;
  return c;
}

/* Reads every committed token back through fd_cache_export and the layer
 * storage, and counts those whose K and V (every layer, head, dim) hold what
 * was written. */
uint32_t intact_tokens(fd_cache *cache, cudaStream_t stream) {
  const uint64_t ids[kRequests] = {1, 2, 3, 4};
  const uint32_t stride = kBlocks;
  std::vector<int32_t> tables(size_t{kRequests} * stride), lens(kRequests);
  FD_ASSERT_OK(fd_cache_export(cache, ids, kRequests, stride, tables.data(), lens.data()));
  std::vector<std::vector<uint16_t>> k(kLayers), v(kLayers);
  int64_t st[4] = {0, 0, 0, 0};
  for (uint32_t l = 0; l < kLayers; ++l) {
    void *kc = nullptr, *vc = nullptr;
    FD_ASSERT_OK(fd_cache_layer_storage(cache, l, &kc, &vc, st));
    const size_t elems = static_cast<size_t>(st[0]) * kBlocks;
    k[l].resize(elems);
    v[l].resize(elems);
    CUDA_OK(fd_gpu_download(stream, k[l].data(), kc, elems * 2));
    CUDA_OK(fd_gpu_download(stream, v[l].data(), vc, elems * 2));
  }
  uint32_t intact = 0;
  for (uint32_t r = 0; r < kRequests; ++r) {
    assert_int_equal(lens[r], kSteps);
    for (uint32_t t = 0; t < kSteps; ++t) {
      const int64_t block = tables[size_t{r} * stride + t / kBlockSize];
      bool ok = true;
      for (uint32_t l = 0; l < kLayers; ++l)
        for (uint32_t h = 0; h < kHeads; ++h)
          for (uint32_t d = 0; d < kDim; ++d) {
            const size_t at = static_cast<size_t>(block * st[0] + h * st[1] +
                                                  (t % kBlockSize) * st[2] + d * st[3]);
            ok = ok && k[l][at] == value(0, l, r + 1, t, h, d) &&
                 v[l][at] == value(1, l, r + 1, t, h, d);
          }
      intact += ok ? 1 : 0;
    }
  }
  return intact;
}

void check_cache_creation_with_busy_default_stream(int32_t layout) {
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  /* Every step's inputs in device memory, ready before the load starts. */
  const size_t kv_elems = size_t{kRequests} * kHeads * kDim;
  std::vector<void *> bufs;
  for (uint32_t i = 0; i < 2 * kLayers * kSteps; ++i) {
    void *p = nullptr;
    CUDA_OK(cudaMalloc(&p, kv_elems * 2));
    const uint32_t which = i % 2, layer = (i / 2) % kLayers, step = i / (2 * kLayers);
    const std::vector<uint16_t> x = step_input(which, layer, step);
    CUDA_OK(fd_gpu_upload(s, p, x.data(), kv_elems * 2));
    bufs.push_back(p);
  }
  DefaultStreamLoad load;
  CUDA_OK(cudaDeviceSynchronize());

  load.start(load_ms());
  fd_cache_config c = cache_config(layout);
  fd_cache *cache = nullptr;
  FD_ASSERT_OK(fd_cache_create(&c, &cache));
  const uint64_t ids[kRequests] = {1, 2, 3, 4};
  for (uint64_t id : ids) FD_ASSERT_OK(fd_cache_add_request(cache, id));
  for (uint32_t t = 0; t < kSteps; ++t) {
    fd_tx tx;
    FD_ASSERT_OK(fd_tx_begin(cache, ids, kRequests, &tx));
    for (uint32_t l = 0; l < kLayers; ++l)
      FD_ASSERT_OK(fd_tx_write_layer(cache, tx, l, bufs[(t * kLayers + l) * 2],
                                     bufs[(t * kLayers + l) * 2 + 1], (fd_stream)s));
    FD_ASSERT_OK(fd_tx_commit(cache, tx));
  }
  const cudaError_t q = cudaStreamQuery(nullptr);
  const bool busy = q == cudaErrorNotReady;
  if (!busy) CUDA_OK(q);
  /* Everything done, the load included, before reading back. */
  CUDA_OK(cudaDeviceSynchronize());
  const uint32_t intact = intact_tokens(cache, s);
  printf(
      "check: %s cache created with work pending on the default stream (still busy after the "
      "writes were enqueued: %s), %u tokens written and committed on a non-blocking stream: "
      "%u/%u intact %s\n",
      layout == FD_LAYOUT_DIM_MAJOR ? "dim-major" : "token-major", busy ? "yes" : "no",
      kRequests * kSteps, intact, kRequests * kSteps,
      intact == kRequests * kSteps ? "ok" : "FAILED");
  fflush(stdout);
  FD_ASSERT_OK(fd_cache_validate(cache));
  FD_ASSERT_OK(fd_cache_async_error(cache));
  fd_cache_destroy(cache);
  for (void *p : bufs) cudaFree(p);
  cudaStreamDestroy(s);
  assert_int_equal(intact, kRequests * kSteps);
}

void test_create_then_write_on_side_stream(void **state) {
  (void)state;
  check_cache_creation_with_busy_default_stream(FD_LAYOUT_TOKEN_MAJOR);
  check_cache_creation_with_busy_default_stream(FD_LAYOUT_DIM_MAJOR);
}

/* The engine's device scratch is cleared at creation too: an engine created
 * while the default stream is busy, then stepped on a non-blocking stream,
 * commits tokens that read back intact (its attention output is compared in
 * gpu_engine_step; here the stored K/V). */
void test_engine_on_busy_default_stream(void **state) {
  (void)state;
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t q_elems = size_t{kRequests} * 8 * kDim, kv_elems = size_t{kRequests} * kHeads * kDim;
  std::vector<void *> q(kLayers), k(kLayers), v(kLayers), out(kLayers);
  for (uint32_t l = 0; l < kLayers; ++l) {
    CUDA_OK(cudaMalloc(&q[l], q_elems * 2));
    CUDA_OK(cudaMalloc(&out[l], q_elems * 2));
    CUDA_OK(cudaMalloc(&k[l], kv_elems * 2));
    CUDA_OK(cudaMalloc(&v[l], kv_elems * 2));
    CUDA_OK(fd_gpu_fill(s, q[l], 0, q_elems * 2));
  }
  DefaultStreamLoad load;
  CUDA_OK(cudaDeviceSynchronize());
  load.start(load_ms());
  fd_cache_config c = cache_config(FD_LAYOUT_TOKEN_MAJOR);
  fd_cache *cache = nullptr;
  FD_ASSERT_OK(fd_cache_create(&c, &cache));
  fd_engine_config ec;
  fd_engine_config_init(&ec);
  ec.num_q_heads = 8;
  fd_engine *engine = nullptr;
  FD_ASSERT_OK(fd_engine_create(cache, &ec, &engine));
  const uint64_t ids[kRequests] = {1, 2, 3, 4};
  for (uint64_t id : ids) {
    FD_ASSERT_OK(fd_engine_add_request(engine, id));
    FD_ASSERT_OK(fd_engine_admit(engine, id));
  }
  /* V is stored raw (K is rotated by the engine): check V only. */
  for (uint32_t t = 0; t < kSteps; ++t) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      const std::vector<uint16_t> kx = step_input(0, l, t), vx = step_input(1, l, t);
      CUDA_OK(fd_gpu_upload(s, k[l], kx.data(), kv_elems * 2));
      CUDA_OK(fd_gpu_upload(s, v[l], vx.data(), kv_elems * 2));
    }
    fd_engine_step st;
    st.struct_size = sizeof st;
    FD_ASSERT_OK(fd_engine_begin_step(engine, ids, kRequests, &st));
    assert_int_equal(st.outcome, FD_STEP_OPENED);
    for (uint32_t l = 0; l < kLayers; ++l)
      FD_ASSERT_OK(fd_engine_step_layer(engine, st.tx, l, q[l], k[l], v[l], out[l], (fd_stream)s));
    FD_ASSERT_OK(fd_engine_commit_step(engine, st.tx));
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<int32_t> tables(size_t{kRequests} * kBlocks), lens(kRequests);
  FD_ASSERT_OK(fd_cache_export(cache, ids, kRequests, kBlocks, tables.data(), lens.data()));
  uint32_t intact = 0;
  for (uint32_t l = 0; l < kLayers; ++l) {
    void *kc = nullptr, *vc = nullptr;
    int64_t sd[4];
    FD_ASSERT_OK(fd_cache_layer_storage(cache, l, &kc, &vc, sd));
    std::vector<uint16_t> vh(static_cast<size_t>(sd[0]) * kBlocks);
    CUDA_OK(fd_gpu_download(s, vh.data(), vc, vh.size() * 2));
    for (uint32_t r = 0; r < kRequests; ++r)
      for (uint32_t t = 0; t < kSteps; ++t) {
        const int64_t block = tables[size_t{r} * kBlocks + t / kBlockSize];
        bool ok = true;
        for (uint32_t h = 0; h < kHeads; ++h)
          for (uint32_t d = 0; d < kDim; ++d)
            ok = ok && vh[static_cast<size_t>(block * sd[0] + h * sd[1] + (t % kBlockSize) * sd[2] +
                                              d * sd[3])] == value(1, l, r + 1, t, h, d);
        intact += ok ? 1 : 0;
      }
  }
  printf(
      "check: engine created with work pending on the default stream, %u steps on a "
      "non-blocking stream: %u/%u layer-tokens of V intact %s\n",
      kSteps, intact, kLayers * kRequests * kSteps,
      intact == kLayers * kRequests * kSteps ? "ok" : "FAILED");
  fflush(stdout);
  FD_ASSERT_OK(fd_engine_validate(engine));
  FD_ASSERT_OK(fd_cache_async_error(cache));
  fd_engine_destroy(engine);
  fd_cache_destroy(cache);
  for (auto *list : {&q, &k, &v, &out})
    for (void *p : *list) cudaFree(p);
  cudaStreamDestroy(s);
  assert_int_equal(intact, kLayers * kRequests * kSteps);
}

}  // namespace

int main(void) {
  if (!fd_gpu_test_device_present()) return FD_GPU_TEST_SKIPPED;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_then_write_on_side_stream),
      cmocka_unit_test(test_engine_on_busy_default_stream),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
