/* Many threads at once, each using the C API the way its thread contracts
 * allow (include/flashdec.h), for ThreadSanitizer (CTest label "threads") and
 * as an ordinary suite:
 * - 8 workers, each with its own caches and engines and a fixed seed, run
 *   thousands of random operations: requests, transactions with plain and
 *   RoPE layer writes, commit/abort, prefixes (register, attach, evict),
 *   exports, metrics, validation, engine steps in both modes (scheduler plan
 *   and apply in managed mode), and CPU fd_decode with cpu_threads > 1, also
 *   on a problem large enough that the backend starts its worker threads.
 *   Every result is checked against a per-thread shadow of what was written
 *   (cache contents, seq_lens, counts) and decode outputs against
 *   fd_reference_attention_dense and a single-threaded rerun (bitwise).
 * - Two threads share one cache, taking turns under a mutex (the cache is
 *   externally synchronised); each checks its own requests' contents.
 * - One scheduler, snapshot and decision (thread-safe / immutable) are read
 *   and planned from by every thread at once.
 * - fd_last_error_message is per thread: after each expected failure a thread
 *   remembers its message (which names that thread's own ids), and checks
 *   that it is still there after its later successful calls, whatever the
 *   other threads fail in between.
 * Worker threads never call cmocka (it is not thread-safe): a failed check
 * throws, the thread records it, and the main thread fails the test.
 * FLASHDEC_STRESS_OPS overrides the operations per worker (default 30000,
 * 3000 under ThreadSanitizer). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "fd_test.h"

#if defined(__SANITIZE_THREAD__)
#define FD_STRESS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FD_STRESS_TSAN 1
#endif
#endif
#ifndef FD_STRESS_TSAN
#define FD_STRESS_TSAN 0
#endif

namespace {

/* ---- checks that work off the main thread ------------------------------ */

struct CheckFailed {
  std::string what;
};

[[noreturn]] void check_failed(const char *file, int line, const std::string &what) {
  char where[256];
  snprintf(where, sizeof where, "%s:%d: ", file, line);
  throw CheckFailed{where + what};
}

