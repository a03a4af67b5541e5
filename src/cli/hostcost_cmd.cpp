// `flashdec hostcost`: the host-side costs of docs/benchmarks.md (CPU only, no
// GPU):
//  - cache transactions (cache_cost): fd_tx_begin + fd_tx_commit for batch
//    1, 64 and 256; one layer write call (fd_tx_write_layer and
//    fd_tx_write_layer_rope); a whole 32-layer step of batch 256 (begin + 32
//    layer writes + commit); block-table / seq_lens export for batch 256 with
//    64 blocks per row. Tiny heads (1 KV head, head_dim 8, f32) keep the data
//    copy negligible next to the bookkeeping;
//  - fd_scheduler_plan with 256 active and 1,000 waiting requests;
//  - engine step bookkeeping for batch 256 and 32 layers, kernels excluded:
//    the same token is driven once through the engine and once through the
//    raw cache + fd_decode calls the engine makes; the difference is the
//    engine's own cost. Tiny heads (1 KV head, head_dim 8) keep the kernels
//    small in both, and requests are replaced every 8 tokens so that rows
//    stay short.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "commands.hpp"
#include "flashdec.h"

namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

bool ok(fd_status s, const char *what) {
  if (s == FD_OK) return true;
  std::fprintf(stderr, "hostcost: %s: %s: %s\n", what, fd_status_string(s),
               fd_last_error_message());
  return false;
}

int plan_cost(int iterations) {
  const uint32_t bs = 16;
  fd_snapshot_info info;
  fd_snapshot_info_init(&info);
  info.block_size = bs;
  info.max_blocks = 65536;
  fd_snapshot *snap = nullptr;
  // 256 active requests, each with 100 tokens (7 blocks) of a 600-token life.
  info.free_blocks = 65536 - 256 * 7;
  if (!ok(fd_snapshot_create(&info, &snap), "snapshot")) return 1;
  for (uint32_t i = 0; i < 256; ++i) {
    fd_request_spec s;
    fd_request_spec_init(&s);
    s.id = i;
    s.submission_order = i;
    s.initial_context_tokens = 100;
    s.max_new_tokens = 500;
    if (!ok(fd_snapshot_add_active(snap, &s, 100, 7, 0, 38, i % 5), "add_active")) return 1;
  }
  for (uint32_t i = 0; i < 1000; ++i) {
    fd_request_spec s;
    fd_request_spec_init(&s);
    s.id = 1000 + i;
    s.submission_order = 1000 + i;
    s.initial_context_tokens = 50 + (i * 37) % 900;
    s.max_new_tokens = 16 + (i * 11) % 400;
    if (!ok(fd_snapshot_add_waiting(snap, &s, i % 4, i % 3), "add_waiting")) return 1;
  }
  fd_scheduler_config sc;
  fd_scheduler_config_init(&sc);
  sc.max_active_requests = 384;
  sc.max_batch_requests = 256;
  fd_scheduler *sch = nullptr;
  if (!ok(fd_scheduler_create(&sc, &sch), "scheduler")) return 1;
  std::vector<double> t;
  for (int i = 0; i < iterations; ++i) {
    fd_decision *d = nullptr;
    const auto t0 = Clock::now();
    if (!ok(fd_scheduler_plan(sch, snap, &d), "plan")) return 1;
    t.push_back(us_since(t0));
    fd_decision_destroy(d);
  }
  std::printf("| scheduler plan, 256 active + 1,000 waiting | %.1f us | <= 200 us |\n", median(t));
  fd_scheduler_destroy(sch);
  fd_snapshot_destroy(snap);
  return 0;
}

// A cache of tiny heads (1 KV head, head_dim 8, f32) whose data copies are
// negligible next to the bookkeeping measured here.
fd_cache *tiny_cache(uint32_t layers, uint32_t max_blocks) {
  fd_cache_config cc;
  fd_cache_config_init(&cc);
  cc.num_layers = layers;
  cc.num_kv_heads = 1;
  cc.head_dim = 8;
  cc.block_size = 16;
  cc.max_blocks = max_blocks;
  cc.dtype = FD_DTYPE_F32;
  fd_cache *c = nullptr;
  return ok(fd_cache_create(&cc, &c), "cache") ? c : nullptr;
}

