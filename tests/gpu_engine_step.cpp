/* The decode engine on a CUDA cache (docs/semantics.md S8): the same seeded
 * unscheduled workload (prefill, steps, an explicit abort, a failing layer
 * that aborts the token, finish, cancel, backpressure, a step captured in a
 * global-mode CUDA graph capture) runs on a CPU-cache engine and on a
 * CUDA-cache engine; every layer's attention output must agree within bf16
 * tolerance (relative L2 error per (row, head) <= 5e-3) and the cache
 * metrics, engine metrics, request states, seq_lens and block tables must be
 * equal after every operation. The same over FP8 caches (E4M3, E5M2),
 * whose stored bytes must also match the CPU cache's. Also: device scratch
 * growth past its initial row capacity, and the CUDA-specific errors (host
 * pointers where device memory is required). Every check prints one line. */
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
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "dtype.hpp" /* the FP8 types (src/core) */
#include "fd_gpu_test.h"
#include "fd_test_fp8_close.h"
#include "test_fp8_support.h"

namespace {

const double kTolerance = 5e-3; /* relative L2 error per (row, head) */

struct Shape {
  uint32_t layers = 3, hkv = 2, hq = 8, dim = 128, bs = 16, blocks = 24;
  uint32_t max_rows = 8; /* rows the test buffers hold */
  /* The cache's element type; an FP8 cache takes bf16 inputs and the
   * per-layer scales (layers entries each). */
  int32_t dtype = FD_DTYPE_BF16;
  const float *k_scales = nullptr, *v_scales = nullptr;
};

/* One engine on one backend, with its step buffers: q/k/v/out for every
 * layer (device memory on CUDA, host memory on the CPU). */
struct Side {
  Shape s;
  bool cuda = false;
  fd_cache *cache = nullptr;
  fd_engine *engine = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<void *> q, k, v, out;
  std::vector<std::vector<uint16_t>> host;

  size_t q_elems() const { return (size_t)s.max_rows * s.hq * s.dim; }
  size_t kv_elems() const { return (size_t)s.max_rows * s.hkv * s.dim; }
  void *alloc(size_t elems) {
    if (cuda) {
      void *p = nullptr;
      CUDA_OK(cudaMalloc(&p, elems * 2));
      /* Defined contents (zeros) until a check writes its own: some calls
       * read a buffer the check never filled (initcheck). */
      CUDA_OK(fd_gpu_fill(stream, p, 0, elems * 2));
      return p;
    }
    host.emplace_back(elems);
    return host.back().data();
  }
  void setup(const Shape &shape, bool on_gpu) {
    s = shape;
    cuda = on_gpu;
    host.reserve(4 * s.layers + 4);
    fd_cache_config c;
    fd_cache_config_init(&c);
    c.num_layers = s.layers, c.num_kv_heads = s.hkv, c.head_dim = s.dim, c.block_size = s.bs;
    c.max_blocks = s.blocks, c.dtype = s.dtype;
    if (fd::dtype_is_fp8(s.dtype)) {
      c.input_dtype = FD_DTYPE_BF16;
      c.k_scales = s.k_scales;
      c.v_scales = s.v_scales;
    }
    if (cuda) c.device.type = FD_DEVICE_CUDA;
    FD_ASSERT_OK(fd_cache_create(&c, &cache));
    fd_engine_config ec;
    fd_engine_config_init(&ec);
    ec.num_q_heads = s.hq;
    ec.cpu_threads = 2;
    FD_ASSERT_OK(fd_engine_create(cache, &ec, &engine));
    if (cuda) CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (uint32_t l = 0; l < s.layers; ++l) {
      q.push_back(alloc(q_elems()));
      out.push_back(alloc(q_elems()));
      /* k/v of layer l hold max_rows rows for a step, or [layers, hkv, dim]
       * for a prefill (k[0], v[0] only). */
      const size_t kv = std::max(kv_elems(), (size_t)s.layers * s.hkv * s.dim);
      k.push_back(alloc(kv));
      v.push_back(alloc(kv));
    }
  }
  ~Side() {
    fd_engine_destroy(engine);
    fd_cache_destroy(cache);
    if (cuda) {
      for (auto *list : {&q, &k, &v, &out})
        for (void *p : *list) cudaFree(p);
      if (stream) cudaStreamDestroy(stream);
    }
  }
  void put(void *dst, const std::vector<uint16_t> &src) {
    if (cuda) {
      /* In stream order (queued work may read dst) and landed before the
       * next step on the stream or a prefill on the legacy default stream
       * (fd_gpu_test.h). */
      CUDA_OK(fd_gpu_upload(stream, dst, src.data(), src.size() * 2));
    } else {
      memcpy(dst, src.data(), src.size() * 2);
    }
  }
  std::vector<uint16_t> get(const void *src, size_t elems) {
    std::vector<uint16_t> h(elems);
    if (cuda) {
      CUDA_OK(fd_gpu_download(stream, h.data(), src, elems * 2));
    } else {
      memcpy(h.data(), src, elems * 2);
    }
    return h;
  }
};

std::vector<uint16_t> seeded(uint64_t seed, size_t n, float scale) {
  fd_test_rng rng = {seed * 0x9E3779B97F4A7C15ull + 12345};
  std::vector<uint16_t> x(n);
  for (auto &e : x) e = fd_test_f32_to_bf16(scale * fd_test_normal(&rng));
  return x;
}

/* Worst relative L2 error over (row, head) vectors of `dim` elements. */
double rel_error(const std::vector<uint16_t> &got, const std::vector<uint16_t> &want,
                 uint32_t dim) {
  double worst = 0;
  for (size_t row = 0; row < got.size() / dim; ++row) {
    double num = 0, den = 0;
    for (uint32_t d = 0; d < dim; ++d) {
      const double g = fd_test_bf16_to_f32(got[row * dim + d]);
      const double w = fd_test_bf16_to_f32(want[row * dim + d]);
      if (!std::isfinite(g)) return INFINITY;
      num += (g - w) * (g - w), den += w * w;
    }
    worst = std::fmax(worst, std::sqrt(num / (den > 0 ? den : 1)));
  }
  return worst;
}

fd_cache_metrics cache_metrics(const fd_cache *c) {
  fd_cache_metrics m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  FD_ASSERT_OK(fd_cache_metrics_get(c, &m));
  return m;
}

fd_engine_metrics engine_metrics(const fd_engine *e) {
  fd_engine_metrics m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  FD_ASSERT_OK(fd_engine_metrics_get(e, &m));
  return m;
}

#define SAME_FIELD(a, b, field, what)                                            \
  do {                                                                           \
    if ((a).field != (b).field) {                                                \
      print_error("%s: %s differs: gpu %llu, cpu %llu\n", what, #field,          \
                  (unsigned long long)(a).field, (unsigned long long)(b).field); \
      fail();                                                                    \
    }                                                                            \
  } while (0)

/* A CPU engine and a CUDA engine driven through the same calls. */
struct Pair {
  Side g, c;
  std::vector<uint64_t> known;

