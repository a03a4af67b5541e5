// Device-memory K/V storage of the CUDA backend. The cache decides where each
// token goes (cache/kv_storage.hpp); this storage stages a transaction's
// per-token locations once (pinned memory, uploaded by the first layer write on that write's
// stream), launches the append kernels (kernels/append_launch.hpp) per layer,
// and delivers metadata exports into caller device buffers, all without a host
// synchronisation. Only creation and prefix registration synchronise:
// creation clears owned storage on a private stream and waits for it, so the
// storage is ready for work on any stream (docs/cuda-streams.md).
#include "cuda/kv_storage_cuda.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "append_launch.hpp"
#include "backend/backend.hpp"
#include "cache/kv_storage.hpp"
#include "core/arg_checks.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"

namespace fd {

/* StagingRing ------------------------------------------------------------- */

StagingRing::~StagingRing() {
  for (auto &s : slots_) {
    if (s->event) (void)cudaEventDestroy(s->event);
    if (s->host) (void)cudaFreeHost(s->host);
    if (s->device) (void)cudaFree(s->device);
  }
}

namespace {

// cudaEventQuery counts as a potentially unsafe call while any stream of the
// process is being captured in global mode, and would invalidate a capture
// the caller has open around a step. Our events are never recorded inside a
// capture (used_on retires such slots instead), so querying them cannot
// conflict with it: this thread switches to relaxed mode for the query.
cudaError_t query_outside_capture_rules(cudaEvent_t event) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  const cudaError_t e = cudaEventQuery(event);
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  return e;
}

}  // namespace

bool StagingRing::idle(Slot &slot) {
  if (slot.retired) return false;
  if (!slot.recorded) return true;
  const cudaError_t e = query_outside_capture_rules(slot.event);
  if (e == cudaErrorNotReady) return false;
  // Success, or a device fault that query_errors() reports: either way no
  // pending work will read the slot any more.
  slot.recorded = false;
  return true;
}

void StagingRing::resize(Slot &slot, size_t bytes) {
  if (slot.capacity >= bytes) return;
  size_t cap = 4096;
  while (cap < bytes) cap *= 2;
  if (slot.host) cuda_check(cudaFreeHost(slot.host), "cudaFreeHost");
  slot.host = nullptr;
  if (slot.device) cuda_check(cudaFree(slot.device), "cudaFree");
  slot.device = nullptr;
  slot.capacity = 0;
  cuda_check(cudaHostAlloc(&slot.host, cap, cudaHostAllocDefault),
             "cudaHostAlloc (pinned staging memory)");
  if (with_device_) cuda_check(cudaMalloc(&slot.device, cap), "cudaMalloc (staging memory)");
  slot.capacity = cap;
}

void StagingRing::preallocate(size_t count, size_t bytes) {
  while (slots_.size() < count && slots_.size() < kMaxSlots) {
    auto slot = std::make_unique<Slot>();
    cuda_check(cudaEventCreateWithFlags(&slot->event, cudaEventDisableTiming), "cudaEventCreate");
    slots_.push_back(std::move(slot));
    resize(*slots_.back(), bytes);
  }
}

StagingRing::Slot &StagingRing::acquire(size_t bytes) {
  // Look from the slot after the last one handed out: slots are taken in
  // turn, so the first one looked at is the one whose work was enqueued
  // longest ago, the most likely to be done (one event query per acquire in
  // a pipelined loop instead of one more per still-busy recent slot).
  Slot *pick = nullptr;
  const size_t n = slots_.size();
  for (size_t i = 0; i < n && pick == nullptr; ++i) {
    Slot &s = *slots_[(next_ + i) % n];
    if (s.capacity >= bytes && idle(s)) pick = &s;
  }
  for (size_t i = 0; i < n && pick == nullptr; ++i) {
    Slot &s = *slots_[(next_ + i) % n];
    if (idle(s)) pick = &s;
  }
  if (pick == nullptr && slots_.size() < kMaxSlots) {
    auto slot = std::make_unique<Slot>();
    cuda_check(cudaEventCreateWithFlags(&slot->event, cudaEventDisableTiming), "cudaEventCreate");
    slots_.push_back(std::move(slot));
    pick = slots_.back().get();
  }
  if (pick == nullptr) {
    // Full ring, nothing idle: wait for the least recently used live slot,
    // or recycle the least recently used retired one.
    Slot *oldest_live = nullptr, *oldest_retired = nullptr;
    for (auto &s : slots_) {
      Slot *&o = s->retired ? oldest_retired : oldest_live;
      if (o == nullptr || s->last_use < o->last_use) o = s.get();
    }
    if (oldest_live != nullptr) {
      cuda_check(cudaEventSynchronize(oldest_live->event), "cudaEventSynchronize (staging)");
      oldest_live->recorded = false;
      pick = oldest_live;
    } else {
      pick = oldest_retired;
      pick->retired = false;
      pick->recorded = false;
    }
  }
  resize(*pick, bytes);
  pick->last_use = ++clock_;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].get() == pick) next_ = i + 1;
  return *pick;
}