// Requests ids[i] of a cache, replaced by fresh ones (untimed) every
// `lifetime` tokens so that rows stay short and the cache never fills up.
struct Batch {
  fd_cache *cache;
  std::vector<uint64_t> ids;
  uint32_t tokens = 0;

  bool start(fd_cache *c, uint32_t batch) {
    cache = c;
    ids.resize(batch);
    for (uint32_t i = 0; i < batch; ++i) {
      ids[i] = i + 1;
      if (!ok(fd_cache_add_request(c, ids[i]), "add")) return false;
    }
    return true;
  }
  bool renew(uint32_t lifetime) {
    if (++tokens % lifetime != 0) return true;
    for (uint64_t &id : ids) {
      if (!ok(fd_cache_finish_request(cache, id), "finish")) return false;
      id += ids.size();
      if (!ok(fd_cache_add_request(cache, id), "add")) return false;
    }
    return true;
  }
  uint32_t size() const { return static_cast<uint32_t>(ids.size()); }
};

int cache_tx_cost(uint32_t batch, int iterations) {
  fd_cache *c = tiny_cache(1, batch * 8);
  Batch b;
  if (c == nullptr || !b.start(c, batch)) return 1;
  std::vector<float> k(size_t{batch} * 8, 0.5f), q(size_t{batch} * 8, 0.25f);
  std::vector<double> begin, commit, write, rope;
  for (int it = 0; it < iterations; ++it) {
    fd_tx tx;
    auto t0 = Clock::now();
    if (!ok(fd_tx_begin(c, b.ids.data(), b.size(), &tx), "tx_begin")) return 1;
    begin.push_back(us_since(t0));
    t0 = Clock::now();
    if (!ok(fd_tx_write_layer(c, tx, 0, k.data(), k.data(), nullptr), "write_layer")) return 1;
    write.push_back(us_since(t0));
    t0 = Clock::now();
    if (!ok(fd_tx_commit(c, tx), "tx_commit")) return 1;
    commit.push_back(us_since(t0));
    if (!ok(fd_tx_begin(c, b.ids.data(), b.size(), &tx), "tx_begin")) return 1;
    t0 = Clock::now();
    if (!ok(fd_tx_write_layer_rope(c, tx, 0, q.data(), 1, k.data(), k.data(), 8, 10000.f, q.data(),
                                   nullptr),
            "write_layer_rope"))
      return 1;
    rope.push_back(us_since(t0));
    if (!ok(fd_tx_abort(c, tx), "tx_abort")) return 1;
    if (!b.renew(64)) return 1;
  }
  std::printf("| cache tx_begin, batch %u | %.2f us | |\n", batch, median(begin));
  std::printf("| cache tx_commit, batch %u | %.2f us | |\n", batch, median(commit));
  std::printf("| cache tx_write_layer, batch %u (copy of %u x 64 B included) | %.2f us | |\n",
              batch, batch, median(write));
  std::printf(
      "| cache tx_write_layer_rope, batch %u (RoPE of %u x 2 x 8 floats included) | %.2f us | |\n",
      batch, batch, median(rope));
  fd_cache_destroy(c);
  return 0;
}

// begin + 32 layer writes + commit, batch 256: the per-step host time of
// the cache (on the CPU backend the tiny copies stand in for the kernels).
int cache_step_cost(int iterations) {
  const uint32_t B = 256, L = 32;
  fd_cache *c = tiny_cache(L, B * 8);
  Batch b;
  if (c == nullptr || !b.start(c, B)) return 1;
  std::vector<float> k(size_t{B} * 8, 0.5f);
  std::vector<double> step;
  for (int it = 0; it < iterations; ++it) {
    const auto t0 = Clock::now();
    fd_tx tx;
    if (!ok(fd_tx_begin(c, b.ids.data(), B, &tx), "tx_begin")) return 1;
    for (uint32_t l = 0; l < L; ++l)
      if (!ok(fd_tx_write_layer(c, tx, l, k.data(), k.data(), nullptr), "write_layer")) return 1;
    if (!ok(fd_tx_commit(c, tx), "tx_commit")) return 1;
    step.push_back(us_since(t0));
    if (!b.renew(64)) return 1;
  }
  std::printf(
      "| cache step, batch 256, 32 layers (begin + 32 x write_layer + commit, tiny copies "
      "included) | %.1f us | <= 50 us (kernels excluded) |\n",
      median(step));
  fd_cache_destroy(c);
  return 0;
}