  void setup(const Shape &s) {
    g.setup(s, true);
    c.setup(s, false);
  }

  void expect_same_state(const char *after) {
    const fd_cache_metrics a = cache_metrics(g.cache), b = cache_metrics(c.cache);
    SAME_FIELD(a, b, used_blocks, after);
    SAME_FIELD(a, b, free_blocks, after);
    SAME_FIELD(a, b, active_tokens, after);
    SAME_FIELD(a, b, allocation_count, after);
    SAME_FIELD(a, b, free_count, after);
    SAME_FIELD(a, b, capacity_failure_count, after);
    SAME_FIELD(a, b, active_request_count, after);
    SAME_FIELD(a, b, finished_request_count, after);
    SAME_FIELD(a, b, cancelled_request_count, after);
    SAME_FIELD(a, b, transaction_begin_count, after);
    SAME_FIELD(a, b, transaction_commit_count, after);
    SAME_FIELD(a, b, transaction_abort_count, after);
    SAME_FIELD(a, b, open_transaction_count, after);
    SAME_FIELD(a, b, transaction_layer_write_count, after);
    const fd_engine_metrics x = engine_metrics(g.engine), y = engine_metrics(c.engine);
    SAME_FIELD(x, y, waiting_request_count, after);
    SAME_FIELD(x, y, active_request_count, after);
    SAME_FIELD(x, y, finished_request_count, after);
    SAME_FIELD(x, y, cancelled_request_count, after);
    SAME_FIELD(x, y, completed_step_count, after);
    SAME_FIELD(x, y, appended_token_count, after);
    SAME_FIELD(x, y, prefill_token_count, after);
    SAME_FIELD(x, y, backpressure_count, after);
    SAME_FIELD(x, y, state_version, after);
    SAME_FIELD(x, y, open_step_transaction_count, after);
    SAME_FIELD(x, y, transaction_layer_step_count, after);
    SAME_FIELD(x, y, transaction_abort_count, after);
    for (uint64_t id : known) {
      int32_t sg = -1, sc = -2;
      FD_ASSERT_OK(fd_engine_get_request_state(g.engine, id, &sg));
      FD_ASSERT_OK(fd_engine_get_request_state(c.engine, id, &sc));
      assert_int_equal(sg, sc);
      if (sg != FD_ENGINE_REQUEST_ACTIVE) continue;
      const uint32_t stride = g.s.blocks;
      std::vector<int32_t> tg(stride), tc(stride);
      int32_t lg = -1, lc = -2;
      FD_ASSERT_OK(fd_cache_export(g.cache, &id, 1, stride, tg.data(), &lg));
      FD_ASSERT_OK(fd_cache_export(c.cache, &id, 1, stride, tc.data(), &lc));
      if (lg != lc || tg != tc) {
        print_error("%s: request %llu seq_len gpu %d cpu %d (or its block table differs)\n", after,
                    (unsigned long long)id, lg, lc);
        fail();
      }
    }
    FD_ASSERT_OK(fd_engine_validate(g.engine));
    FD_ASSERT_OK(fd_engine_validate(c.engine));
    FD_ASSERT_OK(fd_cache_async_error(g.cache));
  }