#define CHECK(cond)                                                \
  do {                                                             \
    if (!(cond)) check_failed(__FILE__, __LINE__, "CHECK " #cond); \
  } while (0)

/* Each thread's view of its last error: set after every expected failure. */
thread_local std::string t_expected_message;

void expect_status(const char *file, int line, const char *expr, fd_status got, fd_status want,
                   const char *substring) {
  const std::string msg = fd_last_error_message();
  if (got != want || (want != FD_OK && (msg.empty() || msg.find(substring) == std::string::npos)))
    check_failed(file, line,
                 std::string(expr) + " returned " + fd_status_string(got) + " (\"" + msg +
                     "\"), expected " + fd_status_string(want) + " with \"" + substring + "\"");
  if (want != FD_OK) {
    t_expected_message = msg;
  } else if (msg != t_expected_message) {
    // A successful call leaves the message alone, and no other thread's
    // failure shows up here.
    check_failed(file, line,
                 std::string(expr) + " succeeded but the last error changed from \"" +
                     t_expected_message + "\" to \"" + msg + "\"");
  }
}

#define CHECK_OK(expr) expect_status(__FILE__, __LINE__, #expr, (expr), FD_OK, "")
#define CHECK_FAILS(expr, status, substring) \
  expect_status(__FILE__, __LINE__, #expr, (expr), (status), (substring))

/* ---- data --------------------------------------------------------------- */

/* n elements of dtype with random values, in 4-byte-aligned storage. */
std::vector<float> random_data(fd_test_rng *rng, int32_t dtype, size_t n, float scale = 1.f) {
  std::vector<float> buf(n);
  for (size_t i = 0; i < n; ++i) fd_test_store(buf.data(), i, dtype, scale * fd_test_normal(rng));
  return buf;
}

std::vector<float> to_f32(const void *p, int32_t dtype, size_t n) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = fd_test_load(p, i, dtype);
  return out;
}

std::vector<float> from_f32(const std::vector<float> &x, int32_t dtype) {
  std::vector<float> buf(x.size());
  for (size_t i = 0; i < x.size(); ++i) fd_test_store(buf.data(), i, dtype, x[i]);
  return buf;
}

bool close_enough(float got, float want, int32_t dtype) {
  if (!std::isfinite(got)) return false;
  const float tol = dtype == FD_DTYPE_F32 ? 2e-4f : 2e-2f;
  return std::fabs(got - want) <= tol * (1.f + std::fabs(want));
}

void check_close(const std::vector<float> &got, const std::vector<float> &want, int32_t dtype,
                 const char *what) {
  CHECK(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (!close_enough(got[i], want[i], dtype))
      check_failed(__FILE__, __LINE__,
                   std::string(what) + ": element " + std::to_string(i) + " is " +
                       std::to_string(got[i]) + ", expected " + std::to_string(want[i]));
}

/* Rotates x ([tokens, heads, dim] in dtype) through the public fd_rope_apply. */
std::vector<float> rope(std::vector<float> x, int32_t dtype, uint32_t tokens, uint32_t heads,
                        uint32_t dim, const std::vector<int32_t> &positions, uint32_t rotary,
                        float base) {
  CHECK_OK(fd_rope_apply(dtype, x.data(), tokens, heads, dim, positions.data(), rotary, base));
  return x;
}

/* One request of a shadow: committed tokens per layer, [len][kv_heads * dim]. */
struct Shadow {
  int32_t len = 0;
  std::vector<std::vector<float>> k, v;
  explicit Shadow(uint32_t layers = 0) : k(layers), v(layers) {}
};

/* Dense reference over rows' shadows plus an optional extra token per row. */
std::vector<float> reference(int32_t dtype, uint32_t hq, uint32_t hkv, uint32_t dim,
                             const std::vector<const Shadow *> &rows, uint32_t layer,
                             const std::vector<float> &q /* dtype */,
                             const std::vector<float> *extra_k = nullptr,
                             const std::vector<float> *extra_v = nullptr) {
  const uint32_t b = (uint32_t)rows.size();
  uint32_t max_len = 1;
  std::vector<int32_t> lens(b);
  for (uint32_t r = 0; r < b; ++r) {
    lens[r] = rows[r]->len + (extra_k ? 1 : 0);
    max_len = std::max(max_len, (uint32_t)lens[r]);
  }
  std::vector<float> k((size_t)b * hkv * max_len * dim, 0.f), v(k.size(), 0.f);
  const size_t tok = (size_t)hkv * dim;
  for (uint32_t r = 0; r < b; ++r)
    for (int32_t t = 0; t < lens[r]; ++t)
      for (uint32_t h = 0; h < hkv; ++h)
        for (uint32_t d = 0; d < dim; ++d) {
          const size_t dst = (((size_t)r * hkv + h) * max_len + (size_t)t) * dim + d;
          if (t < rows[r]->len) {
            k[dst] = rows[r]->k[layer][(size_t)t * tok + h * dim + d];
            v[dst] = rows[r]->v[layer][(size_t)t * tok + h * dim + d];
          } else {
            k[dst] = (*extra_k)[r * tok + h * dim + d];
            v[dst] = (*extra_v)[r * tok + h * dim + d];
          }
        }
  const std::vector<float> kd = from_f32(k, dtype), vd = from_f32(v, dtype);
  std::vector<float> out((size_t)b * hq * dim);
  CHECK_OK(fd_reference_attention_dense(dtype, b, hq, hkv, dim, max_len, q.data(), kd.data(),
                                        vd.data(), lens.data(), 0.f, out.data()));
  return to_f32(out.data(), dtype, out.size());
}

template <class T>
T pick(fd_test_rng *rng, const std::vector<T> &v) {
  return v[fd_test_next(rng) % v.size()];
}

/* ---- objects every thread reads at once --------------------------------- */

struct SharedPlan {
  fd_scheduler *scheduler = nullptr;
  fd_snapshot *snapshot = nullptr;
  fd_decision *decision = nullptr;
  std::vector<uint64_t> lists[5];
  fd_decision_summary summary;
};
SharedPlan g_plan;

std::vector<uint64_t> decision_ids(const fd_decision *d, int32_t which) {
  uint32_t n = 0;
  CHECK_OK(fd_decision_ids(d, which, NULL, 0, &n));
  std::vector<uint64_t> v(n);
  if (n) CHECK_OK(fd_decision_ids(d, which, v.data(), n, &n));
  return v;
}

fd_decision_summary summary_of(const fd_decision *d) {
  fd_decision_summary s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  CHECK_OK(fd_decision_get_summary(d, &s));
  return s;
}

void check_decision_equal(const fd_decision *d) {
  for (int32_t l = 0; l < 5; ++l) CHECK(decision_ids(d, l) == g_plan.lists[l]);
  const fd_decision_summary s = summary_of(d);
  CHECK(memcmp(&s, &g_plan.summary, sizeof s) == 0);
}

/* Reads the shared decision and plans again from its snapshot, concurrently
 * with every other thread. */
void read_shared_plan() {
  check_decision_equal(g_plan.decision);
  int32_t reasons[8];
  uint32_t n = 0;
  CHECK_OK(fd_decision_reasons(g_plan.decision, reasons, 8, &n));
  CHECK(n == g_plan.summary.reason_count);
  fd_decision *again = nullptr;
  CHECK_OK(fd_scheduler_plan(g_plan.scheduler, g_plan.snapshot, &again));
  check_decision_equal(again);
  fd_decision_destroy(again);
  fd_snapshot *copy = nullptr;
  CHECK_OK(fd_decision_copy_snapshot(g_plan.decision, &copy));
  CHECK_OK(fd_scheduler_plan(g_plan.scheduler, copy, &again));
  check_decision_equal(again);
  fd_decision_destroy(again);
  fd_snapshot_destroy(copy);
}

/* ---- a large decode: the CPU backend starts its own worker threads ------ */

struct BigDecode {
  static constexpr uint32_t kB = 4, kHq = 8, kHkv = 2, kD = 64, kBs = 16, kMbps = 64;
  std::vector<float> q, k, v, ref, single;
  std::vector<int32_t> tables, lens;
  uint32_t num_blocks = 0;

  explicit BigDecode(uint64_t seed) {
    fd_test_rng rng = {seed};
    lens.resize(kB);
    for (uint32_t r = 0; r < kB; ++r) lens[r] = (int32_t)fd_test_range(&rng, 900, kMbps * kBs);
    num_blocks = kB * kMbps;
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[fd_test_next(&rng) % i]);
    tables.assign((size_t)kB * kMbps, -1);
    size_t next = 0;
    for (uint32_t r = 0; r < kB; ++r)
      for (int32_t i = 0; i < (lens[r] + (int32_t)kBs - 1) / (int32_t)kBs; ++i)
        tables[(size_t)r * kMbps + i] = perm[next++];
    q = random_data(&rng, FD_DTYPE_F32, (size_t)kB * kHq * kD, 2.f);
    k = random_data(&rng, FD_DTYPE_F32, (size_t)num_blocks * kHkv * kBs * kD);
    v = random_data(&rng, FD_DTYPE_F32, k.size());
    single = run(1);
    // The dense reference of the same problem.
    const uint32_t max_len = kMbps * kBs;
    std::vector<float> kd((size_t)kB * kHkv * max_len * kD, 0.f), vd(kd.size(), 0.f);
    for (uint32_t r = 0; r < kB; ++r)
      for (uint32_t h = 0; h < kHkv; ++h)
        for (int32_t t = 0; t < lens[r]; ++t)
          for (uint32_t d = 0; d < kD; ++d) {
            const size_t blk = (size_t)tables[(size_t)r * kMbps + (uint32_t)t / kBs];
            const size_t src = ((blk * kHkv + h) * kBs + (uint32_t)t % kBs) * kD + d;
            const size_t dst = (((size_t)r * kHkv + h) * max_len + (size_t)t) * kD + d;
            kd[dst] = k[src];
            vd[dst] = v[src];
          }
    ref.resize(q.size());
    CHECK_OK(fd_reference_attention_dense(FD_DTYPE_F32, kB, kHq, kHkv, kD, max_len, q.data(),
                                          kd.data(), vd.data(), lens.data(), 0.f, ref.data()));
    check_close(single, ref, FD_DTYPE_F32, "big decode vs reference");
  }

  std::vector<float> run(uint32_t threads) const {
    std::vector<float> out(q.size(), NAN);
    fd_decode_params p;
    fd_decode_params_init(&p);
    fd_test_decode_dtype(&p, FD_DTYPE_F32);
    p.batch = kB;
    p.num_q_heads = kHq;
    p.num_kv_heads = kHkv;
    p.head_dim = kD;
    p.block_size = kBs;
    p.num_blocks = num_blocks;
    p.max_blocks_per_seq = kMbps;
    p.num_splits = 1;
    p.q = q.data();
    p.k_cache = k.data();
    p.v_cache = v.data();
    p.block_tables = tables.data();
    p.seq_lens = lens.data();
    p.out = out.data();
    p.cpu_threads = threads;
    CHECK_OK(fd_decode(&p));
    return out;
  }

  void check(uint32_t threads) const {
    const std::vector<float> out = run(threads);
    CHECK(memcmp(out.data(), single.data(), out.size() * sizeof(float)) == 0);
  }
};

/* ---- a cache driven through transactions and prefixes ------------------- */

struct PrefixShadow {
  uint32_t num_blocks = 0;
  Shadow tokens;
};

class CacheDriver {
 public:
  CacheDriver(fd_cache *cache, uint64_t id_base, const std::string &tag, bool exact_counts,
              uint64_t seed)
      : c_(cache), next_id_(id_base), tag_(tag), exact_(exact_counts), rng_{seed} {
    cfg_.struct_size = sizeof cfg_;
    CHECK_OK(fd_cache_get_config(c_, &cfg_));
    tok_ = (size_t)cfg_.num_kv_heads * cfg_.head_dim;
  }

  /* One random operation; returns its name for the statistics. */
  int step() {
    const int op = (int)fd_test_range(&rng_, 0, 99);
    if (active_.size() < 2 || op < 12) {
      add();
      return 0;
    }
    if (op < 52) {
      transaction();
      return 1;
    }
    if (op < 60) {
      close_one();
      return 2;
    }
    if (op < 64) {
      register_prefix();
      return 3;
    }
    if (op < 69) {
      attach_prefix();
      return 4;
    }
    if (op < 72) {
      evict_prefix();
      return 5;
    }
    if (op < 82) {
      check_contents();
      return 6;
    }
    if (op < 92) {
      decode();
      return 7;
    }
    if (op < 96) {
      bad_calls();
      return 8;
    }
    validate();
    return 9;
  }

  void validate() {
    CHECK_OK(fd_cache_validate(c_));
    fd_cache_metrics m;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    CHECK_OK(fd_cache_metrics_get(c_, &m));
    CHECK(m.open_transaction_count == 0);
    CHECK(m.used_blocks + m.free_blocks == m.max_blocks);
    if (exact_) {
      CHECK(m.active_request_count == active_.size());
      uint64_t tokens = 0;
      for (const auto &a : active_) tokens += (uint64_t)a.second.len;
      CHECK(m.active_tokens == tokens);
    } else {
      CHECK(m.active_request_count >= active_.size());
    }
  }

  /* Finishes every request and evicts the prefixes this driver registered. */
  void drain() {
    while (!active_.empty()) close_id(active_.begin()->first);
    for (const auto &p : prefixes_) {
      const fd_status st = fd_prefix_evict(c_, p.first.c_str());
      CHECK(st == FD_OK || st == FD_ERR_NOT_FOUND);
      if (st != FD_OK) t_expected_message = fd_last_error_message();
    }
    validate();
  }

 private:
  void add() {
    if (active_.size() >= 8) {
      close_one();
      return;
    }
    const uint64_t id = next_id_++;
    CHECK_OK(fd_cache_add_request(c_, id));
    active_.emplace(id, Shadow(cfg_.num_layers));
  }

  void close_id(uint64_t id) {
    if (fd_test_next(&rng_) % 2)
      CHECK_OK(fd_cache_finish_request(c_, id));
    else
      CHECK_OK(fd_cache_cancel_request(c_, id));
    active_.erase(id);
    terminal_.push_back(id);
  }

  void close_one() {
    std::vector<uint64_t> ids = active_ids();
    close_id(pick(&rng_, ids));
  }

  std::vector<uint64_t> active_ids() const {
    std::vector<uint64_t> ids;
    for (const auto &a : active_) ids.push_back(a.first);
    return ids;
  }

  std::vector<uint64_t> random_rows(uint32_t max_rows) {
    std::vector<uint64_t> ids = active_ids();
    for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[fd_test_next(&rng_) % i]);
    ids.resize(std::min<size_t>(ids.size(), (size_t)fd_test_range(&rng_, 1, max_rows)));
    return ids;
  }

  void transaction() {
    std::vector<uint64_t> ids = random_rows(4);
    const uint32_t b = (uint32_t)ids.size();
    // Long requests end, so that blocks come back.
    for (uint64_t id : ids)
      if (active_.at(id).len > 40) {
        close_id(id);
        return;
      }
    uint32_t needed = 0, free = 0;
    CHECK_OK(fd_cache_blocks_needed(c_, ids.data(), b, &needed, &free));
    uint32_t want = 0;
    for (uint64_t id : ids) want += active_.at(id).len % (int32_t)cfg_.block_size == 0;
    CHECK(needed == want);
    fd_tx tx;
    if (needed > free) {
      CHECK_FAILS(fd_tx_begin(c_, ids.data(), b, &tx), FD_ERR_OUT_OF_BLOCKS, "transaction needs");
      close_one();
      return;
    }
    CHECK_OK(fd_tx_begin(c_, ids.data(), b, &tx));
    std::vector<int32_t> positions(b);
    CHECK_OK(fd_tx_get_rows(c_, tx, b, NULL, positions.data(), NULL, NULL, NULL));
    for (uint32_t r = 0; r < b; ++r) CHECK(positions[r] == active_.at(ids[r]).len);
    const int32_t dt = cfg_.dtype;
    const size_t n = (size_t)b * tok_;
    std::vector<std::vector<float>> ks(cfg_.num_layers), vs(cfg_.num_layers);
    const uint32_t stop_at = fd_test_next(&rng_) % 8 == 0
                                 ? (uint32_t)fd_test_range(&rng_, 0, cfg_.num_layers)
                                 : cfg_.num_layers + 1;
    for (uint32_t l = 0; l < cfg_.num_layers; ++l) {
      if (l == stop_at) break;
      if (fd_test_next(&rng_) % 16 == 0) {
        std::vector<float> junk(n, 0.f);
        CHECK_FAILS(fd_tx_write_layer(c_, tx, l + 1, junk.data(), junk.data(), NULL),
                    FD_ERR_INVALID_ARGUMENT, "requires layer");
      }
      std::vector<float> k = random_data(&rng_, dt, n), v = random_data(&rng_, dt, n);
      if (fd_test_next(&rng_) % 2) {
        CHECK_OK(fd_tx_write_layer(c_, tx, l, k.data(), v.data(), NULL));
        ks[l] = to_f32(k.data(), dt, n);
      } else {
        const uint32_t hq = cfg_.num_kv_heads * (uint32_t)fd_test_range(&rng_, 1, 2);
        const uint32_t rotary = 2 * (uint32_t)fd_test_range(&rng_, 1, cfg_.head_dim / 2);
        const float base = fd_test_next(&rng_) % 2 ? 10000.f : 500.f;
        std::vector<float> q = random_data(&rng_, dt, (size_t)b * hq * cfg_.head_dim);
        std::vector<float> q_out(q.size());
        CHECK_OK(fd_tx_write_layer_rope(c_, tx, l, q.data(), hq, k.data(), v.data(), rotary, base,
                                        q_out.data(), NULL));
        const std::vector<float> q_want =
            rope(q, dt, b, hq, cfg_.head_dim, positions, rotary, base);
        check_close(to_f32(q_out.data(), dt, q.size()), to_f32(q_want.data(), dt, q.size()), dt,
                    "rotated q");
        const std::vector<float> k_rot =
            rope(k, dt, b, cfg_.num_kv_heads, cfg_.head_dim, positions, rotary, base);
        ks[l] = to_f32(k_rot.data(), dt, n);
      }
      vs[l] = to_f32(v.data(), dt, n);
    }
    if (stop_at <= cfg_.num_layers) {
      if (stop_at < cfg_.num_layers) CHECK_FAILS(fd_tx_commit(c_, tx), FD_ERR_INVALID_STATE, "");
      CHECK_OK(fd_tx_abort(c_, tx));
      CHECK_FAILS(fd_tx_commit(c_, tx), FD_ERR_INVALID_STATE, "already");
      return;
    }
    CHECK_OK(fd_tx_commit(c_, tx));
    for (uint32_t r = 0; r < b; ++r) {
      Shadow &s = active_.at(ids[r]);
      for (uint32_t l = 0; l < cfg_.num_layers; ++l) {
        s.k[l].insert(s.k[l].end(), ks[l].begin() + r * tok_, ks[l].begin() + (r + 1) * tok_);
        s.v[l].insert(s.v[l].end(), vs[l].begin() + r * tok_, vs[l].begin() + (r + 1) * tok_);
      }
      s.len += 1;
    }
  }

  void register_prefix() {
    if (cfg_.prefix_cache_capacity_blocks == 0) return;
    const std::string name = tag_ + "-p" + std::to_string(prefix_serial_++);
    PrefixShadow p;
    p.num_blocks = (uint32_t)fd_test_range(&rng_, 1, 3);
    const uint32_t tokens = p.num_blocks * cfg_.block_size;
    p.tokens = Shadow(cfg_.num_layers);
    p.tokens.len = (int32_t)tokens;
    const size_t per_layer = (size_t)tokens * tok_;
    std::vector<float> kin(cfg_.num_layers * per_layer), vin(kin.size());
    const int32_t dt = cfg_.dtype;
    const uint32_t H = cfg_.num_kv_heads, D = cfg_.head_dim, B = cfg_.block_size;
    for (uint32_t l = 0; l < cfg_.num_layers; ++l) {
      const std::vector<float> k = to_f32(random_data(&rng_, dt, per_layer).data(), dt, per_layer);
      const std::vector<float> v = to_f32(random_data(&rng_, dt, per_layer).data(), dt, per_layer);
      p.tokens.k[l] = k;
      p.tokens.v[l] = v;
      // Input order [layer, block, head, token, dim] (dim-major: [.., dim, token]).
      for (uint32_t t = 0; t < tokens; ++t)
        for (uint32_t h = 0; h < H; ++h)
          for (uint32_t d = 0; d < D; ++d) {
            const size_t blk = t / B, off = t % B;
            const size_t inner = cfg_.layout == FD_LAYOUT_TOKEN_MAJOR ? off * D + d : d * B + off;
            const size_t dst = l * per_layer + (blk * H + h) * B * D + inner;
            fd_test_store(kin.data(), dst, dt, k[(size_t)t * tok_ + h * D + d]);
            fd_test_store(vin.data(), dst, dt, v[(size_t)t * tok_ + h * D + d]);
          }
    }
    const fd_status st =
        fd_prefix_register(c_, name.c_str(), kin.data(), vin.data(), p.num_blocks, NULL);
    if (st == FD_ERR_OUT_OF_BLOCKS) {
      CHECK_FAILS(st, FD_ERR_OUT_OF_BLOCKS, "");
      return;
    }
    CHECK_OK(st);
    CHECK_FAILS(fd_prefix_register(c_, name.c_str(), kin.data(), vin.data(), 1, NULL),
                FD_ERR_ALREADY_EXISTS, name.c_str());
    prefixes_[name] = p;
  }

  bool resident(const std::string &name, fd_prefix_info *info) {
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    const fd_status st = fd_prefix_get_info(c_, name.c_str(), info);
    if (st == FD_OK) return true;
    CHECK_FAILS(st, FD_ERR_NOT_FOUND, name.c_str());
    return false;
  }

  void attach_prefix() {
    if (prefixes_.empty() || active_.size() >= 8) return;
    auto it = prefixes_.begin();
    std::advance(it, (long)(fd_test_next(&rng_) % prefixes_.size()));
    fd_prefix_info info;
    const bool here = resident(it->first, &info);
    const uint64_t id = next_id_++;
    CHECK_OK(fd_cache_add_request(c_, id));
    active_.emplace(id, Shadow(cfg_.num_layers));
    if (!here) {
      CHECK_FAILS(fd_prefix_attach(c_, id, it->first.c_str()), FD_ERR_NOT_FOUND, it->first.c_str());
      return;
    }
    CHECK(info.num_blocks == it->second.num_blocks);
    CHECK_OK(fd_prefix_attach(c_, id, it->first.c_str()));
    active_.at(id) = it->second.tokens;
    fd_prefix_info after;
    CHECK(resident(it->first, &after));
    CHECK(after.ref_count == info.ref_count + 1);
  }

  void evict_prefix() {
    if (prefixes_.empty()) return;
    auto it = prefixes_.begin();
    std::advance(it, (long)(fd_test_next(&rng_) % prefixes_.size()));
    fd_prefix_info info;
    if (!resident(it->first, &info)) {
      CHECK_FAILS(fd_prefix_evict(c_, it->first.c_str()), FD_ERR_NOT_FOUND, it->first.c_str());
      prefixes_.erase(it);
    } else if (info.ref_count > 0) {
      CHECK_FAILS(fd_prefix_evict(c_, it->first.c_str()), FD_ERR_INVALID_STATE, it->first.c_str());
    } else {
      CHECK_OK(fd_prefix_evict(c_, it->first.c_str()));
      prefixes_.erase(it);
    }
  }

  /* Exported seq_lens and the cache's storage equal the shadow. */
  void check_contents() {
    std::vector<uint64_t> ids = random_rows(6);
    const uint32_t b = (uint32_t)ids.size();
    uint32_t stride = 0;
    CHECK_OK(fd_cache_max_blocks_per_seq(c_, ids.data(), b, &stride));
    stride = std::max(stride, 1u);
    std::vector<int32_t> tables((size_t)b * stride), lens(b);
    CHECK_OK(fd_cache_export(c_, ids.data(), b, stride, tables.data(), lens.data()));
    const int32_t dt = cfg_.dtype;
    const uint32_t H = cfg_.num_kv_heads, D = cfg_.head_dim, B = cfg_.block_size;
    for (uint32_t l = 0; l < cfg_.num_layers; ++l) {
      void *k = nullptr, *v = nullptr;
      int64_t s[4];
      CHECK_OK(fd_cache_layer_storage(c_, l, &k, &v, s));
      for (uint32_t r = 0; r < b; ++r) {
        const Shadow &sh = active_.at(ids[r]);
        CHECK(lens[r] == sh.len);
        for (int32_t t = 0; t < sh.len; ++t) {
          const int32_t blk = tables[(size_t)r * stride + (uint32_t)t / B];
          CHECK(blk >= 0 && (uint32_t)blk < cfg_.max_blocks);
          for (uint32_t h = 0; h < H; ++h)
            for (uint32_t d = 0; d < D; ++d) {
              const size_t at =
                  (size_t)(blk * s[0] + h * s[1] + (t % (int32_t)B) * s[2] + d * s[3]);
              const size_t i = (size_t)t * tok_ + h * D + d;
              if (!close_enough(fd_test_load(k, at, dt), sh.k[l][i], dt) ||
                  fd_test_load(v, at, dt) != sh.v[l][i])
                check_failed(__FILE__, __LINE__,
                             "cache contents differ from the shadow: request " +
                                 std::to_string(ids[r]) + " layer " + std::to_string(l) +
                                 " token " + std::to_string(t));
            }
        }
        for (uint32_t i = ((uint32_t)sh.len + B - 1) / B; i < stride; ++i)
          CHECK(tables[(size_t)r * stride + i] == -1);
      }
    }
  }

  /* fd_decode over the cache's own storage, several worker threads allowed,
   * against a single-threaded rerun and the dense reference of the shadow. */
  void decode() {
    std::vector<uint64_t> ids = random_rows(4);
    const uint32_t b = (uint32_t)ids.size();
    uint32_t stride = 0;
    CHECK_OK(fd_cache_max_blocks_per_seq(c_, ids.data(), b, &stride));
    stride = std::max(stride, 1u);
    std::vector<int32_t> tables((size_t)b * stride), lens(b);
    CHECK_OK(fd_cache_export(c_, ids.data(), b, stride, tables.data(), lens.data()));
    const uint32_t layer = (uint32_t)fd_test_range(&rng_, 0, cfg_.num_layers - 1);
    void *k = nullptr, *v = nullptr;
    int64_t s[4];
    CHECK_OK(fd_cache_layer_storage(c_, layer, &k, &v, s));
    const int32_t dt = cfg_.dtype;
    const uint32_t hq = cfg_.num_kv_heads * (uint32_t)fd_test_range(&rng_, 1, 3);
    const std::vector<float> q = random_data(&rng_, dt, (size_t)b * hq * cfg_.head_dim);
    fd_decode_params p;
    fd_decode_params_init(&p);
    fd_test_decode_dtype(&p, dt);
    p.layout = cfg_.layout;
    p.batch = b;
    p.num_q_heads = hq;
    p.num_kv_heads = cfg_.num_kv_heads;
    p.head_dim = cfg_.head_dim;
    p.block_size = cfg_.block_size;
    p.num_blocks = cfg_.max_blocks;
    p.max_blocks_per_seq = stride;
    p.q = q.data();
    p.k_cache = k;
    p.v_cache = v;
    p.stride_block = s[0];
    p.stride_head = s[1];
    p.stride_token = s[2];
    p.stride_dim = s[3];
    p.block_tables = tables.data();
    p.seq_lens = lens.data();
    p.flags = FD_DECODE_CHECK_INDICES;
    p.num_splits = (int32_t)fd_test_range(&rng_, 0, 3);
    std::vector<float> out(q.size()), out1(q.size());
    p.out = out.data();
    size_t ws_bytes = 0;
    CHECK_OK(fd_decode_workspace_size(&p, &ws_bytes));
    std::vector<float> ws(ws_bytes / sizeof(float) + 1);
    p.workspace = ws.data();
    p.workspace_size = ws_bytes;
    p.cpu_threads = (uint32_t)fd_test_range(&rng_, 2, 4);
    CHECK_OK(fd_decode(&p));
    p.out = out1.data();
    p.cpu_threads = 1;
    CHECK_OK(fd_decode(&p));
    CHECK(memcmp(out.data(), out1.data(), out.size() * sizeof(float)) == 0);
    std::vector<const Shadow *> rows;
    for (uint64_t id : ids) rows.push_back(&active_.at(id));
    check_close(to_f32(out.data(), dt, out.size()),
                reference(dt, hq, cfg_.num_kv_heads, cfg_.head_dim, rows, layer, q), dt,
                "decode over the cache");
  }

  /* Failures that name this thread's own ids. */
  void bad_calls() {
    const uint64_t unknown = next_id_ + 1000000;
    CHECK_FAILS(fd_cache_finish_request(c_, unknown), FD_ERR_NOT_FOUND,
                ("unknown request " + std::to_string(unknown)).c_str());
    if (!terminal_.empty()) {
      const uint64_t id = pick(&rng_, terminal_);
      CHECK_FAILS(fd_cache_add_request(c_, id), FD_ERR_INVALID_STATE,
                  ("request " + std::to_string(id)).c_str());
      int32_t st = 0;
      CHECK_OK(fd_cache_request_state(c_, id, &st));
      CHECK(st == FD_REQUEST_FINISHED || st == FD_REQUEST_CANCELLED);
    }
    const std::string missing = tag_ + "-missing";
    CHECK_FAILS(fd_prefix_evict(c_, missing.c_str()), FD_ERR_NOT_FOUND, missing.c_str());
  }

  fd_cache *c_;
  fd_cache_config cfg_;
  size_t tok_ = 0;
  uint64_t next_id_;
  std::string tag_;
  bool exact_;
  fd_test_rng rng_;
  std::map<uint64_t, Shadow> active_;
  std::vector<uint64_t> terminal_;
  std::map<std::string, PrefixShadow> prefixes_;
  unsigned prefix_serial_ = 0;
};

