// The seam between the paged cache's bookkeeping and the memory that holds
// K and V. The cache decides *where* each token goes; a KvStorage only moves
// bytes. The CPU implementation lives in cpu_kv_storage.cpp; the CUDA one comes
// through the backend seam (backend::make_cuda_kv_storage, backend/backend.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "attention/paged_kv.hpp"
#include "flashdec.h"

namespace fd {

// Shape and element type of the storage: one layer's K (V has the same
// geometry) is a PagedKv whose num_blocks is the cache's max_blocks, and the
// layers follow each other `stride_layer` elements apart. Owned storage is
// packed: [num_layers, max_blocks, num_kv_heads, block_size, head_dim]
// (token-major) or [..., head_dim, block_size] (dim-major). External storage
// (fd_cache_config.k_storage ...) has the caller's strides, resolved by the
// same resolve_paged_kv as fd_decode's and fd_kv_append's.
struct KvGeometry : PagedKv {
  uint32_t num_layers = 0;
  // Element type of the K, V (and Q) that layer writes take: dtype, or
  // f16/bf16/f32 over an FP8 storage, which quantises with the layer's
  // scales (KvStorage::k_scale / v_scale).
  int32_t input_dtype = FD_DTYPE_BF16;
  // fd_rope_style of write_layer_rope (fd_cache_config.rope_style).
  int32_t rope_style = FD_ROPE_SPLIT_HALF;
  int64_t stride_layer = 0;  // elements between layers (resolved)
  // External storage: null k means owned.
  void *ext_k = nullptr;
  void *ext_v = nullptr;

  bool external() const { return ext_k != nullptr; }
  uint32_t max_blocks() const { return num_blocks; }
  size_t element_size() const { return element_bytes; }
  // Elements of one packed block of one layer (all heads), of one packed
  // layer, of all of an owned K (or V).
  size_t block_elements() const;
  size_t layer_elements() const;
  size_t total_elements() const;
  // Element strides of (block, head, token, dim) of a packed layer: owned
  // storage's, and the order of copy_blocks_in's source blocks.
  void packed_strides(int64_t out[4]) const;
  // True when a block's heads, tokens and dims lie as in packed storage, so
  // that one block is block_elements() contiguous elements.
  bool block_packed() const;
};

// Checks the storage fields of a config whose other fields are already
// checked (reserved0, pointers, strides, sizes) and resolves the geometry.
// Throws FD_ERR_INVALID_ARGUMENT naming the field ("config.stride_dim must
// be 1 ...").
KvGeometry resolve_kv_geometry(const fd_cache_config &c);

// The element type layer writes take (fd_cache_config.input_dtype with -1
// resolved: the cache's dtype); the config's own fields are kept as given.
inline int32_t cache_input_dtype(const fd_cache_config &c) {
  return c.input_dtype == -1 ? c.dtype : c.input_dtype;
}

// Throws FD_ERR_INVALID_ARGUMENT naming `name[i]` unless every one of the
// `n` scales is finite and > 0 (S1.1).
void check_kv_scales(const float *scales, uint32_t n, const char *name);

// Throws FD_ERR_INVALID_ARGUMENT when the byte size of an owned K (or V)
// does not fit int64_t.
void check_geometry_size(const KvGeometry &g);

// A non-owning reference to a callable `void(int32_t *tables, int32_t *lens)`
// (the metadata fill of KvStorage::export_tables). Unlike std::function,
// making one never allocates: exports run on the step path. The callable
// must outlive the call it is passed to (a lambda argument does).
class ExportFill {
 public:
  template <class F, class = std::enable_if_t<!std::is_same<std::decay_t<F>, ExportFill>::value>>
  ExportFill(const F &fill)  // NOLINT: implicit, so that a lambda can be passed
      : fill_(&fill), call_([](const void *f, int32_t *tables, int32_t *lens) {
          (*static_cast<const F *>(f))(tables, lens);
        }) {}
  void operator()(int32_t *tables, int32_t *lens) const { call_(fill_, tables, lens); }

 private:
  const void *fill_;
  void (*call_)(const void *, int32_t *, int32_t *);
};

// Destination of one row of a layer write: one new token (a transaction row
// of k tokens has k of them, packed in row order).
struct RowLocation {
  int32_t block;
  int32_t offset;
};

struct LayerStorage {
  void *k = nullptr;
  void *v = nullptr;
  int64_t strides[4] = {0, 0, 0, 0};  // block, head, token, dim (elements)
};

class KvStorage {
 public:
  virtual ~KvStorage() = default;

