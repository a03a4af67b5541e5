// Host-time benchmark of the decode step on a CUDA cache (docs/benchmarks.md,
// "Host costs"): how long the host spends issuing work, with the GPU work
// left to run asynchronously (the stream is drained between samples, outside
// the timed region). Public API only, so the same source builds against the
// 0.1 header (no plan API) and the 0.2 one, to compare commits in one run.
//
//  - engine step: fd_engine_begin_step + 32 x fd_engine_step_layer +
//    fd_engine_commit_step, batch 256, shape A (32 q / 8 KV heads, head_dim
//    128), bf16, block 16; rows grow from a 512-token prefill;
//  - fd_decode host time per call, batch 256 x 1024 tokens (one layer);
//  - 0.2 only: fd_decode_plan_create with exact host lengths (batch 256) and
//    fd_decode_run host time per call (one plan, 32 layer calls);
//  - the floor: host time of a bare launch of an empty kernel with a
//    parameter block of the decode kernel's size, launched the same way
//    (cudaLaunchKernelEx with programmatic stream serialization), and of one
//    cudaFuncSetAttribute call.
// Medians over samples. Writes JSON to stdout.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "flashdec.h"

namespace {

using Clock = std::chrono::steady_clock;

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)
#define CHECK_FD(x)                                                                             \
  do {                                                                                          \
    fd_status s_ = (x);                                                                         \
    if (s_ != FD_OK) {                                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, fd_last_error_message()); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

constexpr uint32_t kLayers = 32, kHq = 32, kHkv = 8, kDim = 128, kBlock = 16;

void set_bf16(fd_decode_params &p) {
#if FD_VERSION_MINOR >= 2
  p.q_dtype = p.kv_dtype = p.out_dtype = FD_DTYPE_BF16;
#else
  p.dtype = FD_DTYPE_BF16;
#endif
}

// Engine step host time, batch 256, 32 layers.
double engine_step_us(int steps) {
  const uint32_t batch = 256, prefill = 512;
  fd_cache_config cc;
  fd_cache_config_init(&cc);
  cc.num_layers = kLayers;
  cc.num_kv_heads = kHkv;
  cc.head_dim = kDim;
  cc.block_size = kBlock;
  cc.max_blocks = batch * ((prefill + 64 + steps) / kBlock + 2);
  cc.dtype = FD_DTYPE_BF16;
  cc.device.type = FD_DEVICE_CUDA;
  fd_cache *cache = nullptr;
  CHECK_FD(fd_cache_create(&cc, &cache));
  fd_engine *engine = nullptr;
  fd_engine_config ec;
  fd_engine_config_init(&ec);
  ec.num_q_heads = kHq;
  CHECK_FD(fd_engine_create(cache, &ec, &engine));
  void *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr, *pk = nullptr, *pv = nullptr;
  const size_t qb = size_t{batch} * kHq * kDim * 2, kb = size_t{batch} * kHkv * kDim * 2;
  CHECK_CUDA(cudaMalloc(&q, qb));
  CHECK_CUDA(cudaMalloc(&out, qb));
  CHECK_CUDA(cudaMalloc(&k, kb));
  CHECK_CUDA(cudaMalloc(&v, kb));
  CHECK_CUDA(cudaMemset(q, 0, qb));
  CHECK_CUDA(cudaMemset(k, 0, kb));
  CHECK_CUDA(cudaMemset(v, 0, kb));
  const size_t pb = size_t{kLayers} * kHkv * kDim * 2;
  CHECK_CUDA(cudaMalloc(&pk, pb));
  CHECK_CUDA(cudaMalloc(&pv, pb));
  CHECK_CUDA(cudaMemset(pk, 0, pb));
  CHECK_CUDA(cudaMemset(pv, 0, pb));
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<uint64_t> ids(batch);
  for (uint32_t r = 0; r < batch; ++r) {
    ids[r] = r + 1;
    CHECK_FD(fd_engine_add_request(engine, ids[r]));
    CHECK_FD(fd_engine_admit(engine, ids[r]));
    for (uint32_t t = 0; t < prefill; ++t)
      CHECK_FD(fd_engine_prefill_request_layers(engine, ids[r], pk, pv));
  }
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<double> t;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = Clock::now();
    fd_engine_step step;
    step.struct_size = sizeof step;
    CHECK_FD(fd_engine_begin_step(engine, ids.data(), batch, &step));
    for (uint32_t l = 0; l < kLayers; ++l)
      CHECK_FD(fd_engine_step_layer(engine, step.tx, l, q, k, v, out,
                                    reinterpret_cast<fd_stream>(stream)));
    CHECK_FD(fd_engine_commit_step(engine, step.tx));
    const double us = us_since(t0);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    if (s >= 5) t.push_back(us);
  }
  fd_engine_destroy(engine);
  fd_cache_destroy(cache);
  for (void *p : {q, k, v, out, pk, pv}) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return median(t);
}

struct DecodeSetup {
  fd_decode_params p;
  std::vector<int32_t> host_lens;
  std::vector<void *> owned;
  cudaStream_t stream;
};