void StagingRing::used_on(Slot &slot, cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cuda_check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  slot.last_use = ++clock_;
  if (status != cudaStreamCaptureStatusNone) {
    slot.retired = true;  // a graph may read it at every replay
    return;
  }
  cuda_check(cudaEventRecord(slot.event, stream), "cudaEventRecord");
  slot.recorded = true;
}

cudaError_t StagingRing::query_errors() const {
  for (const auto &s : slots_) {
    if (!s->recorded) continue;
    const cudaError_t e = query_outside_capture_rules(s->event);
    if (e != cudaSuccess && e != cudaErrorNotReady) return e;
  }
  return cudaSuccess;
}

/* CudaKvStorage ----------------------------------------------------------- */

namespace {

void require_device_memory(const void *p, int32_t ordinal, const char *what) {
  if (!backend::is_cuda_device_memory(p, ordinal))
    fail(FD_ERR_INVALID_ARGUMENT, "%s is not device memory of CUDA device %d", what, ordinal);
}

class CudaKvStorage final : public KvStorage {
 public:
  CudaKvStorage(const KvGeometry &g, int32_t ordinal)
      : g_(g),
        ordinal_(ordinal),
        elem_(g.element_size()),
        input_(dtype_is_fp8(g.dtype) ? g.input_dtype : g.dtype),
        in_elem_(dtype_size(input_)),
        rows_ring_(true),
        export_ring_(false) {
    CudaDeviceScope scope(ordinal_);
    // Room for 4 transactions of up to 1365 tokens and 4 exports of 16Ki
    // entries in flight before anything is allocated on the way (the rings
    // free themselves if the constructor throws later).
    rows_ring_.preallocate(4, 16384);
    export_ring_.preallocate(4, 65536);
    if (g.external()) {
      require_device_memory(g.ext_k, ordinal, "config.k_storage");
      require_device_memory(g.ext_v, ordinal, "config.v_storage");
      k_ = static_cast<unsigned char *>(g.ext_k);
      v_ = static_cast<unsigned char *>(g.ext_v);
    } else {
      const size_t bytes = g.total_elements() * elem_;
      try {
        void *k = nullptr, *v = nullptr;
        cuda_check(cudaMalloc(&k, bytes), "cudaMalloc (K cache)");
        k_ = static_cast<unsigned char *>(k);
        cuda_check(cudaMalloc(&v, bytes), "cudaMalloc (V cache)");
        v_ = static_cast<unsigned char *>(v);
        // Cleared and finished before the cache exists: its first writes may
        // come on any stream (bug 6 of issue 11: a cudaMemset left queued on
        // the legacy default stream behind the caller's work ran after
        // writes on a non-blocking stream and wiped them).
        cuda_zero_fill_sync(k_, bytes, "clearing the K cache");
        cuda_zero_fill_sync(v_, bytes, "clearing the V cache");
      } catch (...) {
        free_owned();
        throw;
      }
    }
    // Resolved for both (owned storage is packed).
    layer_stride_ = g.stride_layer;
    strides_[0] = g.stride_block;
    strides_[1] = g.stride_head;
    strides_[2] = g.stride_token;
    strides_[3] = g.stride_dim;
    block_packed_ = g.block_packed();
  }

