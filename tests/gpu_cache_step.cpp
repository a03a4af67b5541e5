/* The GPU-resident cache (issue 5): one token step on the GPU (begin; per
 * layer fd_tx_write_layer_rope then fd_decode over the effective lengths;
 * commit) equals the CPU backend on the same inputs, eagerly, with the
 * per-layer work captured in a CUDA graph and replayed, and with the whole
 * step inside a global-mode stream capture (which any host synchronisation
 * would invalidate). Also: external NHD device storage, device exports,
 * prefixes from host and device memory, creation errors (OOM for an absurd
 * max_blocks), write errors that leave the transaction unchanged. */
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
#include <cstring>
#include <string>
#include <vector>

#include "fd_gpu_test.h"

namespace {

struct Shape {
  int32_t dtype = FD_DTYPE_BF16;
  int32_t layout = FD_LAYOUT_TOKEN_MAJOR;
  uint32_t layers = 3, hkv = 2, hq = 8, dim = 128, bs = 16, blocks = 64, rotary = 128;
  bool nhd = false; /* external NHD storage */
};

const uint32_t kBatch = 5;
const uint32_t kMbps = 8;

/* Inputs of one layer of one step, the same for both backends. */
struct LayerInput {
  std::vector<uint16_t> q, k, v;
};

LayerInput input(const Shape &s, uint32_t step, uint32_t layer) {
  fd_test_rng rng = {1000003ull * step + layer + 17};
  LayerInput in;
  in.q.resize(kBatch * s.hq * s.dim);
  in.k.resize(kBatch * s.hkv * s.dim);
  in.v.resize(in.k.size());
  for (auto &x : in.q) fd_test_store(&x, 0, s.dtype, 3.f * fd_test_normal(&rng));
  for (auto &x : in.k) fd_test_store(&x, 0, s.dtype, fd_test_normal(&rng));
  for (auto &x : in.v) fd_test_store(&x, 0, s.dtype, fd_test_normal(&rng));
  return in;
}

int64_t layer_elems(const Shape &s) {
  return (int64_t)s.blocks * s.hkv * s.bs * s.dim;
}

fd_cache_config config(const Shape &s, bool cuda, void *k_ext, void *v_ext) {
  fd_cache_config c;
  fd_cache_config_init(&c);
  c.num_layers = s.layers, c.num_kv_heads = s.hkv, c.head_dim = s.dim, c.block_size = s.bs;
  c.max_blocks = s.blocks, c.dtype = s.dtype, c.layout = s.layout;
  c.prefix_cache_capacity_blocks = 4;
  if (cuda) c.device.type = FD_DEVICE_CUDA;
  if (s.nhd) {
    c.k_storage = k_ext, c.v_storage = v_ext;
    c.stride_block = (int64_t)s.bs * s.hkv * s.dim, c.stride_head = s.dim;
    c.stride_token = (int64_t)s.hkv * s.dim, c.stride_dim = 1;
  }
  return c;
}

/* One backend: a cache plus the buffers a step needs. */
struct Side {
  Shape s;
  bool cuda = false;
  fd_cache *cache = nullptr;
  cudaStream_t stream = nullptr;
  void *k_ext = nullptr, *v_ext = nullptr; /* NHD storage */
  /* Step buffers (device memory on CUDA, host on CPU). */
  void *q = nullptr, *k = nullptr, *v = nullptr, *q_rot = nullptr, *out = nullptr;
  int32_t *tables = nullptr, *lens = nullptr;
  std::vector<std::vector<uint8_t>> host; /* CPU-side storage of the above */

