// CPU backend of fd_decode, which is also the paged reference (S2,
// implementation 2).
//
// Work is split into items of (row, kv head, chunk): a row's tokens are cut
// into chunks of kChunkTokens (the last one shorter), a layout that depends
// only on the row's length, never on the thread count. An item streams its
// chunk's tokens through the block table in tiles: each tile's K and V are
// converted to FP32 once and serve every query head of the GQA group, so each
// K/V element is read from memory once per group. The code is compiled once
// per K/V type (the hot loop); q and out, read and written once per item,
// convert at run time, so every combination of the compute types over every
// K/V type is served. FP8 K/V is read as stored: the K scale is folded into
// the query scale and the V scale into the output (S1.1). The softmax is the online
// (streaming) form with FP32 state per query head (attention/decode_cpu_kernels.hpp
// has the arithmetic, a fixed sequence of IEEE operations in every build).
// A row of one chunk writes its output directly; otherwise each chunk leaves
// its unnormalised state (max, weight sum, weighted V sums) in a slot, and
// whichever thread finishes the (row, kv head)'s last chunk merges the slots
// in chunk order (log-sum-exp). Items are computed by exactly one thread each
// and merged in a fixed order, so results do not depend on the number of
// threads.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/thread_pool.hpp"
#include "attention/decode_cpu_kernels.hpp"
#include "attention/decode_cpu_tile.hpp"
#include "attention/decode_problem.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FD_CPU_AVX2_CLONE 1
#else
#define FD_CPU_AVX2_CLONE 0
#endif

namespace fd {
namespace {

using cpu::F8;

// Tokens per chunk: a row longer than this is split so that even one row
// spreads over many threads. A fixed number: the chunk layout, and with it
// the order of every sum, depends only on the problem.
constexpr size_t kChunkTokens = 256;

// Tokens per tile: enough to amortise the per-tile softmax bookkeeping, small
// enough that the K and V tiles stay in the L1/L2 caches.
size_t tile_tokens(uint32_t head_dim) {
  return std::clamp<size_t>(8192 / head_dim, 8, 64);
}

size_t chunks_of(int32_t len) {
  return std::max<size_t>(1, (static_cast<size_t>(len) + kChunkTokens - 1) / kChunkTokens);
}

// The positions a row's queries attend: from the first one its earliest
// query token sees (0, or later with a sliding window) to seq_len. Chunks
// cover only this span, so a window skips the tokens before it entirely.
struct RowSpan {
  size_t first;   // first attended position
  size_t chunks;  // chunks of kChunkTokens from `first`
};
RowSpan row_span(const DecodeProblem &pb, uint32_t row) {
  const int32_t len = pb.seq_lens[row];
  const int64_t earliest_query = int64_t{len} - pb.q_len(row);  // position of query token 0
  const int64_t first = len > 0 ? VariantPolicy::of(pb.variant).first_visible(earliest_query) : 0;
  return RowSpan{static_cast<size_t>(first), chunks_of(static_cast<int32_t>(len - first))};
}

// Per-thread FP32 scratch. An item's query rows are its row's query tokens
// times the GQA group (token-major: row j * group + g is query token j, head
// g of the group); one query token per request row gives `group` rows.
struct Scratch {
  float *q;     // [query rows, head_dim], pre-multiplied by sm_scale
  float *k;     // [tile, head_dim]
  float *v;     // [tile, head_dim]
  float *p;     // [query rows, tile8]: scores, then softmax weights
  float *acc;   // [query rows, head_dim]: weighted V sums
  float *m;     // [query rows]: running maximum score
  float *l;     // [query rows]: running sum of weights
  float *corr;  // [query rows]: rescale factors
};

// Everything a call needs besides the problem, in one allocation made before
// any work starts, so that running out of memory fails the call before the
// output is touched: the item index of each row, the partial-state slots of
// rows of several chunks, one completion counter per (row, kv head), and
// each thread's scratch (starting on its own cache line).
class Plan {
 public:
  Plan(const DecodeProblem &pb, size_t tile, size_t max_threads)
      : pb_(pb),
        group_(pb.group_size),
        dim_(pb.head_dim),
        tile_(tile),
        tile8_((tile + 7) / 8 * 8),
        heads_(pb.num_kv_heads) {
    // Counts first (no allocation yet).
    size_t max_q_len = 1;
    for (uint32_t r = 0; r < pb.batch; ++r) {
      const size_t n = row_span(pb, r).chunks;
      items_ += n * heads_;
      if (n > 1) slots_ += n * heads_;
      max_q_len = std::max(max_q_len, static_cast<size_t>(pb.q_len(r)));
    }
    qrows_ = max_q_len * group_;
    slot_floats_ = round_line(2 * qrows_ + qrows_ * dim_);
    const size_t scratch = 2 * qrows_ * dim_ + 2 * tile_ * dim_ + qrows_ * tile8_ + 3 * qrows_;
    per_thread_ = round_line(scratch + 7 * kLine);
    const size_t rows = pb.batch;
    const size_t index_bytes = round_bytes((2 * rows + 1) * sizeof(size_t));
    const size_t count_bytes = round_bytes(rows * heads_ * sizeof(std::atomic<uint32_t>));
    const size_t float_bytes = (per_thread_ * max_threads + slots_ * slot_floats_) * sizeof(float);
    // Not value-initialised: every float is written before it is read.
    // Plain operator new (not new[]): the failure-injection tests replace it.
    storage_.reset(::operator new(index_bytes + count_bytes + float_bytes + 64));
    char *at = static_cast<char *>(storage_.get());
    at += (64 - reinterpret_cast<uintptr_t>(at) % 64) % 64;
    row_item_ = reinterpret_cast<size_t *>(at);
    row_slot_ = row_item_ + rows + 1;
    done_ = reinterpret_cast<std::atomic<uint32_t> *>(at + index_bytes);
    threads_ = reinterpret_cast<float *>(at + index_bytes + count_bytes);
    slot_base_ = threads_ + per_thread_ * max_threads;
    size_t item = 0, slot = 0;
    for (uint32_t r = 0; r < pb.batch; ++r) {
      const size_t n = row_span(pb, r).chunks;
      row_item_[r] = item;
      row_slot_[r] = slot;
      item += n * heads_;
      if (n > 1) slot += n * heads_;
    }
    row_item_[rows] = item;
    for (size_t i = 0; i < rows * heads_; ++i) new (done_ + i) std::atomic<uint32_t>(0);
  }