// Block tables and seq_lens of 256 rows with 64 blocks each (1,024 tokens of
// block_size 16): fd_cache_export, and fd_tx_block_tables +
// fd_tx_get_rows (effective lengths) inside an open transaction.
int cache_export_cost(int iterations) {
  const uint32_t B = 256, blocks = 64;
  fd_cache *c = tiny_cache(1, B * (blocks + 1));
  Batch b;
  if (c == nullptr || !b.start(c, B)) return 1;
  std::vector<float> k(size_t{B} * 8, 0.5f);
  for (uint32_t t = 0; t < blocks * 16; ++t) {
    fd_tx tx;
    if (!ok(fd_tx_begin(c, b.ids.data(), B, &tx), "tx_begin") ||
        !ok(fd_tx_write_layer(c, tx, 0, k.data(), k.data(), nullptr), "write_layer") ||
        !ok(fd_tx_commit(c, tx), "tx_commit"))
      return 1;
  }
  std::vector<int32_t> tables(size_t{B} * (blocks + 1)), lens(B);
  std::vector<double> exp, txt;
  for (int it = 0; it < iterations; ++it) {
    auto t0 = Clock::now();
    if (!ok(fd_cache_export(c, b.ids.data(), B, blocks, tables.data(), lens.data()), "export"))
      return 1;
    exp.push_back(us_since(t0));
  }
  fd_tx tx;
  if (!ok(fd_tx_begin(c, b.ids.data(), B, &tx), "tx_begin")) return 1;
  for (int it = 0; it < iterations; ++it) {
    auto t0 = Clock::now();
    if (!ok(fd_tx_block_tables(c, tx, blocks + 1, tables.data()), "tx_block_tables") ||
        !ok(fd_tx_get_rows(c, tx, B, nullptr, nullptr, nullptr, nullptr, lens.data()),
            "tx_get_rows"))
      return 1;
    txt.push_back(us_since(t0));
  }
  std::printf("| cache export (fd_cache_export), batch 256, 64 blocks per row | %.2f us | |\n",
              median(exp));
  std::printf(
      "| transaction tables (fd_tx_block_tables + fd_tx_get_rows), batch 256, 65 blocks per "
      "row | %.2f us | |\n",
      median(txt));
  fd_cache_destroy(c);
  return 0;
}

int cache_cost(int iterations) {
  for (uint32_t batch : {1u, 64u, 256u})
    if (cache_tx_cost(batch, iterations * 4) != 0) return 1;
  if (cache_step_cost(iterations) != 0) return 1;
  return cache_export_cost(iterations * 4);
}

struct StepCosts {
  std::vector<double> engine_total, engine_begin, engine_commit, raw_total;
};