DecodeSetup decode_setup() {
  const uint32_t batch = 256, len = 1024, mbps = len / kBlock;
  DecodeSetup d;
  fd_decode_params &p = d.p;
  fd_decode_params_init(&p);
  set_bf16(p);
  p.batch = batch;
  p.num_q_heads = kHq;
  p.num_kv_heads = kHkv;
  p.head_dim = kDim;
  p.block_size = kBlock;
  p.num_blocks = batch * mbps;
  p.max_blocks_per_seq = mbps;
  p.max_seq_len_hint = static_cast<int32_t>(len);
  p.device.type = FD_DEVICE_CUDA;
  const size_t kvb = size_t{p.num_blocks} * kHkv * kBlock * kDim * 2,
               qb = size_t{batch} * kHq * kDim * 2;
  void *k, *v, *q, *out, *tables, *lens, *ws;
  CHECK_CUDA(cudaMalloc(&k, kvb));
  CHECK_CUDA(cudaMalloc(&v, kvb));
  CHECK_CUDA(cudaMalloc(&q, qb));
  CHECK_CUDA(cudaMalloc(&out, qb));
  CHECK_CUDA(cudaMemset(k, 0, kvb));
  CHECK_CUDA(cudaMemset(v, 0, kvb));
  CHECK_CUDA(cudaMemset(q, 0, qb));
  std::vector<int32_t> t(size_t{batch} * mbps);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>(i);
  d.host_lens.assign(batch, static_cast<int32_t>(len));
  CHECK_CUDA(cudaMalloc(&tables, t.size() * 4));
  CHECK_CUDA(cudaMalloc(&lens, batch * 4));
  CHECK_CUDA(cudaMemcpy(tables, t.data(), t.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(lens, d.host_lens.data(), batch * 4, cudaMemcpyHostToDevice));
  p.q = q, p.k_cache = k, p.v_cache = v, p.out = out;
  p.block_tables = static_cast<const int32_t *>(tables);
  p.seq_lens = static_cast<const int32_t *>(lens);
  size_t wsb = 0;
  CHECK_FD(fd_decode_workspace_size(&p, &wsb));
  wsb = std::max<size_t>(wsb, 64u << 20);
  CHECK_CUDA(cudaMalloc(&ws, wsb));
  p.workspace = ws, p.workspace_size = wsb;
  CHECK_CUDA(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
  p.stream = reinterpret_cast<fd_stream>(d.stream);
  d.owned = {k, v, q, out, tables, lens, ws};
  return d;
}

// Host time per call of `call` (32 calls per sample, stream drained between samples).
template <class F>
double per_call_us(cudaStream_t stream, F call) {
  std::vector<double> t;
  for (int s = 0; s < 60; ++s) {
    const auto t0 = Clock::now();
    for (uint32_t l = 0; l < kLayers; ++l) call();
    const double us = us_since(t0) / kLayers;
    CHECK_CUDA(cudaStreamSynchronize(stream));
    if (s >= 10) t.push_back(us);
  }
  return median(t);
}

// An empty kernel with a parameter block the size of the decode kernel's.
struct BareParams {
  unsigned char bytes[144];
};
__global__ void bare_kernel(const BareParams p) {
  if (threadIdx.x == 1024) printf("%d", p.bytes[0]);  // never true; keeps p alive
}

double bare_launch_us(cudaStream_t stream) {
  BareParams p{};
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1);
  config.blockDim = dim3(128);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return per_call_us(stream, [&] { CHECK_CUDA(cudaLaunchKernelEx(&config, bare_kernel, p)); });
}

double set_attribute_us() {
  std::vector<double> t;
  for (int i = 0; i < 2000; ++i) {
    const auto t0 = Clock::now();
    CHECK_CUDA(
        cudaFuncSetAttribute(bare_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    if (i >= 100) t.push_back(us_since(t0));
  }
  return median(t);
}

}  // namespace

int main() {
  CHECK_CUDA(cudaSetDevice(0));
  const double step = engine_step_us(45);
  DecodeSetup d = decode_setup();
  const double decode = per_call_us(d.stream, [&] { CHECK_FD(fd_decode(&d.p)); });
  std::printf("{\n  \"version\": \"%s\",\n", fd_version_string());
  std::printf("  \"engine_step_batch256_32layers_us\": %.1f,\n", step);
  std::printf("  \"fd_decode_host_us_per_call_batch256\": %.2f,\n", decode);
  std::printf("  \"bare_launch_host_us\": %.2f,\n", bare_launch_us(d.stream));
  std::printf("  \"cuda_func_set_attribute_host_us\": %.2f", set_attribute_us());
#if FD_VERSION_MINOR >= 2
  std::vector<double> plan_t;
  for (int i = 0; i < 2000; ++i) {
    fd_decode_plan *plan = nullptr;
    const auto t0 = Clock::now();
    CHECK_FD(fd_decode_plan_create(&d.p, d.host_lens.data(), &plan));
    const double us = us_since(t0);
    fd_decode_plan_destroy(plan);
    if (i >= 100) plan_t.push_back(us);
  }
  fd_decode_plan *plan = nullptr;
  CHECK_FD(fd_decode_plan_create(&d.p, d.host_lens.data(), &plan));
  const double run = per_call_us(d.stream, [&] { CHECK_FD(fd_decode_run(plan, &d.p)); });
  fd_decode_plan_destroy(plan);
  std::printf(",\n  \"plan_create_us_batch256\": %.2f,\n  \"run_host_us_per_layer_batch256\": %.2f",
              median(plan_t), run);
#endif
  std::printf("\n}\n");
  for (void *p : d.owned) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaStreamDestroy(d.stream));
  return 0;
}