  size_t items() const { return items_; }

  // The arrays are padded apart by a cache line: back to back, the K and V
  // tiles (32 KiB each) would map to the same L1 sets and evict each other.
  Scratch scratch(size_t thread) const {
    float *at = threads_ + thread * per_thread_;
    Scratch s{};
    s.q = at;
    s.k = s.q + qrows_ * dim_ + kLine;
    s.v = s.k + tile_ * dim_ + kLine;
    s.p = s.v + tile_ * dim_ + kLine;
    s.acc = s.p + qrows_ * tile8_ + kLine;
    s.m = s.acc + qrows_ * dim_ + kLine;
    s.l = s.m + qrows_ + kLine;
    s.corr = s.l + qrows_ + kLine;
    return s;
  }

  template <int32_t kKv>
  FD_HOT_INLINE void run_item(size_t item, Scratch &s) const;

 private:
  static constexpr size_t kLine = 64 / sizeof(float);
  static size_t round_line(size_t floats) { return (floats + kLine - 1) / kLine * kLine; }
  static size_t round_bytes(size_t bytes) { return (bytes + 63) / 64 * 64; }

  template <int32_t kKv>
  FD_HOT_INLINE void attend(uint32_t row, uint32_t kv_head, size_t t_begin, size_t t_end,
                            Scratch &s) const;
  FD_HOT_INLINE void merge(const float *first, size_t n, size_t rows, Scratch &s, size_t out,
                           size_t q_stride, uint32_t kv_head) const;
  // Writes the normalised rows of s.acc (query token j, head g at element
  // out + j * q_stride + g * dim of the output), times the V scale;
  // attention sinks join the denominators here.
  FD_HOT_INLINE void store(const Scratch &s, size_t rows, size_t out, size_t q_stride,
                           uint32_t kv_head) const;

