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
#include <thread>
#include <vector>

#include "core/dtype.hpp"
#include "core/error.hpp"
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

// Per-thread FP32 scratch, allocated before any thread starts so that running
// out of memory fails the call before the output is touched.
struct Scratch {
  explicit Scratch(const DecodeProblem &pb, size_t tile)
      : q(size_t{pb.group_size} * pb.head_dim),
        k(tile * pb.head_dim),
        v(tile * pb.head_dim),
        p(size_t{pb.group_size} * tile),
        acc(size_t{pb.group_size} * pb.head_dim),
        m(pb.group_size),
        l(pb.group_size) {}
  std::vector<float> q;    // [group, head_dim], pre-multiplied by sm_scale
  std::vector<float> k;    // [tile, head_dim]
  std::vector<float> v;    // [tile, head_dim]
  std::vector<float> p;    // [group, tile]: scores, then softmax weights
  std::vector<float> acc;  // [group, head_dim]: weighted V sums
  std::vector<float> m;    // [group]: running maximum score
  std::vector<float> l;    // [group]: running sum of weights
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
  float *w = s.p.data() + g * tile;
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
      float *a = s.acc.data() + g * dim;
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
  std::fill(s.m.begin(), s.m.end(), -INFINITY);
  std::fill(s.l.begin(), s.l.end(), 0.f);
  std::fill(s.acc.begin(), s.acc.end(), 0.f);

  const TileSource<kDtype> k_src(pb, pb.k, row, kv_head);
  const TileSource<kDtype> v_src(pb, pb.v, row, kv_head);
  for (size_t t0 = 0; t0 < len; t0 += tile) {
    const size_t n = std::min(tile, len - t0);
    k_src.gather(t0, n, s.k.data());
    for (size_t g = 0; g < group; ++g)
      for (size_t j = 0; j < n; ++j)
        s.p[g * tile + j] = dot(s.q.data() + g * dim, s.k.data() + j * dim, dim);
    for (size_t g = 0; g < group; ++g) online_softmax_update(s, g, n, tile, dim);
    v_src.gather(t0, n, s.v.data());
    for (size_t g = 0; g < group; ++g)
      accumulate(s.p.data() + g * tile, s.v.data(), n, dim, s.acc.data() + g * dim);
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

// Threads worth starting: starting one costs tens of microseconds, so small
// problems run on the calling thread alone.
size_t choose_threads(const DecodeProblem &pb, size_t items) {
  size_t requested = pb.cpu_threads;
  if (requested == 0) requested = std::max(1u, std::thread::hardware_concurrency());
  uint64_t tokens = 0;
  for (uint32_t r = 0; r < pb.batch; ++r) tokens += static_cast<uint64_t>(pb.seq_lens[r]);
  // Multiply-adds per K/V element: group for the scores, group for V, plus conversion.
  const uint64_t work = tokens * pb.num_kv_heads * pb.head_dim * (2ull * pb.group_size + 2);
  constexpr uint64_t kWorkPerThread = 1ull << 20;
  const uint64_t useful = std::max<uint64_t>(1, work / kWorkPerThread);
  return static_cast<size_t>(std::min<uint64_t>({requested, items, useful}));
}

template <int32_t kDtype>
void run(const DecodeProblem &pb) {
  const size_t items = static_cast<size_t>(pb.batch) * pb.num_kv_heads;
  const size_t threads = choose_threads(pb, items);
  const size_t tile = tile_tokens(pb.head_dim);
  std::vector<Scratch> scratch(threads, Scratch(pb, tile));
  const AttendFn attend_item = select_attend<kDtype>();
  std::atomic<size_t> next{0};
  // Items are handed out dynamically (rows can differ widely in length); which
  // thread computes an item does not change its result.
  auto worker = [&](size_t w) {
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < items;
         i = next.fetch_add(1, std::memory_order_relaxed))
      attend_item(pb, static_cast<uint32_t>(i / pb.num_kv_heads),
                  static_cast<uint32_t>(i % pb.num_kv_heads), scratch[w], tile);
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (size_t w = 1; w < threads; ++w) {
    // Whatever starting a thread throws (std::system_error, or bad_alloc for
    // its state), the call carries on with the threads it has: letting it
    // escape would destroy `pool` with running threads (std::terminate), and
    // they may already have written part of the output.
    try {
      pool.emplace_back(worker, w);
    } catch (...) {
      break;  // no more threads available: the ones running (and this one) finish the work
    }
  }
  worker(0);
  for (std::thread &t : pool) t.join();
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