  ~CudaKvStorage() override { free_owned(); }

  void write_layer(uint32_t layer, const RowLocation *, size_t num_rows, const void *k,
                   const void *v, fd_stream stream) override {
    launch(layer, num_rows, nullptr, 0, k, v, 0, 0.f, nullptr, stream);
  }

  void write_layer_rope(uint32_t layer, const RowLocation *, const int32_t *, size_t num_rows,
                        const void *q, uint32_t num_q_heads, const void *k, const void *v,
                        uint32_t rotary_dim, float rope_base, void *q_out,
                        fd_stream stream) override {
    launch(layer, num_rows, q, num_q_heads, k, v, rotary_dim, rope_base, q_out, stream);
  }

  void copy_blocks_in(const int32_t *blocks, size_t num_blocks, const void *k_blocks,
                      const void *v_blocks, fd_stream stream) override {
    // Not on the hot path: the sources are borrowed for the call, so the
    // copies complete before returning (cudaMemcpyDefault: host or device).
    CudaDeviceScope scope(ordinal_);
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    copy_in(k_, blocks, num_blocks, static_cast<const unsigned char *>(k_blocks), s);
    copy_in(v_, blocks, num_blocks, static_cast<const unsigned char *>(v_blocks), s);
    cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize (prefix registration)");
  }

  LayerStorage layer(uint32_t layer) override {
    LayerStorage s;
    const size_t offset = static_cast<size_t>(layer) * static_cast<size_t>(layer_stride_) * elem_;
    s.k = k_ + offset;
    s.v = v_ + offset;
    std::copy(strides_, strides_ + 4, s.strides);
    return s;
  }

  // `num_rows`: the transaction's new tokens (one location per token), so
  // the staging is sized by tokens, and a transaction with more tokens than
  // any before allocates.
  void reserve_rows(size_t num_rows) override {
    CudaDeviceScope scope(ordinal_);
    if (unrecorded_writes_) {
      // The previous transaction ended (aborted) before its last layer: its
      // later kernels are not behind the slot's event yet. Their stream is
      // the last write's (a transaction's writes share one stream).
      rows_ring_.used_on(*staged_, last_stream_);
      unrecorded_writes_ = false;
    }
    pending_ = &rows_ring_.acquire(std::max<size_t>(num_rows, 1) * 3 * sizeof(int32_t));
  }

  void stage_rows(const RowLocation *rows, const int32_t *positions,
                  size_t num_rows) noexcept override {
    // [block ids][offsets][positions], uploaded with one copy.
    auto *h = static_cast<int32_t *>(pending_->host);
    for (size_t i = 0; i < num_rows; ++i) {
      h[i] = rows[i].block;
      h[num_rows + i] = rows[i].offset;
      h[2 * num_rows + i] = positions[i];
    }
    staged_ = pending_;
    staged_rows_ = num_rows;
    uploaded_ = false;
  }

  void check_write(size_t num_rows, const void *q, uint32_t num_q_heads, const void *k,
                   const void *v, const void *q_out) const override {
    if (q == nullptr) return;
    const size_t q_bytes = num_rows * num_q_heads * g_.head_dim * in_elem_;
    const size_t kv_bytes = num_rows * g_.num_kv_heads * g_.head_dim * in_elem_;
    if (q_out != q && ranges_overlap(q_out, q_bytes, q, q_bytes))
      fail(FD_ERR_INVALID_ARGUMENT, "q_out must equal q or not overlap it on a CUDA cache");
    if (ranges_overlap(q_out, q_bytes, k, kv_bytes) || ranges_overlap(q_out, q_bytes, v, kv_bytes))
      fail(FD_ERR_INVALID_ARGUMENT, "q_out must not overlap k or v on a CUDA cache");
  }

