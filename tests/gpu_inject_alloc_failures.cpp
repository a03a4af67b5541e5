/* Device allocation failure injection (issue 11): the library's CUDA
 * allocations (cudaMalloc, cudaHostAlloc / cudaMallocHost for pinned staging,
 * and the events and streams it creates) are wrapped at link time
 * (-Wl,--wrap, tests/CMakeLists.txt "gpu_inject" suites; nothing in the
 * library or its API). For each operation below, run n = 1, 2, ... makes the
 * n-th wrapped call fail with cudaErrorMemoryAllocation, until a run reaches
 * no n-th call (it then succeeded, having made n - 1). Every failing run must
 * return FD_ERR_OUT_OF_MEMORY with a message, leave no CUDA error behind,
 * and leave every observable state as it was (exports, metrics, state
 * versions, request states, validators); the same call without injection
 * then succeeds. fd_engine_step_layer is the documented exception: any
 * failure aborts the step, so its failing runs must leave exactly that.
 *
 * Operations: creating a CUDA cache (staging rings, K/V, the clearing
 * stream), a transaction that grows the row staging, an export that grows
 * the export staging, creating an engine (device scratch), and a step whose
 * begin grows the rows and block-table scratch and the row staging and whose
 * first layer grows the export staging. The last line gives the number of
 * injection points exercised. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fd_gpu_test.h"

/* ---- The wrapped calls --------------------------------------------------- */

extern "C" {
cudaError_t __real_cudaMalloc(void **ptr, size_t bytes);
cudaError_t __real_cudaMallocHost(void **ptr, size_t bytes);
cudaError_t __real_cudaHostAlloc(void **ptr, size_t bytes, unsigned int flags);
cudaError_t __real_cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t __real_cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
}

namespace {

struct Injection {
  bool armed = false;
  long calls = 0;   /* wrapped calls since arming */
  long fail_at = 0; /* the call that fails (1-based) */
  const char *failed = nullptr;
};
Injection g_injection;

bool inject(const char *what) {
  if (!g_injection.armed) return false;
  if (++g_injection.calls != g_injection.fail_at) return false;
  g_injection.failed = what;
  return true;
}

}  // namespace

extern "C" {
cudaError_t __wrap_cudaMalloc(void **ptr, size_t bytes) {
  if (inject("cudaMalloc")) return cudaErrorMemoryAllocation;
  return __real_cudaMalloc(ptr, bytes);
}
cudaError_t __wrap_cudaMallocHost(void **ptr, size_t bytes) {
  if (inject("cudaMallocHost")) return cudaErrorMemoryAllocation;
  return __real_cudaMallocHost(ptr, bytes);
}
cudaError_t __wrap_cudaHostAlloc(void **ptr, size_t bytes, unsigned int flags) {
  if (inject("cudaHostAlloc")) return cudaErrorMemoryAllocation;
  return __real_cudaHostAlloc(ptr, bytes, flags);
}
cudaError_t __wrap_cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  if (inject("cudaEventCreateWithFlags")) return cudaErrorMemoryAllocation;
  return __real_cudaEventCreateWithFlags(event, flags);
}
cudaError_t __wrap_cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
  if (inject("cudaStreamCreateWithFlags")) return cudaErrorMemoryAllocation;
  return __real_cudaStreamCreateWithFlags(stream, flags);
}
}

