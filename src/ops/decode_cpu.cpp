// CPU backend of fd_decode, which is also the paged reference (S2,
// implementation 2).
//
// One work item is one (row, kv head). It streams the row's tokens through the
// block table once, in tiles: each tile's K and V are converted to FP32 once
// and serve every query head of the GQA group, so each K/V element is read
// from memory once per group. The softmax is the online (streaming) form with
// FP32 state per query head. Work items are independent and each is computed
// by exactly one thread in a fixed order, so results do not depend on the
// number of threads.
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
#include "ops/decode_cpu_tile.hpp"
#include "ops/decode_problem.hpp"

// The hot helpers are forced inline so that the AVX2 copy of the work item
// below really compiles them for AVX2.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FD_CPU_AVX2_CLONE 1
#else
#define FD_CPU_AVX2_CLONE 0
#endif
#define FD_HOT_INLINE [[gnu::always_inline]] inline

namespace fd {
namespace {

// Per-thread FP32 scratch. All threads' scratch is one allocation made before
// any work starts, so that running out of memory fails the call before the
// output is touched; each thread's part starts on its own cache line.
struct Scratch {
  float *q;    // [group, head_dim], pre-multiplied by sm_scale
  float *k;    // [tile, head_dim]
  float *v;    // [tile, head_dim]
  float *p;    // [group, tile]: scores, then softmax weights
  float *acc;  // [group, head_dim]: weighted V sums
  float *m;    // [group]: running maximum score
  float *l;    // [group]: running sum of weights
};

class ScratchArena {
 public:
  ScratchArena(const DecodeProblem &pb, size_t tile, size_t threads)
      : group_(pb.group_size), dim_(pb.head_dim), tile_(tile) {
    const size_t floats = 2 * group_ * dim_ + 2 * tile_ * dim_ + group_ * tile_ + 2 * group_;
    per_thread_ = (floats + 7 * kPad + kLine - 1) / kLine * kLine;
    // Not value-initialised: every float is written before it is read.
    // Plain operator new (not new[]): the failure-injection tests replace it.
    storage_.reset(
        static_cast<float *>(::operator new((per_thread_ * threads + kLine) * sizeof(float))));
    const auto addr = reinterpret_cast<uintptr_t>(storage_.get());
    base_ = storage_.get() + (kLine - addr / sizeof(float) % kLine) % kLine;
  }
  // The arrays are padded apart by a cache line: back to back, the K and V
  // tiles (32 KiB each) would map to the same L1 sets and evict each other.
  Scratch get(size_t thread) {
    float *at = base_ + thread * per_thread_;
    Scratch s{};
    s.q = at;
    s.k = s.q + group_ * dim_ + kPad;
    s.v = s.k + tile_ * dim_ + kPad;
    s.p = s.v + tile_ * dim_ + kPad;
    s.acc = s.p + group_ * tile_ + kPad;
    s.m = s.acc + group_ * dim_ + kPad;
    s.l = s.m + group_ + kPad;
    return s;
  }