  void *alloc(size_t bytes) {
    if (cuda) {
      void *p = nullptr;
      if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
      return p;
    }
    host.emplace_back(bytes);
    return host.back().data();
  }
  void setup(const Shape &shape, bool on_gpu) {
    s = shape;
    cuda = on_gpu;
    host.reserve(16);
    const size_t e = 2;
    if (cuda) CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (s.nhd) {
      k_ext = alloc((size_t)(layer_elems(s) * s.layers) * e);
      v_ext = alloc((size_t)(layer_elems(s) * s.layers) * e);
      if (cuda) {
        /* On the stream the cache is written on, finished before it is. */
        CUDA_OK(fd_gpu_fill(stream, k_ext, 0, (size_t)(layer_elems(s) * s.layers) * e));
        CUDA_OK(fd_gpu_fill(stream, v_ext, 0, (size_t)(layer_elems(s) * s.layers) * e));
      }
    }
    fd_cache_config c = config(s, cuda, k_ext, v_ext);
    FD_ASSERT_OK(fd_cache_create(&c, &cache));
    q = alloc(kBatch * s.hq * s.dim * e);
    q_rot = alloc(kBatch * s.hq * s.dim * e);
    out = alloc(kBatch * s.hq * s.dim * e);
    k = alloc((size_t)s.layers * kBatch * s.hkv * s.dim * e);
    v = alloc((size_t)s.layers * kBatch * s.hkv * s.dim * e);
    tables = static_cast<int32_t *>(alloc(kBatch * kMbps * 4));
    lens = static_cast<int32_t *>(alloc(kBatch * 4));
    for (uint64_t id = 1; id <= kBatch; ++id) FD_ASSERT_OK(fd_cache_add_request(cache, id));
  }
  ~Side() {
    fd_cache_destroy(cache);
    if (cuda) {
      for (void *p : {k_ext, v_ext, q, k, v, q_rot, out, (void *)tables, (void *)lens}) cudaFree(p);
      if (stream) cudaStreamDestroy(stream);
    }
  }
  void put(void *dst, const void *src, size_t bytes) {
    if (cuda) {
      /* In stream order (work still queued on the stream may read dst), and
       * landed before the library's next work on the stream. */
      CUDA_OK(fd_gpu_upload(stream, dst, src, bytes));
    } else
      memcpy(dst, src, bytes);
  }
  std::vector<uint16_t> get(const void *src, size_t elems) {
    std::vector<uint16_t> h(elems);
    if (cuda)
      CUDA_OK(fd_gpu_download(stream, h.data(), src, elems * 2));
    else
      memcpy(h.data(), src, elems * 2);
    return h;
  }
  uint8_t *k_layer(uint32_t l) { return (uint8_t *)k + (size_t)l * kBatch * s.hkv * s.dim * 2; }
  uint8_t *v_layer(uint32_t l) { return (uint8_t *)v + (size_t)l * kBatch * s.hkv * s.dim * 2; }

  /* Uploads the step's K/V of every layer (before any capture). */
  void load_kv(uint32_t step) {
    for (uint32_t l = 0; l < s.layers; ++l) {
      const LayerInput in = input(s, step, l);
      put(k_layer(l), in.k.data(), in.k.size() * 2);
      put(v_layer(l), in.v.data(), in.v.size() * 2);
    }
  }

  /* Enqueues (CUDA) or runs (CPU) one layer: rope + append, then decode. */
  void layer(fd_tx tx, uint32_t l) { FD_ASSERT_OK(try_layer(tx, l)); }
  /* The same, returning the first failure (for use inside a capture, which
   * must be ended before the test may fail). */
  fd_status try_layer(fd_tx tx, uint32_t l) {
    fd_status st = fd_tx_write_layer_rope(cache, tx, l, q, s.hq, k_layer(l), v_layer(l), s.rotary,
                                          10000.f, q_rot, (fd_stream)stream);
    if (st != FD_OK) return st;
    void *kc = nullptr, *vc = nullptr;
    int64_t strides[4];
    st = fd_cache_layer_storage(cache, l, &kc, &vc, strides);
    if (st != FD_OK) return st;
    fd_decode_params p;
    fd_decode_params_init(&p);
    fd_test_decode_dtype(&p, s.dtype), p.layout = s.layout, p.batch = kBatch, p.num_q_heads = s.hq;
    p.num_kv_heads = s.hkv, p.head_dim = s.dim, p.block_size = s.bs, p.num_blocks = s.blocks;
    p.max_blocks_per_seq = kMbps, p.q = q_rot, p.k_cache = kc, p.v_cache = vc;
    p.stride_block = strides[0], p.stride_head = strides[1], p.stride_token = strides[2];
    p.stride_dim = strides[3];
    p.block_tables = tables, p.seq_lens = lens, p.out = out;
    p.num_splits = 1;
    if (cuda) p.device.type = FD_DEVICE_CUDA, p.stream = (fd_stream)stream;
    return fd_decode(&p);
  }