fd_cache *make_cache(uint32_t layers, uint32_t kv, uint32_t dim, uint32_t bs, uint32_t blocks,
                     uint32_t prefix_blocks, int32_t dtype, int32_t layout) {
  fd_cache_config cfg;
  fd_cache_config_init(&cfg);
  cfg.num_layers = layers;
  cfg.num_kv_heads = kv;
  cfg.head_dim = dim;
  cfg.block_size = bs;
  cfg.max_blocks = blocks;
  cfg.prefix_cache_capacity_blocks = prefix_blocks;
  cfg.dtype = dtype;
  cfg.layout = layout;
  fd_cache *c = nullptr;
  CHECK_OK(fd_cache_create(&cfg, &c));
  return c;
}

/* ---- an engine on its own cache (f32), both modes ----------------------- */

class EngineDriver {
 public:
  static constexpr uint32_t kKv = 2, kHq = 4, kD = 16, kBs = 4, kBlocks = 40;

  EngineDriver(uint64_t seed, uint64_t id_base, const std::string &tag, bool scheduled)
      : rng_{seed}, next_id_(id_base), tag_(tag), scheduled_(scheduled) {
    layers_ = (uint32_t)fd_test_range(&rng_, 1, 3);
    c_ = make_cache(layers_, kKv, kD, kBs, kBlocks, 8, FD_DTYPE_F32, FD_LAYOUT_TOKEN_MAJOR);
    fd_engine_config ec;
    fd_engine_config_init(&ec);
    ec.num_q_heads = kHq;
    rotary_ = fd_test_next(&rng_) % 2 ? kD : kD / 2;
    base_ = fd_test_next(&rng_) % 2 ? 10000.f : 100.f;
    ec.rotary_dim = rotary_;
    ec.rope_base = base_;
    ec.cpu_threads = (uint32_t)fd_test_range(&rng_, 2, 4);
    CHECK_OK(fd_engine_create(c_, &ec, &e_));
  }
  ~EngineDriver() {
    fd_engine_destroy(e_);
    fd_cache_destroy(c_);
  }
  EngineDriver(const EngineDriver &) = delete;
  EngineDriver &operator=(const EngineDriver &) = delete;