  // Writes one layer's K and V ([rows, num_kv_heads, head_dim] each, in the
  // storage's dtype and memory) to the given locations. Arguments are valid.
  virtual void write_layer(uint32_t layer, const RowLocation *rows, size_t num_rows, const void *k,
                           const void *v, fd_stream stream) = 0;

  // As write_layer, but K is first rotated with RoPE at `positions` (S3.1,
  // in the geometry's rope_style);
  // V is written raw and the rotated Q ([rows, num_q_heads, head_dim]) goes to
  // q_out (which may equal q). Arguments are valid.
  virtual void write_layer_rope(uint32_t layer, const RowLocation *rows, const int32_t *positions,
                                size_t num_rows, const void *q, uint32_t num_q_heads, const void *k,
                                const void *v, uint32_t rotary_dim, float rope_base, void *q_out,
                                fd_stream stream) = 0;

  // Copies full blocks ([num_layers, num_blocks, ...] in storage order per
  // block) into the physical blocks `blocks`.
  virtual void copy_blocks_in(const int32_t *blocks, size_t num_blocks, const void *k_blocks,
                              const void *v_blocks, fd_stream stream) = 0;

  // Base pointers and element strides of one layer.
  virtual LayerStorage layer(uint32_t layer) = 0;

  // --- Transaction staging (device storages; the CPU storage ignores it) ---
  // begin calls reserve_rows(n), n = the transaction's new tokens, before it
  // mutates anything (it may throw, e.g. when staging memory cannot be
  // allocated) and stage_rows() once the token locations are final. A device storage keeps them and
  // uploads them once, at the transaction's first layer write; write_layer* then ignore `rows` and
  // `positions` in favour of the staged copy.
  virtual void reserve_rows(size_t /*num_rows*/) {}
  virtual void stage_rows(const RowLocation * /*rows*/, const int32_t * /*positions*/,
                          size_t /*num_rows*/) noexcept {}

  // Checks what only this storage limits about a layer write's buffers
  // (e.g. forbidden overlaps on a device); throws FD_ERR_INVALID_ARGUMENT.
  virtual void check_write(size_t /*num_rows*/, const void * /*q*/, uint32_t /*num_q_heads*/,
                           const void * /*k*/, const void * /*v*/, const void * /*q_out*/) const {}

  // Metadata export: `fill` writes `table_ints` block-table entries and
  // `len_ints` lengths into the host arrays it is given (and may throw
  // before writing anything); the storage then delivers them to `tables` /
  // `lens` (host memory for the CPU storage, device memory enqueued on
  // `stream` for a device storage). Null destinations are skipped.
  virtual void export_tables(size_t table_ints, size_t len_ints, int32_t *tables, int32_t *lens,
                             fd_stream stream, ExportFill fill);

  // First asynchronous device fault seen in this storage's work (FD_OK when
  // none); never blocks.
  virtual fd_status async_error(std::string * /*message*/) const { return FD_OK; }

  // Per-layer K/V scales of an FP8 storage (1 otherwise): writes quantise
  // with them. The cache sets them at creation and on fd_cache_set_kv_scales
  // (between transactions); set_scales may throw std::bad_alloc before
  // changing anything.
  void set_scales(const float *k_scales, const float *v_scales, uint32_t num_layers);
  float k_scale(uint32_t layer) const { return layer < k_scales_.size() ? k_scales_[layer] : 1.f; }
  float v_scale(uint32_t layer) const { return layer < v_scales_.size() ? v_scales_[layer] : 1.f; }

 private:
  std::vector<float> k_scales_, v_scales_;
  std::vector<int32_t> export_scratch_;  // host export_tables' staging, reused
};

// Zero-initialised host storage (or the caller's external host storage).
// Throws FD_ERR_OUT_OF_MEMORY when it cannot be allocated.
std::unique_ptr<KvStorage> make_cpu_kv_storage(const KvGeometry &geometry);

// Picks the implementation for `device` (already validated).
std::unique_ptr<KvStorage> make_kv_storage(const KvGeometry &geometry, const fd_device &device);

}  // namespace fd