  /* An FP8 cache's bytes: for every active request, layer and stored token,
   * V equal to the CPU cache's and K (rotated in FP32 by either backend,
   * whose cos / sin may differ by an ulp) equal or neighbours
   * (expect_fp8_close). Prints how many K bytes were neighbours. */
  void expect_same_bytes(const char *after) {
    CUDA_OK(cudaDeviceSynchronize()); /* prefills write on the legacy stream */
    const Shape &s = g.s;
    size_t near = 0, compared = 0;
    for (uint32_t l = 0; l < s.layers; ++l) {
      void *gk = nullptr, *gv = nullptr, *ck = nullptr, *cv = nullptr;
      int64_t gs[4], cs[4];
      FD_ASSERT_OK(fd_cache_layer_storage(g.cache, l, &gk, &gv, gs));
      FD_ASSERT_OK(fd_cache_layer_storage(c.cache, l, &ck, &cv, cs));
      assert_memory_equal(gs, cs, sizeof gs);
      const size_t pool = (size_t)s.blocks * (size_t)gs[0];
      std::vector<uint8_t> hk(pool), hv(pool);
      CUDA_OK(fd_gpu_download(g.stream, hk.data(), gk, pool));
      CUDA_OK(fd_gpu_download(g.stream, hv.data(), gv, pool));
      const uint8_t *wk = static_cast<const uint8_t *>(ck), *wv = static_cast<const uint8_t *>(cv);
      /* The stored tokens' bytes of both caches, in (request, token, head,
       * dim) order. */
      std::vector<uint8_t> k_gpu, k_cpu, v_gpu, v_cpu;
      for (uint64_t id : known) {
        int32_t state = -1;
        FD_ASSERT_OK(fd_engine_get_request_state(c.engine, id, &state));
        if (state != FD_ENGINE_REQUEST_ACTIVE) continue;
        std::vector<int32_t> table(s.blocks);
        int32_t len = 0;
        FD_ASSERT_OK(fd_cache_export(c.cache, &id, 1, s.blocks, table.data(), &len));
        for (int32_t t = 0; t < len; ++t)
          for (uint32_t h = 0; h < s.hkv; ++h)
            for (uint32_t d = 0; d < s.dim; ++d) {
              const size_t at =
                  (size_t)(table[t / s.bs] * gs[0] + h * gs[1] + (t % s.bs) * gs[2] + d * gs[3]);
              k_gpu.push_back(hk[at]), k_cpu.push_back(wk[at]);
              v_gpu.push_back(hv[at]), v_cpu.push_back(wv[at]);
            }
      }
      for (size_t i = 0; i < v_gpu.size(); ++i)
        if (v_gpu[i] != v_cpu[i]) {
          print_error("%s: layer %u V byte %zu: gpu 0x%02x, cpu 0x%02x\n", after, l, i, v_gpu[i],
                      v_cpu[i]);
          fail();
        }
      near += expect_fp8_close(k_gpu, k_cpu, "k_cache");
      compared += k_gpu.size();
    }
    printf(
        "check: %s: %zu stored K/V bytes of each kind compared: V equal, K equal but %zu "
        "neighbours: ok\n",
        after, compared, near);
  }

  void admit(uint64_t id) {
    for (Side *s : {&g, &c}) {
      FD_ASSERT_OK(fd_engine_add_request(s->engine, id));
      FD_ASSERT_OK(fd_engine_admit(s->engine, id));
    }
    known.push_back(id);
  }

  void prefill(uint64_t id, uint64_t seed) {
    const size_t n = (size_t)g.s.layers * g.s.hkv * g.s.dim;
    const std::vector<uint16_t> k = seeded(seed, n, 1.f), v = seeded(seed + 7, n, 1.f);
    for (Side *s : {&g, &c}) {
      s->put(s->k[0], k);
      s->put(s->v[0], v);
      FD_ASSERT_OK(fd_engine_prefill_request_layers(s->engine, id, s->k[0], s->v[0]));
    }
  }

  /* Uploads the step's inputs for `rows` rows on both sides. */
  void load_step(uint32_t step, uint32_t rows) {
    for (uint32_t l = 0; l < g.s.layers; ++l) {
      const uint64_t seed = 1000ull * step + l;
      const std::vector<uint16_t> q = seeded(seed, (size_t)rows * g.s.hq * g.s.dim, 1.f);
      const std::vector<uint16_t> k = seeded(seed + 1, (size_t)rows * g.s.hkv * g.s.dim, 1.f);
      const std::vector<uint16_t> v = seeded(seed + 2, (size_t)rows * g.s.hkv * g.s.dim, 1.f);
      for (Side *s : {&g, &c}) {
        s->put(s->q[l], q);
        s->put(s->k[l], k);
        s->put(s->v[l], v);
      }
    }
  }

