/* Host allocation failure injection on the CPU backend (docs/abi.md rule 9):
 * every host allocation (operator new, tests/common/alloc_failures.h) made by
 * each call below fails in turn, one run per allocation on a fresh fixture.
 * Each failing run must return FD_ERR_OUT_OF_MEMORY with a message, leave
 * every observable state as it was (cache and engine metrics, validators,
 * request states, exported block tables and seq_lens, the committed K/V of
 * every active request, prefix infos, the open transaction's rows and tables,
 * out-pointers), and the same call must then succeed without injection, with
 * the outcome of a run that never failed. The number of allocations failed
 * per call is printed (and must be > 0 where the call allocates).
 *
 * The exceptions the contract documents: a failed layer write counts in
 * transaction_failure_count; a failed fd_engine_step_layer aborts the step
 * (its result is compared with fd_engine_abort_step's).
 *
 * Not covered here: the K/V storage itself (calloc, not operator new) and the
 * decode worker threads (a thread that cannot start is skipped, and the call
 * succeeds). */
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include "alloc_failures.h"
#include "fd_test.h"
#include "test_engine_support.h"

namespace {

constexpr uint32_t kLayers = 2, kKv = 2, kD = 4, kBs = 4, kBlocks = 16, kPrefixCap = 6;
constexpr uint32_t kHq = 4;
constexpr uint32_t kStride = kBlocks;
const uint64_t kIds[] = {1, 2, 3, 4, 5, 6, 7, 8};
const char *const kPrefixes[] = {"old", "hot", "new"};

/* Everything a failed call must leave as it was, as bytes. */
struct Observed {
  std::vector<uint8_t> bytes;
  std::vector<std::string> labels;  // what each appended piece is, for reports
  std::vector<size_t> sizes;
  template <class T>
  void add(const char *label, const T &v) {
    const uint8_t *p = reinterpret_cast<const uint8_t *>(&v);
    bytes.insert(bytes.end(), p, p + sizeof v);
    labels.push_back(label);
    sizes.push_back(sizeof v);
  }
  void add_vec(const char *label, const std::vector<uint8_t> &v) {
    bytes.insert(bytes.end(), v.begin(), v.end());
    labels.push_back(label);
    sizes.push_back(v.size());
  }
};

struct Fixture {
  fd_cache *c = nullptr;
  fd_engine *e = nullptr;
  fd_tx tx = {0, 0};
  bool tx_open = false;
  fd_engine_step step;
  bool step_open = false;
  fd_cache *created_cache = nullptr;
  fd_engine *created_engine = nullptr;
};

void destroy(Fixture &f) {
  fd_engine_destroy(f.created_engine);
  fd_engine_destroy(f.e);
  fd_cache_destroy(f.created_cache);
  fd_cache_destroy(f.c);
}

fd_cache_config cache_config() {
  fd_cache_config cfg;
  fd_cache_config_init(&cfg);
  cfg.num_layers = kLayers;
  cfg.num_kv_heads = kKv;
  cfg.head_dim = kD;
  cfg.block_size = kBs;
  cfg.max_blocks = kBlocks;
  cfg.prefix_cache_capacity_blocks = kPrefixCap;
  cfg.dtype = FD_DTYPE_F32;
  return cfg;
}

std::vector<float> values(size_t n, float seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = seed + 0.01f * (float)i;
  return v;
}

void cache_observe(fd_cache *c, Observed &o) {
  fd_cache_metrics m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  FD_ASSERT_OK(fd_cache_metrics_get(c, &m));
  o.add("cache metrics", m);
  const fd_status v = fd_cache_validate(c);
  if (v != FD_OK) print_error("fd_cache_validate: %s\n", fd_last_error_message());
  o.add("cache validate", v);
  void *k[kLayers], *vv[kLayers];
  int64_t s[4];
  for (uint32_t l = 0; l < kLayers; ++l)
    FD_ASSERT_OK(fd_cache_layer_storage(c, l, &k[l], &vv[l], s));
  for (uint64_t id : kIds) {
    int32_t st = -1;
    FD_ASSERT_OK(fd_cache_request_state(c, id, &st));
    o.add("cache request state", st);
    if (st != FD_REQUEST_ACTIVE) continue;
    int32_t table[kStride], len = -1;
    FD_ASSERT_OK(fd_cache_export(c, &id, 1, kStride, table, &len));
    o.add("block table", table);
    o.add("seq_len", len);
    // The committed K/V of the request, every layer.
    std::vector<uint8_t> kv;
    for (uint32_t l = 0; l < kLayers; ++l)
      for (int32_t t = 0; t < len; ++t)
        for (uint32_t h = 0; h < kKv; ++h)
          for (uint32_t d = 0; d < kD; ++d) {
            const int64_t at =
                table[t / (int32_t)kBs] * s[0] + h * s[1] + (t % (int32_t)kBs) * s[2] + d * s[3];
            const uint8_t *pk = static_cast<const uint8_t *>(k[l]) + at * 4;
            const uint8_t *pv = static_cast<const uint8_t *>(vv[l]) + at * 4;
            kv.insert(kv.end(), pk, pk + 4);
            kv.insert(kv.end(), pv, pv + 4);
          }
    o.add_vec("committed K/V", kv);
  }
  for (const char *name : kPrefixes) {
    fd_prefix_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    const fd_status st = fd_prefix_get_info(c, name, &info);
    o.add("prefix status", st);
    o.add("prefix info", info);
  }
  uint64_t version = 0;
  FD_ASSERT_OK(fd_cache_state_version(c, &version));
  o.add("cache state version", version);
}

void tx_observe(fd_cache *c, fd_tx tx, Observed &o) {
  fd_tx_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  const fd_status st = fd_tx_get_info(c, tx, &info);
  o.add("tx status", st);
  o.add("tx info", info);
  if (st != FD_OK) return;
  std::vector<uint64_t> ids(info.batch);
  std::vector<int32_t> pos(info.batch), blk(info.batch), off(info.batch), eff(info.batch);
  FD_ASSERT_OK(fd_tx_get_rows(c, tx, info.batch, ids.data(), pos.data(), blk.data(), off.data(),
                              eff.data()));
  std::vector<int32_t> tables((size_t)info.batch * kStride);
  FD_ASSERT_OK(fd_tx_block_tables(c, tx, kStride, tables.data()));
  for (size_t r = 0; r < info.batch; ++r) {
    o.add("tx row id", ids[r]);
    o.add("tx row position", pos[r]);
    o.add("tx row block", blk[r]);
    o.add("tx row offset", off[r]);
    o.add("tx row effective len", eff[r]);
  }
  for (int32_t x : tables) o.add("tx table", x);
}

void engine_observe(fd_engine *e, Observed &o) {
  fd_engine_metrics m = es_metrics(e);
  o.add("engine metrics", m);
  const fd_status v = fd_engine_validate(e);
  if (v != FD_OK) print_error("fd_engine_validate: %s\n", fd_last_error_message());
  o.add("engine validate", v);
  for (uint64_t id : kIds) o.add("engine request state", es_state(e, id));
}

Observed observe(Fixture &f) {
  Observed o;
  if (f.c) cache_observe(f.c, o);
  if (f.tx_open) tx_observe(f.c, f.tx, o);
  if (f.e) engine_observe(f.e, o);
  o.add("created cache", f.created_cache != nullptr);
  o.add("created engine", f.created_engine != nullptr);
  return o;
}

/* Reports the first differing piece. */
bool same(const Observed &a, const Observed &b, const char *what,
          const std::vector<std::string> &skip = {}) {
  if (a.bytes == b.bytes && a.labels == b.labels) return true;
  if (a.labels != b.labels) {
    print_error("%s: different pieces observed (%zu / %zu)\n", what, a.labels.size(),
                b.labels.size());
    return false;
  }
  const bool equal = true;
  for (size_t i = 0, at = 0; i < a.labels.size(); at += a.sizes[i], ++i) {
    if (std::find(skip.begin(), skip.end(), a.labels[i]) != skip.end()) continue;
    if (a.sizes[i] != b.sizes[i] || memcmp(&a.bytes[at], &b.bytes[at], a.sizes[i]) != 0) {
      print_error("%s: \"%s\" (piece %zu) differs\n", what, a.labels[i].c_str(), i);
      for (size_t w = 0; w + 8 <= a.sizes[i]; w += 8) {
        uint64_t x, y;
        memcpy(&x, &a.bytes[at + w], 8);
        memcpy(&y, &b.bytes[at + w], 8);
        if (x != y)
          print_error("  bytes %zu..%zu: %llu, expected %llu\n", w, w + 7, (unsigned long long)x,
                      (unsigned long long)y);
      }
      return false;
    }
  }
  return equal;
}

/* The cache both fixtures start from, with prefixes "old" (registered first,
 * least recently used) and "hot", two blocks each. */
void create_cache_with_prefixes(Fixture &f) {
  const fd_cache_config cfg = cache_config();
  FD_ASSERT_OK(fd_cache_create(&cfg, &f.c));
  const size_t blk = (size_t)kLayers * kKv * kBs * kD;
  std::vector<float> a = values(2 * blk, 0.5f), b = values(2 * blk, -0.25f);
  FD_ASSERT_OK(fd_prefix_register(f.c, "old", a.data(), b.data(), 2, NULL));
  FD_ASSERT_OK(fd_prefix_register(f.c, "hot", b.data(), a.data(), 2, NULL));
}

/* A cache with: request 1 empty, 2 with 4 tokens (next token needs a block),
 * 3 with 5 tokens, 4 attached to prefix "hot"; prefixes "old" (inactive, least
 * recently used) and "hot" (referenced). */
void make_cache_state(Fixture &f) {
  create_cache_with_prefixes(f);
  for (uint64_t id : {1, 2, 3, 4}) FD_ASSERT_OK(fd_cache_add_request(f.c, id));
  FD_ASSERT_OK(fd_prefix_attach(f.c, 4, "hot"));
  const size_t row = (size_t)kKv * kD;
  for (int t = 0; t < 5; ++t) {
    std::vector<uint64_t> ids = {3};
    if (t < 4) ids.push_back(2);
    fd_tx tx;
    FD_ASSERT_OK(fd_tx_begin(f.c, ids.data(), (uint32_t)ids.size(), &tx));
    for (uint32_t l = 0; l < kLayers; ++l) {
      std::vector<float> k = values(ids.size() * row, (float)t + (float)l),
                         v = values(ids.size() * row, -(float)t);
      FD_ASSERT_OK(fd_tx_write_layer(f.c, tx, l, k.data(), v.data(), NULL));
    }
    FD_ASSERT_OK(fd_tx_commit(f.c, tx));
  }
}

const uint64_t kTxIds[] = {1, 2, 3, 4};

void begin_tx(Fixture &f) {
  FD_ASSERT_OK(fd_tx_begin(f.c, kTxIds, 4, &f.tx));
  f.tx_open = true;
}

/* Inputs of the calls under test, allocated before any failure is armed
 * (the test's own code must not allocate while a failure is armed). */
struct Inputs {
  std::vector<float> k[kLayers], v, q, q_out, out, prefix_a, prefix_b, prefill;
  Inputs() {
    for (uint32_t l = 0; l < kLayers; ++l) k[l] = values(4 * (size_t)kKv * kD, 1.5f + (float)l);
    v = values(4 * (size_t)kKv * kD, -2.f);
    q = values(4 * (size_t)kHq * kD, 0.75f);
    q_out.resize(q.size());
    out.resize(q.size());
    const size_t blk = (size_t)kLayers * kKv * kBs * kD;
    prefix_a = values(4 * blk, 3.f);
    prefix_b = values(4 * blk, 4.f);
    prefill = values((size_t)kLayers * kKv * kD, 0.4f);
  }
};
const Inputs *g_in = nullptr;

fd_status write_layer(Fixture &f, uint32_t layer, bool rope) {
  const Inputs &in = *g_in;
  if (!rope) return fd_tx_write_layer(f.c, f.tx, layer, in.k[layer].data(), in.v.data(), NULL);
  std::vector<float> &q_out = const_cast<Inputs &>(in).q_out;
  std::fill(q_out.begin(), q_out.end(), 0.f);
  const fd_status st =
      fd_tx_write_layer_rope(f.c, f.tx, layer, in.q.data(), kHq, in.k[layer].data(), in.v.data(),
                             kD, 10000.f, q_out.data(), NULL);
  if (st != FD_OK) {
    for (float x : q_out) assert_true(x == 0.f);  // q_out is written on success only
  }
  return st;
}

/* An engine on a cache with prefixes "old" and "hot": requests 1 (empty),
 * 2 (4 tokens: its next token needs a block), 3 (5 tokens) and 4 (empty),
 * all admitted through the engine. */
void make_engine_state(Fixture &f) {
  create_cache_with_prefixes(f);
  f.e = es_engine(f.c, kHq);
  for (uint64_t id : {1, 2, 3, 4}) {
    FD_ASSERT_OK(fd_engine_add_request(f.e, id));
    FD_ASSERT_OK(fd_engine_admit(f.e, id));
  }
  for (int t = 0; t < 5; ++t) {
    std::vector<float> k = values((size_t)kLayers * kKv * kD, 0.1f * (float)t), v = k;
    if (t < 4) FD_ASSERT_OK(fd_engine_prefill_request_layers(f.e, 2, k.data(), v.data()));
    FD_ASSERT_OK(fd_engine_prefill_request_layers(f.e, 3, k.data(), v.data()));
  }
}

const uint64_t kStepIds[] = {1, 2, 3, 4};

void begin_step(Fixture &f) {
  memset(&f.step, 0, sizeof f.step);
  f.step.struct_size = sizeof f.step;
  FD_ASSERT_OK(fd_engine_begin_step(f.e, kStepIds, 4, &f.step));
  assert_int_equal(f.step.outcome, FD_STEP_OPENED);
  f.step_open = true;
}

fd_status step_layer(Fixture &f, uint32_t layer) {
  const Inputs &in = *g_in;
  std::vector<float> &out = const_cast<Inputs &>(in).out;
  std::fill(out.begin(), out.end(), -7.f);
  const fd_status st = fd_engine_step_layer(f.e, f.step.tx, layer, in.q.data(), in.k[layer].data(),
                                            in.v.data(), out.data(), NULL);
  if (st != FD_OK) {
    for (float x : out) assert_true(x == -7.f);  // written on success only
  }
  return st;
}

/* One call under test. */
struct Case {
  const char *name;
  std::function<void(Fixture &)> make;
  std::function<fd_status(Fixture &)> call;
  // The expected state after a failure, when it is not the state before:
  // applied to a fresh fixture (e.g. the abort a failed step layer implies).
  std::function<void(Fixture &)> failure_equivalent;
  bool expect_points = true;
  // A failure inside the cache's layer write counts in
  // transaction_failure_count (documented); elsewhere it does not.
  bool tx_failure_may_count = false;
  // Pieces a failure may change (a weaker documented guarantee; reported).
  std::vector<std::string> may_change;
};

/* The cache's transaction_failure_count in an observation (cache metrics are
 * its first piece). */
uint64_t *tx_failures(Observed &o,
                      size_t field = offsetof(fd_cache_metrics, transaction_failure_count)) {
  assert_string_equal(o.labels[0].c_str(), "cache metrics");
  return reinterpret_cast<uint64_t *>(&o.bytes[field]);
}

long g_total_points = 0;

/* Fails allocation k = 0, 1, ... of the call, each on a fresh fixture. */
long sweep(const Case &cs) {
  // The outcome of a run that never failed.
  Fixture twin;
  cs.make(twin);
  FD_ASSERT_OK(cs.call(twin));
  const Observed twin_after = observe(twin);
  destroy(twin);

  long points = 0, absorbed = 0, counted = 0, written = 0, moved = 0;
  for (long k = 0;; ++k) {
    assert_true(k < 100000);
    Fixture f;
    cs.make(f);
    Observed before = observe(f);
    if (cs.failure_equivalent) {
      Fixture g;
      cs.make(g);
      cs.failure_equivalent(g);
      before = observe(g);
      destroy(g);
    }
    fd_alloc_fail_arm(k);
    const fd_status st = cs.call(f);
    const bool fired = fd_alloc_fail_disarm();
    if (st == FD_OK) {
      destroy(f);
      if (!fired) break;
      ++absorbed;  // the call absorbed the failure (e.g. a decode thread not started)
      continue;
    }
    assert_true(fired);
    ++points;
    const std::string msg = fd_last_error_message();
    if (st != FD_ERR_OUT_OF_MEMORY || msg.empty()) {
      print_error("%s: allocation %ld failed: %s (\"%s\"), expected FD_ERR_OUT_OF_MEMORY\n",
                  cs.name, k, fd_status_string(st), msg.c_str());
      fail();
    }
    Observed after = observe(f);
    if (cs.tx_failure_may_count) {
      uint64_t got, want;
      memcpy(&got, tx_failures(after), 8);
      memcpy(&want, tx_failures(before), 8);
      if (got == want + 1) {
        ++counted;
        memcpy(tx_failures(after), &want, 8);
      }
      // A failure after the step's layer write (in the decode) aborts a step
      // whose write was counted.
      const size_t writes = offsetof(fd_cache_metrics, transaction_layer_write_count);
      memcpy(&got, tx_failures(after, writes), 8);
      memcpy(&want, tx_failures(before, writes), 8);
      if (got == want + 1) {
        ++written;
        memcpy(tx_failures(after, writes), &want, 8);
      }
    }
    if (!cs.may_change.empty() && !same(after, before, "", cs.may_change)) {
      print_error("%s: allocation %ld failed (\"%s\") and changed the state\n", cs.name, k,
                  msg.c_str());
      fail();
    }
    if (!cs.may_change.empty() && after.bytes != before.bytes) ++moved;
    if (cs.may_change.empty() && !same(after, before, cs.name)) {
      print_error("%s: allocation %ld failed (\"%s\") and changed the state\n", cs.name, k,
                  msg.c_str());
      fail();
    }
    // The same call succeeds once the fault is gone (after a failed step
    // layer: a fresh step), with the outcome of a run that never failed.
    if (cs.failure_equivalent) {
      destroy(f);
      f = Fixture();
      cs.make(f);
    }
    FD_ASSERT_OK(cs.call(f));
    if (!same(observe(f), twin_after, cs.name, cs.may_change)) {
      print_error("%s: retry after failing allocation %ld differs from a clean run\n", cs.name, k);
      fail();
    }
    destroy(f);
  }
  print_message("%-34s %3ld allocation failures injected%s\n", cs.name, points,
                absorbed ? " (+ absorbed)" : "");
  if (counted)
    print_message("%-34s %3ld of them counted in transaction_failure_count\n", "", counted);
  if (moved)
    print_message("%-34s %3ld of them moved cache counters / versions (not all or nothing)\n", "",
                  moved);
  if (written)
    print_message("%-34s %3ld of them after the layer's cache write (step aborted)\n", "", written);
  if (absorbed) print_message("%-34s %3ld failures absorbed by the call\n", "", absorbed);
  if (cs.expect_points) assert_true(points > 0);
  g_total_points += points;
  return points;
}

void test_cache_create(void **) {
  Case cs;
  cs.name = "fd_cache_create";
  cs.make = [](Fixture &) {};
  cs.call = [](Fixture &f) {
    const fd_cache_config cfg = cache_config();
    fd_cache *out = f.created_cache;
    const fd_status st = fd_cache_create(&cfg, &f.created_cache);
    if (st != FD_OK) assert_ptr_equal(f.created_cache, out);  // out-pointer untouched
    return st;
  };
  sweep(cs);
}

void test_engine_create(void **) {
  Case cs;
  cs.name = "fd_engine_create";
  cs.make = make_cache_state;
  cs.call = [](Fixture &f) {
    fd_engine_config ec;
    fd_engine_config_init(&ec);
    ec.num_q_heads = kHq;
    ec.cpu_threads = 1;
    return fd_engine_create(f.c, &ec, &f.created_engine);
  };
  sweep(cs);
}

void test_cache_requests(void **) {
  Case add;
  add.name = "fd_cache_add_request";
  add.make = make_cache_state;
  add.call = [](Fixture &f) { return fd_cache_add_request(f.c, 5); };
  add.expect_points = false;
  sweep(add);
  Case fin;
  fin.name = "fd_cache_finish_request";
  fin.make = make_cache_state;
  fin.call = [](Fixture &f) { return fd_cache_finish_request(f.c, 3); };
  fin.expect_points = false;
  sweep(fin);
}

void test_transaction(void **) {
  Case begin;
  begin.name = "fd_tx_begin";
  begin.make = make_cache_state;
  begin.call = [](Fixture &f) {
    const fd_status st = fd_tx_begin(f.c, kTxIds, 4, &f.tx);
    if (st == FD_OK) f.tx_open = true;
    return st;
  };
  sweep(begin);

  for (bool rope : {false, true}) {
    for (uint32_t layer : {0u, kLayers - 1}) {
      Case w;
      static std::string names[4];
      std::string &name = names[(rope ? 2 : 0) + (layer ? 1 : 0)];
      name = std::string(rope ? "fd_tx_write_layer_rope" : "fd_tx_write_layer") + " (layer " +
             std::to_string(layer) + ")";
      w.name = name.c_str();
      w.make = [layer, rope](Fixture &f) {
        make_cache_state(f);
        begin_tx(f);
        for (uint32_t l = 0; l < layer; ++l) FD_ASSERT_OK(write_layer(f, l, rope));
      };
      w.call = [layer, rope](Fixture &f) { return write_layer(f, layer, rope); };
      // A failed layer write counts in transaction_failure_count (documented):
      // its expected state is the one a refused write (wrong layer) leaves.
      w.failure_equivalent = [layer](Fixture &f) {
        std::vector<float> x(4 * (size_t)kKv * kD, 0.f);
        assert_int_equal(fd_tx_write_layer(f.c, f.tx, layer + 1, x.data(), x.data(), NULL),
                         FD_ERR_INVALID_ARGUMENT);
      };
      w.expect_points = false;
      sweep(w);
    }
  }

  Case commit;
  commit.name = "fd_tx_commit";
  commit.make = [](Fixture &f) {
    make_cache_state(f);
    begin_tx(f);
    for (uint32_t l = 0; l < kLayers; ++l) FD_ASSERT_OK(write_layer(f, l, l % 2 == 1));
  };
  commit.call = [](Fixture &f) { return fd_tx_commit(f.c, f.tx); };
  commit.expect_points = false;
  sweep(commit);

  Case abort_;
  abort_.name = "fd_tx_abort";
  abort_.make = commit.make;
  abort_.call = [](Fixture &f) { return fd_tx_abort(f.c, f.tx); };
  abort_.expect_points = false;
  sweep(abort_);
}

void test_prefixes(void **) {
  // Fits in the free prefix capacity (2 of 6 blocks free).
  Case fits;
  fits.name = "fd_prefix_register";
  fits.make = make_cache_state;
  fits.call = [](Fixture &f) {
    return fd_prefix_register(f.c, "new", g_in->prefix_a.data(), g_in->prefix_b.data(), 2, NULL);
  };
  sweep(fits);
  // Needs the LRU eviction of "old" first: a failure must bring it back.
  Case evicts;
  evicts.name = "fd_prefix_register (evicts LRU)";
  evicts.make = make_cache_state;
  evicts.call = [](Fixture &f) {
    return fd_prefix_register(f.c, "new", g_in->prefix_a.data(), g_in->prefix_b.data(), 4, NULL);
  };
  sweep(evicts);
  Case attach;
  attach.name = "fd_prefix_attach";
  attach.make = make_cache_state;
  attach.call = [](Fixture &f) { return fd_prefix_attach(f.c, 1, "old"); };
  attach.expect_points = false;
  sweep(attach);
  Case evict;
  evict.name = "fd_prefix_evict";
  evict.make = make_cache_state;
  evict.call = [](Fixture &f) { return fd_prefix_evict(f.c, "old"); };
  evict.expect_points = false;
  sweep(evict);
}

void test_engine_step(void **) {
  Case begin;
  begin.name = "fd_engine_begin_step";
  begin.make = make_engine_state;
  begin.call = [](Fixture &f) {
    fd_engine_step st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    const fd_status s = fd_engine_begin_step(f.e, kStepIds, 4, &st);
    if (s == FD_OK) {
      f.step = st;
      f.step_open = true;
    }
    return s;
  };
  sweep(begin);

  for (uint32_t layer : {0u, kLayers - 1}) {
    Case sl;
    static std::string names[2];
    names[layer ? 1 : 0] = "fd_engine_step_layer (layer " + std::to_string(layer) + ")";
    sl.name = names[layer ? 1 : 0].c_str();
    sl.make = [layer](Fixture &f) {
      make_engine_state(f);
      begin_step(f);
      for (uint32_t l = 0; l < layer; ++l) FD_ASSERT_OK(step_layer(f, l));
    };
    sl.call = [layer](Fixture &f) { return step_layer(f, layer); };
    // Any failure aborts the step (documented): as fd_engine_abort_step.
    sl.failure_equivalent = [](Fixture &f) { FD_ASSERT_OK(fd_engine_abort_step(f.e, f.step.tx)); };
    sl.tx_failure_may_count = true;
    sweep(sl);
  }

  Case commit;
  commit.name = "fd_engine_commit_step";
  commit.make = [](Fixture &f) {
    make_engine_state(f);
    begin_step(f);
    for (uint32_t l = 0; l < kLayers; ++l) FD_ASSERT_OK(step_layer(f, l));
  };
  commit.call = [](Fixture &f) { return fd_engine_commit_step(f.e, f.step.tx); };
  commit.expect_points = false;
  sweep(commit);

  Case prefill;
  prefill.name = "fd_engine_prefill_request_layers";
  prefill.make = make_engine_state;
  prefill.call = [](Fixture &f) {
    return fd_engine_prefill_request_layers(f.e, 2, g_in->prefill.data(), g_in->prefill.data());
  };
  // The cache's begin reserves what commit and abort need, so a failure can
  // only come before the transaction opens: nothing changes, counters and
  // versions included.
  sweep(prefill);

  Case add;
  add.name = "fd_engine_add_request";
  add.make = make_engine_state;
  add.call = [](Fixture &f) { return fd_engine_add_request(f.e, 6); };
  add.expect_points = false;
  sweep(add);
  Case admit;
  admit.name = "fd_engine_admit";
  admit.make = [](Fixture &f) {
    make_engine_state(f);
    FD_ASSERT_OK(fd_engine_add_request(f.e, 6));
  };
  admit.call = [](Fixture &f) { return fd_engine_admit(f.e, 6); };
  admit.expect_points = false;
  sweep(admit);
}

}  // namespace

int main(void) {
  const Inputs inputs;
  g_in = &inputs;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cache_create),   cmocka_unit_test(test_engine_create),
      cmocka_unit_test(test_cache_requests), cmocka_unit_test(test_transaction),
      cmocka_unit_test(test_prefixes),       cmocka_unit_test(test_engine_step),
  };
  const int failed = cmocka_run_group_tests(tests, NULL, NULL);
  print_message("host allocation failures injected in total: %ld\n", g_total_points);
  return failed;
}