  fd_tx begin_step() {
    const uint64_t ids[kBatch] = {1, 2, 3, 4, 5};
    fd_tx tx;
    FD_ASSERT_OK(fd_tx_begin(cache, ids, kBatch, &tx));
    FD_ASSERT_OK(fd_tx_block_tables_async(cache, tx, kMbps, tables, lens, (fd_stream)stream));
    return tx;
  }
};

/* Q is the same for every layer of a step here (the decode output of the
 * last layer is what gets compared), loaded before the step. */
void load_q(Side &side, uint32_t step) {
  const LayerInput in = input(side.s, step, 99);
  side.put(side.q, in.q.data(), in.q.size() * 2);
}

void eager_step(Side &side, uint32_t step) {
  load_q(side, step);
  side.load_kv(step);
  fd_tx tx = side.begin_step();
  for (uint32_t l = 0; l < side.s.layers; ++l) side.layer(tx, l);
  FD_ASSERT_OK(fd_tx_commit(side.cache, tx));
  if (side.cuda) CUDA_OK(cudaStreamSynchronize(side.stream));
}

double rel_error(const std::vector<uint16_t> &got, const std::vector<uint16_t> &want, int32_t dtype,
                 uint32_t dim) {
  double worst = 0;
  for (size_t row = 0; row < got.size() / dim; ++row) {
    double num = 0, den = 0;
    for (uint32_t d = 0; d < dim; ++d) {
      const double g = fd_test_load(got.data(), row * dim + d, dtype);
      const double w = fd_test_load(want.data(), row * dim + d, dtype);
      if (!std::isfinite(g)) return INFINITY;
      num += (g - w) * (g - w), den += w * w;
    }
    worst = std::fmax(worst, std::sqrt(num / (den > 0 ? den : 1)));
  }
  return worst;
}

/* The whole K/V storage of both sides must agree: V bit-exact, K within one
 * rounding (RoPE's libm last bits). */
void compare_storage(Side &g, Side &c) {
  const Shape &s = g.s;
  for (uint32_t l = 0; l < s.layers; ++l) {
    void *gk, *gv, *ck, *cv;
    int64_t st[4];
    FD_ASSERT_OK(fd_cache_layer_storage(g.cache, l, &gk, &gv, st));
    FD_ASSERT_OK(fd_cache_layer_storage(c.cache, l, &ck, &cv, st));
    const size_t n = (size_t)layer_elems(s);
    const std::vector<uint16_t> kg = g.get(gk, n), vg = g.get(gv, n);
    assert_memory_equal(vg.data(), cv, n * 2);
    const uint16_t *kc = static_cast<const uint16_t *>(ck);
    const float rel = s.dtype == FD_DTYPE_BF16 ? 0x1p-7f : 0x1p-10f;
    for (size_t i = 0; i < n; ++i) {
      if (kg[i] == kc[i]) continue;
      const float a = fd_test_load(kg.data(), i, s.dtype), b = fd_test_load(kc, i, s.dtype);
      if (std::fabs(a - b) > rel * std::fmax(std::fabs(b), 1e-3f)) {
        print_error("layer %u K element %zu: gpu %g cpu %g\n", l, i, (double)a, (double)b);
        fail();
      }
    }
  }
}

void compare_outputs(Side &g, Side &c) {
  const size_t n = kBatch * g.s.hq * g.s.dim;
  const double tol = g.s.dtype == FD_DTYPE_BF16 ? 2e-2 : 5e-3;
  const double err_q = rel_error(g.get(g.q_rot, n), c.get(c.q_rot, n), g.s.dtype, g.s.dim);
  const double err_o = rel_error(g.get(g.out, n), c.get(c.out, n), g.s.dtype, g.s.dim);
  if (err_q > 1e-2 || err_o > tol) {
    print_error("rotated q rel error %.3g, decode output rel error %.3g\n", err_q, err_o);
    fail();
  }
}

/* Builds context with eager steps on both sides (rows grow past block
 * boundaries), then runs `final_step` on the GPU side and an eager step on
 * the CPU side, and compares everything. */
template <class Final>
void run_scenario(const Shape &s, uint32_t steps, Final final_step) {
  Side g, c;
  g.setup(s, true);
  c.setup(s, false);
  /* Stagger lengths: request r gets r extra tokens first. */
  for (uint64_t r = 1; r <= kBatch; ++r)
    for (uint64_t t = 0; t < r * 3; ++t)
      for (Side *side : {&g, &c}) {
        const uint64_t id = r;
        fd_tx tx;
        FD_ASSERT_OK(fd_tx_begin(side->cache, &id, 1, &tx));
        side->load_kv(1000 + (uint32_t)(r * 100 + t)); /* batch-5 buffers, row 0 used */
        for (uint32_t l = 0; l < s.layers; ++l)
          FD_ASSERT_OK(fd_tx_write_layer(side->cache, tx, l, side->k_layer(l), side->v_layer(l),
                                         (fd_stream)side->stream));
        FD_ASSERT_OK(fd_tx_commit(side->cache, tx));
      }
  for (uint32_t step = 0; step < steps; ++step) {
    eager_step(g, step);
    eager_step(c, step);
  }
  final_step(g, steps);
  eager_step(c, steps);
  compare_outputs(g, c);
  compare_storage(g, c);
  FD_ASSERT_OK(fd_cache_validate(g.cache));
  FD_ASSERT_OK(fd_cache_async_error(g.cache));
}

void graph_step(Side &g, uint32_t step) {
  load_q(g, step);
  g.load_kv(step);
  fd_tx tx = g.begin_step();
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeGlobal));
  for (uint32_t l = 0; l < g.s.layers; ++l) g.layer(tx, l);
  CUDA_OK(cudaStreamEndCapture(g.stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  /* Replaying twice writes the same bytes (the step is idempotent). */
  CUDA_OK(cudaGraphLaunch(exec, g.stream));
  CUDA_OK(cudaGraphLaunch(exec, g.stream));
  CUDA_OK(cudaStreamSynchronize(g.stream));
  FD_ASSERT_OK(fd_tx_commit(g.cache, tx));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

/* begin, exports, every layer and commit inside one global-mode capture:
 * a host synchronisation, a blocking copy or an allocation anywhere would
 * invalidate it and EndCapture would fail. */
void captured_step(Side &g, uint32_t step) {
  load_q(g, step);
  g.load_kv(step);
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeGlobal));
  /* No assertion inside the capture: collect the statuses, end the capture,
   * then check (a failed test must not leave the stream capturing). */
  const uint64_t ids[kBatch] = {1, 2, 3, 4, 5};
  std::vector<fd_status> st;
  std::vector<std::string> msg;
  auto note = [&](fd_status s) {
    st.push_back(s);
    msg.push_back(s == FD_OK ? "" : fd_last_error_message());
  };
  fd_tx tx = {0, 0};
  note(fd_tx_begin(g.cache, ids, kBatch, &tx));
  /* The committed view, then the transaction's view over it. */
  note(fd_cache_export_async(g.cache, ids, kBatch, kMbps, g.tables, g.lens, (fd_stream)g.stream));
  note(fd_tx_block_tables_async(g.cache, tx, kMbps, g.tables, g.lens, (fd_stream)g.stream));
  for (uint32_t l = 0; l < g.s.layers; ++l) note(g.try_layer(tx, l));
  note(fd_tx_commit(g.cache, tx));
  const cudaError_t end = cudaStreamEndCapture(g.stream, &graph);
  for (size_t i = 0; i < st.size(); ++i)
    if (st[i] != FD_OK) {
      print_error("call %zu inside the capture failed: %s (%s)\n", i, fd_status_string(st[i]),
                  msg[i].c_str());
      fail();
    }
  if (end != cudaSuccess) {
    print_error("stream capture of a whole step failed: %s (a host synchronisation?)\n",
                cudaGetErrorString(end));
    fail();
  }
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, g.stream));
  CUDA_OK(cudaStreamSynchronize(g.stream));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

