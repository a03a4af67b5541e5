// fd_kv_append / fd_rope_kv_append: reads the caller's (possibly older)
// parameter struct, checks every host-known value, resolves defaults into an
// AppendProblem and dispatches to the CPU or the CUDA backend. Nothing is
// written before every check has passed.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attention/paged_kv.hpp"
#include "backend/backend.hpp"
#include "core/arg_checks.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/versioned.hpp"
#include "ops/kv_append.hpp"
#include "ops/rope.hpp"

namespace fd {
namespace {

// Every field up to and including `positions` is required; device and
// stream default to the CPU and the NULL stream.
constexpr size_t kMinParamsSize = offsetof(fd_kv_append_params, positions) + sizeof(void *);

fd_kv_append_params default_params() {
  fd_kv_append_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.dtype = FD_DTYPE_BF16;
  p.layout = FD_LAYOUT_TOKEN_MAJOR;
  p.rope_base = 10000.f;
  p.device.type = FD_DEVICE_CPU;
  p.cache_dtype = -1;
  p.k_scale = 1.f;
  p.v_scale = 1.f;
  return p;
}

// struct_size policy of core/versioned.hpp: an older caller's struct
// without device and stream runs on the CPU; a newer one is refused.
fd_kv_append_params read_params(const fd_kv_append_params *src) {
  return read_versioned<kMinParamsSize>(src, default_params(), "params");
}

void require_positive(uint32_t value, const char *name) {
  if (value == 0) fail(FD_ERR_INVALID_ARGUMENT, "params->%s must be > 0", name);
}

// The element types (S1.1): dtype (q, k, v, q_out) is a compute type;
// cache_dtype (-1: dtype) is a K/V type; scales are finite, > 0 and, unless
// the cache is FP8 (which quantises with them), 1. Returns the cache dtype.
int32_t resolve_dtypes(const fd_kv_append_params &p) {
  if (dtype_is_fp8(p.dtype))
    fail(FD_ERR_INVALID_ARGUMENT,
         "params->dtype %s is a storage type: dtype (q, k, v, q_out) must be f32, f16 or bf16; "
         "give the FP8 cache's type in cache_dtype",
         dtype_name(p.dtype));
  if (!dtype_valid(p.dtype))
    fail(FD_ERR_INVALID_ARGUMENT,
         "params->dtype %d is not an fd_dtype (f32 = 0, f16 = 1, bf16 = 2)",
         static_cast<int>(p.dtype));
  const int32_t cache = p.cache_dtype == -1 ? p.dtype : p.cache_dtype;
  if (!kv_dtype_valid(cache))
    fail(FD_ERR_INVALID_ARGUMENT,
         "params->cache_dtype %d is not an fd_dtype (-1: dtype, f32 = 0, f16 = 1, bf16 = 2, "
         "fp8_e4m3 = 3, fp8_e5m2 = 4)",
         static_cast<int>(p.cache_dtype));
  const struct {
    const char *name;
    float value;
  } scales[] = {{"k_scale", p.k_scale}, {"v_scale", p.v_scale}};
  for (const auto &sc : scales) {
    if (!std::isfinite(sc.value) || sc.value <= 0.f)
      fail(FD_ERR_INVALID_ARGUMENT, "params->%s must be finite and > 0 (1: none), got %g", sc.name,
           static_cast<double>(sc.value));
    if (!dtype_is_fp8(cache) && sc.value != 1.f)
      fail(FD_ERR_INVALID_ARGUMENT,
           "params->%s is %g, but scales quantise into an FP8 cache_dtype; with cache_dtype %s "
           "it must be 1",
           sc.name, static_cast<double>(sc.value), dtype_name(cache));
  }
  if (p.reserved1 != 0)
    fail(FD_ERR_INVALID_ARGUMENT, "params->reserved1 must be 0, got %u", p.reserved1);
  if (p.reserved2 != 0)
    fail(FD_ERR_INVALID_ARGUMENT, "params->reserved2 must be 0, got %u", p.reserved2);
  return cache;
}

// Combinations that are valid but not served; checked after every
// invalid-argument check.
void check_served_dtypes(const fd_kv_append_params &p, int32_t cache) {
  if (!dtype_is_fp8(cache) && cache != p.dtype)
    fail(FD_ERR_UNSUPPORTED,
         "params->cache_dtype %s with dtype %s is not served: a cache that is not FP8 takes its "
         "own type (cache_dtype -1 or equal to dtype)",
         dtype_name(cache), dtype_name(p.dtype));
}

AppendProblem resolve(const fd_kv_append_params *params, bool rope) {
  const fd_kv_append_params p = read_params(params);
  AppendProblem pb;
  if (p.reserved0 != 0)
    fail(FD_ERR_INVALID_ARGUMENT, "params->reserved0 must be 0, got %u", p.reserved0);
  const int32_t cache_dtype = resolve_dtypes(p);
  // The caches: dtype, layout, extents, strides and span (the one resolver).
  PagedKvRequest cache = paged_kv_request(p, cache_dtype, p.num_blocks);
  cache.packed_what = "params->k_cache/v_cache ([num_blocks, num_kv_heads, block_size, head_dim])";
  cache.span_what = "params->k_cache/v_cache (the elements its sizes and strides address)";
  pb.kv = resolve_paged_kv(cache, "params->");
  require_positive(p.num_tokens, "num_tokens");
  if (p.num_blocks > static_cast<uint32_t>(INT32_MAX) ||
      p.block_size > static_cast<uint32_t>(INT32_MAX))
    fail(FD_ERR_INVALID_ARGUMENT,
         "params->num_blocks %u and block_size %u must not exceed INT32_MAX", p.num_blocks,
         p.block_size);
  require_non_null(p.k, "params->k");
  require_non_null(p.v, "params->v");
  require_non_null(p.k_cache, "params->k_cache");
  require_non_null(p.v_cache, "params->v_cache");
  require_non_null(p.block_ids, "params->block_ids");
  require_non_null(p.offsets, "params->offsets");
  if (rope) {
    require_non_null(p.q, "params->q");
    require_non_null(p.q_out, "params->q_out");
    require_non_null(p.positions, "params->positions");
    if (p.num_q_heads == 0 || p.num_q_heads % p.num_kv_heads != 0)
      fail(FD_ERR_INVALID_ARGUMENT,
           "params->num_q_heads %u must be a positive multiple of num_kv_heads %u", p.num_q_heads,
           p.num_kv_heads);
    check_rope_args(p.head_dim, p.rotary_dim, p.rope_base);
    check_rope_style(p.rope_style, "params->rope_style");
  }
  if (p.device.type == FD_DEVICE_CPU) {
    if (p.device.ordinal != 0)
      fail(FD_ERR_INVALID_ARGUMENT, "params->device.ordinal must be 0 for a CPU device, got %d",
           p.device.ordinal);
  } else if (p.device.type == FD_DEVICE_CUDA) {
    if (p.device.ordinal < 0)
      fail(FD_ERR_INVALID_ARGUMENT, "params->device.ordinal must be >= 0, got %d",
           p.device.ordinal);
  } else {
    fail(FD_ERR_INVALID_ARGUMENT, "params->device.type %d is not an fd_device_type", p.device.type);
  }
  // Elements of the caches (ce) and of q, k, v and q_out (e).
  const size_t ce = pb.kv.element_bytes, e = dtype_size(p.dtype);
  const char *kv_what = "params->k/v ([num_tokens, num_kv_heads, head_dim])";
  const size_t kv_bytes = checked_extent_mul(
      checked_extent_mul(checked_extent_mul(p.num_tokens, p.num_kv_heads, kv_what), p.head_dim,
                         kv_what),
      e, kv_what);
  const struct {
    const void *ptr;
    size_t alignment;
    const char *name;
  } arrays[] = {{p.k, e, "params->k"},
                {p.v, e, "params->v"},
                {p.k_cache, ce, "params->k_cache"},
                {p.v_cache, ce, "params->v_cache"},
                {p.block_ids, 4, "params->block_ids"},
                {p.offsets, 4, "params->offsets"},
                {rope ? p.q : nullptr, e, "params->q"},
                {rope ? p.q_out : nullptr, e, "params->q_out"},
                {rope ? p.positions : nullptr, 4, "params->positions"}};
  for (const auto &a : arrays) require_aligned(a.ptr, a.alignment, a.name);
  if (rope) {
    const char *q_what = "params->q ([num_tokens, num_q_heads, head_dim])";
    const size_t q_bytes = checked_extent_mul(
        checked_extent_mul(checked_extent_mul(p.num_tokens, p.num_q_heads, q_what), p.head_dim,
                           q_what),
        e, q_what);
    if (p.q_out != p.q && ranges_overlap(p.q_out, q_bytes, p.q, q_bytes))
      fail(FD_ERR_INVALID_ARGUMENT, "params->q_out must equal q or not overlap it");
    if (ranges_overlap(p.q_out, q_bytes, p.k, kv_bytes) ||
        ranges_overlap(p.q_out, q_bytes, p.v, kv_bytes))
      fail(FD_ERR_INVALID_ARGUMENT, "params->q_out must not overlap k or v");
  }

  check_served_dtypes(p, cache_dtype);
  pb.src_dtype = p.dtype;
  pb.k_scale = p.k_scale;
  pb.v_scale = p.v_scale;
  pb.num_tokens = p.num_tokens;
  pb.num_q_heads = rope ? p.num_q_heads : 0;
  pb.rotary_dim = rope ? p.rotary_dim : 0;
  pb.rope_base = p.rope_base;
  pb.rope_style = rope ? p.rope_style : FD_ROPE_SPLIT_HALF;
  pb.q = rope ? p.q : nullptr;
  pb.q_out = rope ? p.q_out : nullptr;
  pb.k = p.k;
  pb.v = p.v;
  pb.k_cache = p.k_cache;
  pb.v_cache = p.v_cache;
  pb.block_ids = p.block_ids;
  pb.offsets = p.offsets;
  pb.positions = rope ? p.positions : nullptr;
  pb.device_type = p.device.type;
  pb.device_ordinal = p.device.ordinal;
  pb.stream = p.stream;
  return pb;
}

fd_status run(const fd_kv_append_params *params, bool rope) {
  return guard([&] {
    const AppendProblem pb = resolve(params, rope);
    if (pb.device_type == FD_DEVICE_CUDA) {
      backend::cuda_kv_append(pb);
    } else {
      check_append_indices(pb, pb.block_ids, pb.offsets, pb.positions);
      kv_append_cpu(pb);
    }
    return FD_OK;
  });
}

}  // namespace

void check_append_indices(const AppendProblem &p, const int32_t *block_ids, const int32_t *offsets,
                          const int32_t *positions) {
  for (uint32_t i = 0; i < p.num_tokens; ++i) {
    if (block_ids[i] < 0 || static_cast<uint32_t>(block_ids[i]) >= p.kv.num_blocks)
      fail(FD_ERR_INVALID_ARGUMENT, "block_ids[%u] = %d is out of range [0, %u) (num_blocks)", i,
           block_ids[i], p.kv.num_blocks);
    if (offsets[i] < 0 || static_cast<uint32_t>(offsets[i]) >= p.kv.block_size)
      fail(FD_ERR_INVALID_ARGUMENT, "offsets[%u] = %d is out of range [0, %u) (block_size)", i,
           offsets[i], p.kv.block_size);
    if (positions != nullptr && positions[i] < 0)
      fail(FD_ERR_INVALID_ARGUMENT, "positions[%u] = %d must be >= 0", i, positions[i]);
  }
}

}  // namespace fd

extern "C" {

FD_API void fd_kv_append_params_init(fd_kv_append_params *params) {
  if (params != nullptr) *params = fd::default_params();
}

FD_API fd_status fd_kv_append(const fd_kv_append_params *params) {
  return fd::run(params, false);
}

FD_API fd_status fd_rope_kv_append(const fd_kv_append_params *params) {
  return fd::run(params, true);
}

}  // extern "C"