  /* Runs about `ops` operations; returns how many ran. */
  long run(long ops) {
    long done = 0;
    if (scheduled_) {
      while (done < ops) done += scheduled_round();
    } else {
      for (; done < ops; ++done) unscheduled_op();
    }
    validate();
    return done;
  }

 private:
  struct Waiting {
    uint32_t context = 0, new_tokens = 0;
    std::string prefix;
  };

  void validate() {
    CHECK_OK(fd_engine_validate(e_));
    fd_engine_metrics m;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    CHECK_OK(fd_engine_metrics_get(e_, &m));
    CHECK(m.active_request_count == active_.size());
    CHECK(m.open_step_transaction_count == 0);
    CHECK(m.scheduler_managed == (scheduled_ && submitted_ ? 1u : 0u));
    CHECK_OK(fd_cache_validate(c_));
  }

  int32_t state(uint64_t id) {
    int32_t s = -1;
    CHECK_OK(fd_engine_get_request_state(e_, id, &s));
    return s;
  }

  uint32_t free_blocks() {
    fd_cache_metrics m;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    CHECK_OK(fd_cache_metrics_get(c_, &m));
    return (uint32_t)m.free_blocks;
  }

  std::vector<float> rotated(const std::vector<float> &x, uint32_t heads,
                             const std::vector<int32_t> &pos) {
    return rope(x, FD_DTYPE_F32, (uint32_t)pos.size(), heads, kD, pos, rotary_, base_);
  }

