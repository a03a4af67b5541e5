// CUDA backend of decode attention (backend/backend.hpp): checks what only
// this backend limits (dtypes, head_dim, block size, group size, alignment),
// plans the split-KV work list from host-known values (the rules in
// attention/decode_splits.cpp, fed the device's CTA slots), and enqueues the
// kernels of a work list on the caller's stream. Running does no host
// synchronisation, device allocation or device read, except on the
// FD_DECODE_CHECK_INDICES path, which copies the indices to the host on
// purpose.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention/decode_cpu_indices.hpp"
#include "attention/decode_problem.hpp"
#include "attention/decode_splits.hpp"
#include "attention/decode_work.hpp"
#include "backend/backend.hpp"
#include "core/arg_checks.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "cuda/cuda_util.hpp"
#include "decode_launch.hpp"

namespace fd {
namespace {

int log2_exact(uint32_t v) {
  int n = 0;
  while ((1u << n) < v) ++n;
  return n;
}

// What this backend serves; everything else is FD_ERR_UNSUPPORTED naming the
// parameter.
void check_supported(const DecodeProblem &pb) {
  // The variants of S2.3 (soft-cap, sliding window, sinks) are served with
  // every type, head_dim and layout below: nothing to refuse here.
  // Served element types: q = out = K/V in f16 or bf16, and q = out in f16
  // or bf16 over FP8 (E4M3 or E5M2) K/V.
  const bool fp8 = dtype_is_fp8(pb.kv.dtype);
  if (pb.kv.dtype != FD_DTYPE_F16 && pb.kv.dtype != FD_DTYPE_BF16 && !fp8)
    fail(FD_ERR_UNSUPPORTED,
         "kv_dtype %s is not supported on CUDA (supported: f16, bf16, fp8_e4m3, fp8_e5m2)",
         dtype_name(pb.kv.dtype));
  if (fp8 && pb.q_dtype != FD_DTYPE_F16 && pb.q_dtype != FD_DTYPE_BF16)
    fail(FD_ERR_UNSUPPORTED,
         "q_dtype %s is not supported with kv_dtype %s on CUDA (supported: f16, bf16)",
         dtype_name(pb.q_dtype), dtype_name(pb.kv.dtype));
  if (!fp8 && pb.q_dtype != pb.kv.dtype)
    fail(FD_ERR_UNSUPPORTED,
         "q_dtype %s is not supported with kv_dtype %s on CUDA (q_dtype must be %s)",
         dtype_name(pb.q_dtype), dtype_name(pb.kv.dtype), dtype_name(pb.kv.dtype));
  if (pb.out_dtype != pb.q_dtype)
    fail(FD_ERR_UNSUPPORTED,
         "out_dtype %s is not supported with q_dtype %s on CUDA (out_dtype must be %s)",
         dtype_name(pb.out_dtype), dtype_name(pb.q_dtype), dtype_name(pb.q_dtype));
  if (pb.head_dim != 64 && pb.head_dim != 96 && pb.head_dim != 128 && pb.head_dim != 256)
    fail(FD_ERR_UNSUPPORTED, "head_dim %u is not supported on CUDA (supported: 64, 96, 128, 256)",
         pb.head_dim);
  if (fp8 && pb.head_dim != 64 && pb.head_dim != 128)
    fail(FD_ERR_UNSUPPORTED,
         "head_dim %u is not supported with kv_dtype %s on CUDA (supported: 64, 128)", pb.head_dim,
         dtype_name(pb.kv.dtype));
  if (pb.kv.block_size != 8 && pb.kv.block_size != 16 && pb.kv.block_size != 32)
    fail(FD_ERR_UNSUPPORTED, "block_size %u is not supported on CUDA (supported: 8, 16, 32)",
         pb.kv.block_size);
  if (pb.group_size < 1 || pb.group_size > static_cast<uint32_t>(cuda::kDecodeMaxGroup))
    fail(FD_ERR_UNSUPPORTED,
         "GQA group size %u (num_q_heads / num_kv_heads) is not supported on CUDA "
         "(supported: 1..%d)",
         pb.group_size, cuda::kDecodeMaxGroup);
  // The kernel copies 16 bytes (8 16-bit or 16 FP8 elements) at a time along
  // the contiguous axis, so each copy must start 16-byte aligned (FP8
  // dim-major tiles of 8-token blocks copy 8 bytes per dim).
  if (!is_aligned(pb.k, 16) || !is_aligned(pb.v, 16))
    fail(FD_ERR_UNSUPPORTED, "k_cache and v_cache must be 16-byte aligned on CUDA");
  // q is read as pairs of elements (4 bytes).
  if (reinterpret_cast<uintptr_t>(pb.q) % 4 != 0)
    fail(FD_ERR_UNSUPPORTED, "q must be 4-byte aligned on CUDA");
  const PagedKv &kv = pb.kv;
  const bool dim_major = kv.dim_major();
  const struct {
    const char *name;
    int64_t value;
  } strides[3] = {
      {"stride_block", kv.stride_block},
      {"stride_head", kv.stride_head},
      {dim_major ? "stride_dim" : "stride_token", dim_major ? kv.stride_dim : kv.stride_token}};
  const int64_t elem = static_cast<int64_t>(dtype_size(kv.dtype));
  for (int i = 0; i < 3; ++i) {
    const bool row_of_8 = fp8 && dim_major && kv.block_size == 8 && i == 2;
    const int64_t bytes = row_of_8 ? 8 : 16;  // the copy's alignment
    if (strides[i].value * elem % bytes != 0)
      fail(FD_ERR_UNSUPPORTED,
           "%s %lld is not supported on CUDA: it must be a multiple of %lld elements (%lld bytes)",
           strides[i].name, static_cast<long long>(strides[i].value),
           static_cast<long long>(bytes / elem), static_cast<long long>(bytes));
  }
  if ((dim_major ? kv.stride_token : kv.stride_dim) != 1)
    fail(FD_ERR_UNSUPPORTED, "%s must be 1 for this layout on CUDA",
         dim_major ? "stride_token" : "stride_dim");
  const uint64_t grid_rows = static_cast<uint64_t>(pb.batch) * pb.num_kv_heads;
  if (grid_rows * cuda::kDecodeMaxSplits > 0x7fffffffull || kv.num_blocks > 0x7fffffffu ||
      static_cast<uint64_t>(pb.max_blocks_per_seq) * kv.block_size > 0x7fffffffull)
    fail(FD_ERR_UNSUPPORTED, "batch %u x num_kv_heads %u is too large for one CUDA launch",
         pb.batch, pb.num_kv_heads);
  // Several query tokens per row: one CTA per query tile (and split), one
  // merge warp group per (row, query token, q head); both index spaces must
  // fit one CUDA grid in 32-bit arithmetic.
  const uint64_t q_tiles = static_cast<uint64_t>(cuda::query_tiles(pb));
  if (grid_rows * q_tiles * cuda::kDecodeMaxSplits > 0x7fffffffull ||
      static_cast<uint64_t>(pb.batch) * static_cast<uint64_t>(pb.max_q_len) * pb.num_q_heads >
          0x7fffffffull)
    fail(FD_ERR_UNSUPPORTED,
         "batch %u x max_q_len_hint %d x num_q_heads %u query rows are too many for one CUDA "
         "launch",
         pb.batch, static_cast<int>(pb.max_q_len), pb.num_q_heads);
}

int multiprocessor_count(int32_t ordinal) {
  int sms = 0;
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal),
             "cudaDeviceGetAttribute(multiProcessorCount)");
  return sms > 0 ? sms : 1;
}