  /* Bulk prefill of `n` tokens ([layers, n, hkv, dim]) on both sides. */
  void prefill_tokens(uint64_t id, uint32_t n, uint64_t seed) {
    const size_t elems = (size_t)g.s.layers * n * g.s.hkv * g.s.dim;
    const std::vector<uint16_t> k = seeded(seed, elems, 1.f), v = seeded(seed + 7, elems, 1.f);
    for (Side *s : {&g, &c}) {
      void *kb = s->alloc(elems), *vb = s->alloc(elems);
      s->put(kb, k);
      s->put(vb, v);
      if (s->cuda) CUDA_OK(cudaStreamSynchronize(s->stream)); /* prefill reads on stream 0 */
      FD_ASSERT_OK(fd_engine_prefill_request_tokens(s->engine, id, n, kb, vb));
      if (s->cuda) {
        CUDA_OK(cudaFree(kb));
        CUDA_OK(cudaFree(vb));
      }
    }
  }

  /* Both engines open the step (counts empty: one token per row); returns
   * the common outcome. */
  int32_t begin(const std::vector<uint64_t> &ids, fd_tx *tg, fd_tx *tc,
                const std::vector<uint32_t> &counts = {}) {
    fd_engine_step a, b;
    a.struct_size = b.struct_size = sizeof a;
    if (counts.empty()) {
      FD_ASSERT_OK(fd_engine_begin_step(g.engine, ids.data(), (uint32_t)ids.size(), &a));
      FD_ASSERT_OK(fd_engine_begin_step(c.engine, ids.data(), (uint32_t)ids.size(), &b));
    } else {
      FD_ASSERT_OK(fd_engine_begin_step_multi(g.engine, ids.data(), counts.data(),
                                              (uint32_t)ids.size(), &a));
      FD_ASSERT_OK(fd_engine_begin_step_multi(c.engine, ids.data(), counts.data(),
                                              (uint32_t)ids.size(), &b));
    }
    assert_int_equal(a.outcome, b.outcome);
    assert_int_equal(a.needed_blocks, b.needed_blocks);
    assert_int_equal(a.free_blocks, b.free_blocks);
    *tg = a.tx, *tc = b.tx;
    return a.outcome;
  }

  void compare_outputs(uint32_t step, uint32_t rows) {
    double worst = 0;
    const size_t n = (size_t)rows * g.s.hq * g.s.dim;
    for (uint32_t l = 0; l < g.s.layers; ++l)
      worst = std::fmax(worst, rel_error(g.get(g.out[l], n), c.get(c.out[l], n), g.s.dim));
    printf(
        "check: step %u (%u rows, %u layers): worst rel err per (row, head) %.3g (limit %.0e) %s\n",
        step, rows, g.s.layers, worst, kTolerance, worst <= kTolerance ? "ok" : "FAILED");
    fflush(stdout);
    if (!(worst <= kTolerance)) fail();
  }