void test_step_graph_replay(void **state) {
  (void)state;
  Shape a;
  run_scenario(a, 4, graph_step);
  Shape b;
  b.dtype = FD_DTYPE_F16, b.dim = 64, b.rotary = 32, b.layout = FD_LAYOUT_DIM_MAJOR, b.bs = 8;
  b.hkv = 1, b.hq = 4;
  run_scenario(b, 3, graph_step);
}

void test_step_inside_capture(void **state) {
  (void)state;
  Shape a;
  a.rotary = 64;
  run_scenario(a, 2, captured_step);
}

void test_external_nhd_storage(void **state) {
  (void)state;
  Shape a;
  a.nhd = true;
  a.rotary = 96;
  run_scenario(a, 3, eager_step);
}

void test_exports_and_prefixes(void **state) {
  (void)state;
  Shape s;
  s.layers = 2;
  Side g, c;
  g.setup(s, true);
  c.setup(s, false);
  for (uint32_t step = 0; step < 20; ++step) {
    eager_step(g, step);
    eager_step(c, step);
  }
  const uint64_t ids[3] = {4, 1, 5};
  int32_t want_t[3 * kMbps], want_l[3];
  FD_ASSERT_OK(fd_cache_export(g.cache, ids, 3, kMbps, want_t, want_l));
  /* The poison goes on the export's stream: a cudaMemset on the legacy
   * default stream is not ordered before the export on a non-blocking stream
   * and could land after it (issue 11). */
  CUDA_OK(fd_gpu_fill(g.stream, g.tables, 0xff, kBatch * kMbps * 4));
  CUDA_OK(fd_gpu_fill(g.stream, g.lens, 0xff, kBatch * 4));
  FD_ASSERT_OK(
      fd_cache_export_async(g.cache, ids, 3, kMbps, g.tables, g.lens, (fd_stream)g.stream));
  std::vector<int32_t> got_t(3 * kMbps), got_l(3);
  CUDA_OK(fd_gpu_download(g.stream, got_t.data(), g.tables, got_t.size() * 4));
  CUDA_OK(fd_gpu_download(g.stream, got_l.data(), g.lens, 12));
  assert_memory_equal(got_t.data(), want_t, sizeof want_t);
  assert_memory_equal(got_l.data(), want_l, sizeof want_l);
  FD_ASSERT_FAILS(fd_cache_export_async(g.cache, ids, 3, 1, g.tables, g.lens, (fd_stream)g.stream),
                  FD_ERR_INVALID_ARGUMENT, "more than table_stride 1");
  /* Many back-to-back exports without a sync reuse staging safely. */
  for (int i = 0; i < 200; ++i)
    FD_ASSERT_OK(
        fd_cache_export_async(g.cache, ids, 3, kMbps, g.tables, g.lens, (fd_stream)g.stream));
  CUDA_OK(fd_gpu_download(g.stream, got_t.data(), g.tables, got_t.size() * 4));
  assert_memory_equal(got_t.data(), want_t, sizeof want_t);

  /* Prefixes from host memory and from device memory land bit-exactly. */
  const size_t n = (size_t)s.layers * 2 * s.hkv * s.bs * s.dim;
  std::vector<uint16_t> kb(n), vb(n);
  for (size_t i = 0; i < n; ++i) kb[i] = (uint16_t)(i * 3), vb[i] = (uint16_t)(i * 5 + 1);
  void *dk = nullptr, *dv = nullptr;
  CUDA_OK(cudaMalloc(&dk, n * 2));
  CUDA_OK(cudaMalloc(&dv, n * 2));
  /* Uploaded on the registration's stream (a pageable cudaMemcpy may return
   * before the bytes land, and the legacy stream does not order them before
   * the non-blocking stream's copies). */
  CUDA_OK(fd_gpu_upload(g.stream, dk, kb.data(), n * 2));
  CUDA_OK(fd_gpu_upload(g.stream, dv, vb.data(), n * 2));
  FD_ASSERT_OK(fd_prefix_register(g.cache, "host", kb.data(), vb.data(), 2, (fd_stream)g.stream));
  FD_ASSERT_OK(fd_prefix_register(g.cache, "dev", dk, dv, 2, (fd_stream)g.stream));
  for (const char *name : {"host", "dev"}) {
    fd_prefix_info info;
    info.struct_size = sizeof info;
    FD_ASSERT_OK(fd_prefix_get_info(g.cache, name, &info));
    const size_t block = (size_t)s.hkv * s.bs * s.dim;
    for (uint32_t l = 0; l < s.layers; ++l) {
      void *kc, *vc;
      int64_t st[4];
      FD_ASSERT_OK(fd_cache_layer_storage(g.cache, l, &kc, &vc, st));
      std::vector<uint16_t> got = g.get((uint16_t *)kc + (size_t)info.first_block * block, block);
      assert_memory_equal(got.data(), kb.data() + (size_t)l * 2 * block, block * 2);
      got = g.get((uint16_t *)vc + (size_t)info.first_block * block, block);
      assert_memory_equal(got.data(), vb.data() + (size_t)l * 2 * block, block * 2);
    }
  }
  cudaFree(dk);
  cudaFree(dv);
  FD_ASSERT_OK(fd_cache_async_error(g.cache));
}

