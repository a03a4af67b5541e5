// CPU backend of fd_decode, which is also the paged reference (S2,
// implementation 2).
//
// Work is split into items of (row, kv head, chunk): a row's tokens are cut
// into chunks of kChunkTokens (the last one shorter), a layout that depends
// only on the row's length, never on the thread count. An item streams its
// chunk's tokens through the block table in tiles: each tile's K and V are
// converted to FP32 once and serve every query head of the GQA group, so each
// K/V element is read from memory once per group. The softmax is the online
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

// Per-thread FP32 scratch.
struct Scratch {
  float *q;     // [group, head_dim], pre-multiplied by sm_scale
  float *k;     // [tile, head_dim]
  float *v;     // [tile, head_dim]
  float *p;     // [group, tile8]: scores, then softmax weights
  float *acc;   // [group, head_dim]: weighted V sums
  float *m;     // [group]: running maximum score
  float *l;     // [group]: running sum of weights
  float *corr;  // [group]: rescale factors
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
    for (uint32_t r = 0; r < pb.batch; ++r) {
      const size_t n = chunks_of(pb.seq_lens[r]);
      items_ += n * heads_;
      if (n > 1) slots_ += n * heads_;
    }
    slot_floats_ = round_line(2 * group_ + group_ * dim_);
    const size_t scratch = 2 * group_ * dim_ + 2 * tile_ * dim_ + group_ * tile8_ + 3 * group_;
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
      const size_t n = chunks_of(pb.seq_lens[r]);
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
    s.k = s.q + group_ * dim_ + kLine;
    s.v = s.k + tile_ * dim_ + kLine;
    s.p = s.v + tile_ * dim_ + kLine;
    s.acc = s.p + group_ * tile8_ + kLine;
    s.m = s.acc + group_ * dim_ + kLine;
    s.l = s.m + group_ + kLine;
    s.corr = s.l + group_ + kLine;
    return s;
  }

  template <class Ty>
  FD_HOT_INLINE void run_item(size_t item, Scratch &s) const;

 private:
  static constexpr size_t kLine = 64 / sizeof(float);
  static size_t round_line(size_t floats) { return (floats + kLine - 1) / kLine * kLine; }
  static size_t round_bytes(size_t bytes) { return (bytes + 63) / 64 * 64; }

  template <class Ty>
  FD_HOT_INLINE void attend(uint32_t row, uint32_t kv_head, size_t t_begin, size_t t_end,
                            Scratch &s) const;
  template <class Ty>
  FD_HOT_INLINE void merge(const float *first, size_t n, Scratch &s,
                           typename Elem<Ty::kOut>::T *out) const;

  const DecodeProblem &pb_;
  size_t group_, dim_, tile_, tile8_, heads_;
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
// kv_head) in s.m, s.l and s.acc.
template <class Ty>
FD_HOT_INLINE void Plan::attend(uint32_t row, uint32_t kv_head, size_t t_begin, size_t t_end,
                                Scratch &s) const {
  using T = typename Elem<Ty::kQ>::T;
  const size_t dim = dim_, group = group_;
  const size_t first = (static_cast<size_t>(row) * pb_.num_q_heads + kv_head * group) * dim;
  const T *q = static_cast<const T *>(pb_.q) + first;
  {
    const size_t nq = group * dim;
    size_t i = 0;
    for (; i + 8 <= nq; i += 8) Elem<Ty::kQ>::to_f32x8(q + i, s.q + i);
    for (; i < nq; ++i) s.q[i] = Elem<Ty::kQ>::to_f32(q[i]);
    const float scale = VariantPolicy::of(pb_.variant).query_scale();
    for (i = 0; i < nq; ++i) s.q[i] *= scale;
  }
  std::fill(s.m, s.m + group, -INFINITY);
  std::fill(s.l, s.l + group, 0.f);
  std::fill(s.acc, s.acc + group * dim, 0.f);

  const TileSource<Ty::kKV> k_src(pb_, pb_.k, row, kv_head);
  const TileSource<Ty::kKV> v_src(pb_, pb_.v, row, kv_head);
  for (size_t t0 = t_begin; t0 < t_end; t0 += tile_) {
    const size_t n = std::min(tile_, t_end - t0);
    k_src.gather(t0, n, s.k);
    cpu::scores(s.q, s.k, n, group, dim, tile8_, s.p);
    for (size_t g = 0; g < group; ++g)
      s.corr[g] = cpu::softmax_update(s.p + g * tile8_, n, s.m[g], s.l[g]);
    v_src.gather(t0, n, s.v);
    size_t g = 0;
    for (; g + 4 <= group; g += 4)
      cpu::accumulate<4>(s.p + g * tile8_, tile8_, s.v, n, dim, s.corr + g, s.acc + g * dim);
    for (; g < group; ++g)
      cpu::accumulate<1>(s.p + g * tile8_, tile8_, s.v, n, dim, s.corr + g, s.acc + g * dim);
  }
}