  /* A full step on both engines; on the GPU eagerly or, with `capture`,
   * begin + layers + commit inside a global-mode stream capture (which any
   * host synchronisation or allocation would invalidate), then replayed.
   * `counts` (several tokens per row, fd_engine_begin_step_multi) and `keep`
   * (fd_engine_commit_step_keep) may be empty. */
  void step(uint32_t step_no, const std::vector<uint64_t> &ids, bool capture = false,
            const std::vector<uint32_t> &counts = {}, const std::vector<uint32_t> &keep = {}) {
    uint32_t rows = (uint32_t)ids.size();
    if (!counts.empty()) rows = std::accumulate(counts.begin(), counts.end(), 0u);
    const uint32_t n_ids = (uint32_t)ids.size();
    auto begin_on = [&](fd_engine *e, fd_engine_step *st) {
      return counts.empty() ? fd_engine_begin_step(e, ids.data(), n_ids, st)
                            : fd_engine_begin_step_multi(e, ids.data(), counts.data(), n_ids, st);
    };
    auto commit_on = [&](fd_engine *e, fd_tx tx) {
      return keep.empty() ? fd_engine_commit_step(e, tx)
                          : fd_engine_commit_step_keep(e, tx, keep.data(), n_ids);
    };
    load_step(step_no, rows);
    fd_tx tg, tc;
    if (!capture) {
      assert_int_equal(begin(ids, &tg, &tc, counts), FD_STEP_OPENED);
      for (uint32_t l = 0; l < g.s.layers; ++l) {
        FD_ASSERT_OK(fd_engine_step_layer(g.engine, tg, l, g.q[l], g.k[l], g.v[l], g.out[l],
                                          (fd_stream)g.stream));
        FD_ASSERT_OK(
            fd_engine_step_layer(c.engine, tc, l, c.q[l], c.k[l], c.v[l], c.out[l], nullptr));
      }
      FD_ASSERT_OK(commit_on(g.engine, tg));
      FD_ASSERT_OK(commit_on(c.engine, tc));
    } else {
      CUDA_OK(cudaStreamSynchronize(g.stream));
      cudaGraph_t graph = nullptr;
      CUDA_OK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeGlobal));
      /* No assertion inside the capture: collect, end the capture, check. */
      std::vector<fd_status> st;
      std::vector<std::string> msg;
      auto note = [&](fd_status s) {
        st.push_back(s);
        msg.push_back(s == FD_OK ? "" : fd_last_error_message());
      };
      fd_engine_step a;
      a.struct_size = sizeof a;
      note(begin_on(g.engine, &a));
      for (uint32_t l = 0; l < g.s.layers && st.back() == FD_OK; ++l)
        note(fd_engine_step_layer(g.engine, a.tx, l, g.q[l], g.k[l], g.v[l], g.out[l],
                                  (fd_stream)g.stream));
      if (st.back() == FD_OK) note(commit_on(g.engine, a.tx));
      const cudaError_t end = cudaStreamEndCapture(g.stream, &graph);
      for (size_t i = 0; i < st.size(); ++i)
        if (st[i] != FD_OK) {
          print_error("engine call %zu inside the capture failed: %s (%s)\n", i,
                      fd_status_string(st[i]), msg[i].c_str());
          fail();
        }
      if (end != cudaSuccess) {
        print_error(
            "the capture was invalidated (a host synchronisation or allocation on the "
            "step path?): %s\n",
            cudaGetErrorString(end));
        fail();
      }
      cudaGraphExec_t exec = nullptr;
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      CUDA_OK(cudaGraphLaunch(exec, g.stream));
      CUDA_OK(cudaStreamSynchronize(g.stream));
      CUDA_OK(cudaGraphExecDestroy(exec));
      CUDA_OK(cudaGraphDestroy(graph));
      printf(
          "check: step %u: begin_step + %u x step_layer + commit_step inside a global-mode "
          "capture: ok\n",
          step_no, g.s.layers);
      fd_engine_step b;
      b.struct_size = sizeof b;
      FD_ASSERT_OK(begin_on(c.engine, &b));
      for (uint32_t l = 0; l < c.s.layers; ++l)
        FD_ASSERT_OK(
            fd_engine_step_layer(c.engine, b.tx, l, c.q[l], c.k[l], c.v[l], c.out[l], nullptr));
      FD_ASSERT_OK(commit_on(c.engine, b.tx));
    }
    compare_outputs(step_no, rows);
    expect_same_state("after a step");
  }
};