void test_creation_errors(void **state) {
  (void)state;
  fd_cache *cache = (fd_cache *)(uintptr_t)0x1;
  fd_cache_config c;
  fd_cache_config_init(&c);
  c.device.type = FD_DEVICE_CUDA;
  /* 32 layers x 2^26 blocks of 8 x 16 x 128 bf16: 64 TiB for each of K and V. */
  c.num_layers = 32, c.num_kv_heads = 8, c.head_dim = 128, c.block_size = 16;
  c.max_blocks = 1u << 26;
  FD_ASSERT_FAILS(fd_cache_create(&c, &cache), FD_ERR_OUT_OF_MEMORY, "cudaMalloc (K cache)");
  assert_ptr_equal(cache, (fd_cache *)(uintptr_t)0x1);
  CUDA_OK(cudaGetLastError()); /* no error left behind */
  fd_cache_config_init(&c);
  c.device.type = FD_DEVICE_CUDA;
  c.dtype = FD_DTYPE_F32;
  FD_ASSERT_FAILS(fd_cache_create(&c, &cache), FD_ERR_UNSUPPORTED, "f32");
  c.dtype = FD_DTYPE_BF16;
  c.head_dim = 2048;
  FD_ASSERT_FAILS(fd_cache_create(&c, &cache), FD_ERR_UNSUPPORTED, "head_dim 2048");
  c.head_dim = 128;
  c.device.ordinal = 99;
  FD_ASSERT_FAILS(fd_cache_create(&c, &cache), FD_ERR_NO_DEVICE, "CUDA device 99");
  c.device.ordinal = 0;
  std::vector<uint16_t> host(1 << 20);
  c.max_blocks = 4, c.num_kv_heads = 2, c.block_size = 16;
  c.k_storage = host.data(), c.v_storage = host.data();
  FD_ASSERT_FAILS(fd_cache_create(&c, &cache), FD_ERR_INVALID_ARGUMENT,
                  "config.k_storage is not device memory of CUDA device 0");
  assert_ptr_equal(cache, (fd_cache *)(uintptr_t)0x1);
  /* A normal cache still works afterwards. */
  fd_cache_config_init(&c);
  c.device.type = FD_DEVICE_CUDA;
  cache = NULL;
  FD_ASSERT_OK(fd_cache_create(&c, &cache));
  fd_cache_destroy(cache);
}