// Compute capability 9.0 exactly: the sm_90a kernels (kernels/decode_sm90.cu)
// run on no other device.
bool is_sm90(int32_t ordinal) {
  int major = 0, minor = 0;
  cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal),
             "cudaDeviceGetAttribute(computeCapabilityMajor)");
  cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal),
             "cudaDeviceGetAttribute(computeCapabilityMinor)");
  return major == 9 && minor == 0;
}

// FD_DECODE_CHECK_INDICES: the one synchronising path. Copies seq_lens and
// block tables to the host and checks them before anything is launched.
void check_indices_on_host(const DecodeProblem &pb, cudaStream_t stream) {
  std::vector<int32_t> lens(pb.batch);
  std::vector<int32_t> tables(static_cast<size_t>(pb.batch) * pb.max_blocks_per_seq);
  std::vector<int32_t> indptr(pb.q_indptr != nullptr ? pb.batch + 1 : 0);
  std::vector<float> sinks(pb.variant.sinks != nullptr ? pb.num_q_heads : 0);
  if (pb.variant.sinks != nullptr)
    cuda_check(cudaMemcpyAsync(sinks.data(), pb.variant.sinks, sinks.size() * sizeof(float),
                               cudaMemcpyDefault, stream),
               "copying sinks to the host");
  if (pb.q_indptr != nullptr)
    cuda_check(cudaMemcpyAsync(indptr.data(), pb.q_indptr, indptr.size() * sizeof(int32_t),
                               cudaMemcpyDefault, stream),
               "copying q_indptr to the host");
  cuda_check(cudaMemcpyAsync(lens.data(), pb.seq_lens, lens.size() * sizeof(int32_t),
                             cudaMemcpyDefault, stream),
             "copying seq_lens to the host");
  cuda_check(cudaMemcpyAsync(tables.data(), pb.block_tables, tables.size() * sizeof(int32_t),
                             cudaMemcpyDefault, stream),
             "copying block_tables to the host");
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  // The same checks as the CPU backend's, including seq_len <= the resolved
  // max_seq_len_hint: a row longer than the hint would otherwise run with
  // the hint's split layout at reduced speed, and the hint is the caller's
  // promise.
  // (The sinks are device memory: the check reads the host copy.)
  DecodeProblem host = pb;
  if (pb.variant.sinks != nullptr) host.variant.sinks = sinks.data();
  check_decode_indices(host, lens.data(), tables.data(),
                       pb.q_indptr != nullptr ? indptr.data() : nullptr);
}

}  // namespace