void test_workload_matches_cpu(void **state) {
  (void)state;
  Pair p;
  Shape s;
  p.setup(s);
  printf("check: engine created on a CUDA cache (bf16, %u layers, head_dim %u, block %u, GQA %u)\n",
         s.layers, s.dim, s.bs, s.hq / s.hkv);
  for (uint64_t id = 1; id <= 5; ++id) p.admit(id);
  for (uint64_t id = 1; id <= 5; ++id)
    for (uint64_t t = 0; t < 3 + 5 * id; ++t) p.prefill(id, 100 * id + t);
  p.expect_same_state("after prefill");
  printf("check: prefill of 5 requests (8..28 tokens): same cache state: ok\n");

  const std::vector<uint64_t> all = {1, 2, 3, 4, 5};
  for (uint32_t step = 0; step < 4; ++step) p.step(step, all);

  /* An explicit abort after two layers. */
  {
    p.load_step(4, 5);
    fd_tx tg, tc;
    assert_int_equal(p.begin(all, &tg, &tc), FD_STEP_OPENED);
    for (uint32_t l = 0; l < 2; ++l) {
      FD_ASSERT_OK(fd_engine_step_layer(p.g.engine, tg, l, p.g.q[l], p.g.k[l], p.g.v[l], p.g.out[l],
                                        (fd_stream)p.g.stream));
      FD_ASSERT_OK(fd_engine_step_layer(p.c.engine, tc, l, p.c.q[l], p.c.k[l], p.c.v[l], p.c.out[l],
                                        nullptr));
    }
    FD_ASSERT_OK(fd_engine_abort_step(p.g.engine, tg));
    FD_ASSERT_OK(fd_engine_abort_step(p.c.engine, tc));
    p.expect_same_state("after abort_step");
    assert_int_equal(engine_metrics(p.g.engine).transaction_abort_count, 1);
    printf("check: abort_step after 2 layers: token rolled back on both: ok\n");
  }
  /* A failing layer (out of order) aborts the token on both. */
  {
    p.load_step(5, 5);
    fd_tx tg, tc;
    assert_int_equal(p.begin(all, &tg, &tc), FD_STEP_OPENED);
    FD_ASSERT_OK(fd_engine_step_layer(p.g.engine, tg, 0, p.g.q[0], p.g.k[0], p.g.v[0], p.g.out[0],
                                      (fd_stream)p.g.stream));
    FD_ASSERT_OK(
        fd_engine_step_layer(p.c.engine, tc, 0, p.c.q[0], p.c.k[0], p.c.v[0], p.c.out[0], nullptr));
    FD_ASSERT_FAILS(fd_engine_step_layer(p.g.engine, tg, 2, p.g.q[2], p.g.k[2], p.g.v[2],
                                         p.g.out[2], (fd_stream)p.g.stream),
                    FD_ERR_INVALID_ARGUMENT, "step requires layer 1, got layer 2");
    FD_ASSERT_FAILS(
        fd_engine_step_layer(p.c.engine, tc, 2, p.c.q[2], p.c.k[2], p.c.v[2], p.c.out[2], nullptr),
        FD_ERR_INVALID_ARGUMENT, "step requires layer 1, got layer 2");
    p.expect_same_state("after a failed step_layer");
    assert_int_equal(engine_metrics(p.g.engine).open_step_transaction_count, 0);
    assert_int_equal(engine_metrics(p.g.engine).transaction_abort_count, 2);
    printf("check: failing step_layer (wrong layer) aborted the token on both: ok\n");
  }
  for (uint32_t step = 6; step < 8; ++step) p.step(step, all);

  for (Side *side : {&p.g, &p.c}) {
    FD_ASSERT_OK(fd_engine_finish(side->engine, 2));
    FD_ASSERT_OK(fd_engine_cancel(side->engine, 4));
  }
  p.expect_same_state("after finish(2) and cancel(4)");
  printf("check: finish and cancel: same blocks and states: ok\n");

  /* Backpressure: request 6 fills the pool up to a block boundary, so a
   * step with it needs a block and none is free. */
  p.admit(6);
  uint32_t prefilled = 0;
  for (;;) {
    const fd_cache_metrics m = cache_metrics(p.g.cache);
    int32_t len = 0;
    const uint64_t id = 6;
    FD_ASSERT_OK(fd_cache_export(p.g.cache, &id, 1, 0, nullptr, &len));
    if (m.free_blocks == 0 && len % (int32_t)s.bs == 0) break;
    if (prefilled > s.blocks * s.bs) {
      print_error("request 6 never reached a full pool (%u tokens prefilled)\n", prefilled);
      fail();
    }
    p.prefill(6, 5000 + prefilled++);
  }
  p.expect_same_state("after filling the pool");
  {
    const std::vector<uint64_t> ids = {1, 3, 5, 6};
    fd_tx tg, tc;
    assert_int_equal(p.begin(ids, &tg, &tc), FD_STEP_BACKPRESSURE);
    p.expect_same_state("after backpressure");
    assert_int_equal(engine_metrics(p.g.engine).backpressure_count, 1);
    printf("check: backpressure with a full pool (%u tokens prefilled into request 6): ok\n",
           prefilled);
  }
  for (Side *side : {&p.g, &p.c}) FD_ASSERT_OK(fd_engine_cancel(side->engine, 6));
  const std::vector<uint64_t> rest = {1, 3, 5};
  p.step(8, rest);
  p.step(9, rest, /*capture=*/true);
  p.step(10, rest);
  for (Side *side : {&p.g, &p.c})
    for (uint64_t id : rest) FD_ASSERT_OK(fd_engine_finish(side->engine, id));
  p.expect_same_state("at the end");
  const fd_engine_metrics m = engine_metrics(p.g.engine);
  printf(
      "check: workload done: %llu steps, %llu prefill tokens, %llu aborts, %llu backpressure: "
      "same metrics on both engines: ok\n",
      (unsigned long long)m.completed_step_count, (unsigned long long)m.prefill_token_count,
      (unsigned long long)m.transaction_abort_count, (unsigned long long)m.backpressure_count);
}

/* Several tokens per row (docs/semantics.md S8): bulk prefill, verify steps
 * of 1 + drafts per row with a keep, a prompt chunk longer than one query
 * tile (40 tokens x GQA 4 = 160 query rows per KV head), and a multi-token
 * step captured in a CUDA graph; every output and all state against the
 * CPU engine. */
void test_multi_token_steps_match_cpu(void **state) {
  (void)state;
  Pair p;
  Shape s;
  s.max_rows = 48;
  p.setup(s);
  for (uint64_t id = 1; id <= 3; ++id) p.admit(id);
  const uint32_t prompt[3] = {20, 37, 5};
  for (uint64_t id = 1; id <= 3; ++id) p.prefill_tokens(id, prompt[id - 1], 700 + id);
  p.expect_same_state("after bulk prefill");
  assert_int_equal(cache_metrics(p.g.cache).transaction_commit_count, 3);
  printf("check: bulk prefill of 20/37/5 tokens in 3 transactions: same cache state: ok\n");
  const std::vector<uint64_t> all = {1, 2, 3};
  p.step(20, all, false, {4, 1, 6}, {2, 1, 6});
  p.step(21, all, false, {4, 4, 4}, {4, 0, 1});
  p.step(22, {2}, false, {40}, {});
  p.step(23, all, true, {4, 4, 4}, {1, 3, 2});
  p.step(24, all);
  printf("check: verify steps with keep, a 40-token chunk, a captured multi-token step: ok\n");
}