// Merges the n chunk slots of one (row, kv head), in chunk order, into out:
// the maximum of the chunks' maxima, then each chunk's weight sum and V sums
// scaled by e^(its max - that maximum), added in chunk order.
template <class Ty>
FD_HOT_INLINE void Plan::merge(const float *first, size_t n, Scratch &s,
                               typename Elem<Ty::kOut>::T *out) const {
  const size_t group = group_, dim = dim_;
  for (size_t g = 0; g < group; ++g) {
    float mx = -INFINITY;
    for (size_t c = 0; c < n; ++c) {
      const float m = first[c * slot_floats_ + g];
      mx = m > mx ? m : mx;
    }
    s.m[g] = mx;
    s.l[g] = 0.f;
  }
  std::fill(s.acc, s.acc + group * dim, 0.f);
  for (size_t c = 0; c < n; ++c) {
    const float *slot = first + c * slot_floats_;
    for (size_t g = 0; g < group; ++g) {
      const float f = cpu::exp1(slot[g] - s.m[g]);
      s.l[g] += slot[group + g] * f;
      const float *a = slot + 2 * group + g * dim;
      float *acc = s.acc + g * dim;
      for (size_t d = 0; d < dim; ++d) acc[d] += a[d] * f;
    }
  }
  for (size_t g = 0; g < group; ++g) {
    const float inv = 1.0f / s.l[g];
    for (size_t d = 0; d < dim; ++d)
      out[g * dim + d] = Elem<Ty::kOut>::from_f32(s.acc[g * dim + d] * inv);
  }
}

template <class Ty>
FD_HOT_INLINE void Plan::run_item(size_t item, Scratch &s) const {
  using T = typename Elem<Ty::kOut>::T;
  const size_t rows = pb_.batch;
  const size_t row =
      static_cast<size_t>(std::upper_bound(row_item_, row_item_ + rows + 1, item) - row_item_ - 1);
  const size_t len = static_cast<size_t>(pb_.seq_lens[row]);
  const size_t n = chunks_of(pb_.seq_lens[row]);
  const size_t local = item - row_item_[row];
  const auto kv_head = static_cast<uint32_t>(local / n);
  const size_t chunk = local % n;
  const size_t group = group_, dim = dim_;
  // The group's query heads are consecutive: kv_head * group .. + group - 1.
  T *out = static_cast<T *>(pb_.out) + (row * pb_.num_q_heads + kv_head * group) * dim;
  if (len == 0) {
    for (size_t i = 0; i < group * dim; ++i) out[i] = Elem<Ty::kOut>::from_f32(0.f);
    return;
  }
  const size_t t0 = chunk * kChunkTokens;
  attend<Ty>(static_cast<uint32_t>(row), kv_head, t0, std::min(len, t0 + kChunkTokens), s);
  if (n == 1) {
    for (size_t g = 0; g < group; ++g) {
      const float inv = 1.0f / s.l[g];
      for (size_t d = 0; d < dim; ++d)
        out[g * dim + d] = Elem<Ty::kOut>::from_f32(s.acc[g * dim + d] * inv);
    }
    return;
  }
  float *first = slot_base_ + (row_slot_[row] + kv_head * n) * slot_floats_;
  float *slot = first + chunk * slot_floats_;
  std::memcpy(slot, s.m, group * sizeof(float));
  std::memcpy(slot + group, s.l, group * sizeof(float));
  std::memcpy(slot + 2 * group, s.acc, group * dim * sizeof(float));
  // The release half publishes this slot; the acquire half, in the thread
  // that finishes last, makes every other chunk's slot visible to it.
  std::atomic<uint32_t> &done = done_[row * heads_ + kv_head];
  if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == n) merge<Ty>(first, n, s, out);
}