void test_write_errors(void **state) {
  (void)state;
  Shape s;
  Side g;
  g.setup(s, true);
  load_q(g, 0);
  g.load_kv(0);
  fd_tx tx = g.begin_step();
  fd_cache_metrics m0, m1;
  m0.struct_size = m1.struct_size = sizeof m0;
  FD_ASSERT_OK(fd_cache_metrics_get(g.cache, &m0));
  FD_ASSERT_FAILS(fd_tx_write_layer_rope(g.cache, tx, 0, g.q, s.hq, g.k_layer(0), g.v_layer(0), 128,
                                         10000.f, g.k_layer(0), (fd_stream)g.stream),
                  FD_ERR_INVALID_ARGUMENT, "q_out must not overlap k or v");
  FD_ASSERT_FAILS(fd_tx_write_layer_rope(g.cache, tx, 0, g.q, s.hq, g.k_layer(0), g.v_layer(0), 128,
                                         10000.f, (uint8_t *)g.q + 2, (fd_stream)g.stream),
                  FD_ERR_INVALID_ARGUMENT, "q_out must equal q or not overlap it");
  FD_ASSERT_OK(fd_cache_metrics_get(g.cache, &m1));
  assert_int_equal(m1.transaction_failure_count, m0.transaction_failure_count + 2);
  fd_tx_info info;
  info.struct_size = sizeof info;
  FD_ASSERT_OK(fd_tx_get_info(g.cache, tx, &info));
  assert_int_equal(info.next_layer, 0);
  for (uint32_t l = 0; l < s.layers; ++l) g.layer(tx, l);
  FD_ASSERT_OK(fd_tx_commit(g.cache, tx));
  CUDA_OK(cudaStreamSynchronize(g.stream));
  FD_ASSERT_OK(fd_cache_async_error(g.cache));
}

}  // namespace

int main(void) {
  if (!fd_gpu_test_device_present()) return FD_GPU_TEST_SKIPPED;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step_graph_replay),    cmocka_unit_test(test_step_inside_capture),
      cmocka_unit_test(test_external_nhd_storage), cmocka_unit_test(test_exports_and_prefixes),
      cmocka_unit_test(test_creation_errors),      cmocka_unit_test(test_write_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
