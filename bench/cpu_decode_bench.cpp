// cpu_decode_bench: fd_decode on the CPU backend against this machine's copy
// bandwidth, measured in the same run (docs/benchmarks.md, "CPU backend
// decode"). Uses only the public C API, so it can time any libflashdec build.
//
// Cases: shape A (32 q heads / 8 kv heads / head_dim 128), block 16,
// token-major, blocks assigned to rows in a seeded random permutation;
// batch 8 x 4096 (bf16 and fp32) and batch 1 x 2048 (bf16), each with the
// requested thread count and with one thread. Unless --hot, each case rotates
// among enough independent K/V sets that their total exceeds --rotate-mib, so
// the last-level cache does not hold the working set; batch 1 x 2048 is also
// timed "hot" (one set, cache-resident after the warm-up), which is what a
// tight loop over one layer sees.
//
// Copy ceiling: a --threads-way parallel memcpy of a --copy-mib buffer into
// another (each thread copies one contiguous slice), counting bytes read plus
// bytes written. Effective bytes of a decode = K and V read + Q read + out
// written. Each timed case is first checked against the dense FP32
// reference (fd_reference_attention_dense) with peaked attention.
//
//   cpu_decode_bench [--threads N] [--iterations N] [--copy-mib N]
//                    [--rotate-mib N] [--json FILE] [--md FILE]
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "flashdec.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kQHeads = 32, kKvHeads = 8, kDim = 128, kBlock = 16;

struct Options {
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  unsigned iterations = 30;
  size_t copy_mib = 1024;
  size_t rotate_mib = 512;
  std::string json, md;
};

struct Stats {
  double median_us = 0, p10_us = 0, p90_us = 0;
};