/* The engine on FP8 caches (E4M3 and E5M2, bf16 inputs, per-layer
 * scales): a CUDA cache's engine against the CPU cache's through token-by-
 * token and bulk prefill, steps, a verify step of several tokens per row, a
 * scale change between steps and a step captured in a CUDA graph; outputs
 * within the tolerance, the same state, and the same stored bytes. */
void test_fp8_cache_matches_cpu(void **state) {
  (void)state;
  for (int32_t dtype : {FD_DTYPE_FP8_E4M3, FD_DTYPE_FP8_E5M2}) {
    const float fmax = f8_max(dtype);
    const float ks[3] = {4.f / fmax, 0.02f, 0.5f}, vs[3] = {0.03f, 4.f / fmax, 0.25f};
    Pair p;
    Shape s;
    s.dtype = dtype;
    s.k_scales = ks, s.v_scales = vs;
    s.max_rows = 16;
    p.setup(s);
    const char *name = fd::dtype_name(dtype);
    printf("check: engines on a CUDA and a CPU cache (%s, bf16 inputs, %u layers, GQA %u)\n", name,
           s.layers, s.hq / s.hkv);
    for (uint64_t id = 1; id <= 4; ++id) p.admit(id);
    for (uint64_t t = 0; t < 9; ++t) p.prefill(1, 300 + t);
    p.prefill_tokens(2, 21, 400);
    p.prefill_tokens(3, 3, 500);
    p.expect_same_state("after prefill");
    p.expect_same_bytes("after prefill");
    const std::vector<uint64_t> all = {1, 2, 3, 4};
    for (uint32_t step = 0; step < 3; ++step) p.step(step, all);
    p.step(3, all, false, {3, 1, 4, 2}, {2, 1, 4, 0});
    /* New scales: the next steps read every stored token with them. */
    const float ks2[3] = {ks[0] * 2.f, ks[1] * 0.5f, ks[2]},
                vs2[3] = {vs[0] * 0.25f, vs[1], vs[2] * 3.f};
    FD_ASSERT_OK(fd_cache_set_kv_scales(p.g.cache, ks2, vs2));
    FD_ASSERT_OK(fd_cache_set_kv_scales(p.c.cache, ks2, vs2));
    p.step(4, all);
    p.step(5, all, /*capture=*/true);
    p.step(6, all, false, {2, 2, 2, 2}, {});
    p.expect_same_bytes("after the steps");
    for (Side *side : {&p.g, &p.c}) {
      FD_ASSERT_OK(fd_engine_finish(side->engine, 2));
      FD_ASSERT_OK(fd_engine_cancel(side->engine, 4));
    }
    p.expect_same_state("after finish(2) and cancel(4)");
    p.step(7, {1, 3});
    printf("check: %s: prefill, steps, a verify step, new scales, a captured step: ok\n", name);
  }
}

/* More rows than the initial device scratch holds (256): the scratch grows
 * in begin_step and the outputs still match the CPU engine. */
void test_scratch_growth(void **state) {
  (void)state;
  Pair p;
  Shape s;
  s.layers = 1, s.hkv = 1, s.hq = 4, s.blocks = 300, s.max_rows = 280;
  p.setup(s);
  std::vector<uint64_t> ids;
  for (uint64_t id = 1; id <= 280; ++id) {
    p.admit(id);
    ids.push_back(id);
  }
  p.step(0, std::vector<uint64_t>(ids.begin(), ids.begin() + 100));
  p.step(1, ids);
  p.step(2, ids);
  printf("check: 280-row steps after a 100-row step (device scratch grown past 256 rows): ok\n");
}

