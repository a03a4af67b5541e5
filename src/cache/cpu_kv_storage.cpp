// Host-memory K/V storage of the CPU backend. Layer writes take K, V (and
// Q) in the geometry's input_dtype; an FP8 storage quantises them with the
// layer's scales (S1.1).
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cache/kv_storage.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "ops/rope.hpp"

namespace fd {
namespace {

struct FreeDeleter {
  void operator()(unsigned char *p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<unsigned char, FreeDeleter>;

// calloc: zero-initialised, and large caches get lazily zeroed pages instead
// of being written up front.
HostBuffer allocate_zeroed(size_t bytes, const char *what) {
  unsigned char *p = static_cast<unsigned char *>(std::calloc(bytes == 0 ? 1 : bytes, 1));
  if (p == nullptr)
    fail(FD_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory for the %s cache", bytes,
         what);
  return HostBuffer(p);
}

class CpuKvStorage final : public KvStorage {
 public:
  explicit CpuKvStorage(const KvGeometry &g)
      : g_(g),
        elem_(g.element_size()),
        fp8_(dtype_is_fp8(g.dtype)),
        block_packed_(g.block_packed()) {
    if (g.external()) {
      // The caller's memory, with the caller's strides; not cleared.
      k_base_ = static_cast<unsigned char *>(g.ext_k);
      v_base_ = static_cast<unsigned char *>(g.ext_v);
    } else {
      k_ = allocate_zeroed(g.total_elements() * g.element_size(), "K");
      v_ = allocate_zeroed(g.total_elements() * g.element_size(), "V");
      k_base_ = k_.get();
      v_base_ = v_.get();
    }
    // Resolved for both (owned storage is packed).
    layer_stride_ = static_cast<size_t>(g.stride_layer);
    strides_[0] = g.stride_block;
    strides_[1] = g.stride_head;
    strides_[2] = g.stride_token;
    strides_[3] = g.stride_dim;
  }

  void write_layer(uint32_t layer, const RowLocation *rows, size_t num_rows, const void *k,
                   const void *v, fd_stream) override {
    scatter(k_base_, layer, rows, num_rows, k, g_.input_dtype, key_scale(layer));
    scatter(v_base_, layer, rows, num_rows, v, g_.input_dtype, value_scale(layer));
  }

  void write_layer_rope(uint32_t layer, const RowLocation *rows, const int32_t *positions,
                        size_t num_rows, const void *q, uint32_t num_q_heads, const void *k,
                        const void *v, uint32_t rotary_dim, float rope_base, void *q_out,
                        fd_stream) override {
    // K is rotated into scratch; Q is rotated last so that a q_out that
    // overlaps k or v cannot corrupt what gets stored.
    // (The scratch is a member reused by every call: no allocation per layer.)
    // Every allocation happens before the first store, so a failure (out of
    // memory) leaves the cache unchanged. Into FP8 the rotated K stays FP32
    // and is rounded once, to FP8 (S1.1).
    const size_t k_elems = num_rows * g_.num_kv_heads * g_.head_dim;
    const int32_t rot_dtype = fp8_ ? FD_DTYPE_F32 : g_.input_dtype;
    k_rot_.resize(k_elems * dtype_size(rot_dtype));
    rope_scratch_.resize(rope_scratch_floats(rotary_dim));
    if (fp8_) {
      convert_elements(k, g_.input_dtype, k_rot_.data(), FD_DTYPE_F32, k_elems, 1, 1.f);
      k = k_rot_.data();
    }
    rope_rotate(rot_dtype, k, k_rot_.data(), num_rows, g_.num_kv_heads, g_.head_dim, positions,
                rotary_dim, rope_base, g_.rope_style, rope_scratch_.data());
    scatter(k_base_, layer, rows, num_rows, k_rot_.data(), rot_dtype, key_scale(layer));
    scatter(v_base_, layer, rows, num_rows, v, g_.input_dtype, value_scale(layer));
    rope_rotate(g_.input_dtype, q, q_out, num_rows, num_q_heads, g_.head_dim, positions, rotary_dim,
                rope_base, g_.rope_style, rope_scratch_.data());
  }

  void copy_blocks_in(const int32_t *blocks, size_t num_blocks, const void *k_blocks,
                      const void *v_blocks, fd_stream) override {
    copy_in(k_base_, blocks, num_blocks, static_cast<const unsigned char *>(k_blocks));
    copy_in(v_base_, blocks, num_blocks, static_cast<const unsigned char *>(v_blocks));
  }

  LayerStorage layer(uint32_t layer) override {
    LayerStorage s;
    const size_t offset = static_cast<size_t>(layer) * layer_stride_ * elem_;
    s.k = k_base_ + offset;
    s.v = v_base_ + offset;
    for (int i = 0; i < 4; ++i) s.strides[i] = strides_[i];
    return s;
  }

 private:
  // The layer's quantisation scales (1 for a storage that is not FP8).
  float key_scale(uint32_t layer) const { return fp8_ ? k_scale(layer) : 1.f; }
  float value_scale(uint32_t layer) const { return fp8_ ? v_scale(layer) : 1.f; }

  // src: [rows, num_kv_heads, head_dim] of src_dtype; element (r, h, d)
  // goes to token rows[r].offset of block rows[r].block, head h, dim d,
  // divided by `scale` (convert_elements: a plain copy for the storage's
  // own type at scale 1).
  void scatter(unsigned char *base, uint32_t layer, const RowLocation *rows, size_t num_rows,
               const void *src, int32_t src_dtype, float scale) const {
    unsigned char *layer_base = base + static_cast<size_t>(layer) * layer_stride_ * elem_;
    const size_t d = g_.head_dim, src_elem = dtype_size(src_dtype);
    const auto *from = static_cast<const unsigned char *>(src);
    for (size_t r = 0; r < num_rows; ++r) {
      for (size_t h = 0; h < g_.num_kv_heads; ++h) {
        const size_t dst = static_cast<size_t>(rows[r].block) * size_t(strides_[0]) +
                           h * size_t(strides_[1]) + size_t(rows[r].offset) * size_t(strides_[2]);
        convert_elements(from + (r * g_.num_kv_heads + h) * d * src_elem, src_dtype,
                         layer_base + dst * elem_, g_.dtype, d, strides_[3], scale);
      }
    }
  }

  // src: [num_layers, num_blocks, block] with blocks packed in the layout's
  // order ([heads, block_size, head_dim] or [heads, head_dim, block_size]).
  void copy_in(unsigned char *base, const int32_t *blocks, size_t num_blocks,
               const unsigned char *src) const {
    const size_t block_bytes = g_.block_elements() * elem_;
    const bool dim_major = g_.dim_major();
    // Packed source rows: head_dim elements per token (token-major) or
    // block_size per dim (dim-major); the destination's row pitch is the
    // other axis' stride (its contiguous axis has stride 1).
    const size_t rows = dim_major ? g_.head_dim : g_.block_size;
    const size_t row_elems = dim_major ? g_.block_size : g_.head_dim;
    const size_t pitch = size_t(dim_major ? strides_[3] : strides_[2]);
    for (size_t l = 0; l < g_.num_layers; ++l)
      for (size_t i = 0; i < num_blocks; ++i) {
        const unsigned char *from = src + (l * num_blocks + i) * block_bytes;
        unsigned char *to =
            base + (l * layer_stride_ + size_t(blocks[i]) * size_t(strides_[0])) * elem_;
        if (block_packed_) {
          std::memcpy(to, from, block_bytes);
          continue;
        }
        for (size_t h = 0; h < g_.num_kv_heads; ++h)
          for (size_t r = 0; r < rows; ++r)
            std::memcpy(to + (h * size_t(strides_[1]) + r * pitch) * elem_,
                        from + (h * rows + r) * row_elems * elem_, row_elems * elem_);
      }
  }

  KvGeometry g_;
  size_t elem_;
  bool fp8_;           // quantises on write with the layer's scales
  bool block_packed_;  // a block is block_elements() contiguous packed elements
  HostBuffer k_;       // owned storage (null for external storage)
  HostBuffer v_;
  unsigned char *k_base_ = nullptr;
  unsigned char *v_base_ = nullptr;
  size_t layer_stride_ = 0;  // elements
  int64_t strides_[4];
  std::vector<unsigned char> k_rot_;  // write_layer_rope's rotated K
  std::vector<float> rope_scratch_;   // write_layer_rope's RoPE tables (see rope_rotate)
};

}  // namespace

std::unique_ptr<KvStorage> make_cpu_kv_storage(const KvGeometry &geometry) {
  check_geometry_size(geometry);
  return std::unique_ptr<KvStorage>(new CpuKvStorage(geometry));
}

}  // namespace fd
