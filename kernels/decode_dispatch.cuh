// Host side of the paged decode kernels: launches with programmatic stream
// serialization, the shared-memory preparation and the compile-time dispatch
// from a DecodeLaunch to one instantiation of decode_kernel and the merge
// (instantiated per element-type pair in decode_<dtype>.cu).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "decode_kernel.cuh"
#include "decode_merge.cuh"
#include "flashdec.h"

namespace fd {
namespace cuda {
namespace detail {

// Launches `kernel` with programmatic stream serialization (see pdl_wait):
// it may start while the previous kernel in the stream drains. Captured into
// a CUDA graph this becomes a programmatic edge.
template <class... Params, class... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), unsigned grid, unsigned threads, size_t smem,
                       cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

}  // namespace detail

// The Hopper kernel for several query tokens per row (decode_sm90.cu,
// compiled for sm_90a only): defined and instantiated there for 16-bit q =
// K/V (T) and head_dim 64 / 128.
namespace sm90 {
template <class T, int D>
cudaError_t prepare_attention();
template <class T, int D>
cudaError_t launch_attention(const detail::Params &p, cudaStream_t stream);
}  // namespace sm90

// Whether an instantiation of decode_kernel has an sm90 twin: several query
// tokens per row, 16-bit K/V of q's type, token-major, head_dim 64 or 128
// (a run takes it on a compute capability 9.0 device without attention
// variants: DecodeWorkList::sm90_device, Variant::is_plain).
template <class TQ, class TKV, int D, bool kDimMajor, bool kMulti>
constexpr bool kHasSm90 = kMulti && !kDimMajor && std::is_same<TQ, TKV>::value &&
                          !detail::KvType<TKV>::kFp8 && (D == 64 || D == 128);

// Whether an instantiation of decode_kernel has a deep twin (Config's
// kDeep): head_dim 128, 16-bit K/V, token-major, one query token per row. A
// run takes it when its plan chose it (DecodeWorkList::deep_stages) and it
// has no attention variant.
template <class TKV, int D, bool kDimMajor, bool kMulti>
constexpr bool kHasDeep = D == 128 && !kDimMajor && !kMulti && !detail::KvType<TKV>::kFp8;

// Whether an instantiation of decode_kernel has a swapped-operand twin
// (decode_swapped.cuh, staged by cp.async): FP8 K/V, one query token per
// row; token-major ones also a TMA-staged twin, and each of those in a
// second shape (Config's kDeep with kSwap). A run takes the twin when swapped_serves
// (attention/swap_choice.hpp, the rule the plan shares); the TMA twin when
// its plan chose it (DecodeWorkList::tma_stages) and the driver encodes the
// tensor maps (encode_kv_maps); the deep shape when its plan chose it
// (DecodeWorkList::deep_stages).
template <class TKV, int D, bool kDimMajor, bool kMulti>
constexpr bool kHasSwap = !kMulti && detail::KvType<TKV>::kFp8;
template <int D, bool kDeep = false>
using SwapConfig = detail::Config<D, 1, kDeep, true>;

// Dynamic shared memory of the TMA-staged swapped kernel: the stages, then
// one 8-byte mbarrier per stage.
template <int D, bool kDeep>
constexpr size_t kTmaSmemBytes =
    SwapConfig<D, kDeep>::kSmemBytes + 8 * SwapConfig<D, kDeep>::kStages;

// Encodes the TMA tensor maps the swapped FP8 kernel stages K and V through
// (p.tma_k, p.tma_v): each cache as a 4-d byte tensor whose dims 1-3 are the
// token in block, the KV head and the block, ordered by stride (the order
// goes to p.tma_pos), boxes of one block of one head,
// swizzled in 128-byte (head_dim 128) or 64-byte (64) spans as f8_tm_offset
// stages a tile. Host work only (no device call). The backend has already
// required what TMA requires too (positive strides and addresses in
// multiples of 16 bytes, src/cuda/decode_cuda.cpp check_supported); false
// for a stride of 2^40 bytes or more, when the driver lacks the entry point
// or refuses a map: the caller then takes the cp.async staging.
inline bool encode_kv_maps(const DecodeLaunch &l, detail::Params &p) {
  constexpr int64_t kMaxStride = int64_t{1} << 40;
  if (l.stride_token >= kMaxStride || l.stride_head >= kMaxStride || l.stride_block >= kMaxStride)
    return false;
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || fn == nullptr)
    return false;
  auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  const cuuint32_t dim_bytes = static_cast<cuuint32_t>(l.head_dim);
  const cuuint32_t block = 1u << l.block_size_log2;
  // Axes token, head, block with their extents and strides, in stride order.
  struct Axis {
    cuuint64_t extent, stride;
    cuuint32_t box;
    int which;  // 0 token, 1 head, 2 block
  };
  Axis axes[3] = {
      {block, static_cast<cuuint64_t>(l.stride_token), block, 0},
      {static_cast<cuuint64_t>(l.work.num_kv_heads), static_cast<cuuint64_t>(l.stride_head), 1, 1},
      {static_cast<cuuint64_t>(l.num_blocks), static_cast<cuuint64_t>(l.stride_block), 1, 2}};
  for (int i = 1; i < 3; ++i)
    for (int j = i; j > 0 && axes[j].stride < axes[j - 1].stride; --j)
      std::swap(axes[j], axes[j - 1]);
  const cuuint64_t dims[4] = {dim_bytes, axes[0].extent, axes[1].extent, axes[2].extent};
  const cuuint64_t strides[3] = {axes[0].stride, axes[1].stride, axes[2].stride};
  const cuuint32_t box[4] = {dim_bytes, axes[0].box, axes[1].box, axes[2].box};
  for (int i = 0; i < 3; ++i) p.tma_pos[axes[i].which] = static_cast<int8_t>(i + 1);
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const CUtensorMapSwizzle swizzle =
      l.head_dim == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  for (int i = 0; i < 2; ++i) {
    const CUresult r =
        encode(i == 0 ? &p.tma_k : &p.tma_v, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4,
               const_cast<void *>(i == 0 ? l.k : l.v), dims, strides, box, unit,
               CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return false;
  }
  return true;
}

// Sets the swapped kernels' (shape kDeep) dynamic shared memory limits.
template <class TQ, class TKV, int D, bool kDimMajor, bool kMulti, bool kDeep>
cudaError_t prepare_swapped() {
  cudaError_t err = cudaFuncSetAttribute(
      detail::decode_kernel<TQ, TKV, D, kDimMajor, kMulti, false, kDeep, true>,
      cudaFuncAttributeMaxDynamicSharedMemorySize, SwapConfig<D, kDeep>::kSmemBytes);
  if constexpr (kDimMajor) return err;  // (no TMA twin)
  if (err != cudaSuccess) return err;
  return cudaFuncSetAttribute(detail::decode_kernel_tma<TQ, TKV, D, kDeep>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, kTmaSmemBytes<D, kDeep>);
}

// Launches the swapped kernel of shape kDeep: TMA-staged when the plan chose
// it and the tensor maps encode, else by cp.async.
template <class TQ, class TKV, int D, bool kDimMajor, bool kMulti, bool kDeep>
cudaError_t launch_swapped(const DecodeLaunch &l, detail::Params &p, unsigned grid) {
  constexpr int kThreads = detail::Config<D>::kThreads;
  if (!kDimMajor && l.work.tma_stages && encode_kv_maps(l, p))
    return detail::launch_pdl(detail::decode_kernel_tma<TQ, TKV, D, kDeep>, grid, kThreads,
                              kTmaSmemBytes<D, kDeep>, l.stream, p);
  return detail::launch_pdl(
      detail::decode_kernel<TQ, TKV, D, kDimMajor, kMulti, false, kDeep, true>, grid, kThreads,
      SwapConfig<D, kDeep>::kSmemBytes, l.stream, p);
}

// Launches decode_kernel<TQ, TKV, D, layout> and the merge (defined per
// element-type pair in decode_<dtype>.cu so they compile in parallel).
template <class TQ, class TKV>
cudaError_t launch_decode_typed(const DecodeLaunch &launch);

// Raises the attention kernel's dynamic shared memory limit on the current
// device (a per-device, per-function setting that launches then rely on).
// Both instantiations: plain and with attention variants (a run takes the
// variant from its own params).
template <class TQ, class TKV, int D, bool kDimMajor, bool kMulti = false>
cudaError_t prepare_decode_variant(bool sm90 = false) {
  if constexpr (kHasSm90<TQ, TKV, D, kDimMajor, kMulti>) {
    if (sm90) {
      const cudaError_t err = sm90::prepare_attention<TQ, D>();
      if (err != cudaSuccess) return err;
    }
  } else {
    (void)sm90;
  }
  if constexpr (kHasDeep<TKV, D, kDimMajor, kMulti>) {
    const cudaError_t err = cudaFuncSetAttribute(
        detail::decode_kernel<TQ, TKV, D, kDimMajor, kMulti, false, true>,
        cudaFuncAttributeMaxDynamicSharedMemorySize, detail::Config<D, 2, true>::kSmemBytes);
    if (err != cudaSuccess) return err;
  }
  if constexpr (kHasSwap<TKV, D, kDimMajor, kMulti>) {
    cudaError_t err = prepare_swapped<TQ, TKV, D, kDimMajor, kMulti, false>();
    if constexpr (!kDimMajor)
      if (err == cudaSuccess) err = prepare_swapped<TQ, TKV, D, kDimMajor, kMulti, true>();
    if (err != cudaSuccess) return err;
  }
  const cudaError_t err = cudaFuncSetAttribute(
      detail::decode_kernel<TQ, TKV, D, kDimMajor, kMulti, false>,
      cudaFuncAttributeMaxDynamicSharedMemorySize, detail::Config<D, sizeof(TKV)>::kSmemBytes);
  if (err != cudaSuccess) return err;
  return cudaFuncSetAttribute(detail::decode_kernel<TQ, TKV, D, kDimMajor, kMulti, true>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              detail::Config<D, sizeof(TKV)>::kSmemBytes);
}

// Prepares the variant of one element-type pair for `head_dim` and layout
// (defined per pair in decode_<dtype>.cu, beside launch_decode_typed).
template <class TQ, class TKV>
cudaError_t prepare_decode_typed(int32_t head_dim, bool dim_major, bool multi, bool sm90);

// Head dims of the kernels: 64 and 128 for every type pair, 96 and 256 for
// 16-bit K/V only (the host refuses them over FP8).
template <class TKV>
constexpr bool kServesWideDims = !detail::KvType<TKV>::kFp8;

// Calls f(std::integral_constant<int, D>, std::bool_constant<kDimMajor>)
// for the kernel shape of `head_dim` and layout over TKV, so that the
// preparation and the launch dispatch to the same set of instantiations;
// cudaErrorInvalidValue for a head_dim TKV has no kernels for.
template <class TKV, class F>
cudaError_t with_kernel_shape(int32_t head_dim, bool dim_major, F &&f) {
  auto layout = [&](auto d) {
    return dim_major ? f(d, std::true_type{}) : f(d, std::false_type{});
  };
  if constexpr (kServesWideDims<TKV>) {
    if (head_dim == 96) return layout(std::integral_constant<int, 96>{});
    if (head_dim == 256) return layout(std::integral_constant<int, 256>{});
  }
  if (head_dim == 128) return layout(std::integral_constant<int, 128>{});
  if (head_dim == 64) return layout(std::integral_constant<int, 64>{});
  return cudaErrorInvalidValue;
}

template <class TQ, class TKV, bool kMulti>
cudaError_t prepare_decode_layouts(int32_t head_dim, bool dim_major, bool sm90) {
  return with_kernel_shape<TKV>(head_dim, dim_major, [&](auto d, auto dim_major_t) {
    return prepare_decode_variant<TQ, TKV, decltype(d)::value, decltype(dim_major_t)::value,
                                  kMulti>(sm90);
  });
}

template <class TQ, class TKV>
cudaError_t prepare_decode_dispatch(int32_t head_dim, bool dim_major, bool multi, bool sm90) {
  return multi ? prepare_decode_layouts<TQ, TKV, true>(head_dim, dim_major, sm90)
               : prepare_decode_layouts<TQ, TKV, false>(head_dim, dim_major, sm90);
}

// Launches one variant; prepare_decode_variant must have run on this device.
template <class TQ, class TKV, int D, bool kDimMajor, bool kMulti = false>
cudaError_t launch_decode_variant(const DecodeLaunch &l) {
  using Cfg = detail::Config<D, sizeof(TKV)>;
  auto kernel = l.variant.is_plain() ? detail::decode_kernel<TQ, TKV, D, kDimMajor, kMulti, false>
                                     : detail::decode_kernel<TQ, TKV, D, kDimMajor, kMulti, true>;
  cudaError_t err = cudaSuccess;
  detail::Params p;
  p.q = l.q;
  p.k = l.k;
  p.v = l.v;
  p.out = l.out;
  p.block_tables = l.block_tables;
  p.seq_lens = l.seq_lens;
  p.q_indptr = l.q_indptr;
  p.stride_block = l.stride_block;
  p.stride_head = l.stride_head;
  p.stride_token = l.stride_token;
  p.stride_dim = l.stride_dim;
  p.block_bytes = static_cast<uint64_t>(l.stride_block) * sizeof(TKV);
  p.token_bytes = static_cast<uint64_t>(l.stride_token) * sizeof(TKV);
  p.dim_bytes = static_cast<uint64_t>(l.stride_dim) * sizeof(TKV);
  p.block_size_log2 = l.block_size_log2;
  p.num_blocks = l.num_blocks;
  p.max_blocks_per_seq = l.max_blocks_per_seq;
  // 1, 2 or 4 m-tiles (the warps split evenly among them) for a query tile's
  // rows.
  const int query_rows = (kMulti ? l.work.q_tile_tokens : 1) * l.work.group_size;
  p.m_tiles = query_rows <= 16 ? 1 : (query_rows <= 32 ? 2 : 4);
  p.work = l.work;
  p.variant = VariantPolicy::of(l.variant);
  p.sinks = l.variant.sinks;
  // The K scale multiplies every dot product: folded into the logit scale.
  p.variant.log2_scale *= l.k_scale;
  p.v_scale = l.v_scale;
  p.q_bf16 = l.q_dtype == FD_DTYPE_BF16;
  p.partial_o = l.partial_o;
  p.partial_ml = l.partial_ml;
  const unsigned grid = static_cast<unsigned>(l.work.size());
  bool launched = false;
  if constexpr (kHasSm90<TQ, TKV, D, kDimMajor, kMulti>) {
    const int64_t rows = static_cast<int64_t>(l.work.q_tile_tokens) * l.work.group_size;
    if (l.work.sm90_device && sm90_serves(l.q_dtype, l.kv_dtype, l.dim_major, l.head_dim,
                                          l.work.max_q_len, rows, l.variant.is_plain())) {
      err = sm90::launch_attention<TQ, D>(p, l.stream);
      launched = true;
    }
  }
  if constexpr (kHasDeep<TKV, D, kDimMajor, kMulti>) {
    if (l.work.deep_stages && l.variant.is_plain()) {
      err = detail::launch_pdl(detail::decode_kernel<TQ, TKV, D, kDimMajor, kMulti, false, true>,
                               grid, Cfg::kThreads, detail::Config<D, 2, true>::kSmemBytes,
                               l.stream, p);
      launched = true;
    }
  }
  if constexpr (kHasSwap<TKV, D, kDimMajor, kMulti>) {
    if (swapped_serves(l.kv_dtype, l.work.max_q_len, l.work.group_size, l.variant.is_plain())) {
      if constexpr (!kDimMajor)
        err = l.work.deep_stages ? launch_swapped<TQ, TKV, D, kDimMajor, kMulti, true>(l, p, grid)
                                 : launch_swapped<TQ, TKV, D, kDimMajor, kMulti, false>(l, p, grid);
      else
        err = launch_swapped<TQ, TKV, D, kDimMajor, kMulti, false>(l, p, grid);
      launched = true;
    }
  }
  if (!launched)
    err = detail::launch_pdl(kernel, grid, Cfg::kThreads, Cfg::kSmemBytes, l.stream, p);
  if (err != cudaSuccess || !l.work.has_partials()) return err;
  const int rows_heads = static_cast<int>(l.work.query_rows());
  const detail::MergeShape m = detail::merge_shape(rows_heads, l.work.slot_splits(), D);
  // The output has q's type: TQ, or by q_dtype over FP8 K/V.
  auto merge = detail::decode_merge_kernel<TQ, D, kMulti>;
  if (detail::KvType<TKV>::kFp8 && p.q_bf16)
    merge = detail::decode_merge_kernel<__nv_bfloat16, D, kMulti>;
  return detail::launch_pdl(merge, static_cast<unsigned>(m.ctas), 32 * m.wph * m.heads_per_cta,
                            m.smem_bytes(D), l.stream, l.partial_o, l.partial_ml, l.seq_lens,
                            l.q_indptr, l.out, l.work, l.max_blocks_per_seq << l.block_size_log2,
                            m.wph, m.heads_per_cta, l.v_scale, p.variant, p.sinks);
}

template <class TQ, class TKV, bool kMulti>
cudaError_t launch_decode_layouts(const DecodeLaunch &l) {
  return with_kernel_shape<TKV>(l.head_dim, l.dim_major, [&](auto d, auto dim_major_t) {
    return launch_decode_variant<TQ, TKV, decltype(d)::value, decltype(dim_major_t)::value, kMulti>(
        l);
  });
}

// Several query tokens per row (the plan's max_q_len > 1) take their own
// instantiation, so plain decode runs the one-token code unchanged.
template <class TQ, class TKV>
cudaError_t launch_decode_dispatch(const DecodeLaunch &l) {
  return l.work.max_q_len > 1 ? launch_decode_layouts<TQ, TKV, true>(l)
                              : launch_decode_layouts<TQ, TKV, false>(l);
}

}  // namespace cuda
}  // namespace fd