namespace backend {

DecodeWorkList cuda_plan_decode(const DecodeProblem &problem, const int32_t *host_seq_lens,
                                bool limit_by_workspace) {
  require_cuda_device(problem.device_ordinal);
  check_supported(problem);
  // Once per plan, not per run: the kernel's shared memory limit is a
  // per-device setting, and runs on this plan use the same device, element
  // types, head_dim and layout (attention/decode_plan.cpp checks it).
  const bool sm90 = is_sm90(problem.device_ordinal);
  {
    CudaDeviceScope scope(problem.device_ordinal);
    cuda::DecodeLaunch kernel;
    kernel.q_dtype = problem.q_dtype;
    kernel.kv_dtype = problem.kv.dtype;
    kernel.head_dim = static_cast<int32_t>(problem.head_dim);
    kernel.dim_major = problem.kv.dim_major();
    kernel.work.max_q_len = problem.max_q_len;
    kernel.work.sm90_device = sm90;
    cuda_check(cuda::prepare_decode(kernel), "preparing the CUDA decode kernel");
  }
  // The split layout counts only the keys a row's queries can see: with a
  // sliding window, the span from the tile holding the first visible
  // position (decode_work.hpp, planned_span), the whole row otherwise.
  const VariantPolicy policy = VariantPolicy::of(problem.variant);
  const int32_t q_tile = cuda::query_tile_tokens(problem);
  auto span = [&](int32_t len) {
    return planned_span(policy, len, problem.max_q_len, q_tile, cuda::kDecodeTileTokens);
  };
  int max_len = span(problem.max_seq_len);
  int64_t total_len = 0;       // of the spans, when the lengths are known
  std::vector<int32_t> spans;  // the spans, when the lengths are known
  if (host_seq_lens != nullptr) {
    max_len = 0;
    spans.resize(problem.batch);
    for (uint32_t r = 0; r < problem.batch; ++r) {
      const int32_t s = span(host_seq_lens[r]);
      spans[r] = s;
      max_len = std::max(max_len, s);
      total_len += s;
    }
  }
  cuda::DecodeSlots slots;
  slots.sms = multiprocessor_count(problem.device_ordinal);
  slots.sm90_device = sm90;
  const auto head_dim = static_cast<int32_t>(problem.head_dim);
  const bool swapped = cuda::takes_swapped(problem);
  slots.ctas_per_sm = swapped ? cuda::decode_swap_ctas_per_sm(head_dim)
                              : cuda::decode_ctas_per_sm(head_dim, cuda::takes_sm90(problem, sm90));
  slots.deep_ctas_per_sm =
      swapped ? cuda::decode_swap_ctas_per_sm(head_dim, true) : cuda::decode_deep_ctas_per_sm();
  return cuda::plan_decode_splits(problem, max_len, limit_by_workspace, slots, total_len,
                                  spans.empty() ? nullptr : spans.data());
}

size_t cuda_decode_workspace_bytes(const DecodeProblem &problem, const DecodeWorkList &work) {
  return cuda::decode_workspace_bytes(problem, work);
}

void cuda_run_decode(const DecodeProblem &problem, const DecodeWorkList &work) {
  // A run may change everything but the planned shape: check it again
  // (cheap, host values only).
  check_supported(problem);
  CudaDeviceScope scope(problem.device_ordinal);
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(problem.stream);
  if (problem.flags & FD_DECODE_CHECK_INDICES) check_indices_on_host(problem, stream);

  const PagedKv &kv = problem.kv;
  cuda::DecodeLaunch l;
  l.q_dtype = problem.q_dtype;
  l.kv_dtype = kv.dtype;
  l.dim_major = kv.dim_major();
  l.head_dim = static_cast<int32_t>(problem.head_dim);
  l.q = problem.q;
  l.k = problem.k;
  l.v = problem.v;
  l.out = problem.out;
  l.block_tables = problem.block_tables;
  l.seq_lens = problem.seq_lens;
  l.q_indptr = problem.q_indptr;
  l.stride_block = kv.stride_block;
  l.stride_head = kv.stride_head;
  l.stride_token = kv.stride_token;
  l.stride_dim = kv.stride_dim;
  l.block_size_log2 = log2_exact(kv.block_size);
  l.num_blocks = static_cast<int32_t>(kv.num_blocks);
  l.max_blocks_per_seq = static_cast<int32_t>(problem.max_blocks_per_seq);
  l.variant = problem.variant;
  l.k_scale = problem.k_scale;
  l.v_scale = problem.v_scale;
  l.work = work;
  if (work.has_partials()) {
    l.partial_o = static_cast<float *>(problem.workspace);
    l.partial_ml = l.partial_o + static_cast<size_t>(work.partial_slots()) * problem.head_dim;
  }
  l.stream = stream;
  cuda_check(cuda::launch_decode(l), "launching the CUDA decode kernel");
}

}  // namespace backend
}  // namespace fd