  void export_tables(size_t table_ints, size_t len_ints, int32_t *tables, int32_t *lens,
                     fd_stream stream, ExportFill fill) override {
    CudaDeviceScope scope(ordinal_);
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    const size_t bytes = (table_ints + len_ints) * sizeof(int32_t);
    StagingRing::Slot &slot = export_ring_.acquire(std::max<size_t>(bytes, 1));
    auto *h = static_cast<int32_t *>(slot.host);
    fill(h, h + table_ints);  // may throw: nothing enqueued yet
    if (tables != nullptr && table_ints > 0)
      cuda_check(
          cudaMemcpyAsync(tables, h, table_ints * sizeof(int32_t), cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync (block tables)");
    if (lens != nullptr && len_ints > 0)
      cuda_check(cudaMemcpyAsync(lens, h + table_ints, len_ints * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, s),
                 "cudaMemcpyAsync (seq_lens)");
    export_ring_.used_on(slot, s);
  }

  fd_status async_error(std::string *message) const override {
    if (fault_ == cudaSuccess) {
      cudaError_t e = rows_ring_.query_errors();
      if (e == cudaSuccess) e = export_ring_.query_errors();
      fault_ = e;
    }
    if (fault_ == cudaSuccess) return FD_OK;
    *message = std::string("asynchronous CUDA fault in the cache's device work: ") +
               cudaGetErrorName(fault_) + " (" + cudaGetErrorString(fault_) + ")";
    return FD_ERR_DEVICE;
  }

 private:
  void free_owned() {
    if (g_.external()) return;  // the caller's memory
    if (k_) (void)cudaFree(k_);
    if (v_) (void)cudaFree(v_);
    k_ = v_ = nullptr;
  }

  void launch(uint32_t layer, size_t num_rows, const void *q, uint32_t num_q_heads, const void *k,
              const void *v, uint32_t rotary_dim, float rope_base, void *q_out, fd_stream stream) {
    CudaDeviceScope scope(ordinal_);
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    StagingRing::Slot &slot = *staged_;
    const size_t n = staged_rows_;
    const bool first = !uploaded_;
    if (first) {
      // Once per transaction, on the first write's stream.
      cuda_check(cudaMemcpyAsync(slot.device, slot.host, 3 * n * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, s),
                 "cudaMemcpyAsync (transaction rows)");
      uploaded_ = true;
    }
    const int32_t *d = static_cast<const int32_t *>(slot.device);
    const LayerStorage dst = this->layer(layer);
    cuda::AppendLaunch a;
    // Inputs of input_dtype; an FP8 storage quantises with the layer's
    // scales (in the kernel, no extra pass).
    a.dtype = input_;
    a.cache_dtype = g_.dtype;
    a.k_scale = dtype_is_fp8(g_.dtype) ? k_scale(layer) : 1.f;
    a.v_scale = dtype_is_fp8(g_.dtype) ? v_scale(layer) : 1.f;
    a.num_tokens = static_cast<int32_t>(num_rows);
    a.num_q_heads = static_cast<int32_t>(num_q_heads);
    a.num_kv_heads = static_cast<int32_t>(g_.num_kv_heads);
    a.head_dim = static_cast<int32_t>(g_.head_dim);
    a.rotary_dim = static_cast<int32_t>(rotary_dim);
    a.rope_base = rope_base;
    a.rope_style = g_.rope_style;
    a.q = q;
    a.q_out = q_out;
    a.k = k;
    a.v = v;
    a.k_dst = dst.k;
    a.v_dst = dst.v;
    a.stride_block = strides_[0];
    a.stride_head = strides_[1];
    a.stride_token = strides_[2];
    a.stride_dim = strides_[3];
    a.block_ids = d;
    a.offsets = d + n;
    a.positions = d + 2 * n;
    a.stream = s;
    cuda_check(cuda::launch_append(a), "launching the KV append kernel");
    // The slot's event goes behind the first write (which carries the
    // upload) and the last layer's write; middle layers skip the event
    // record (host cost) and rely on the last one, or on reserve_rows after
    // an abort.
    if (first || layer + 1 == g_.num_layers) {
      rows_ring_.used_on(slot, s);
      unrecorded_writes_ = false;
    } else {
      unrecorded_writes_ = true;
      last_stream_ = s;
    }
  }

  // src: [num_layers, num_blocks, block] packed in the layout's order.
  void copy_in(unsigned char *base, const int32_t *blocks, size_t num_blocks,
               const unsigned char *src, cudaStream_t s) const {
    const size_t block_bytes = g_.block_elements() * elem_;
    const bool dim_major = g_.dim_major();
    const size_t rows = dim_major ? g_.head_dim : g_.block_size;
    const size_t row_bytes = (dim_major ? g_.block_size : g_.head_dim) * elem_;
    const size_t pitch = static_cast<size_t>(dim_major ? strides_[3] : strides_[2]) * elem_;
    for (size_t l = 0; l < g_.num_layers; ++l)
      for (size_t i = 0; i < num_blocks; ++i) {
        const unsigned char *from = src + (l * num_blocks + i) * block_bytes;
        unsigned char *to = base + (l * static_cast<size_t>(layer_stride_) +
                                    static_cast<size_t>(blocks[i]) * size_t(strides_[0])) *
                                       elem_;
        if (block_packed_) {
          cuda_check(cudaMemcpyAsync(to, from, block_bytes, cudaMemcpyDefault, s),
                     "cudaMemcpyAsync (prefix blocks)");
          continue;
        }
        for (size_t h = 0; h < g_.num_kv_heads; ++h)
          cuda_check(cudaMemcpy2DAsync(to + h * size_t(strides_[1]) * elem_, pitch,
                                       from + h * rows * row_bytes, row_bytes, row_bytes, rows,
                                       cudaMemcpyDefault, s),
                     "cudaMemcpy2DAsync (prefix blocks)");
      }
  }

  KvGeometry g_;
  int32_t ordinal_;
  size_t elem_;     // bytes per stored element
  int32_t input_;   // dtype of layer writes' K, V and Q
  size_t in_elem_;  // ... and its bytes per element
  unsigned char *k_ = nullptr;
  unsigned char *v_ = nullptr;
  bool block_packed_ = true;  // one block of one layer is contiguous
  int64_t layer_stride_ = 0;  // elements
  int64_t strides_[4] = {0, 0, 0, 0};
  StagingRing rows_ring_;                 // transaction tokens' locations (pinned + device twin)
  StagingRing export_ring_;               // metadata exports (pinned)
  StagingRing::Slot *pending_ = nullptr;  // reserved by reserve_rows
  StagingRing::Slot *staged_ = nullptr;   // the open transaction's rows
  size_t staged_rows_ = 0;
  bool uploaded_ = false;
  bool unrecorded_writes_ = false;  // writes since the staged slot's last event
  cudaStream_t last_stream_ = nullptr;
  mutable cudaError_t fault_ = cudaSuccess;
};

}  // namespace

std::unique_ptr<KvStorage> backend::make_cuda_kv_storage(const KvGeometry &geometry,
                                                         int32_t ordinal) {
  require_cuda_device(ordinal);
  // Served: f16 and bf16 storage written in its own type, and FP8 (E4M3 or
  // E5M2) storage written in f16 or bf16 (quantised by the append kernels).
  if (geometry.dtype != FD_DTYPE_F16 && geometry.dtype != FD_DTYPE_BF16 &&
      !dtype_is_fp8(geometry.dtype))
    fail(FD_ERR_UNSUPPORTED,
         "dtype %s is not supported by CUDA caches (supported: f16, bf16, fp8_e4m3, fp8_e5m2)",
         dtype_name(geometry.dtype));
  if (dtype_is_fp8(geometry.dtype) && geometry.input_dtype != FD_DTYPE_F16 &&
      geometry.input_dtype != FD_DTYPE_BF16)
    fail(FD_ERR_UNSUPPORTED,
         "input_dtype %s is not supported by CUDA caches of dtype %s (supported: f16, bf16)",
         dtype_name(geometry.input_dtype), dtype_name(geometry.dtype));
  if (geometry.head_dim > static_cast<uint32_t>(cuda::kAppendMaxHeadDim))
    fail(FD_ERR_UNSUPPORTED, "head_dim %u is not supported by CUDA caches (at most %d)",
         geometry.head_dim, cuda::kAppendMaxHeadDim);
  check_geometry_size(geometry);
  return std::unique_ptr<KvStorage>(new CudaKvStorage(geometry, ordinal));
}

}  // namespace fd