Stats summarise(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  auto at = [&](double f) {
    return us[static_cast<size_t>(f * static_cast<double>(us.size() - 1))];
  };
  return {at(0.5), at(0.1), at(0.9)};
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

uint16_t to_bf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  b += 0x7fffu + ((b >> 16) & 1u);  // round to nearest even (inputs are finite)
  return static_cast<uint16_t>(b >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

// ---- copy ceiling -----------------------------------------------------------
double copy_gbps(size_t mib, unsigned threads, unsigned reps) {
  const size_t bytes = mib << 20;
  std::vector<char> src(bytes), dst(bytes);
  std::vector<double> us;
  auto once = [&] {
    std::vector<std::thread> pool;
    const size_t slice = (bytes / threads + 63) / 64 * 64;
    const auto t0 = Clock::now();
    for (unsigned t = 0; t < threads; ++t) {
      const size_t off = std::min(bytes, t * slice), n = std::min(slice, bytes - off);
      pool.emplace_back([&, off, n] { std::memcpy(dst.data() + off, src.data() + off, n); });
    }
    for (auto &th : pool) th.join();
    return seconds_since(t0) * 1e6;
  };
  std::memset(src.data(), 1, bytes);  // fault every page in before timing
  std::memset(dst.data(), 2, bytes);
  once();
  for (unsigned r = 0; r < reps; ++r) us.push_back(once());
  const Stats s = summarise(us);
  return 2.0 * static_cast<double>(bytes) / (s.median_us * 1e3);  // read + written
}

// ---- decode cases -----------------------------------------------------------
struct Case {
  const char *name;
  int32_t dtype;
  uint32_t batch, seq_len;
  unsigned threads;
  bool hot;
};

struct Result {
  Case c;
  size_t sets = 0;
  Stats t;
  double gbps = 0, fraction = 0, rel_error = 0;
  bool finite = true;
};

// One independent K/V set: storage, a random block permutation and q.
struct KvSet {
  std::vector<unsigned char> k, v;
  std::vector<int32_t> tables;
};

// The element types the cases use, f32 and bf16, each handled explicitly
// (public API only, so the bench keeps its own conversions); any other dtype
// is a bug of the bench.
[[noreturn]] void unused_dtype(int32_t dtype) {
  std::fprintf(stderr, "cpu_decode_bench: dtype %d is not one the cases use\n", dtype);
  std::abort();
}

size_t dtype_bytes(int32_t dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return sizeof(float);
    case FD_DTYPE_BF16: return sizeof(uint16_t);
    default: unused_dtype(dtype);
  }
}

float elem(const std::vector<unsigned char> &buf, int32_t dtype, size_t i) {
  switch (dtype) {
    case FD_DTYPE_F32: {
      float x;
      std::memcpy(&x, buf.data() + i * sizeof x, sizeof x);
      return x;
    }
    case FD_DTYPE_BF16: {
      uint16_t h;
      std::memcpy(&h, buf.data() + i * sizeof h, sizeof h);
      return from_bf16(h);
    }
    default: unused_dtype(dtype);
  }
}

void put(std::vector<unsigned char> &buf, int32_t dtype, size_t i, float x) {
  switch (dtype) {
    case FD_DTYPE_F32: std::memcpy(buf.data() + i * sizeof x, &x, sizeof x); break;
    case FD_DTYPE_BF16: {
      const uint16_t h = to_bf16(x);
      std::memcpy(buf.data() + i * sizeof h, &h, sizeof h);
      break;
    }
    default: unused_dtype(dtype);
  }
}

Result run_case(const Case &c, const Options &o, double copy) {
  const size_t es = dtype_bytes(c.dtype);
  const uint32_t blocks_per_row = (c.seq_len + kBlock - 1) / kBlock;
  const uint32_t num_blocks = blocks_per_row * c.batch;
  const size_t block_elems = size_t{kKvHeads} * kBlock * kDim;
  const size_t set_bytes = 2 * size_t{num_blocks} * block_elems * es;
  Result r;
  r.c = c;
  r.sets = c.hot ? 1 : std::max<size_t>(1, ((o.rotate_mib << 20) + set_bytes - 1) / set_bytes);

  std::mt19937_64 rng(0);
  std::normal_distribution<float> normal(0.f, 1.f);
  const size_t q_elems = size_t{c.batch} * kQHeads * kDim;
  std::vector<unsigned char> q(q_elems * es), out(q_elems * es);
  for (size_t i = 0; i < q_elems; ++i) put(q, c.dtype, i, 3.f * normal(rng));
  std::vector<int32_t> seq_lens(c.batch, static_cast<int32_t>(c.seq_len));
  std::vector<KvSet> sets(r.sets);
  for (KvSet &s : sets) {
    s.k.resize(num_blocks * block_elems * es);
    s.v.resize(num_blocks * block_elems * es);
    for (size_t i = 0; i < num_blocks * block_elems; ++i) {
      put(s.k, c.dtype, i, normal(rng));
      put(s.v, c.dtype, i, normal(rng));
    }
    s.tables.resize(num_blocks);
    for (uint32_t b = 0; b < num_blocks; ++b) s.tables[b] = static_cast<int32_t>(b);
    std::shuffle(s.tables.begin(), s.tables.end(), rng);
  }

  fd_decode_params p;
  fd_decode_params_init(&p);
  p.q_dtype = p.kv_dtype = p.out_dtype = c.dtype;
  p.batch = c.batch;
  p.num_q_heads = kQHeads;
  p.num_kv_heads = kKvHeads;
  p.head_dim = kDim;
  p.block_size = kBlock;
  p.num_blocks = num_blocks;
  p.max_blocks_per_seq = blocks_per_row;
  p.q = q.data();
  p.seq_lens = seq_lens.data();
  p.out = out.data();
  p.cpu_threads = c.threads;
  auto use = [&](const KvSet &s) {
    p.k_cache = s.k.data();
    p.v_cache = s.v.data();
    p.block_tables = s.tables.data();
  };

  // Check set 0 against the dense reference, output pre-filled with NaN.
  use(sets[0]);
  for (size_t i = 0; i < q_elems; ++i) put(out, c.dtype, i, NAN);
  if (fd_decode(&p) != FD_OK) {
    std::fprintf(stderr, "fd_decode failed: %s\n", fd_last_error_message());
    std::exit(1);
  }
  {
    const size_t dense_elems = size_t{c.batch} * kKvHeads * c.seq_len * kDim;
    std::vector<unsigned char> dk(dense_elems * es), dv(dense_elems * es), ref(q_elems * es);
    for (uint32_t row = 0; row < c.batch; ++row)
      for (uint32_t h = 0; h < kKvHeads; ++h)
        for (uint32_t t = 0; t < c.seq_len; ++t) {
          const size_t blk = static_cast<size_t>(sets[0].tables[row * blocks_per_row + t / kBlock]);
          const size_t src = ((blk * kKvHeads + h) * kBlock + t % kBlock) * kDim;
          const size_t dst = ((size_t{row} * kKvHeads + h) * c.seq_len + t) * kDim;
          std::memcpy(dk.data() + dst * es, sets[0].k.data() + src * es, kDim * es);
          std::memcpy(dv.data() + dst * es, sets[0].v.data() + src * es, kDim * es);
        }
    if (fd_reference_attention_dense(c.dtype, c.batch, kQHeads, kKvHeads, kDim, c.seq_len, q.data(),
                                     dk.data(), dv.data(), seq_lens.data(), 0.f,
                                     ref.data()) != FD_OK) {
      std::fprintf(stderr, "reference failed: %s\n", fd_last_error_message());
      std::exit(1);
    }
    for (size_t rh = 0; rh < size_t{c.batch} * kQHeads; ++rh) {
      double num = 0, den = 0;
      for (size_t d = 0; d < kDim; ++d) {
        const double got = elem(out, c.dtype, rh * kDim + d);
        const double want = elem(ref, c.dtype, rh * kDim + d);
        if (!std::isfinite(got)) r.finite = false;
        num += (got - want) * (got - want);
        den += want * want;
      }
      r.rel_error = std::max(r.rel_error, std::sqrt(num / std::max(den, 1e-30)));
    }
  }

  // Warm up (pool start, page faults of every set), then time single calls.
  for (size_t i = 0; i < std::max<size_t>(3, r.sets); ++i) {
    use(sets[i % r.sets]);
    fd_decode(&p);
  }
  std::vector<double> us;
  const auto start = Clock::now();
  for (size_t i = 0; us.size() < o.iterations || (seconds_since(start) < 0.2 && us.size() < 10000);
       ++i) {
    use(sets[i % r.sets]);
    const auto t0 = Clock::now();
    fd_decode(&p);
    us.push_back(seconds_since(t0) * 1e6);
  }
  r.t = summarise(us);
  const double bytes =
      static_cast<double>(c.batch) * c.seq_len * kKvHeads * kDim * 2.0 * static_cast<double>(es) +
      2.0 * static_cast<double>(q_elems * es);
  r.gbps = bytes / (r.t.median_us * 1e3);
  r.fraction = r.gbps / copy;
  return r;
}

const char *dtype_name(int32_t d) {
  return d == FD_DTYPE_F32 ? "fp32" : "bf16";
}

std::string target_of(const Result &r, const Options &o) {
  if (r.c.threads != o.threads) return "-";
  if (r.c.batch == 8 && r.c.dtype == FD_DTYPE_BF16 && !r.c.hot)
    return r.fraction >= 0.6 ? ">=0.6 copy: met" : ">=0.6 copy: missed";
  if (r.c.batch == 1 && r.c.threads >= 16)
    return r.t.median_us < 50 ? "<50 us: met" : "<50 us: missed";
  if (r.c.batch == 1) return "<50 us on 16 cores: n/a here";
  return "-";
}

unsigned parse_uint(const char *flag, const char *s, unsigned long max) {
  char *end = nullptr;
  errno = 0;
  const unsigned long v = std::strtoul(s, &end, 10);
  if (*s < '0' || *s > '9' || *end != '\0' || errno != 0 || v == 0 || v > max) {
    std::fprintf(stderr, "%s: expected an integer in [1, %lu], got '%s'\n", flag, max, s);
    std::exit(2);
  }
  return static_cast<unsigned>(v);
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--threads" && has) {
      o.threads = parse_uint("--threads", argv[++i], 256);
    } else if (a == "--iterations" && has) {
      o.iterations = parse_uint("--iterations", argv[++i], 100000);
    } else if (a == "--copy-mib" && has) {
      o.copy_mib = parse_uint("--copy-mib", argv[++i], 1u << 16);
    } else if (a == "--rotate-mib" && has) {
      o.rotate_mib = parse_uint("--rotate-mib", argv[++i], 1u << 16);
    } else if (a == "--json" && has) {
      o.json = argv[++i];
    } else if (a == "--md" && has) {
      o.md = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: cpu_decode_bench [--threads N] [--iterations N] [--copy-mib N] "
                   "[--rotate-mib N] [--json FILE] [--md FILE]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  FILE *json = o.json.empty() ? nullptr : std::fopen(o.json.c_str(), "w");
  FILE *md = o.md.empty() ? nullptr : std::fopen(o.md.c_str(), "w");
  if ((!o.json.empty() && json == nullptr) || (!o.md.empty() && md == nullptr)) {
    std::fprintf(stderr, "cannot write %s\n", json == nullptr ? o.json.c_str() : o.md.c_str());
    return 2;
  }

  const double copy = copy_gbps(o.copy_mib, o.threads, 10);
  const double copy1 = copy_gbps(std::min<size_t>(o.copy_mib, 512), 1, 5);
  std::printf("libflashdec %s, %u hardware threads\n", fd_version_string(),
              std::thread::hardware_concurrency());
  std::printf("copy ceiling (%zu MiB, read + written): %.1f GB/s on %u threads, %.1f GB/s on 1\n\n",
              o.copy_mib, copy, o.threads, copy1);

  const std::vector<Case> cases = {
      {"8x4096", FD_DTYPE_BF16, 8, 4096, o.threads, false},
      {"8x4096", FD_DTYPE_F32, 8, 4096, o.threads, false},
      {"1x2048", FD_DTYPE_BF16, 1, 2048, o.threads, false},
      {"1x2048 hot", FD_DTYPE_BF16, 1, 2048, o.threads, true},
      {"8x4096", FD_DTYPE_BF16, 8, 4096, 1, false},
      {"1x2048 hot", FD_DTYPE_BF16, 1, 2048, 1, true},
  };
  std::vector<Result> results;
  const char *head =
      "| case | dtype | threads | sets | median us | p10 us | p90 us | GB/s | "
      "of copy | rel err | target |";
  std::printf("%s\n|---|---|---|---|---|---|---|---|---|---|---|\n", head);
  for (const Case &c : cases) {
    if (c.threads == 1 && o.threads == 1 && &c >= &cases[4]) continue;  // already timed
    results.push_back(run_case(c, o, c.threads == 1 ? copy1 : copy));
    const Result &r = results.back();
    std::printf("| %s | %s | %u | %zu | %.1f | %.1f | %.1f | %.2f | %.2f | %.1e | %s |\n", c.name,
                dtype_name(c.dtype), c.threads, r.sets, r.t.median_us, r.t.p10_us, r.t.p90_us,
                r.gbps, r.fraction, r.rel_error, target_of(r, o).c_str());
    std::fflush(stdout);
    const double tol = c.dtype == FD_DTYPE_F32 ? 1e-4 : 5e-3;
    if (!r.finite || !(r.rel_error <= tol)) {
      std::fprintf(stderr, "%s %s: wrong output (rel err %g, finite %d)\n", c.name,
                   dtype_name(c.dtype), r.rel_error, r.finite);
      return 1;
    }
  }
  std::printf(
      "\nGB/s = (K and V read + q read + out written) / median time; \"of copy\" "
      "divides by the copy ceiling of the same thread count.\n");

  if (json != nullptr) {
    std::fprintf(json,
                 "{\n  \"library\": \"%s\",\n  \"hardware_threads\": %u,\n  \"threads\": %u,\n"
                 "  \"copy_mib\": %zu,\n  \"copy_GBps\": %.3f,\n  \"copy_GBps_1_thread\": %.3f,\n"
                 "  \"cases\": [\n",
                 fd_version_string(), std::thread::hardware_concurrency(), o.threads, o.copy_mib,
                 copy, copy1);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result &r = results[i];
      std::fprintf(json,
                   "    {\"case\": \"%s\", \"shape\": \"32/8/128\", \"dtype\": \"%s\", "
                   "\"batch\": %u, \"seq_len\": %u, \"block_size\": %u, \"layout\": "
                   "\"token-major\", \"threads\": %u, \"kv_sets\": %zu, \"hot\": %s, "
                   "\"median_us\": %.3f, \"p10_us\": %.3f, \"p90_us\": %.3f, "
                   "\"effective_GBps\": %.3f, \"fraction_of_copy\": %.4f, \"rel_error\": %.3e, "
                   "\"target\": \"%s\"}%s\n",
                   r.c.name, dtype_name(r.c.dtype), r.c.batch, r.c.seq_len, kBlock, r.c.threads,
                   r.sets, r.c.hot ? "true" : "false", r.t.median_us, r.t.p10_us, r.t.p90_us,
                   r.gbps, r.fraction, r.rel_error, target_of(r, o).c_str(),
                   i + 1 < results.size() ? "," : "");
    }
    std::fprintf(json, "  ]\n}\n");
    std::fclose(json);
  }
  if (md != nullptr) {
    std::fprintf(md,
                 "CPU decode, shape 32/8/128, block 16, libflashdec %s, %u hardware threads.\n"
                 "Copy ceiling (%zu MiB memcpy, read + written): %.1f GB/s on %u threads, "
                 "%.1f GB/s on 1.\n\n%s\n|---|---|---|---|---|---|---|---|---|---|---|\n",
                 fd_version_string(), std::thread::hardware_concurrency(), o.copy_mib, copy,
                 o.threads, copy1, head);
    for (const Result &r : results)
      std::fprintf(md, "| %s | %s | %u | %zu | %.1f | %.1f | %.1f | %.2f | %.2f | %.1e | %s |\n",
                   r.c.name, dtype_name(r.c.dtype), r.c.threads, r.sets, r.t.median_us, r.t.p10_us,
                   r.t.p90_us, r.gbps, r.fraction, r.rel_error, target_of(r, o).c_str());
    std::fclose(md);
  }
  return 0;
}