 private:
  static constexpr size_t kLine = 64 / sizeof(float);
  static constexpr size_t kPad = kLine;
  size_t group_, dim_, tile_, per_thread_ = 0;
  struct Free {
    void operator()(float *p) const { ::operator delete(p); }
  };
  std::unique_ptr<float, Free> storage_;
  float *base_ = nullptr;
};

// Tokens per tile: enough to amortise the per-tile softmax bookkeeping, small
// enough that the K and V tiles stay in the L1/L2 caches.
size_t tile_tokens(uint32_t head_dim) {
  return std::clamp<size_t>(8192 / head_dim, 8, 64);
}

// Sums eight partial sums in a fixed tree order.
FD_HOT_INLINE float reduce8(const float *lane) {
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

// Dot product with eight independent partial sums: a fixed summation order
// the compiler can vectorise without reassociating.
FD_HOT_INLINE float dot(const float *a, const float *b, size_t n) {
  float lane[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  size_t d = 0;
  for (; d + 8 <= n; d += 8)
    for (size_t j = 0; j < 8; ++j) lane[j] += a[d + j] * b[d + j];
  float tail = 0.f;
  for (; d < n; ++d) tail += a[d] * b[d];
  return reduce8(lane) + tail;
}

// Eight floats as one value: element-wise + and * on it are the same IEEE
// operations as on the eight lanes of dot(), whatever the ISA the code is
// compiled for (two SSE registers or one AVX register; no FMA is enabled).
typedef float F8 __attribute__((vector_size(32)));

// Loads eight floats (unaligned); not a function returning F8, whose ABI
// differs between the baseline and the AVX2 copy.
#define FD_LOAD8(dst, src) std::memcpy(&(dst), (src), sizeof(F8))

FD_HOT_INLINE float reduce8(const F8 &v) {
  float lane[8];
  std::memcpy(lane, &v, sizeof lane);
  return reduce8(lane);
}

// p[g * tile + j] = dot(q[g], k[j]) for the group's query heads g and tokens
// j < n. Four query heads share each K row load and keep four independent
// sets of partial sums in flight (one dot alone is a chain of dependent adds);
// each dot's summation order is exactly dot()'s, so the bits are the same.
FD_HOT_INLINE void scores(const float *q, const float *k, size_t n, size_t group, size_t dim,
                          size_t tile, float *p) {
  size_t g = 0;
  for (; g + 4 <= group; g += 4) {
    const float *q0 = q + g * dim, *q1 = q0 + dim, *q2 = q1 + dim, *q3 = q2 + dim;
    for (size_t j = 0; j < n; ++j) {
      const float *kr = k + j * dim;
      F8 l0 = {}, l1 = {}, l2 = {}, l3 = {};
      size_t d = 0;
      for (; d + 8 <= dim; d += 8) {
        F8 kv, a0, a1, a2, a3;
        FD_LOAD8(kv, kr + d);
        FD_LOAD8(a0, q0 + d);
        FD_LOAD8(a1, q1 + d);
        FD_LOAD8(a2, q2 + d);
        FD_LOAD8(a3, q3 + d);
        l0 += a0 * kv;
        l1 += a1 * kv;
        l2 += a2 * kv;
        l3 += a3 * kv;
      }
      float t0 = 0.f, t1 = 0.f, t2 = 0.f, t3 = 0.f;
      for (; d < dim; ++d) {
        t0 += q0[d] * kr[d];
        t1 += q1[d] * kr[d];
        t2 += q2[d] * kr[d];
        t3 += q3[d] * kr[d];
      }
      p[g * tile + j] = reduce8(l0) + t0;
      p[(g + 1) * tile + j] = reduce8(l1) + t1;
      p[(g + 2) * tile + j] = reduce8(l2) + t2;
      p[(g + 3) * tile + j] = reduce8(l3) + t3;
    }
  }
  for (; g < group; ++g)
    for (size_t j = 0; j < n; ++j) p[g * tile + j] = dot(q + g * dim, k + j * dim, dim);
}

// acc[d] += sum_j w[j] * v[j][d] over `n` V rows (v, [n, dim]). Four rows are
// folded per pass over acc (fewer loads and stores of acc), in a fixed order.
FD_HOT_INLINE void accumulate(const float *w, const float *v, size_t n, size_t dim, float *acc) {
  size_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float *v0 = v + j * dim, *v1 = v0 + dim, *v2 = v1 + dim, *v3 = v2 + dim;
    const float w0 = w[j], w1 = w[j + 1], w2 = w[j + 2], w3 = w[j + 3];
    for (size_t d = 0; d < dim; ++d)
      acc[d] += (w0 * v0[d] + w1 * v1[d]) + (w2 * v2[d] + w3 * v3[d]);
  }
  for (; j < n; ++j) {
    const float *vr = v + j * dim;
    for (size_t d = 0; d < dim; ++d) acc[d] += w[j] * vr[d];
  }
}

// Folds one tile of scores (s.p, `n` tokens) into query head g's running
// softmax state and turns the scores into weights relative to the new maximum.
FD_HOT_INLINE void online_softmax_update(Scratch &s, size_t g, size_t n, size_t tile, size_t dim) {
  float *w = s.p + g * tile;
  float tile_max = w[0];
  for (size_t j = 1; j < n; ++j) tile_max = std::max(tile_max, w[j]);
  const float old_max = s.m[g];
  const float new_max = std::max(old_max, tile_max);
  float sum = 0.f;
  for (size_t j = 0; j < n; ++j) {
    w[j] = std::exp(w[j] - new_max);
    sum += w[j];
  }
  if (old_max == -INFINITY) {  // first tile: nothing to rescale
    s.l[g] = sum;
  } else {
    const float correction = std::exp(old_max - new_max);
    s.l[g] = s.l[g] * correction + sum;
    if (correction != 1.f) {
      float *a = s.acc + g * dim;
      for (size_t d = 0; d < dim; ++d) a[d] *= correction;
    }
  }
  s.m[g] = new_max;
}

template <int32_t kDtype>
FD_HOT_INLINE void attend(const DecodeProblem &pb, uint32_t row, uint32_t kv_head, Scratch &s,
                          size_t tile) {
  using T = typename Elem<kDtype>::T;
  const size_t dim = pb.head_dim, group = pb.group_size;
  // The group's query heads are consecutive: kv_head * group .. + group - 1.
  const size_t first = (static_cast<size_t>(row) * pb.num_q_heads + kv_head * group) * dim;
  T *out = static_cast<T *>(pb.out) + first;
  const size_t len = static_cast<size_t>(pb.seq_lens[row]);
  if (len == 0) {
    for (size_t i = 0; i < group * dim; ++i) out[i] = Elem<kDtype>::from_f32(0.f);
    return;
  }
  const T *q = static_cast<const T *>(pb.q) + first;
  for (size_t i = 0; i < group * dim; ++i) s.q[i] = Elem<kDtype>::to_f32(q[i]) * pb.sm_scale;
  std::fill(s.m, s.m + group, -INFINITY);
  std::fill(s.l, s.l + group, 0.f);
  std::fill(s.acc, s.acc + group * dim, 0.f);

  const TileSource<kDtype> k_src(pb, pb.k, row, kv_head);
  const TileSource<kDtype> v_src(pb, pb.v, row, kv_head);
  for (size_t t0 = 0; t0 < len; t0 += tile) {
    const size_t n = std::min(tile, len - t0);
    k_src.gather(t0, n, s.k);
    scores(s.q, s.k, n, group, dim, tile, s.p);
    for (size_t g = 0; g < group; ++g) online_softmax_update(s, g, n, tile, dim);
    v_src.gather(t0, n, s.v);
    for (size_t g = 0; g < group; ++g) accumulate(s.p + g * tile, s.v, n, dim, s.acc + g * dim);
  }
  for (size_t g = 0; g < group; ++g) {
    const float inv = 1.0f / s.l[g];
    for (size_t d = 0; d < dim; ++d)
      out[g * dim + d] = Elem<kDtype>::from_f32(s.acc[g * dim + d] * inv);
  }
}

// One work item: the body above compiled for the baseline ISA and, on x86-64,
// once more for AVX2 (wider vectors, same operations in the same order, no
// FMA, so both give the same bits).
using AttendFn = void (*)(const DecodeProblem &, uint32_t, uint32_t, Scratch &, size_t);

template <int32_t kDtype>
void attend_baseline(const DecodeProblem &pb, uint32_t row, uint32_t kv_head, Scratch &s,
                     size_t tile) {
  attend<kDtype>(pb, row, kv_head, s, tile);
}

#if FD_CPU_AVX2_CLONE
template <int32_t kDtype>
[[gnu::target("avx2")]] void attend_avx2(const DecodeProblem &pb, uint32_t row, uint32_t kv_head,
                                         Scratch &s, size_t tile) {
  attend<kDtype>(pb, row, kv_head, s, tile);
}
#endif

template <int32_t kDtype>
AttendFn select_attend() {
#if FD_CPU_AVX2_CLONE
  if (__builtin_cpu_supports("avx2")) return attend_avx2<kDtype>;
#endif
  return attend_baseline<kDtype>;
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

template <int32_t kDtype>
void run(const DecodeProblem &pb) {
  const size_t items = static_cast<size_t>(pb.batch) * pb.num_kv_heads;
  const size_t threads = choose_threads(pb, items);
  const size_t tile = tile_tokens(pb.head_dim);
  ScratchArena scratch(pb, tile, threads);
  const AttendFn attend_item = select_attend<kDtype>();
  std::atomic<size_t> next{0};
  // Items are handed out dynamically (rows can differ widely in length); which
  // thread computes an item does not change its result. The calling thread
  // takes part (slot 0); pool workers that are free join with slots 1.. (see
  // core/thread_pool.hpp), and any subset of slots finishes the work.
  auto worker = [&](size_t slot) {
    Scratch s = scratch.get(slot);
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < items;
         i = next.fetch_add(1, std::memory_order_relaxed))
      attend_item(pb, static_cast<uint32_t>(i / pb.num_kv_heads),
                  static_cast<uint32_t>(i % pb.num_kv_heads), s, tile);
  };
  parallel_run(threads, worker);
}

}  // namespace

void decode_cpu(const DecodeProblem &problem) {
  switch (problem.dtype) {
    case FD_DTYPE_F32: run<FD_DTYPE_F32>(problem); break;
    case FD_DTYPE_F16: run<FD_DTYPE_F16>(problem); break;
    case FD_DTYPE_BF16: run<FD_DTYPE_BF16>(problem); break;
    default:
      fail(FD_ERR_INTERNAL, "decode_cpu: unresolved dtype %d", static_cast<int>(problem.dtype));
  }
}

}  // namespace fd