  void prefill(uint64_t id) {
    Shadow &s = active_.at(id);
    const size_t tok = (size_t)kKv * kD;
    const std::vector<float> k = random_data(&rng_, FD_DTYPE_F32, layers_ * tok);
    const std::vector<float> v = random_data(&rng_, FD_DTYPE_F32, layers_ * tok);
    if (s.len % (int32_t)kBs == 0 && free_blocks() == 0) {
      CHECK_FAILS(fd_engine_prefill_request_layers(e_, id, k.data(), v.data()),
                  FD_ERR_OUT_OF_BLOCKS, "");
      return;
    }
    CHECK_OK(fd_engine_prefill_request_layers(e_, id, k.data(), v.data()));
    const std::vector<float> k_rot = rotated(k, kKv * layers_, std::vector<int32_t>(1, s.len));
    for (uint32_t l = 0; l < layers_; ++l) {
      s.k[l].insert(s.k[l].end(), k_rot.begin() + l * tok, k_rot.begin() + (l + 1) * tok);
      s.v[l].insert(s.v[l].end(), v.begin() + l * tok, v.begin() + (l + 1) * tok);
    }
    s.len += 1;
  }

  /* One step over `ids`; checks every layer's output. Returns false when
   * the step was aborted (or backpressured). */
  bool step(const std::vector<uint64_t> &ids, bool may_abort) {
    const uint32_t b = (uint32_t)ids.size();
    uint32_t want = 0;
    for (uint64_t id : ids) want += active_.at(id).len % (int32_t)kBs == 0;
    const uint32_t free = free_blocks();
    fd_engine_step st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK_OK(fd_engine_begin_step(e_, ids.data(), b, &st));
    CHECK(st.batch == b && st.needed_blocks == want && st.free_blocks == free);
    if (want > free) {
      CHECK(st.outcome == FD_STEP_BACKPRESSURE);
      return false;
    }
    CHECK(st.outcome == FD_STEP_OPENED);
    std::vector<int32_t> pos;
    std::vector<const Shadow *> rows;
    for (uint64_t id : ids) {
      pos.push_back(active_.at(id).len);
      rows.push_back(&active_.at(id));
    }
    const uint32_t abort_at = may_abort && fd_test_next(&rng_) % 10 == 0
                                  ? (uint32_t)fd_test_range(&rng_, 0, layers_)
                                  : layers_ + 1;
    const size_t tok = (size_t)kKv * kD;
    std::vector<std::vector<float>> ks(layers_), vs(layers_);
    for (uint32_t l = 0; l < layers_; ++l) {
      if (l == abort_at) {
        if (fd_test_next(&rng_) % 2) {
          CHECK_OK(fd_engine_abort_step(e_, st.tx));
        } else {  // a wrong layer aborts the step
          std::vector<float> x((size_t)b * kHq * kD, 0.f), o(x.size());
          CHECK_FAILS(
              fd_engine_step_layer(e_, st.tx, l + 1, x.data(), x.data(), x.data(), o.data(), NULL),
              FD_ERR_INVALID_ARGUMENT, "layer");
        }
        CHECK_FAILS(fd_engine_commit_step(e_, st.tx), FD_ERR_INVALID_STATE, "");
        return false;
      }
      const std::vector<float> q = random_data(&rng_, FD_DTYPE_F32, (size_t)b * kHq * kD, 2.f);
      const std::vector<float> k = random_data(&rng_, FD_DTYPE_F32, (size_t)b * tok);
      const std::vector<float> v = random_data(&rng_, FD_DTYPE_F32, (size_t)b * tok);
      std::vector<float> out(q.size(), NAN);
      CHECK_OK(fd_engine_step_layer(e_, st.tx, l, q.data(), k.data(), v.data(), out.data(), NULL));
      ks[l] = rotated(k, kKv, pos);
      vs[l] = v;
      const std::vector<float> want_out =
          reference(FD_DTYPE_F32, kHq, kKv, kD, rows, l, rotated(q, kHq, pos), &ks[l], &vs[l]);
      check_close(out, want_out, FD_DTYPE_F32, "engine step output");
    }
    if (abort_at == layers_) {
      CHECK_OK(fd_engine_abort_step(e_, st.tx));
      return false;
    }
    CHECK_OK(fd_engine_commit_step(e_, st.tx));
    CHECK_FAILS(fd_engine_commit_step(e_, st.tx), FD_ERR_INVALID_STATE, "");
    for (uint32_t r = 0; r < b; ++r) {
      Shadow &s = active_.at(ids[r]);
      for (uint32_t l = 0; l < layers_; ++l) {
        s.k[l].insert(s.k[l].end(), ks[l].begin() + r * tok, ks[l].begin() + (r + 1) * tok);
        s.v[l].insert(s.v[l].end(), vs[l].begin() + r * tok, vs[l].begin() + (r + 1) * tok);
      }
      s.len += 1;
    }
    return true;
  }

