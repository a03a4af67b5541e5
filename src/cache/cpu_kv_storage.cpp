// Host-memory K/V storage of the CPU backend.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cache/kv_storage.hpp"
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
        k_(allocate_zeroed(g.total_elements() * g.element_size(), "K")),
        v_(allocate_zeroed(g.total_elements() * g.element_size(), "V")) {
    g_.strides(strides_);
  }

  void write_layer(uint32_t layer, const RowLocation *rows, size_t num_rows, const void *k,
                   const void *v, fd_stream) override {
    scatter(k_.get(), layer, rows, num_rows, static_cast<const unsigned char *>(k));
    scatter(v_.get(), layer, rows, num_rows, static_cast<const unsigned char *>(v));
  }

  void write_layer_rope(uint32_t layer, const RowLocation *rows, const int32_t *positions,
                        size_t num_rows, const void *q, uint32_t num_q_heads, const void *k,
                        const void *v, uint32_t rotary_dim, float rope_base, void *q_out,
                        fd_stream) override {
    // K is rotated into scratch; Q is rotated last so that a q_out that
    // overlaps k or v cannot corrupt what gets stored.
    std::vector<unsigned char> k_rot(num_rows * g_.num_kv_heads * g_.head_dim * elem_);
    rope_rotate(g_.dtype, k, k_rot.data(), num_rows, g_.num_kv_heads, g_.head_dim, positions,
                rotary_dim, rope_base);
    scatter(k_.get(), layer, rows, num_rows, k_rot.data());
    scatter(v_.get(), layer, rows, num_rows, static_cast<const unsigned char *>(v));
    rope_rotate(g_.dtype, q, q_out, num_rows, num_q_heads, g_.head_dim, positions, rotary_dim,
                rope_base);
  }

  void copy_blocks_in(const int32_t *blocks, size_t num_blocks, const void *k_blocks,
                      const void *v_blocks, fd_stream) override {
    copy_in(k_.get(), blocks, num_blocks, static_cast<const unsigned char *>(k_blocks));
    copy_in(v_.get(), blocks, num_blocks, static_cast<const unsigned char *>(v_blocks));
  }

  LayerStorage layer(uint32_t layer) override {
    LayerStorage s;
    const size_t offset = static_cast<size_t>(layer) * g_.layer_elements() * elem_;
    s.k = k_.get() + offset;
    s.v = v_.get() + offset;
    for (int i = 0; i < 4; ++i) s.strides[i] = strides_[i];
    return s;
  }

 private:
  // src: [rows, num_kv_heads, head_dim]; element (r, h, d) goes to token
  // rows[r].offset of block rows[r].block, head h, dim d.
  void scatter(unsigned char *base, uint32_t layer, const RowLocation *rows, size_t num_rows,
               const unsigned char *src) const {
    unsigned char *layer_base = base + static_cast<size_t>(layer) * g_.layer_elements() * elem_;
    const size_t d = g_.head_dim;
    for (size_t r = 0; r < num_rows; ++r) {
      for (size_t h = 0; h < g_.num_kv_heads; ++h) {
        const unsigned char *s = src + (r * g_.num_kv_heads + h) * d * elem_;
        const size_t dst = static_cast<size_t>(rows[r].block) * size_t(strides_[0]) +
                           h * size_t(strides_[1]) + size_t(rows[r].offset) * size_t(strides_[2]);
        if (strides_[3] == 1) {
          std::memcpy(layer_base + dst * elem_, s, d * elem_);
        } else {
          for (size_t i = 0; i < d; ++i)
            std::memcpy(layer_base + (dst + i * size_t(strides_[3])) * elem_, s + i * elem_, elem_);
        }
      }
    }
  }

  // src: [num_layers, num_blocks, block] with blocks in storage order.
  void copy_in(unsigned char *base, const int32_t *blocks, size_t num_blocks,
               const unsigned char *src) const {
    const size_t block_bytes = g_.block_elements() * elem_;
    for (size_t l = 0; l < g_.num_layers; ++l)
      for (size_t i = 0; i < num_blocks; ++i)
        std::memcpy(base + (l * g_.max_blocks + size_t(blocks[i])) * block_bytes,
                    src + (l * num_blocks + i) * block_bytes, block_bytes);
  }

  KvGeometry g_;
  size_t elem_;
  HostBuffer k_;
  HostBuffer v_;
  int64_t strides_[4];
};

}  // namespace

std::unique_ptr<KvStorage> make_cpu_kv_storage(const KvGeometry &geometry) {
  check_geometry_size(geometry);
  return std::unique_ptr<KvStorage>(new CpuKvStorage(geometry));
}

}  // namespace fd
