// The decode front end: reads the caller's (possibly older) fd_decode_params,
// checks every host-known value and resolves defaults into a DecodeProblem.
// Nothing runs before every check has passed, so a failing call writes
// nothing. Planning and running live in decode_plan.cpp.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attention/decode_problem.hpp"
#include "attention/paged_kv.hpp"
#include "core/arg_checks.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/versioned.hpp"

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
  p.q_dtype = FD_DTYPE_BF16;
  p.kv_dtype = FD_DTYPE_BF16;
  p.out_dtype = FD_DTYPE_BF16;
  p.layout = FD_LAYOUT_TOKEN_MAJOR;
  p.device.type = FD_DEVICE_CPU;
  p.device.ordinal = 0;
  p.k_scale = 1.f;
  p.v_scale = 1.f;
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
// through the shared checked_extent_mul (core/arg_checks.hpp), whose
// message names the parameters (`what`). Operands are never negative here
// (sizes are checked > 0 and given strides > 0 first), and results stay
// below kMaxOpElements, so they convert to int64 exactly.
int64_t checked_mul(int64_t a, int64_t b, const char *what) {
  return static_cast<int64_t>(
      checked_extent_mul(static_cast<uint64_t>(a), static_cast<uint64_t>(b), what));
}

bool overlaps(const void *a, int64_t a_bytes, const void *b, int64_t b_bytes) {
  return ranges_overlap(a, static_cast<size_t>(a_bytes), b, static_cast<size_t>(b_bytes));
}

// q_dtype and out_dtype: a compute type (FP8 is a storage type: K/V only).
void require_dtype(int32_t dtype, const char *name) {
  if (dtype_is_fp8(dtype))
    fail(FD_ERR_INVALID_ARGUMENT,
         "%s %d (%s) is a storage type (K/V only, kv_dtype): %s must be f32, f16 or bf16", name,
         static_cast<int>(dtype), dtype_name(dtype), name);
  if (!dtype_valid(dtype))
    fail(FD_ERR_INVALID_ARGUMENT, "%s %d is not an fd_dtype (f32 = 0, f16 = 1, bf16 = 2)", name,
         static_cast<int>(dtype));
}

void require_kv_dtype(int32_t dtype) {
  if (!kv_dtype_valid(dtype))
    fail(FD_ERR_INVALID_ARGUMENT,
         "kv_dtype %d is not an fd_dtype (f32 = 0, f16 = 1, bf16 = 2, fp8_e4m3 = 3, fp8_e5m2 = 4)",
         static_cast<int>(dtype));
}

// A dequantisation scale (S1.1): finite and > 0.
void require_scale(float scale, const char *name) {
  if (!std::isfinite(scale) || scale <= 0.f)
    fail(FD_ERR_INVALID_ARGUMENT, "%s must be finite and > 0 (1: none), got %g", name,
         static_cast<double>(scale));
}

// The element-type combinations served (docs/semantics.md S1, S1.1),
// checked after every invalid-argument check. The CPU backend serves them
// all: q_dtype and out_dtype each f32, f16 or bf16 over any kv_dtype. f32 is
// a CPU type; which combinations of the others the CUDA kernels serve is
// their own check (backend::cuda_plan_decode), made when the call is
// planned, before anything runs.
void check_served_dtypes(const fd_decode_params &p) {
  if (p.device.type != FD_DEVICE_CUDA) return;
  const struct {
    const char *name;
    int32_t dtype;
  } fields[] = {{"kv_dtype", p.kv_dtype}, {"q_dtype", p.q_dtype}, {"out_dtype", p.out_dtype}};
  for (const auto &f : fields)
    if (f.dtype == FD_DTYPE_F32)
      fail(FD_ERR_UNSUPPORTED, "%s f32 is served by the CPU backend only, not by FD_DEVICE_CUDA",
           f.name);
}

// Query lengths: several query tokens per row (q_indptr). The CUDA backend
// cannot read the device's q_indptr on the host, so there the hint bounds
// the rows and sizes the plan (its own limits: backend check_supported).
void check_served_queries(const fd_decode_params &p) {
  if (p.max_q_len_hint < 0)
    fail(FD_ERR_INVALID_ARGUMENT, "max_q_len_hint must be >= 0 (0: no bound given), got %d",
         static_cast<int>(p.max_q_len_hint));
  if (p.device.type == FD_DEVICE_CUDA && p.q_indptr != nullptr && p.max_q_len_hint == 0)
    fail(FD_ERR_INVALID_ARGUMENT,
         "max_q_len_hint must be > 0 with q_indptr on CUDA: the host plans from it and cannot "
         "read the device's q_indptr");
}

// Query tokens in all: q_indptr[batch] (host memory: the CPU backend), read
// only where a run needs the extent of q and out; the entries themselves are
// checked with the other indices (check_decode_indices) before anything runs.
int64_t query_tokens(const fd_decode_params &p, bool run) {
  if (p.q_indptr == nullptr) return p.batch;
  if (!run || p.device.type == FD_DEVICE_CUDA) {
    // A plan reads no buffer, and the host cannot read a device q_indptr:
    // the overlap checks take the extent every row has (one token).
    return p.batch;
  }
  const int32_t total = p.q_indptr[p.batch];
  if (total < static_cast<int64_t>(p.batch))
    fail(FD_ERR_INVALID_ARGUMENT,
         "q_indptr[batch] = %d is smaller than batch (%u): every row needs at least one query "
         "token",
         static_cast<int>(total), p.batch);
  return total;
}

}  // namespace