int step_cost(int iterations) {
  const uint32_t L = 32, B = 256, kv = 1, d = 8, bs = 16;
  fd_cache_config cc;
  fd_cache_config_init(&cc);
  cc.num_layers = L;
  cc.num_kv_heads = kv;
  cc.head_dim = d;
  cc.block_size = bs;
  cc.max_blocks = B * 2;
  cc.dtype = FD_DTYPE_F32;
  fd_cache *ce = nullptr, *cr = nullptr;
  if (!ok(fd_cache_create(&cc, &ce), "cache") || !ok(fd_cache_create(&cc, &cr), "cache")) return 1;
  fd_engine_config ec;
  fd_engine_config_init(&ec);
  ec.cpu_threads = 1;
  fd_engine *e = nullptr;
  if (!ok(fd_engine_create(ce, &ec, &e), "engine")) return 1;
  std::vector<uint64_t> ids(B);
  for (uint32_t i = 0; i < B; ++i) {
    ids[i] = i + 1;
    if (!ok(fd_engine_add_request(e, ids[i]), "add") || !ok(fd_engine_admit(e, ids[i]), "admit") ||
        !ok(fd_cache_add_request(cr, ids[i]), "add"))
      return 1;
  }
  std::vector<float> q(B * d, 0.1f), k(B * d, 0.2f), v(B * d, 0.3f), out(B * d), qr(B * d);
  std::vector<int32_t> tables, lens(B);
  void *lk[L], *lv[L];
  int64_t strides[4];
  for (uint32_t l = 0; l < L; ++l) fd_cache_layer_storage(cr, l, &lk[l], &lv[l], strides);
  StepCosts c;
  for (int it = 0; it < iterations; ++it) {
    // Fresh requests every 8 tokens keep the kernels' share small and equal
    // in both paths, so the difference is the engine's own work (untimed).
    if (it > 0 && it % 8 == 0) {
      for (uint32_t i = 0; i < B; ++i) {
        if (!ok(fd_engine_finish(e, ids[i]), "finish") ||
            !ok(fd_cache_finish_request(cr, ids[i]), "finish"))
          return 1;
        ids[i] += B;
        if (!ok(fd_engine_add_request(e, ids[i]), "add") ||
            !ok(fd_engine_admit(e, ids[i]), "admit") ||
            !ok(fd_cache_add_request(cr, ids[i]), "add"))
          return 1;
      }
    }
    // Engine path.
    auto t0 = Clock::now();
    fd_engine_step st;
    st.struct_size = sizeof st;
    if (!ok(fd_engine_begin_step(e, ids.data(), B, &st), "begin_step")) return 1;
    c.engine_begin.push_back(us_since(t0));
    for (uint32_t l = 0; l < L; ++l) {
      if (!ok(fd_engine_step_layer(e, st.tx, l, q.data(), k.data(), v.data(), out.data(), nullptr),
              "step_layer"))
        return 1;
    }
    auto t1 = Clock::now();
    if (!ok(fd_engine_commit_step(e, st.tx), "commit_step")) return 1;
    c.engine_commit.push_back(us_since(t1));
    c.engine_total.push_back(us_since(t0));
    // Raw path: the cache and decode calls a minimal driver needs.
    t0 = Clock::now();
    fd_tx tx;
    if (!ok(fd_tx_begin(cr, ids.data(), B, &tx), "tx_begin")) return 1;
    fd_tx_info info;
    info.struct_size = sizeof info;
    fd_tx_get_info(cr, tx, &info);
    tables.resize(size_t{B} * info.max_blocks_per_seq);
    fd_tx_block_tables(cr, tx, info.max_blocks_per_seq, tables.data());
    fd_tx_get_rows(cr, tx, B, nullptr, nullptr, nullptr, nullptr, lens.data());
    for (uint32_t l = 0; l < L; ++l) {
      if (!ok(fd_tx_write_layer_rope(cr, tx, l, q.data(), kv, k.data(), v.data(), d, 10000.f,
                                     qr.data(), nullptr),
              "write_layer_rope"))
        return 1;
      fd_decode_params p;
      fd_decode_params_init(&p);
      p.dtype = FD_DTYPE_F32;
      p.batch = B;
      p.num_q_heads = kv;
      p.num_kv_heads = kv;
      p.head_dim = d;
      p.block_size = bs;
      p.num_blocks = cc.max_blocks;
      p.max_blocks_per_seq = info.max_blocks_per_seq;
      p.q = qr.data();
      p.k_cache = lk[l];
      p.v_cache = lv[l];
      p.block_tables = tables.data();
      p.seq_lens = lens.data();
      p.out = out.data();
      p.cpu_threads = 1;
      if (!ok(fd_decode(&p), "decode")) return 1;
    }
    if (!ok(fd_tx_commit(cr, tx), "tx_commit")) return 1;
    c.raw_total.push_back(us_since(t0));
  }
  const double eng = median(c.engine_total), raw = median(c.raw_total);
  std::printf("| engine step, batch 256, 32 layers (engine path, kernels included) | %.1f us | |\n",
              eng);
  std::printf("| same token through raw cache + fd_decode calls | %.1f us | |\n", raw);
  std::printf("| engine step bookkeeping (difference) | %.1f us | <= 100 us |\n", eng - raw);
  std::printf(
      "| engine begin_step, batch 256 (includes fd_tx_begin + table export) | %.1f us | |\n",
      median(c.engine_begin));
  std::printf("| engine commit_step, batch 256 (includes fd_tx_commit) | %.1f us | |\n",
              median(c.engine_commit));
  fd_engine_destroy(e);
  fd_cache_destroy(ce);
  fd_cache_destroy(cr);
  return 0;
}

}  // namespace

int hostcost_command(int argc, char **argv) {
  int iterations = 200;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
      iterations = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: flashdec hostcost [--iterations N]\n");
      return 2;
    }
  }
  std::printf("| measurement | median | target |\n|---|---|---|\n");
  if (cache_cost(iterations) != 0) return 1;
  if (plan_cost(iterations) != 0) return 1;
  return step_cost(iterations);
}