// One work item: the code above compiled for the baseline ISA and, on
// x86-64, once more for AVX2 (wider vectors, same operations in the same
// order, no FMA, so both give the same bits).
using ItemFn = void (*)(const Plan &, size_t, Scratch &);

template <class Ty>
void item_baseline(const Plan &plan, size_t item, Scratch &s) {
  plan.run_item<Ty>(item, s);
}

#if FD_CPU_AVX2_CLONE
template <class Ty>
[[gnu::target("avx2")]] void item_avx2(const Plan &plan, size_t item, Scratch &s) {
  plan.run_item<Ty>(item, s);
}
#endif

template <class Ty>
ItemFn select_item() {
#if FD_CPU_AVX2_CLONE
  if (__builtin_cpu_supports("avx2")) return item_avx2<Ty>;
#endif
  return item_baseline<Ty>;
}

// Threads worth using: handing work to a pool worker costs a few microseconds
// (a wake-up), so small problems run on the calling thread alone.
size_t choose_threads(const DecodeProblem &pb, size_t items) {
  const size_t requested = resolve_cpu_threads(pb.cpu_threads);
  uint64_t tokens = 0;
  for (uint32_t r = 0; r < pb.batch; ++r) tokens += static_cast<uint64_t>(pb.seq_lens[r]);
  // Multiply-adds per K/V element: group for the scores, group for V, plus conversion.
  const uint64_t work = tokens * pb.num_kv_heads * pb.head_dim * (2ull * pb.group_size + 2);
  constexpr uint64_t kWorkPerThread = 1ull << 18;
  const uint64_t useful = std::max<uint64_t>(1, work / kWorkPerThread);
  return static_cast<size_t>(std::min<uint64_t>({requested, items, useful}));
}

template <class Ty>
void run(const DecodeProblem &pb) {
  const size_t tile = tile_tokens(pb.head_dim);
  size_t items = 0;
  for (uint32_t r = 0; r < pb.batch; ++r) items += chunks_of(pb.seq_lens[r]) * pb.num_kv_heads;
  const size_t threads = choose_threads(pb, items);
  const Plan plan(pb, tile, threads);
  const ItemFn run_item = select_item<Ty>();
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
  // The served combinations (decode_params.cpp): q, K/V and out of one type.
  // Other pairs are one more line here once their conversions exist.
  const int32_t q = problem.q_dtype, kv = problem.kv.dtype, out = problem.out_dtype;
  if (q == kv && out == kv) {
    switch (kv) {
      case FD_DTYPE_F32: return run<DecodeTypes<FD_DTYPE_F32>>(problem);
      case FD_DTYPE_F16: return run<DecodeTypes<FD_DTYPE_F16>>(problem);
      case FD_DTYPE_BF16: return run<DecodeTypes<FD_DTYPE_BF16>>(problem);
      default: break;
    }
  }
  fail(FD_ERR_INTERNAL, "decode_cpu: unserved dtypes q %d, kv %d, out %d", static_cast<int>(q),
       static_cast<int>(kv), static_cast<int>(out));
}

}  // namespace fd