  const DecodeProblem &pb_;
  size_t group_, dim_, tile_, tile8_, heads_;
  size_t qrows_ = 0;  // query rows of the longest row: max q_len x group
  size_t items_ = 0, slots_ = 0, slot_floats_ = 0, per_thread_ = 0;
  struct Free {
    void operator()(void *p) const { ::operator delete(p); }
  };
  std::unique_ptr<void, Free> storage_;
  size_t *row_item_ = nullptr;             // [batch + 1]: first item of each row
  size_t *row_slot_ = nullptr;             // [batch]: first slot of each row (rows of > 1 chunk)
  std::atomic<uint32_t> *done_ = nullptr;  // [batch, kv heads]: chunks finished
  float *threads_ = nullptr;
  float *slot_base_ = nullptr;
};

// Leaves the online-softmax state of tokens [t_begin, t_end) of (row,
// kv_head) in s.m, s.l and s.acc, for every query row of the item. With
// several query tokens (q_indptr) the mask is causal: query token j of a row
// of length len and q_len tokens sees positions <= len - q_len + j.
template <int32_t kKv>
FD_HOT_INLINE void Plan::attend(uint32_t row, uint32_t kv_head, size_t t_begin, size_t t_end,
                                Scratch &s) const {
  const size_t dim = dim_, group = group_;
  const size_t q_len = static_cast<size_t>(pb_.q_len(row));
  const size_t rows = q_len * group;
  const size_t q_stride = static_cast<size_t>(pb_.num_q_heads) * dim;
  const size_t q = static_cast<size_t>(pb_.q_first(row)) * q_stride + kv_head * group * dim;
  for (size_t j = 0; j < q_len; ++j)
    load_row_f32(pb_.q, pb_.q_dtype, q + j * q_stride, s.q + j * group * dim, group * dim);
  const VariantPolicy policy = VariantPolicy::of(pb_.variant);
  {
    // K = stored x k_scale: the scale joins sm_scale (exactly sm_scale at 1).
    const float scale = policy.query_scale() * pb_.k_scale;
    for (size_t i = 0; i < rows * dim; ++i) s.q[i] *= scale;
  }
  std::fill(s.m, s.m + rows, -INFINITY);
  std::fill(s.l, s.l + rows, 0.f);
  std::fill(s.acc, s.acc + rows * dim, 0.f);

  // Last position query token 0 sees (the causal limit of token j is one more per token).
  const size_t len = static_cast<size_t>(pb_.seq_lens[row]);
  const size_t first_limit = len - q_len;
  // Several query tokens (causal) or a window: per-row masks.
  const bool masked = q_len > 1 || policy.window > 0;
  const TileSource<kKv> k_src(pb_, pb_.k, row, kv_head);
  const TileSource<kKv> v_src(pb_, pb_.v, row, kv_head);
  for (size_t t0 = t_begin; t0 < t_end; t0 += tile_) {
    const size_t n = std::min(tile_, t_end - t0);
    k_src.gather(t0, n, s.k);
    cpu::scores(s.q, s.k, n, rows, dim, tile8_, s.p);
    for (size_t r = 0; r < rows; ++r) {
      float *w = s.p + r * tile8_;
      if (policy.softcap > 0.f)
        for (size_t j = 0; j < n; ++j) w[j] = policy.logit(w[j]);
      if (masked) {
        // Positions [begin, end) of this tile are visible to query row r:
        // causal (its own position is the last) and, with a window, the
        // last `window` positions only.
        const size_t position = first_limit + r / group;
        const size_t lo = static_cast<size_t>(policy.first_visible(static_cast<int64_t>(position)));
        const size_t end = position < t0 ? 0 : std::min(n, position - t0 + 1);
        const size_t begin = lo <= t0 ? 0 : std::min(n, lo - t0);
        if (begin >= end) {
          // Nothing to add: weights 0, state unchanged (no -inf - -inf).
          std::fill(w, w + tile8_, 0.f);
          s.corr[r] = 1.f;
          continue;
        }
        for (size_t j = 0; j < begin; ++j) w[j] = -INFINITY;
        for (size_t j = end; j < n; ++j) w[j] = -INFINITY;
      }
      s.corr[r] = cpu::softmax_update(w, n, s.m[r], s.l[r]);
    }
    v_src.gather(t0, n, s.v);
    size_t r = 0;
    for (; r + 4 <= rows; r += 4)
      cpu::accumulate<4>(s.p + r * tile8_, tile8_, s.v, n, dim, s.corr + r, s.acc + r * dim);
    for (; r < rows; ++r)
      cpu::accumulate<1>(s.p + r * tile8_, tile8_, s.v, n, dim, s.corr + r, s.acc + r * dim);
  }
}

FD_HOT_INLINE void Plan::store(const Scratch &s, size_t rows, size_t out, size_t q_stride,
                               uint32_t kv_head) const {
  const size_t group = group_, dim = dim_;
  const float *sinks = pb_.variant.sinks;
  // V = stored x v_scale, applied once to the normalised sums (exactly
  // 1 / l at 1).
  const float v_scale = pb_.v_scale;
  for (size_t r = 0; r < rows; ++r) {
    float inv = v_scale / s.l[r];
    if (sinks != nullptr) {
      // A sink is one more term of the denominator, e^(sink - max), and no
      // value: rescale to the larger of the two maxima (-inf: no change).
      const float sink = sinks[kv_head * group + r % group];
      const float m = s.m[r], top = sink > m ? sink : m;
      const float keep = cpu::exp1(m - top);
      inv = (v_scale * keep) / (s.l[r] * keep + cpu::exp1(sink - top));
    }
    store_row_f32(pb_.out, pb_.out_dtype, out + (r / group) * q_stride + (r % group) * dim,
                  s.acc + r * dim, inv, dim);
  }
}

// Merges the n chunk slots of one (row, kv head), in chunk order, into out:
// the maximum of the chunks' maxima, then each chunk's weight sum and V sums
// scaled by e^(its max - that maximum), added in chunk order. A chunk that a
// query row sees none of holds max -inf and adds nothing.
FD_HOT_INLINE void Plan::merge(const float *first, size_t n, size_t rows, Scratch &s, size_t out,
                               size_t q_stride, uint32_t kv_head) const {
  const size_t dim = dim_;
  for (size_t r = 0; r < rows; ++r) {
    float mx = -INFINITY;
    for (size_t c = 0; c < n; ++c) {
      const float m = first[c * slot_floats_ + r];
      mx = m > mx ? m : mx;
    }
    s.m[r] = mx;
    s.l[r] = 0.f;
  }
  std::fill(s.acc, s.acc + rows * dim, 0.f);
  for (size_t c = 0; c < n; ++c) {
    const float *slot = first + c * slot_floats_;
    for (size_t r = 0; r < rows; ++r) {
      if (slot[r] == -INFINITY) continue;  // this chunk is past the row's causal limit
      const float f = cpu::exp1(slot[r] - s.m[r]);
      s.l[r] += slot[rows + r] * f;
      const float *a = slot + 2 * rows + r * dim;
      float *acc = s.acc + r * dim;
      for (size_t d = 0; d < dim; ++d) acc[d] += a[d] * f;
    }
  }
  store(s, rows, out, q_stride, kv_head);
}

template <int32_t kKv>
FD_HOT_INLINE void Plan::run_item(size_t item, Scratch &s) const {
  const size_t batch = pb_.batch;
  const size_t row =
      static_cast<size_t>(std::upper_bound(row_item_, row_item_ + batch + 1, item) - row_item_ - 1);
  const size_t len = static_cast<size_t>(pb_.seq_lens[row]);
  const RowSpan span = row_span(pb_, static_cast<uint32_t>(row));
  const size_t n = span.chunks;
  const size_t local = item - row_item_[row];
  const auto kv_head = static_cast<uint32_t>(local / n);
  const size_t chunk = local % n;
  const size_t group = group_, dim = dim_;
  const size_t rows = static_cast<size_t>(pb_.q_len(static_cast<uint32_t>(row))) * group;
  const size_t q_stride = static_cast<size_t>(pb_.num_q_heads) * dim;
  // The group's query heads are consecutive: kv_head * group .. + group - 1.
  const size_t out = static_cast<size_t>(pb_.q_first(static_cast<uint32_t>(row))) * q_stride +
                     kv_head * group * dim;
  if (len == 0) {  // one query token (q_len <= seq_len otherwise)
    std::fill(s.acc, s.acc + group * dim, 0.f);
    store_row_f32(pb_.out, pb_.out_dtype, out, s.acc, 1.f, group * dim);
    return;
  }
  const size_t t0 = span.first + chunk * kChunkTokens;
  attend<kKv>(static_cast<uint32_t>(row), kv_head, t0, std::min(len, t0 + kChunkTokens), s);
  if (n == 1) {
    store(s, rows, out, q_stride, kv_head);
    return;
  }
  float *first = slot_base_ + (row_slot_[row] + kv_head * n) * slot_floats_;
  float *slot = first + chunk * slot_floats_;
  std::memcpy(slot, s.m, rows * sizeof(float));
  std::memcpy(slot + rows, s.l, rows * sizeof(float));
  std::memcpy(slot + 2 * rows, s.acc, rows * dim * sizeof(float));
  // The release half publishes this slot; the acquire half, in the thread
  // that finishes last, makes every other chunk's slot visible to it.
  std::atomic<uint32_t> &done = done_[row * heads_ + kv_head];
  if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == n)
    merge(first, n, rows, s, out, q_stride, kv_head);
}

// One work item: the code above compiled for the baseline ISA and, on
// x86-64, once more for AVX2 (wider vectors, same operations in the same
// order, no FMA, so both give the same bits).
using ItemFn = void (*)(const Plan &, size_t, Scratch &);

template <int32_t kKv>
void item_baseline(const Plan &plan, size_t item, Scratch &s) {
  plan.run_item<kKv>(item, s);
}

#if FD_CPU_AVX2_CLONE
template <int32_t kKv>
[[gnu::target("avx2")]] void item_avx2(const Plan &plan, size_t item, Scratch &s) {
  plan.run_item<kKv>(item, s);
}
#endif

template <int32_t kKv>
ItemFn select_item() {
#if FD_CPU_AVX2_CLONE
  if (__builtin_cpu_supports("avx2")) return item_avx2<kKv>;
#endif
  return item_baseline<kKv>;
}

// Threads worth using: handing work to a pool worker costs a few microseconds
// (a wake-up), so small problems run on the calling thread alone.
size_t choose_threads(const DecodeProblem &pb, size_t items) {
  const size_t requested = resolve_cpu_threads(pb.cpu_threads);
  uint64_t tokens = 0;
  for (uint32_t r = 0; r < pb.batch; ++r)
    tokens += static_cast<uint64_t>(pb.seq_lens[r]) * static_cast<uint64_t>(pb.q_len(r));
  // Multiply-adds per K/V element: group for the scores, group for V, plus conversion.
  const uint64_t work = tokens * pb.num_kv_heads * pb.head_dim * (2ull * pb.group_size + 2);
  constexpr uint64_t kWorkPerThread = 1ull << 18;
  const uint64_t useful = std::max<uint64_t>(1, work / kWorkPerThread);
  return static_cast<size_t>(std::min<uint64_t>({requested, items, useful}));
}

template <int32_t kKv>
void run(const DecodeProblem &pb) {
  const size_t tile = tile_tokens(pb.head_dim);
  size_t items = 0;
  for (uint32_t r = 0; r < pb.batch; ++r) items += row_span(pb, r).chunks * pb.num_kv_heads;
  const size_t threads = choose_threads(pb, items);
  const Plan plan(pb, tile, threads);
  const ItemFn run_item = select_item<kKv>();
  std::atomic<size_t> next{0};
  // Items are handed out dynamically (rows can differ widely in length); which
  // thread computes an item does not change its result. The calling thread
  // takes part (slot 0); pool workers that are free join with slots 1.. (see
  // core/thread_pool.hpp), and any subset of slots finishes the work.
  auto worker = [&](size_t slot) {
    Scratch s = plan.scratch(slot);
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < items;
         i = next.fetch_add(1, std::memory_order_relaxed))
      run_item(plan, i, s);
  };
  parallel_run(threads, worker);
}

}  // namespace

void decode_cpu(const DecodeProblem &problem) {
  // The served combinations (decode_params.cpp, S1.1): q and out each f32,
  // f16 or bf16 (converted at run time), over any K/V type (compiled).
  const int32_t q = problem.q_dtype, kv = problem.kv.dtype, out = problem.out_dtype;
  if (dtype_valid(q) && dtype_valid(out)) {
    switch (kv) {
      case FD_DTYPE_F32: return run<FD_DTYPE_F32>(problem);
      case FD_DTYPE_F16: return run<FD_DTYPE_F16>(problem);
      case FD_DTYPE_BF16: return run<FD_DTYPE_BF16>(problem);
      case FD_DTYPE_FP8_E4M3: return run<FD_DTYPE_FP8_E4M3>(problem);
      case FD_DTYPE_FP8_E5M2: return run<FD_DTYPE_FP8_E5M2>(problem);
      default: break;
    }
  }
  fail(FD_ERR_INTERNAL, "decode_cpu: unserved dtypes q %d, kv %d, out %d", static_cast<int>(q),
       static_cast<int>(kv), static_cast<int>(out));
}

}  // namespace fd