  std::vector<uint64_t> active_ids() const {
    std::vector<uint64_t> ids;
    for (const auto &a : active_) ids.push_back(a.first);
    return ids;
  }

  void close(uint64_t id) {
    if (fd_test_next(&rng_) % 2) {
      CHECK_OK(fd_engine_finish(e_, id));
      CHECK(state(id) == FD_ENGINE_REQUEST_FINISHED);
    } else {
      CHECK_OK(fd_engine_cancel(e_, id));
      CHECK(state(id) == FD_ENGINE_REQUEST_CANCELLED);
    }
    active_.erase(id);
    CHECK_FAILS(fd_engine_finish(e_, id), FD_ERR_INVALID_STATE, std::to_string(id).c_str());
  }

  void unscheduled_op() {
    const int op = (int)fd_test_range(&rng_, 0, 99);
    if (active_.empty() || (op < 15 && active_.size() < 6)) {
      const uint64_t id = next_id_++;
      CHECK_OK(fd_engine_add_request(e_, id));
      CHECK(state(id) == FD_ENGINE_REQUEST_WAITING);
      CHECK_OK(fd_engine_admit(e_, id));
      active_.emplace(id, Shadow(layers_));
    } else if (op < 30) {
      const uint64_t id = pick(&rng_, active_ids());
      if (active_.at(id).len < 10) prefill(id);
    } else if (op < 80) {
      std::vector<uint64_t> ids = active_ids();
      for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[fd_test_next(&rng_) % i]);
      ids.resize((size_t)fd_test_range(&rng_, 1, (int64_t)ids.size()));
      if (!step(ids, true) && free_blocks() < 4) close(pick(&rng_, active_ids()));
    } else if (op < 90) {
      std::vector<uint64_t> ids = active_ids();
      uint64_t longest = ids[0];
      for (uint64_t id : ids)
        if (active_.at(id).len > active_.at(longest).len) longest = id;
      close(op < 85 ? longest : pick(&rng_, ids));
    } else if (op < 97) {
      validate();
    } else {
      const uint64_t unknown = next_id_ + 5000000;
      CHECK_FAILS(fd_engine_admit(e_, unknown), FD_ERR_NOT_FOUND, std::to_string(unknown).c_str());
      read_shared_plan();
    }
  }

  /* Scheduler-managed: a prefix, a batch of submissions, then plan / apply /
   * prefill / step until every request is terminal. Returns operations run. */
  long scheduled_round() {
    long ops = 0;
    const size_t tok = (size_t)kKv * kD;
    std::string prefix;
    PrefixShadow ps;
    if (!submitted_) {
      prefix = tag_ + "-sys";
      ps.num_blocks = (uint32_t)fd_test_range(&rng_, 1, 2);
      ps.tokens = Shadow(layers_);
      ps.tokens.len = (int32_t)(ps.num_blocks * kBs);
      const size_t per_layer = (size_t)ps.tokens.len * tok;
      std::vector<float> kin = random_data(&rng_, FD_DTYPE_F32, layers_ * per_layer);
      std::vector<float> vin = random_data(&rng_, FD_DTYPE_F32, kin.size());
      // [layer, block, head, token, dim] -> shadow [token][head * dim].
      for (uint32_t l = 0; l < layers_; ++l) {
        ps.tokens.k[l].resize(per_layer);
        ps.tokens.v[l].resize(per_layer);
        for (uint32_t t = 0; t < (uint32_t)ps.tokens.len; ++t)
          for (uint32_t h = 0; h < kKv; ++h)
            for (uint32_t d = 0; d < kD; ++d) {
              const size_t src =
                  l * per_layer + (((size_t)t / kBs) * kKv + h) * kBs * kD + (t % kBs) * kD + d;
              ps.tokens.k[l][(size_t)t * tok + h * kD + d] = kin[src];
              ps.tokens.v[l][(size_t)t * tok + h * kD + d] = vin[src];
            }
      }
      CHECK_OK(fd_engine_register_prefix(e_, prefix.c_str(), kin.data(), vin.data(), ps.num_blocks,
                                         NULL));
      prefix_ = ps;
      prefix_name_ = prefix;
    }
    std::map<uint64_t, Waiting> waiting;
    const int n = (int)fd_test_range(&rng_, 3, 8);
    for (int i = 0; i < n; ++i) {
      const uint64_t id = next_id_++;
      Waiting w;
      w.new_tokens = (uint32_t)fd_test_range(&rng_, 1, 6);
      const int kind = (int)fd_test_range(&rng_, 0, 9);
      if (kind < 3) {
        w.prefix = prefix_name_;
        w.context = prefix_.num_blocks * kBs;
      } else if (kind < 9) {
        w.context = (uint32_t)fd_test_range(&rng_, 0, 6);
      } else {
        w.new_tokens = kBlocks * kBs * 2;  // never fits: rejected
      }
      fd_request_spec spec;
      fd_request_spec_init(&spec);
      spec.id = id;
      spec.submission_order = id;
      spec.initial_context_tokens = w.context;
      spec.max_new_tokens = w.new_tokens;
      spec.prefix_id = w.prefix.empty() ? NULL : w.prefix.c_str();
      CHECK_OK(fd_engine_submit_request(e_, &spec));
      submitted_ = true;
      CHECK_FAILS(fd_engine_submit_request(e_, &spec), FD_ERR_ALREADY_EXISTS, "");
      waiting[id] = w;
      ++ops;
    }
    std::map<uint64_t, Waiting> running;
    for (int iter = 0; iter < 200 && (!waiting.empty() || !running.empty()); ++iter) {
      fd_snapshot *snap = nullptr;
      CHECK_OK(fd_engine_snapshot(e_, (uint64_t)iter, NULL, 0, &snap));
      fd_decision *d = nullptr;
      CHECK_OK(fd_scheduler_plan(g_plan.scheduler, snap, &d));
      fd_snapshot_destroy(snap);
      CHECK_OK(fd_engine_apply_decision(e_, g_plan.scheduler, d));
      ops += 2;
      for (uint64_t id : decision_ids(d, FD_DECISION_REJECTED)) {
        CHECK(waiting.count(id) == 1);
        CHECK(state(id) == FD_ENGINE_REQUEST_REJECTED);
        waiting.erase(id);
      }
      for (uint64_t id : decision_ids(d, FD_DECISION_ADMIT)) {
        CHECK(waiting.count(id) == 1);
        CHECK(state(id) == FD_ENGINE_REQUEST_ACTIVE);
        const Waiting w = waiting.at(id);
        waiting.erase(id);
        running[id] = w;
        active_.emplace(id, w.prefix.empty() ? Shadow(layers_) : prefix_.tokens);
        while ((uint32_t)active_.at(id).len < w.context) {
          prefill(id);
          ++ops;
        }
      }
      const std::vector<uint64_t> run = decision_ids(d, FD_DECISION_RUNNABLE);
      const bool stepped = !run.empty() && step(run, true);
      if (stepped) {
        ++ops;
        for (uint64_t id : run) {
          const Waiting &w = running.at(id);
          if ((uint32_t)active_.at(id).len == w.context + w.new_tokens) {
            CHECK(state(id) == FD_ENGINE_REQUEST_FINISHED);
            active_.erase(id);
            running.erase(id);
          } else {
            CHECK(state(id) == FD_ENGINE_REQUEST_ACTIVE);
          }
        }
      }
      if (stepped && fd_test_next(&rng_) % 4 == 0)
        CHECK_FAILS(fd_engine_apply_decision(e_, g_plan.scheduler, d), FD_ERR_STALE_HANDLE, "");
      fd_decision_destroy(d);
      if (iter % 8 == 0) validate();
    }
    CHECK(waiting.empty() && running.empty());
    validate();
    return ops;
  }

  fd_test_rng rng_;
  uint64_t next_id_;
  std::string tag_;
  bool scheduled_;
  bool submitted_ = false;
  uint32_t layers_ = 1, rotary_ = kD;
  float base_ = 10000.f;
  fd_cache *c_ = nullptr;
  fd_engine *e_ = nullptr;
  std::map<uint64_t, Shadow> active_;
  PrefixShadow prefix_;
  std::string prefix_name_;
};