void test_cuda_pointer_errors(void **state) {
  (void)state;
  Side g;
  Shape s;
  g.setup(s, true);
  for (uint64_t id = 1; id <= 2; ++id) {
    FD_ASSERT_OK(fd_engine_add_request(g.engine, id));
    FD_ASSERT_OK(fd_engine_admit(g.engine, id));
  }
  const size_t n = (size_t)s.layers * s.hkv * s.dim;
  const std::vector<uint16_t> hk = seeded(1, n, 1.f), hv = seeded(2, n, 1.f);
  g.put(g.k[0], hk);
  g.put(g.v[0], hv);
  FD_ASSERT_OK(fd_engine_prefill_request_layers(g.engine, 1, g.k[0], g.v[0]));

  /* Prefill with host k or v: refused before anything changes. */
  const fd_cache_metrics c0 = cache_metrics(g.cache);
  const fd_engine_metrics e0 = engine_metrics(g.engine);
  FD_ASSERT_FAILS(fd_engine_prefill_request_layers(g.engine, 1, hk.data(), g.v[0]),
                  FD_ERR_INVALID_ARGUMENT, "k is not device memory of CUDA device 0");
  FD_ASSERT_FAILS(fd_engine_prefill_request_layers(g.engine, 1, g.k[0], hv.data()),
                  FD_ERR_INVALID_ARGUMENT, "v is not device memory of CUDA device 0");
  const fd_cache_metrics c1 = cache_metrics(g.cache);
  const fd_engine_metrics e1 = engine_metrics(g.engine);
  assert_memory_equal(&c0, &c1, sizeof c0);
  assert_memory_equal(&e0, &e1, sizeof e0);
  printf("check: prefill with host k / v refused, nothing changed: ok\n");

  const uint64_t ids[2] = {1, 2};
  std::vector<uint16_t> host_q((size_t)2 * s.hq * s.dim), host_out(host_q.size());
  struct Case {
    const char *name;
    int slot; /* 0 q, 1 k, 2 v, 3 out */
  } cases[] = {{"q", 0}, {"k", 1}, {"v", 2}, {"out_attention", 3}};
  uint64_t aborts = 0;
  for (const Case &cs : cases) {
    fd_engine_step st;
    st.struct_size = sizeof st;
    FD_ASSERT_OK(fd_engine_begin_step(g.engine, ids, 2, &st));
    assert_int_equal(st.outcome, FD_STEP_OPENED);
    /* Layer 0 succeeds, so the failure must also roll back queued work's
     * transaction, not just refuse a first call. */
    FD_ASSERT_OK(fd_engine_step_layer(g.engine, st.tx, 0, g.q[0], g.k[0], g.v[0], g.out[0],
                                      (fd_stream)g.stream));
    const void *q = cs.slot == 0 ? (const void *)host_q.data() : g.q[1];
    const void *k = cs.slot == 1 ? (const void *)hk.data() : g.k[1];
    const void *v = cs.slot == 2 ? (const void *)hv.data() : g.v[1];
    void *out = cs.slot == 3 ? (void *)host_out.data() : g.out[1];
    const std::string want = std::string(cs.name) + " is not device memory of CUDA device 0";
    FD_ASSERT_FAILS(fd_engine_step_layer(g.engine, st.tx, 1, q, k, v, out, (fd_stream)g.stream),
                    FD_ERR_INVALID_ARGUMENT, want.c_str());
    aborts += 1;
    const fd_engine_metrics em = engine_metrics(g.engine);
    assert_int_equal(em.open_step_transaction_count, 0);
    assert_int_equal(em.transaction_abort_count, aborts);
    assert_int_equal(em.completed_step_count, 0);
    const fd_cache_metrics cm = cache_metrics(g.cache);
    assert_int_equal(cm.open_transaction_count, 0);
    assert_int_equal(cm.used_blocks, c0.used_blocks);
    assert_int_equal(cm.active_tokens, c0.active_tokens);
    FD_ASSERT_OK(fd_engine_validate(g.engine));
    printf("check: step_layer with host %s: FD_ERR_INVALID_ARGUMENT, token aborted: ok\n", cs.name);
  }
  /* The engine still works afterwards. */
  fd_engine_step st;
  st.struct_size = sizeof st;
  FD_ASSERT_OK(fd_engine_begin_step(g.engine, ids, 2, &st));
  for (uint32_t l = 0; l < s.layers; ++l)
    FD_ASSERT_OK(fd_engine_step_layer(g.engine, st.tx, l, g.q[l], g.k[l], g.v[l], g.out[l],
                                      (fd_stream)g.stream));
  FD_ASSERT_OK(fd_engine_commit_step(g.engine, st.tx));
  CUDA_OK(cudaStreamSynchronize(g.stream));
  FD_ASSERT_OK(fd_cache_async_error(g.cache));
  int32_t lens[2] = {0, 0};
  FD_ASSERT_OK(fd_cache_export(g.cache, ids, 2, 0, nullptr, lens));
  assert_int_equal(lens[0], 2);
  assert_int_equal(lens[1], 1);

  /* Destroying an engine with an open step rolls the transaction back. */
  FD_ASSERT_OK(fd_engine_begin_step(g.engine, ids, 2, &st));
  fd_engine_destroy(g.engine);
  g.engine = nullptr;
  assert_int_equal(cache_metrics(g.cache).open_transaction_count, 0);
  FD_ASSERT_OK(fd_cache_validate(g.cache));
  printf("check: a step after the failures commits; destroy with an open step aborts it: ok\n");
}

}  // namespace

int main(void) {
  if (!fd_gpu_test_device_present()) return FD_GPU_TEST_SKIPPED;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_workload_matches_cpu),
      cmocka_unit_test(test_multi_token_steps_match_cpu),
      cmocka_unit_test(test_fp8_cache_matches_cpu),
      cmocka_unit_test(test_scratch_growth),
      cmocka_unit_test(test_cuda_pointer_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
