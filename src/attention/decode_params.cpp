// fd_decode's front end: reads the caller's (possibly older) parameter struct,
// checks every host-known value, resolves defaults into a DecodeProblem, and
// dispatches to the CPU or the CUDA backend. Nothing runs before every check
// has passed, so a failing call writes nothing.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/versioned.hpp"
#include "core/arg_checks.hpp"
#include "ops/decode_cpu_indices.hpp"
#include "ops/decode_problem.hpp"

namespace fd {
namespace {

// Callers must provide at least every field up to and including `out`; the
// fields after it all have defaults, so older, smaller structs stay valid.
constexpr size_t kMinParamsSize = offsetof(fd_decode_params, out) + sizeof(void *);

constexpr uint32_t kKnownFlags = FD_DECODE_CHECK_INDICES;

fd_decode_params default_params() {
  fd_decode_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.dtype = FD_DTYPE_BF16;
  p.layout = FD_LAYOUT_TOKEN_MAJOR;
  p.device.type = FD_DEVICE_CPU;
  p.device.ordinal = 0;
  return p;
}

// struct_size policy of core/versioned.hpp: older, smaller structs get the
// defaults for their missing tail; newer, larger ones are refused.
fd_decode_params read_params(const fd_decode_params *src) {
  return read_versioned<kMinParamsSize>(src, default_params(), "params");
}

void require_positive(uint32_t value, const char *name) {
  if (value == 0) fail(FD_ERR_INVALID_ARGUMENT, "%s must be > 0", name);
}

// Element counts and byte sizes must stay far from overflow so that backends
// can index with plain 64-bit arithmetic: every product of caller values goes
// through the shared checked_extent_mul/add (core/arg_checks.hpp), whose
// message names the parameters (`what`). Operands are never negative here
// (sizes are checked > 0 and given strides > 0 first), and results stay
// below kMaxOpElements, so they convert to int64 exactly.
int64_t checked_mul(int64_t a, int64_t b, const char *what) {
  return static_cast<int64_t>(
      checked_extent_mul(static_cast<uint64_t>(a), static_cast<uint64_t>(b), what));
}

int64_t checked_add(int64_t a, int64_t b, const char *what) {
  return static_cast<int64_t>(
      checked_extent_add(static_cast<uint64_t>(a), static_cast<uint64_t>(b), what));
}

// Resolves the K/V strides (packed when all four are zero) and returns the
// number of elements a K or V cache spans (largest offset + 1).
int64_t resolve_strides(const fd_decode_params &p, DecodeProblem &pb) {
  const int64_t blocks = p.num_blocks, heads = p.num_kv_heads, tokens = p.block_size,
                dims = p.head_dim;
  const char *what = "the K/V cache (num_blocks x num_kv_heads x block_size x head_dim elements)";
  if (p.stride_block == 0 && p.stride_head == 0 && p.stride_token == 0 && p.stride_dim == 0) {
    const int64_t per_head = checked_mul(tokens, dims, what);
    const int64_t per_block = checked_mul(per_head, heads, what);
    const int64_t total = checked_mul(per_block, blocks, what);
    pb.stride_block = per_block;
    pb.stride_head = per_head;
    if (p.layout == FD_LAYOUT_TOKEN_MAJOR) {
      pb.stride_token = dims;
      pb.stride_dim = 1;
    } else {
      pb.stride_token = 1;
      pb.stride_dim = tokens;
    }
    return total;
  }
  const struct {
    const char *name;
    int64_t value;
  } given[4] = {{"stride_block", p.stride_block},
                {"stride_head", p.stride_head},
                {"stride_token", p.stride_token},
                {"stride_dim", p.stride_dim}};
  for (const auto &s : given)
    if (s.value <= 0)
      fail(FD_ERR_INVALID_ARGUMENT,
           "%s must be > 0 when strides are given (give all four, or all zero for packed "
           "storage), got %lld",
           s.name, static_cast<long long>(s.value));
  if (p.layout == FD_LAYOUT_TOKEN_MAJOR && p.stride_dim != 1)
    fail(FD_ERR_INVALID_ARGUMENT, "stride_dim must be 1 for the token-major layout, got %lld",
         static_cast<long long>(p.stride_dim));
  if (p.layout == FD_LAYOUT_DIM_MAJOR && p.stride_token != 1)
    fail(FD_ERR_INVALID_ARGUMENT, "stride_token must be 1 for the dim-major layout, got %lld",
         static_cast<long long>(p.stride_token));
  const char *strided =
      "the K/V cache addressed by the given strides (stride_block, stride_head, stride_token, "
      "stride_dim times num_blocks, num_kv_heads, block_size, head_dim)";
  int64_t last = checked_mul(blocks - 1, p.stride_block, strided);
  last = checked_add(last, checked_mul(heads - 1, p.stride_head, strided), strided);
  last = checked_add(last, checked_mul(tokens - 1, p.stride_token, strided), strided);
  last = checked_add(last, checked_mul(dims - 1, p.stride_dim, strided), strided);
  pb.stride_block = p.stride_block;
  pb.stride_head = p.stride_head;
  pb.stride_token = p.stride_token;
  pb.stride_dim = p.stride_dim;
  return last + 1;
}

const char *const what_cache_bytes =
    "the K/V cache in bytes (num_blocks x num_kv_heads x block_size x head_dim, or the strides)";

bool overlaps(const void *a, int64_t a_bytes, const void *b, int64_t b_bytes) {
  return ranges_overlap(a, static_cast<size_t>(a_bytes), b, static_cast<size_t>(b_bytes));
}

}  // namespace

DecodeProblem resolve_decode_params(const fd_decode_params *params) {
  const fd_decode_params p = read_params(params);
  DecodeProblem pb;

  if (!dtype_valid(p.dtype))
    fail(FD_ERR_INVALID_ARGUMENT, "dtype %d is not an fd_dtype (f32 = 0, f16 = 1, bf16 = 2)",
         static_cast<int>(p.dtype));
  if (p.layout != FD_LAYOUT_TOKEN_MAJOR && p.layout != FD_LAYOUT_DIM_MAJOR)
    fail(FD_ERR_INVALID_ARGUMENT,
         "layout %d is not an fd_kv_layout (token-major = 0, dim-major = 1)",
         static_cast<int>(p.layout));
  if (p.device.type != FD_DEVICE_CPU && p.device.type != FD_DEVICE_CUDA)
    fail(FD_ERR_INVALID_ARGUMENT, "device.type %d is not an fd_device_type (CPU = 0, CUDA = 1)",
         static_cast<int>(p.device.type));
  if (p.device.type == FD_DEVICE_CPU && p.device.ordinal != 0)
    fail(FD_ERR_INVALID_ARGUMENT, "device.ordinal must be 0 for FD_DEVICE_CPU, got %d",
         static_cast<int>(p.device.ordinal));
  if (p.device.type == FD_DEVICE_CUDA && p.device.ordinal < 0)
    fail(FD_ERR_INVALID_ARGUMENT, "device.ordinal must be >= 0 for FD_DEVICE_CUDA, got %d",
         static_cast<int>(p.device.ordinal));

  require_positive(p.batch, "batch");
  require_positive(p.num_q_heads, "num_q_heads");
  require_positive(p.num_kv_heads, "num_kv_heads");
  if (p.num_q_heads % p.num_kv_heads != 0)
    fail(FD_ERR_INVALID_ARGUMENT,
         "num_q_heads (%u) must be a positive multiple of num_kv_heads (%u)", p.num_q_heads,
         p.num_kv_heads);
  require_positive(p.head_dim, "head_dim");
  require_positive(p.block_size, "block_size");
  require_positive(p.num_blocks, "num_blocks");
  require_positive(p.max_blocks_per_seq, "max_blocks_per_seq");
  if (!std::isfinite(p.sm_scale) || p.sm_scale < 0.f)
    fail(FD_ERR_INVALID_ARGUMENT, "sm_scale must be finite and >= 0 (0: 1/sqrt(head_dim)), got %g",
         static_cast<double>(p.sm_scale));
  if ((p.flags & ~kKnownFlags) != 0)
    fail(FD_ERR_INVALID_ARGUMENT, "flags 0x%x has unknown bits 0x%x", p.flags,
         p.flags & ~kKnownFlags);

  require_non_null(p.q, "q");
  require_non_null(p.k_cache, "k_cache");
  require_non_null(p.v_cache, "v_cache");
  require_non_null(p.block_tables, "block_tables");
  require_non_null(p.seq_lens, "seq_lens");
  require_non_null(p.out, "out");

  const size_t e = dtype_size(p.dtype);
  require_aligned(p.q, e, "q");
  require_aligned(p.k_cache, e, "k_cache");
  require_aligned(p.v_cache, e, "v_cache");
  require_aligned(p.out, e, "out");
  require_aligned(p.block_tables, sizeof(int32_t), "block_tables");
  require_aligned(p.seq_lens, sizeof(int32_t), "seq_lens");

  const int64_t cache_elems = resolve_strides(p, pb);
  const int64_t elem = static_cast<int64_t>(dtype_size(p.dtype));
  const char *qo = "q/out (batch x num_q_heads x head_dim elements)";
  const int64_t qo_bytes =
      checked_mul(checked_mul(checked_mul(p.batch, p.num_q_heads, qo), p.head_dim, qo), elem, qo);
  const char *tables = "block_tables (batch x max_blocks_per_seq entries)";
  const int64_t table_bytes =
      checked_mul(checked_mul(p.batch, p.max_blocks_per_seq, tables), 4, tables);
  const int64_t cache_bytes = checked_mul(cache_elems, elem, what_cache_bytes);

  // A row's capacity in tokens: exact in 64 bits ((2^32 - 1)^2 < 2^64).
  const uint64_t capacity = uint64_t{p.max_blocks_per_seq} * p.block_size;
  if (p.max_seq_len_hint < 0 || static_cast<uint64_t>(p.max_seq_len_hint) > capacity)
    fail(FD_ERR_INVALID_ARGUMENT,
         "max_seq_len_hint must be in [0, max_blocks_per_seq*block_size = %llu], got %d",
         static_cast<unsigned long long>(capacity), static_cast<int>(p.max_seq_len_hint));
  if (p.num_splits < 0)
    fail(FD_ERR_INVALID_ARGUMENT, "num_splits must be >= 0 (0: automatic), got %d",
         static_cast<int>(p.num_splits));
  if (p.workspace == nullptr && p.workspace_size != 0)
    fail(FD_ERR_INVALID_ARGUMENT, "workspace is NULL but workspace_size is %zu", p.workspace_size);
  if (p.reserved0 != 0) fail(FD_ERR_INVALID_ARGUMENT, "reserved0 must be 0, got %u", p.reserved0);

  // The output is written while the inputs are still being read.
  const struct {
    const char *name;
    const void *ptr;
    int64_t bytes;
  } inputs[5] = {{"q", p.q, qo_bytes},
                 {"k_cache", p.k_cache, cache_bytes},
                 {"v_cache", p.v_cache, cache_bytes},
                 {"block_tables", p.block_tables, table_bytes},
                 {"seq_lens", p.seq_lens, 4 * static_cast<int64_t>(p.batch)}};
  for (const auto &in : inputs)
    if (overlaps(p.out, qo_bytes, in.ptr, in.bytes))
      fail(FD_ERR_INVALID_ARGUMENT, "out must not overlap %s", in.name);

  // FP32 storage is a CPU-backend feature (S1); every other CUDA limit is
  // checked by the CUDA backend itself.
  if (p.device.type == FD_DEVICE_CUDA && p.dtype == FD_DTYPE_F32)
    fail(FD_ERR_UNSUPPORTED, "dtype f32 is served by the CPU backend only, not by FD_DEVICE_CUDA");

  pb.dtype = p.dtype;
  pb.layout = p.layout;
  pb.batch = p.batch;
  pb.num_q_heads = p.num_q_heads;
  pb.num_kv_heads = p.num_kv_heads;
  pb.head_dim = p.head_dim;
  pb.block_size = p.block_size;
  pb.num_blocks = p.num_blocks;
  pb.max_blocks_per_seq = p.max_blocks_per_seq;
  pb.group_size = p.num_q_heads / p.num_kv_heads;
  pb.sm_scale = p.sm_scale > 0.f ? p.sm_scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  pb.q = p.q;
  pb.k = p.k_cache;
  pb.v = p.v_cache;
  pb.block_tables = p.block_tables;
  pb.seq_lens = p.seq_lens;
  pb.out = p.out;
  // seq_lens are int32, so a capacity beyond INT32_MAX never binds.
  const uint64_t max_len =
      p.max_seq_len_hint > 0 ? static_cast<uint64_t>(p.max_seq_len_hint) : capacity;
  pb.max_seq_len = static_cast<int32_t>(max_len < INT32_MAX ? max_len : INT32_MAX);
  pb.num_splits = p.num_splits;
  pb.workspace = p.workspace;
  pb.workspace_size = p.workspace_size;
  pb.device_type = p.device.type;
  pb.device_ordinal = p.device.ordinal;
  pb.stream = p.stream;
  pb.cpu_threads = p.cpu_threads;
  pb.flags = p.flags;
  return pb;
}

}  // namespace fd

extern "C" {

FD_API void fd_decode_params_init(fd_decode_params *params) {
  if (params != nullptr) *params = fd::default_params();
}

FD_API fd_status fd_decode_workspace_size(const fd_decode_params *params, size_t *bytes) {
  return fd::guard([&] {
    const fd::DecodeProblem problem = fd::resolve_decode_params(params);
    fd::require_non_null(bytes, "bytes");
    // The CPU backend keeps its partial results in per-thread host scratch.
    const size_t n =
        problem.device_type == FD_DEVICE_CPU ? 0 : fd::decode_cuda_workspace_size(problem);
    *bytes = n;
    return FD_OK;
  });
}

FD_API fd_status fd_decode(const fd_decode_params *params) {
  return fd::guard([&] {
    const fd::DecodeProblem problem = fd::resolve_decode_params(params);
    if (problem.device_type == FD_DEVICE_CPU) {
      // Host pointers: the indices are cheap to check, so they always are.
      fd::check_decode_indices(problem, problem.seq_lens, problem.block_tables);
      fd::decode_cpu(problem);
    } else {
      fd::decode_cuda(problem);
    }
    return FD_OK;
  });
}

}  // extern "C"