/* ---- threads ------------------------------------------------------------ */

long ops_per_worker() {
  const char *env = getenv("FLASHDEC_STRESS_OPS");
  if (env != NULL && atol(env) > 0) return atol(env);
  return FD_STRESS_TSAN ? 3000 : 30000;
}

struct Result {
  std::string failure;
  long ops = 0;
};

void run_guarded(Result *res, void (*body)(Result *, unsigned), unsigned index) {
  try {
    body(res, index);
  } catch (const CheckFailed &f) {
    res->failure = f.what;
  } catch (const std::exception &e) {
    res->failure = std::string("exception: ") + e.what();
  }
}

/* One worker: its own caches and engines, all driven from this thread. */
void worker(Result *res, unsigned t) {
  const uint64_t seed = 0x5eed0000u + t;
  fd_test_rng rng = {seed};
  const long ops = ops_per_worker();
  const uint64_t id_base = (uint64_t)(t + 1) * 100000000ull;
  const std::string tag = "w" + std::to_string(t);
  const BigDecode big(seed * 7);
  const int32_t dtypes[] = {FD_DTYPE_F32, FD_DTYPE_BF16, FD_DTYPE_F16};
  const int32_t dtype = dtypes[t % 3];
  const int32_t layout = (t / 3) % 2 ? FD_LAYOUT_DIM_MAJOR : FD_LAYOUT_TOKEN_MAJOR;
  long cache_ops = 0, epoch = 0;
  while (cache_ops < ops / 2) {
    // A fresh cache now and then: creation and destruction race too.
    fd_cache *c = make_cache((uint32_t)fd_test_range(&rng, 1, 3), 2, 8, 4, 48, 12, dtype, layout);
    CacheDriver drv(c, id_base + (uint64_t)epoch * 1000000ull, tag + "e" + std::to_string(epoch),
                    true, fd_test_next(&rng));
    for (int i = 0; i < 500 && cache_ops < ops / 2; ++i, ++cache_ops) {
      drv.step();
      if (i % 100 == 50) big.check((uint32_t)fd_test_range(&rng, 2, 4));
    }
    drv.drain();
    fd_cache_destroy(c);
    ++epoch;
  }
  long engine_ops = 0;
  for (; engine_ops < ops - cache_ops; ++epoch) {
    const bool scheduled = epoch % 2 == 1;
    EngineDriver eng(fd_test_next(&rng), id_base + 50000000ull + (uint64_t)epoch * 1000000ull,
                     tag + "e" + std::to_string(epoch), scheduled);
    engine_ops += eng.run(std::min<long>(300, ops - cache_ops - engine_ops));
    read_shared_plan();
    big.check((uint32_t)fd_test_range(&rng, 2, 4));
  }
  res->ops = cache_ops + engine_ops;
}

