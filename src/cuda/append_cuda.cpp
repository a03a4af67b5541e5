// CUDA backend of the checked append primitives fd_kv_append /
// fd_rope_kv_append. The index arrays are device memory the caller can still
// change, so they are copied to the host and checked after a stream
// synchronisation (documented in the header), and the kernel is launched only
// when every entry is valid.
#include <cstring>
#include <vector>

#include "append_launch.hpp"
#include "backend/backend.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "cuda/cuda_util.hpp"
#include "ops/kv_append.hpp"

namespace fd {
namespace {

void require_device_pointer(const void *p, int32_t ordinal, const char *what) {
  if (!backend::is_cuda_device_memory(p, ordinal))
    fail(FD_ERR_INVALID_ARGUMENT, "params->%s is not device memory of CUDA device %d", what,
         ordinal);
}

std::vector<int32_t> to_host(const int32_t *src, size_t n, cudaStream_t s, const char *what) {
  std::vector<int32_t> h(n);
  cuda_check(cudaMemcpyAsync(h.data(), src, n * sizeof(int32_t), cudaMemcpyDeviceToHost, s), what);
  return h;
}

}  // namespace

void backend::cuda_kv_append(const AppendProblem &p) {
  const PagedKv &kv = p.kv;
  require_cuda_device(p.device_ordinal);
  // Served: f16 or bf16 inputs into a cache of the same type or into FP8
  // E4M3 or E5M2 (quantised by the kernel).
  if (p.src_dtype != FD_DTYPE_F16 && p.src_dtype != FD_DTYPE_BF16)
    fail(FD_ERR_UNSUPPORTED, "dtype %s is not supported on CUDA (use f16 or bf16)",
         dtype_name(p.src_dtype));
  if (kv.dtype != p.src_dtype && !dtype_is_fp8(kv.dtype))
    fail(FD_ERR_UNSUPPORTED,
         "cache_dtype %s is not supported with dtype %s on CUDA (supported: %s, fp8_e4m3, "
         "fp8_e5m2)",
         dtype_name(kv.dtype), dtype_name(p.src_dtype), dtype_name(p.src_dtype));
  if (kv.head_dim > static_cast<uint32_t>(cuda::kAppendMaxHeadDim))
    fail(FD_ERR_UNSUPPORTED, "head_dim %u is not supported on CUDA (at most %d)", kv.head_dim,
         cuda::kAppendMaxHeadDim);
  if (p.num_tokens > 0x7fffffffu)
    fail(FD_ERR_UNSUPPORTED, "num_tokens %u is too large for one CUDA launch", p.num_tokens);
  CudaDeviceScope scope(p.device_ordinal);
  const struct {
    const void *ptr;
    const char *name;
  } pointers[] = {{p.k, "k"},
                  {p.v, "v"},
                  {p.k_cache, "k_cache"},
                  {p.v_cache, "v_cache"},
                  {p.block_ids, "block_ids"},
                  {p.offsets, "offsets"},
                  {p.q, "q"},
                  {p.q_out, "q_out"},
                  {p.positions, "positions"}};
  for (const auto &x : pointers)
    if (x.ptr != nullptr) require_device_pointer(x.ptr, p.device_ordinal, x.name);

  cudaStream_t s = reinterpret_cast<cudaStream_t>(p.stream);
  const std::vector<int32_t> ids = to_host(p.block_ids, p.num_tokens, s, "copying block_ids");
  const std::vector<int32_t> offs = to_host(p.offsets, p.num_tokens, s, "copying offsets");
  std::vector<int32_t> pos;
  if (p.positions != nullptr) pos = to_host(p.positions, p.num_tokens, s, "copying positions");
  cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize (checking indices)");
  check_append_indices(p, ids.data(), offs.data(), p.positions ? pos.data() : nullptr);

  cuda::AppendLaunch a;
  a.dtype = p.src_dtype;
  a.cache_dtype = kv.dtype;
  a.k_scale = p.k_scale;
  a.v_scale = p.v_scale;
  a.num_tokens = static_cast<int32_t>(p.num_tokens);
  a.num_q_heads = static_cast<int32_t>(p.num_q_heads);
  a.num_kv_heads = static_cast<int32_t>(kv.num_kv_heads);
  a.head_dim = static_cast<int32_t>(kv.head_dim);
  a.rotary_dim = static_cast<int32_t>(p.rotary_dim);
  a.rope_base = p.rope_base;
  a.rope_style = p.rope_style;
  a.q = p.q;
  a.q_out = p.q_out;
  a.k = p.k;
  a.v = p.v;
  a.k_dst = p.k_cache;
  a.v_dst = p.v_cache;
  a.stride_block = kv.stride_block;
  a.stride_head = kv.stride_head;
  a.stride_token = kv.stride_token;
  a.stride_dim = kv.stride_dim;
  a.block_ids = p.block_ids;
  a.offsets = p.offsets;
  a.positions = p.positions;
  a.stream = s;
  cuda_check(cuda::launch_append(a), "launching the KV append kernel");
}

}  // namespace fd