DecodeProblem resolve_decode_params(const fd_decode_params *params, DecodeUse use) {
  const fd_decode_params p = read_params(params);
  DecodeProblem pb;

  require_dtype(p.q_dtype, "q_dtype");
  require_kv_dtype(p.kv_dtype);
  require_dtype(p.out_dtype, "out_dtype");
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
  if (!std::isfinite(p.logit_softcap) || p.logit_softcap < 0.f)
    fail(FD_ERR_INVALID_ARGUMENT, "logit_softcap must be finite and >= 0 (0: none), got %g",
         static_cast<double>(p.logit_softcap));
  if (p.sliding_window < 0)
    fail(FD_ERR_INVALID_ARGUMENT, "sliding_window must be >= 0 (0: none), got %d",
         static_cast<int>(p.sliding_window));
  require_scale(p.k_scale, "k_scale");
  require_scale(p.v_scale, "v_scale");
  if ((p.flags & ~kKnownFlags) != 0)
    fail(FD_ERR_INVALID_ARGUMENT, "flags 0x%x has unknown bits 0x%x", p.flags,
         p.flags & ~kKnownFlags);

  // What 0.2 does not serve is refused before the buffers are looked at.
  check_served_queries(p);
  check_served_dtypes(p);

  const bool run = use == DecodeUse::run;
  if (run) {
    require_non_null(p.q, "q");
    require_non_null(p.k_cache, "k_cache");
    require_non_null(p.v_cache, "v_cache");
    require_non_null(p.block_tables, "block_tables");
    require_non_null(p.seq_lens, "seq_lens");
    require_non_null(p.out, "out");
  }

  const size_t q_elem = dtype_size(p.q_dtype), kv_elem = dtype_size(p.kv_dtype),
               out_elem = dtype_size(p.out_dtype);
  require_aligned(p.q, q_elem, "q");
  require_aligned(p.k_cache, kv_elem, "k_cache");
  require_aligned(p.v_cache, kv_elem, "v_cache");
  require_aligned(p.out, out_elem, "out");
  require_aligned(p.block_tables, sizeof(int32_t), "block_tables");
  require_aligned(p.seq_lens, sizeof(int32_t), "seq_lens");
  require_aligned(p.q_indptr, sizeof(int32_t), "q_indptr");
  require_aligned(p.sinks, sizeof(float), "sinks");

  pb.kv = resolve_paged_kv(paged_kv_request(p, p.kv_dtype, p.num_blocks), "");

  const char *qo = "q/out (query tokens x num_q_heads x head_dim elements)";
  const int64_t q_tokens = query_tokens(p, run);
  const int64_t q_elems = checked_mul(checked_mul(q_tokens, p.num_q_heads, qo), p.head_dim, qo);
  const int64_t q_bytes = checked_mul(q_elems, static_cast<int64_t>(q_elem), qo);
  const int64_t out_bytes = checked_mul(q_elems, static_cast<int64_t>(out_elem), qo);
  const char *tables = "block_tables (batch x max_blocks_per_seq entries)";
  const int64_t table_bytes =
      checked_mul(checked_mul(p.batch, p.max_blocks_per_seq, tables), 4, tables);

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

  // The output is written while the inputs are still being read.
  const struct {
    const char *name;
    const void *ptr;
    int64_t bytes;
  } inputs[6] = {{"q", p.q, q_bytes},
                 {"k_cache", p.k_cache, pb.kv.span_bytes},
                 {"v_cache", p.v_cache, pb.kv.span_bytes},
                 {"block_tables", p.block_tables, table_bytes},
                 {"seq_lens", p.seq_lens, 4 * static_cast<int64_t>(p.batch)},
                 {"q_indptr", p.q_indptr,
                  p.q_indptr != nullptr ? 4 * (static_cast<int64_t>(p.batch) + 1) : 0}};
  for (const auto &in : inputs)
    if (run && overlaps(p.out, out_bytes, in.ptr, in.bytes))
      fail(FD_ERR_INVALID_ARGUMENT, "out must not overlap %s", in.name);

  pb.batch = p.batch;
  pb.num_q_heads = p.num_q_heads;
  pb.num_kv_heads = p.num_kv_heads;
  pb.head_dim = p.head_dim;
  pb.group_size = p.num_q_heads / p.num_kv_heads;
  pb.q_dtype = p.q_dtype;
  pb.out_dtype = p.out_dtype;
  pb.k = p.k_cache;
  pb.v = p.v_cache;
  pb.max_blocks_per_seq = p.max_blocks_per_seq;
  pb.block_tables = p.block_tables;
  pb.seq_lens = p.seq_lens;
  pb.q = p.q;
  pb.out = p.out;
  pb.q_indptr = p.q_indptr;
  pb.q_tokens = q_tokens;
  // The plan sizes its work list from the hint (a plan may be made before
  // q_indptr is known); without q_indptr every row still has one token.
  pb.max_q_len = p.max_q_len_hint > 0 ? p.max_q_len_hint : 1;
  pb.max_q_len_given = p.max_q_len_hint > 0;
  pb.variant.sm_scale =
      p.sm_scale > 0.f ? p.sm_scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  pb.variant.logit_softcap = p.logit_softcap;
  pb.variant.sliding_window = p.sliding_window;
  pb.variant.sinks = p.sinks;
  pb.k_scale = p.k_scale;
  pb.v_scale = p.v_scale;
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

extern "C" FD_API void fd_decode_params_init(fd_decode_params *params) {
  if (params != nullptr) *params = fd::default_params();
}