/* Two threads, one cache, turns under a mutex. */
struct SharedCache {
  fd_cache *cache = nullptr;
  std::mutex mutex;
};
SharedCache g_shared;

void sharer(Result *res, unsigned t) {
  const long turns = ops_per_worker() / 4;
  std::unique_lock<std::mutex> lock(g_shared.mutex);
  CacheDriver drv(g_shared.cache, (uint64_t)(t + 1) * 100000000ull, "s" + std::to_string(t), false,
                  0xabc0u + t);
  lock.unlock();
  fd_test_rng rng = {0x1234u + t};
  for (long turn = 0; turn < turns; ++turn) {
    lock.lock();
    const int n = (int)fd_test_range(&rng, 1, 8);
    for (int i = 0; i < n; ++i) drv.step();
    res->ops += n;
    lock.unlock();
    // The other thread's failures never show up here.
    const std::string mine = fd_last_error_message();
    CHECK(mine == t_expected_message);
    std::this_thread::yield();
  }
  lock.lock();
  drv.drain();
}

void test_threads(void **) {
  // Shared immutable objects: one scheduler, one snapshot, one decision.
  fd_scheduler_config sc;
  fd_scheduler_config_init(&sc);
  sc.max_active_requests = 4;
  sc.max_batch_requests = 3;
  FD_ASSERT_OK(fd_scheduler_create(&sc, &g_plan.scheduler));
  fd_snapshot_info info;
  fd_snapshot_info_init(&info);
  info.block_size = 4;
  info.max_blocks = 12;
  info.free_blocks = 12;
  FD_ASSERT_OK(fd_snapshot_create(&info, &g_plan.snapshot));
  for (uint64_t id = 1; id <= 7; ++id) {
    fd_request_spec s;
    fd_request_spec_init(&s);
    s.id = id;
    s.submission_order = id;
    s.initial_context_tokens = (uint32_t)(id * 3 % 7);
    s.max_new_tokens = id == 5 ? 100 : (uint32_t)id + 2;
    FD_ASSERT_OK(fd_snapshot_add_waiting(g_plan.snapshot, &s, (uint32_t)id % 3, 0));
  }
  FD_ASSERT_OK(fd_scheduler_plan(g_plan.scheduler, g_plan.snapshot, &g_plan.decision));
  for (int32_t l = 0; l < 5; ++l) g_plan.lists[l] = decision_ids(g_plan.decision, l);
  g_plan.summary = summary_of(g_plan.decision);
  assert_false(g_plan.lists[FD_DECISION_ADMIT].empty());
  assert_false(g_plan.lists[FD_DECISION_REJECTED].empty());

  g_shared.cache = make_cache(2, 2, 8, 4, 64, 12, FD_DTYPE_BF16, FD_LAYOUT_TOKEN_MAJOR);

  constexpr unsigned kWorkers = 8, kSharers = 2;
  std::vector<Result> results(kWorkers + kSharers);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kWorkers; ++t) threads.emplace_back(run_guarded, &results[t], worker, t);
  for (unsigned t = 0; t < kSharers; ++t)
    threads.emplace_back(run_guarded, &results[kWorkers + t], sharer, kWorkers + t);
  for (std::thread &th : threads) th.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  bool ok = true;
  long total = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    total += results[i].ops;
    if (!results[i].failure.empty()) {
      print_error("thread %zu: %s\n", i, results[i].failure.c_str());
      ok = false;
    }
  }
  print_message(
      "%u workers x %ld operations + %u threads sharing a cache: %ld operations in "
      "%.1f s%s\n",
      kWorkers, ops_per_worker(), kSharers, total, secs,
      FD_STRESS_TSAN ? " (ThreadSanitizer)" : "");
  FD_ASSERT_OK(fd_cache_validate(g_shared.cache));
  fd_cache_metrics m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  FD_ASSERT_OK(fd_cache_metrics_get(g_shared.cache, &m));
  assert_int_equal(m.active_request_count, 0);
  fd_cache_destroy(g_shared.cache);
  fd_decision_destroy(g_plan.decision);
  fd_snapshot_destroy(g_plan.snapshot);
  fd_scheduler_destroy(g_plan.scheduler);
  assert_true(ok);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