namespace {

/* ---- Observable state ---------------------------------------------------- */

struct CacheState {
  fd_cache_metrics metrics;
  uint64_t version = 0;
  std::vector<int32_t> tables, lens, states;
};

CacheState cache_state(const fd_cache *cache, const std::vector<uint64_t> &ids, uint32_t stride) {
  CacheState s;
  memset(&s.metrics, 0, sizeof s.metrics);
  s.metrics.struct_size = sizeof s.metrics;
  FD_ASSERT_OK(fd_cache_metrics_get(cache, &s.metrics));
  FD_ASSERT_OK(fd_cache_state_version(cache, &s.version));
  FD_ASSERT_OK(fd_cache_validate(cache));
  for (uint64_t id : ids) {
    int32_t st = -1;
    FD_ASSERT_OK(fd_cache_request_state(cache, id, &st));
    s.states.push_back(st);
  }
  if (!ids.empty()) {
    s.tables.resize(ids.size() * stride);
    s.lens.resize(ids.size());
    FD_ASSERT_OK(fd_cache_export(cache, ids.data(), (uint32_t)ids.size(), stride, s.tables.data(),
                                 s.lens.data()));
  }
  return s;
}

/* transaction_failure_count is the one counter allowed to move: whether a
 * begin refused for lack of memory counts as a failed begin is the
 * counter's definition (issue 11), not this test's. */
void expect_same_cache_state(const CacheState &a, const CacheState &b, const char *what) {
  fd_cache_metrics x = a.metrics, y = b.metrics;
  if (y.transaction_failure_count != x.transaction_failure_count &&
      y.transaction_failure_count != x.transaction_failure_count + 1) {
    print_error("%s: transaction_failure_count %llu -> %llu\n", what,
                (unsigned long long)x.transaction_failure_count,
                (unsigned long long)y.transaction_failure_count);
    fail();
  }
  y.transaction_failure_count = x.transaction_failure_count;
  if (memcmp(&x, &y, sizeof x) != 0) {
    print_error("%s: the cache metrics changed\n", what);
    fail();
  }
  if (a.version != b.version) {
    print_error("%s: cache state version %llu -> %llu\n", what, (unsigned long long)a.version,
                (unsigned long long)b.version);
    fail();
  }
  assert_true(a.states == b.states);
  assert_true(a.tables == b.tables);
  assert_true(a.lens == b.lens);
}

struct EngineState {
  fd_engine_metrics metrics;
  std::vector<int32_t> states;
};

EngineState engine_state(const fd_engine *engine, const std::vector<uint64_t> &ids) {
  EngineState s;
  memset(&s.metrics, 0, sizeof s.metrics);
  s.metrics.struct_size = sizeof s.metrics;
  FD_ASSERT_OK(fd_engine_metrics_get(engine, &s.metrics));
  FD_ASSERT_OK(fd_engine_validate(engine));
  for (uint64_t id : ids) {
    int32_t st = -1;
    FD_ASSERT_OK(fd_engine_get_request_state(engine, id, &st));
    s.states.push_back(st);
  }
  return s;
}

void expect_same_engine_state(const EngineState &a, const EngineState &b, const char *what) {
  if (memcmp(&a.metrics, &b.metrics, sizeof a.metrics) != 0) {
    print_error("%s: the engine metrics changed\n", what);
    fail();
  }
  assert_true(a.states == b.states);
}

/* ---- The sweep ----------------------------------------------------------- */

long g_points_total = 0;

/* Scenario: a fresh fixture (constructor), then
 *   fd_status run();               the operation under test
 *   void snapshot();               records the observable state
 *   void expect_unchanged();       compares with the snapshot after a failure
 *   void after_success();          uses the result of a successful run */
template <class Scenario>
void sweep(const char *name) {
  long points = -1;
  for (long n = 1; points < 0; ++n) {
    if (n > 500) {
      print_error("%s: still failing at allocation %ld: does the operation loop?\n", name, n);
      fail();
    }
    std::unique_ptr<Scenario> sc(new Scenario());
    sc->snapshot();
    CUDA_OK(cudaDeviceSynchronize());
    g_injection = Injection();
    g_injection.armed = true;
    g_injection.fail_at = n;
    const fd_status st = sc->run();
    const std::string msg = st == FD_OK ? "" : fd_last_error_message();
    g_injection.armed = false;
    if (g_injection.failed == nullptr) {
      /* No n-th call: the operation made n - 1 and must have succeeded. */
      if (st != FD_OK) {
        print_error("%s: no allocation failed, but the call returned %s (%s)\n", name,
                    fd_status_string(st), msg.c_str());
        fail();
      }
      assert_int_equal(g_injection.calls, n - 1);
      sc->after_success();
      points = n - 1;
      break;
    }
    if (st != FD_ERR_OUT_OF_MEMORY || msg.empty()) {
      print_error("%s: allocation %ld (%s) failed, the call returned %s (\"%s\"), not %s\n", name,
                  n, g_injection.failed, fd_status_string(st), msg.c_str(),
                  fd_status_string(FD_ERR_OUT_OF_MEMORY));
      fail();
    }
    CUDA_OK(cudaGetLastError()); /* nothing left behind for later calls */
    sc->expect_unchanged();
    FD_ASSERT_OK(sc->run()); /* the same call, no injection */
    sc->after_success();
    printf(
        "inject: %s: allocation %ld (%s) failed: FD_ERR_OUT_OF_MEMORY (%s); unchanged; retry ok\n",
        name, n, g_injection.failed, msg.c_str());
  }
  printf("inject: %s: %ld injection points exercised, each refused cleanly\n", name, points);
  fflush(stdout);
  assert_true(points > 0);
  g_points_total += points;
}

/* ---- Fixtures ------------------------------------------------------------ */

fd_cache_config small_config() {
  fd_cache_config c;
  fd_cache_config_init(&c);
  c.device.type = FD_DEVICE_CUDA;
  c.num_layers = 2, c.num_kv_heads = 2, c.head_dim = 128, c.block_size = 16;
  c.max_blocks = 64, c.dtype = FD_DTYPE_BF16;
  return c;
}

/* Many rows: 1400 rows of staging (16800 bytes) outgrow the preallocated
 * 16 KiB slots; 1400 rows x 16 table entries outgrow the 64 KiB export
 * slots; a 1000-block prefix makes a step's block table 1400 x 1001 entries,
 * more than the engine's initial 2^20. */
const uint32_t kRows = 1400, kPrefixBlocks = 1000;

fd_cache_config wide_config() {
  fd_cache_config c;
  fd_cache_config_init(&c);
  c.device.type = FD_DEVICE_CUDA;
  c.num_layers = 1, c.num_kv_heads = 1, c.head_dim = 64, c.block_size = 16;
  c.max_blocks = 4096, c.dtype = FD_DTYPE_BF16;
  c.prefix_cache_capacity_blocks = 1024;
  return c;
}

std::vector<uint64_t> row_ids() {
  std::vector<uint64_t> ids(kRows);
  for (uint32_t i = 0; i < kRows; ++i) ids[i] = i + 1;
  return ids;
}

struct CacheCreation {
  fd_cache *out = (fd_cache *)(uintptr_t)0x1;
  ~CacheCreation() {
    if (out != (fd_cache *)(uintptr_t)0x1) fd_cache_destroy(out);
  }
  void snapshot() {}
  fd_status run() {
    const fd_cache_config c = small_config();
    return fd_cache_create(&c, &out);
  }
  void expect_unchanged() { assert_ptr_equal(out, (fd_cache *)(uintptr_t)0x1); }
  void after_success() {
    FD_ASSERT_OK(fd_cache_validate(out));
    fd_cache_destroy(out);
    out = (fd_cache *)(uintptr_t)0x1;
  }
};

struct WideCache {
  fd_cache *cache = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<uint64_t> ids = row_ids();
  CacheState before;
  WideCache() {
    fd_cache_config c = wide_config();
    FD_ASSERT_OK(fd_cache_create(&c, &cache));
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (uint64_t id : ids) FD_ASSERT_OK(fd_cache_add_request(cache, id));
  }
  ~WideCache() {
    if (stream) cudaStreamSynchronize(stream);
    fd_cache_destroy(cache);
    if (stream) cudaStreamDestroy(stream);
  }
  void snapshot() { before = cache_state(cache, ids, 16); }
  void expect_unchanged() { expect_same_cache_state(before, cache_state(cache, ids, 16), "cache"); }
};

/* fd_tx_begin of 1400 rows: the row staging grows. */
struct TransactionStaging : WideCache {
  fd_tx tx = {0, 0};
  void *k = nullptr, *v = nullptr;
  TransactionStaging() {
    CUDA_OK(cudaMalloc(&k, size_t{kRows} * 64 * 2));
    CUDA_OK(cudaMalloc(&v, size_t{kRows} * 64 * 2));
  }
  ~TransactionStaging() {
    if (stream) cudaStreamSynchronize(stream);
    cudaFree(k);
    cudaFree(v);
  }
  fd_status run() { return fd_tx_begin(cache, ids.data(), kRows, &tx); }
  void after_success() {
    CUDA_OK(fd_gpu_fill(stream, k, 0, size_t{kRows} * 64 * 2));
    CUDA_OK(fd_gpu_fill(stream, v, 0, size_t{kRows} * 64 * 2));
    FD_ASSERT_OK(fd_tx_write_layer(cache, tx, 0, k, v, (fd_stream)stream));
    FD_ASSERT_OK(fd_tx_commit(cache, tx));
    CUDA_OK(cudaStreamSynchronize(stream));
    FD_ASSERT_OK(fd_cache_async_error(cache));
    FD_ASSERT_OK(fd_cache_validate(cache));
  }
};

/* fd_cache_export_async of 1400 x 16 entries: the export staging grows; the
 * caller's device buffers stay untouched on failure. */
struct ExportStaging : WideCache {
  int32_t *tables = nullptr, *lens = nullptr;
  ExportStaging() {
    CUDA_OK(cudaMalloc(reinterpret_cast<void **>(&tables), size_t{kRows} * 16 * 4));
    CUDA_OK(cudaMalloc(reinterpret_cast<void **>(&lens), size_t{kRows} * 4));
    CUDA_OK(fd_gpu_fill(stream, tables, 0x5a, size_t{kRows} * 16 * 4));
    CUDA_OK(fd_gpu_fill(stream, lens, 0x5a, size_t{kRows} * 4));
  }
  ~ExportStaging() {
    if (stream) cudaStreamSynchronize(stream);
    cudaFree(tables);
    cudaFree(lens);
  }
  fd_status run() {
    return fd_cache_export_async(cache, ids.data(), kRows, 16, tables, lens, (fd_stream)stream);
  }
  void expect_unchanged() {
    WideCache::expect_unchanged();
    std::vector<uint8_t> got(size_t{kRows} * 16 * 4);
    CUDA_OK(fd_gpu_download(stream, got.data(), tables, got.size()));
    for (uint8_t b : got) assert_int_equal(b, 0x5a);
  }
  void after_success() {
    std::vector<int32_t> got_t(size_t{kRows} * 16), got_l(kRows);
    CUDA_OK(fd_gpu_download(stream, got_t.data(), tables, got_t.size() * 4));
    CUDA_OK(fd_gpu_download(stream, got_l.data(), lens, got_l.size() * 4));
    assert_true(got_t == before.tables);
    assert_true(got_l == before.lens);
  }
};

/* fd_engine_create on a cache with requests: the device scratch. */
struct EngineCreation {
  fd_cache *cache = nullptr;
  fd_engine *out = (fd_engine *)(uintptr_t)0x1;
  std::vector<uint64_t> ids = {1, 2, 3};
  CacheState before;
  EngineCreation() {
    fd_cache_config c = small_config();
    FD_ASSERT_OK(fd_cache_create(&c, &cache));
    for (uint64_t id : ids) FD_ASSERT_OK(fd_cache_add_request(cache, id));
  }
  ~EngineCreation() {
    if (out != (fd_engine *)(uintptr_t)0x1) fd_engine_destroy(out);
    fd_cache_destroy(cache);
  }
  void snapshot() { before = cache_state(cache, ids, 64); }
  fd_status run() {
    fd_engine_config ec;
    fd_engine_config_init(&ec);
    ec.num_q_heads = 8;
    return fd_engine_create(cache, &ec, &out);
  }
  void expect_unchanged() {
    assert_ptr_equal(out, (fd_engine *)(uintptr_t)0x1);
    expect_same_cache_state(before, cache_state(cache, ids, 64), "cache under a new engine");
  }
  void after_success() {
    FD_ASSERT_OK(fd_engine_validate(out));
    fd_engine_destroy(out);
    out = (fd_engine *)(uintptr_t)0x1;
  }
};

/* An engine on the wide cache: 1400 admitted requests, request 1 holding a
 * 1000-block prefix, and the buffers of one step. */
struct WideEngine {
  fd_cache *cache = nullptr;
  fd_engine *engine = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<uint64_t> ids = row_ids();
  void *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
  CacheState cache_before;
  EngineState engine_before;
  WideEngine() {
    fd_cache_config c = wide_config();
    FD_ASSERT_OK(fd_cache_create(&c, &cache));
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    fd_engine_config ec;
    fd_engine_config_init(&ec);
    ec.num_q_heads = 4;
    FD_ASSERT_OK(fd_engine_create(cache, &ec, &engine));
    for (uint64_t id : ids) {
      FD_ASSERT_OK(fd_engine_add_request(engine, id));
      FD_ASSERT_OK(fd_engine_admit(engine, id));
    }
    const size_t block = size_t{16} * 64;
    std::vector<uint16_t> prefix(kPrefixBlocks * block, 0);
    FD_ASSERT_OK(
        fd_prefix_register(cache, "long", prefix.data(), prefix.data(), kPrefixBlocks, nullptr));
    FD_ASSERT_OK(fd_prefix_attach(cache, 1, "long"));
    const size_t q_bytes = size_t{kRows} * 4 * 64 * 2, kv_bytes = size_t{kRows} * 64 * 2;
    CUDA_OK(cudaMalloc(&q, q_bytes));
    CUDA_OK(cudaMalloc(&out, q_bytes));
    CUDA_OK(cudaMalloc(&k, kv_bytes));
    CUDA_OK(cudaMalloc(&v, kv_bytes));
    CUDA_OK(fd_gpu_fill(stream, q, 0, q_bytes));
    CUDA_OK(fd_gpu_fill(stream, k, 0, kv_bytes));
    CUDA_OK(fd_gpu_fill(stream, v, 0, kv_bytes));
  }
  ~WideEngine() {
    if (stream) cudaStreamSynchronize(stream);
    fd_engine_destroy(engine);
    fd_cache_destroy(cache);
    cudaFree(q);
    cudaFree(k);
    cudaFree(v);
    cudaFree(out);
    if (stream) cudaStreamDestroy(stream);
  }
  void snapshot() {
    cache_before = cache_state(cache, ids, kPrefixBlocks + 1);
    engine_before = engine_state(engine, ids);
  }
  fd_status layer(fd_tx tx) {
    return fd_engine_step_layer(engine, tx, 0, q, k, v, out, (fd_stream)stream);
  }
  void finish_step(fd_tx tx) {
    FD_ASSERT_OK(fd_engine_commit_step(engine, tx));
    CUDA_OK(cudaStreamSynchronize(stream));
    FD_ASSERT_OK(fd_cache_async_error(cache));
    FD_ASSERT_OK(fd_engine_validate(engine));
    int32_t len = 0;
    FD_ASSERT_OK(fd_cache_export(cache, ids.data(), 1, 0, nullptr, &len));
    assert_int_equal(len, (int32_t)(kPrefixBlocks * 16 + 1));
  }
};

/* fd_engine_begin_step: rows, table and row staging grow; all or nothing. */
struct StepBegin : WideEngine {
  fd_engine_step st;
  fd_status run() {
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    return fd_engine_begin_step(engine, ids.data(), kRows, &st);
  }
  void expect_unchanged() {
    expect_same_cache_state(cache_before, cache_state(cache, ids, kPrefixBlocks + 1),
                            "cache after a failed begin_step");
    expect_same_engine_state(engine_before, engine_state(engine, ids),
                             "engine after a failed begin_step");
  }
  void after_success() {
    assert_int_equal(st.outcome, FD_STEP_OPENED);
    FD_ASSERT_OK(layer(st.tx));
    finish_step(st.tx);
  }
};

/* fd_engine_step_layer, layer 0 of an open step: the export staging grows.
 * A failing layer aborts the step (documented): afterwards no step is open,
 * transaction_abort_count moved by one and every request reads as before
 * the step. The retry is a new step. */
struct StepFirstLayer : WideEngine {
  fd_engine_step st;
  bool retried = false;
  StepFirstLayer() {
    /* The state before the step opens: what an aborted step leaves. */
    WideEngine::snapshot();
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    FD_ASSERT_OK(fd_engine_begin_step(engine, ids.data(), kRows, &st));
    assert_int_equal(st.outcome, FD_STEP_OPENED);
  }
  void snapshot() {} /* taken before the step opened */
  fd_status run() {
    if (retried) {
      /* The failed run aborted the step: open a new one. */
      memset(&st, 0, sizeof st);
      st.struct_size = sizeof st;
      FD_ASSERT_OK(fd_engine_begin_step(engine, ids.data(), kRows, &st));
      assert_int_equal(st.outcome, FD_STEP_OPENED);
    }
    const fd_status s = layer(st.tx);
    retried = true;
    return s;
  }
  void expect_unchanged() {
    const CacheState c = cache_state(cache, ids, kPrefixBlocks + 1);
    const EngineState e = engine_state(engine, ids);
    assert_int_equal(e.metrics.open_step_transaction_count, 0);
    assert_int_equal(e.metrics.transaction_abort_count,
                     engine_before.metrics.transaction_abort_count + 1);
    assert_int_equal(c.metrics.open_transaction_count, 0);
    assert_int_equal(c.metrics.used_blocks, cache_before.metrics.used_blocks);
    assert_int_equal(c.metrics.active_tokens, cache_before.metrics.active_tokens);
    assert_true(c.tables == cache_before.tables);
    assert_true(c.lens == cache_before.lens);
    assert_true(e.states == engine_before.states);
  }
  void after_success() { finish_step(st.tx); }
};

void test_cache_creation(void **state) {
  (void)state;
  sweep<CacheCreation>("fd_cache_create (CUDA)");
}

void test_transaction_staging(void **state) {
  (void)state;
  sweep<TransactionStaging>("fd_tx_begin (1400 rows: row staging grows)");
}

void test_export_staging(void **state) {
  (void)state;
  sweep<ExportStaging>("fd_cache_export_async (1400 x 16 entries: export staging grows)");
}

void test_engine_creation(void **state) {
  (void)state;
  sweep<EngineCreation>("fd_engine_create (device scratch)");
}

void test_step_begin(void **state) {
  (void)state;
  sweep<StepBegin>("fd_engine_begin_step (1400 rows, 1400 x 1001 table: scratch and staging grow)");
}

void test_step_first_layer(void **state) {
  (void)state;
  sweep<StepFirstLayer>("fd_engine_step_layer 0 (export staging grows; a failure aborts the step)");
}

int summary(void **state) {
  (void)state;
  printf(
      "inject: %ld injection points exercised in total (device, pinned, event and stream "
      "allocations)\n",
      g_points_total);
  fflush(stdout);
  return 0;
}

}  // namespace

int main(void) {
  if (!fd_gpu_test_device_present()) return FD_GPU_TEST_SKIPPED;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cache_creation), cmocka_unit_test(test_transaction_staging),
      cmocka_unit_test(test_export_staging), cmocka_unit_test(test_engine_creation),
      cmocka_unit_test(test_step_begin),     cmocka_unit_test(test_step_first_layer),
  };
  return cmocka_run_group_tests(tests, NULL, summary);
}
