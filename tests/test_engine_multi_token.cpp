/* Several tokens per request through the engine (docs/semantics.md S8):
 * bulk prompt writes (fd_engine_prefill_request_tokens), steps that carry
 * several tokens for a row (fd_engine_begin_step_multi) and the keep call of
 * speculative verification (fd_engine_commit_step_keep), on a CPU cache.
 *
 * The yardstick is the one-token path: a row's k tokens in one step must give
 * what k one-token steps give (causal attention: token j sees what the j-th
 * single step saw), a bulk prefill must leave the cache holding what
 * token-by-token prefill leaves, and keeping a tokens must leave the engine
 * where a one-token steps would. Every error: status, message, nothing
 * changed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "fd_test.h"
#include "test_engine_support.h"

namespace {

constexpr uint32_t kLayers = 2, kKv = 2, kQ = 4, kDim = 16, kBs = 4;

struct Rig {
  fd_cache *cache = NULL;
  fd_engine *engine = NULL;
  Rig(uint32_t max_blocks, const std::vector<uint64_t> &ids) {
    cache = es_cache(kLayers, kKv, kDim, kBs, max_blocks);
    engine = es_engine(cache, kQ);
    for (uint64_t id : ids) {
      FD_ASSERT_OK(fd_engine_add_request(engine, id));
      FD_ASSERT_OK(fd_engine_admit(engine, id));
    }
  }
  ~Rig() {
    fd_engine_destroy(engine);
    fd_cache_destroy(cache);
  }
};

/* Deterministic per-(request, position, layer) data: the same token gets the
 * same q, k and v whichever path writes it. */
float value(uint64_t id, int32_t position, uint32_t layer, uint32_t which, size_t i) {
  fd_test_rng rng = {id * 1000003u + (uint64_t)position * 7919u + layer * 131u + which * 17u + i};
  return fd_test_normal(&rng);
}

void fill_token(float *dst, size_t n, uint64_t id, int32_t position, uint32_t layer,
                uint32_t which) {
  for (size_t i = 0; i < n; ++i) dst[i] = value(id, position, layer, which, i);
}

/* Prefills `n` tokens of request `id` from position `first`, either in bulk
 * or one token at a time. */
void prefill(Rig &rig, uint64_t id, int32_t first, uint32_t n, bool bulk) {
  const size_t tok = (size_t)kKv * kDim;
  if (bulk) {
    std::vector<float> k((size_t)kLayers * n * tok), v(k.size());
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t t = 0; t < n; ++t) {
        fill_token(&k[((size_t)l * n + t) * tok], tok, id, first + (int32_t)t, l, 1);
        fill_token(&v[((size_t)l * n + t) * tok], tok, id, first + (int32_t)t, l, 2);
      }
    FD_ASSERT_OK(fd_engine_prefill_request_tokens(rig.engine, id, n, k.data(), v.data()));
    return;
  }
  for (uint32_t t = 0; t < n; ++t) {
    std::vector<float> k((size_t)kLayers * tok), v(k.size());
    for (uint32_t l = 0; l < kLayers; ++l) {
      fill_token(&k[l * tok], tok, id, first + (int32_t)t, l, 1);
      fill_token(&v[l * tok], tok, id, first + (int32_t)t, l, 2);
    }
    FD_ASSERT_OK(fd_engine_prefill_request_layers(rig.engine, id, k.data(), v.data()));
  }
}

/* Every stored K/V element of request `id`'s first `len` tokens, in order. */
std::vector<float> stored(const Rig &rig, uint64_t id, int32_t len) {
  std::vector<int32_t> table(64, -1);
  int32_t got = 0;
  FD_ASSERT_OK(fd_cache_export(rig.cache, &id, 1, 64, table.data(), &got));
  assert_int_equal(got, len);
  std::vector<float> out;
  for (uint32_t l = 0; l < kLayers; ++l) {
    void *k = NULL, *v = NULL;
    int64_t strides[4];
    FD_ASSERT_OK(fd_cache_layer_storage(rig.cache, l, &k, &v, strides));
    for (int32_t t = 0; t < len; ++t)
      for (uint32_t h = 0; h < kKv; ++h)
        for (uint32_t d = 0; d < kDim; ++d) {
          const int64_t off = table[t / (int32_t)kBs] * strides[0] + h * strides[1] +
                              (t % (int32_t)kBs) * strides[2] + d * strides[3];
          out.push_back(((const float *)k)[off]);
          out.push_back(((const float *)v)[off]);
        }
  }
  return out;
}

/* Runs one step. counts empty: fd_engine_begin_step (one token per row).
 * Returns the attention output of every layer, [layer][token][head][dim]. */
std::vector<float> step(Rig &rig, const std::vector<uint64_t> &ids,
                        const std::vector<uint32_t> &counts, const std::vector<uint32_t> *keep) {
  std::vector<int32_t> first(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) first[i] = es_seq_len(rig.cache, ids[i]);
  fd_engine_step st;
  st.struct_size = sizeof st;
  if (counts.empty()) {
    FD_ASSERT_OK(fd_engine_begin_step(rig.engine, ids.data(), (uint32_t)ids.size(), &st));
  } else {
    FD_ASSERT_OK(fd_engine_begin_step_multi(rig.engine, ids.data(), counts.data(),
                                            (uint32_t)ids.size(), &st));
  }
  assert_int_equal(st.outcome, FD_STEP_OPENED);
  size_t tokens = 0;
  for (size_t i = 0; i < ids.size(); ++i) tokens += counts.empty() ? 1 : counts[i];
  const size_t qn = (size_t)kQ * kDim, kn = (size_t)kKv * kDim;
  std::vector<float> all;
  for (uint32_t l = 0; l < kLayers; ++l) {
    std::vector<float> q(tokens * qn), k(tokens * kn), v(tokens * kn), out(tokens * qn, NAN);
    size_t t = 0;
    for (size_t i = 0; i < ids.size(); ++i)
      for (uint32_t j = 0; j < (counts.empty() ? 1 : counts[i]); ++j, ++t) {
        fill_token(&q[t * qn], qn, ids[i], first[i] + (int32_t)j, l, 0);
        fill_token(&k[t * kn], kn, ids[i], first[i] + (int32_t)j, l, 1);
        fill_token(&v[t * kn], kn, ids[i], first[i] + (int32_t)j, l, 2);
      }
    FD_ASSERT_OK(
        fd_engine_step_layer(rig.engine, st.tx, l, q.data(), k.data(), v.data(), out.data(), NULL));
    all.insert(all.end(), out.begin(), out.end());
  }
  if (keep != NULL) {
    FD_ASSERT_OK(
        fd_engine_commit_step_keep(rig.engine, st.tx, keep->data(), (uint32_t)keep->size()));
  } else {
    FD_ASSERT_OK(fd_engine_commit_step(rig.engine, st.tx));
  }
  return all;
}

void assert_close(const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    assert_true(std::isfinite(a[i]));
    if (!(std::fabs(a[i] - b[i]) <= 1e-5f * (1.f + std::fabs(b[i])))) {
      print_error("element %zu: %.8g vs %.8g\n", i, (double)a[i], (double)b[i]);
      fail();
    }
  }
}

/* One transaction writes a whole prompt, and the cache then holds what
 * token-by-token prefill writes. */
void test_bulk_prefill_matches_token_by_token(void **state) {
  (void)state;
  Rig bulk(64, {1, 2}), single(64, {1, 2});
  const fd_cache_metrics before = es_cache_metrics(bulk.cache);
  prefill(bulk, 1, 0, 13, true);
  prefill(bulk, 2, 0, 1, true);
  prefill(bulk, 2, 1, 6, true); /* a second chunk continues the row */
  prefill(single, 1, 0, 13, false);
  prefill(single, 2, 0, 7, false);
  const fd_cache_metrics after = es_cache_metrics(bulk.cache);
  assert_int_equal(after.transaction_commit_count - before.transaction_commit_count, 3);
  assert_int_equal(es_metrics(bulk.engine).prefill_token_count, 20);
  for (uint64_t id : {1u, 2u}) {
    const int32_t len = id == 1 ? 13 : 7;
    assert_true(stored(bulk, id, len) == stored(single, id, len));
  }
  FD_ASSERT_OK(fd_cache_validate(bulk.cache));
}

/* k tokens of a row in one step give what k one-token steps give, for rows
 * of different counts side by side, and the lengths grow by k. */
void test_multi_token_step_matches_single_steps(void **state) {
  (void)state;
  const std::vector<uint64_t> ids = {1, 2, 3};
  const std::vector<uint32_t> counts = {3, 1, 6};
  Rig multi(64, ids), single(64, ids);
  const uint32_t context[3] = {5, 8, 3};
  for (size_t i = 0; i < ids.size(); ++i) {
    prefill(multi, ids[i], 0, context[i], true);
    prefill(single, ids[i], 0, context[i], true);
  }
  const std::vector<float> got = step(multi, ids, counts, NULL);
  /* The same tokens, one step per token and request. */
  const size_t qn = (size_t)kQ * kDim;
  const size_t tokens = 10;
  std::vector<float> want(kLayers * tokens * qn);
  size_t t = 0;
  for (size_t i = 0; i < ids.size(); ++i)
    for (uint32_t j = 0; j < counts[i]; ++j, ++t) {
      const std::vector<float> out = step(single, {ids[i]}, {}, NULL);
      for (uint32_t l = 0; l < kLayers; ++l)
        std::copy(&out[l * qn], &out[(l + 1) * qn], &want[(l * tokens + t) * qn]);
    }
  assert_close(got.data(), want.data(), want.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    assert_int_equal(es_seq_len(multi.cache, ids[i]), context[i] + counts[i]);
    assert_true(stored(multi, ids[i], (int32_t)(context[i] + counts[i])) ==
                stored(single, ids[i], (int32_t)(context[i] + counts[i])));
  }
  const fd_engine_metrics m = es_metrics(multi.engine);
  assert_int_equal(m.completed_step_count, 1);
  assert_int_equal(m.appended_token_count, 10);
  FD_ASSERT_OK(fd_cache_validate(multi.cache));
}

/* Keeping a_i of k_i tokens leaves the engine where a_i one-token steps
 * would: same lengths, same free blocks, and the next step sees the same
 * context. */
void test_keep_matches_accepted_prefix(void **state) {
  (void)state;
  const std::vector<uint64_t> ids = {1, 2, 3};
  const std::vector<uint32_t> counts = {5, 4, 2}, keep = {2, 0, 2};
  Rig verify(32, ids), accepted(32, ids);
  for (uint64_t id : ids) {
    prefill(verify, id, 0, 3, true);
    prefill(accepted, id, 0, 3, true);
  }
  (void)step(verify, ids, counts, &keep);
  for (size_t i = 0; i < ids.size(); ++i)
    for (uint32_t j = 0; j < keep[i]; ++j) (void)step(accepted, {ids[i]}, {}, NULL);
  for (size_t i = 0; i < ids.size(); ++i)
    assert_int_equal(es_seq_len(verify.cache, ids[i]), 3 + (int32_t)keep[i]);
  assert_int_equal(es_cache_metrics(verify.cache).free_blocks,
                   es_cache_metrics(accepted.cache).free_blocks);
  assert_int_equal(es_metrics(verify.engine).appended_token_count, 4);
  /* The next token of every row attends the kept context only. */
  const std::vector<float> a = step(verify, ids, {}, NULL);
  const std::vector<float> b = step(accepted, ids, {}, NULL);
  assert_close(a.data(), b.data(), b.size());
  FD_ASSERT_OK(fd_cache_validate(verify.cache));
}

/* Every refusal: status, message, and nothing changed (engine and cache
 * versions, lengths; an open step stays open and can still commit). */
void test_errors_change_nothing(void **state) {
  (void)state;
  const std::vector<uint64_t> ids = {1, 2};
  Rig rig(8, ids);
  prefill(rig, 1, 0, 2, true);
  const uint64_t ev = es_metrics(rig.engine).state_version, cv = es_version(rig.cache);
  fd_engine_step st;
  st.struct_size = sizeof st;
  const uint32_t zero[2] = {2, 0}, counts[2] = {2, 3};
  FD_ASSERT_FAILS(fd_engine_begin_step_multi(rig.engine, ids.data(), NULL, 2, &st),
                  FD_ERR_INVALID_ARGUMENT, "token_counts must not be NULL");
  FD_ASSERT_FAILS(fd_engine_begin_step_multi(rig.engine, ids.data(), zero, 2, &st),
                  FD_ERR_INVALID_ARGUMENT, "token_counts[1] is 0");
  FD_ASSERT_FAILS(fd_engine_begin_step_multi(NULL, ids.data(), counts, 2, &st),
                  FD_ERR_INVALID_ARGUMENT, "engine");
  std::vector<float> kv((size_t)kLayers * kKv * kDim, 0.f);
  FD_ASSERT_FAILS(fd_engine_prefill_request_tokens(rig.engine, 2, 0, kv.data(), kv.data()),
                  FD_ERR_INVALID_ARGUMENT, "num_tokens must be > 0");
  FD_ASSERT_FAILS(fd_engine_prefill_request_tokens(rig.engine, 2, 1, NULL, kv.data()),
                  FD_ERR_INVALID_ARGUMENT, "k must not be NULL");
  FD_ASSERT_FAILS(fd_engine_prefill_request_tokens(rig.engine, 9, 1, kv.data(), kv.data()),
                  FD_ERR_NOT_FOUND, "prefill_request_tokens: unknown request 9");
  /* More tokens than the cache holds: backpressure, nothing else. */
  const uint32_t huge[2] = {40, 1};
  FD_ASSERT_OK(fd_engine_begin_step_multi(rig.engine, ids.data(), huge, 2, &st));
  assert_int_equal(st.outcome, FD_STEP_BACKPRESSURE);
  assert_int_equal(st.needed_blocks, 11); /* 2 + 40 tokens: 11 blocks, 1 held; 0 + 1: 1 block */
  assert_int_equal(es_metrics(rig.engine).backpressure_count, 1);
  assert_int_equal(es_metrics(rig.engine).state_version, ev);
  assert_int_equal(es_version(rig.cache), cv);
  assert_int_equal(es_seq_len(rig.cache, 1), 2);
  assert_int_equal(es_seq_len(rig.cache, 2), 0);

  /* An open step: bad keep calls leave it open and unchanged. */
  FD_ASSERT_OK(fd_engine_begin_step_multi(rig.engine, ids.data(), counts, 2, &st));
  assert_int_equal(st.outcome, FD_STEP_OPENED);
  const size_t qn = (size_t)kQ * kDim, kn = (size_t)kKv * kDim;
  std::vector<float> q(5 * qn, 0.5f), k(5 * kn, 0.25f), v(5 * kn, 1.f), out(5 * qn);
  const uint32_t keep_ok[2] = {1, 3}, keep_big[2] = {3, 1};
  FD_ASSERT_FAILS(fd_engine_commit_step_keep(rig.engine, st.tx, keep_ok, 2), FD_ERR_INVALID_STATE,
                  "0 of 2 layers");
  for (uint32_t l = 0; l < kLayers; ++l)
    FD_ASSERT_OK(
        fd_engine_step_layer(rig.engine, st.tx, l, q.data(), k.data(), v.data(), out.data(), NULL));
  const uint64_t open_version = es_metrics(rig.engine).state_version;
  FD_ASSERT_FAILS(fd_engine_commit_step_keep(rig.engine, st.tx, NULL, 2), FD_ERR_INVALID_ARGUMENT,
                  "keep_counts must not be NULL");
  FD_ASSERT_FAILS(fd_engine_commit_step_keep(rig.engine, st.tx, keep_ok, 1),
                  FD_ERR_INVALID_ARGUMENT, "count 1 must equal the step's 2 rows");
  FD_ASSERT_FAILS(fd_engine_commit_step_keep(rig.engine, st.tx, keep_big, 2),
                  FD_ERR_INVALID_ARGUMENT, "keep_counts[0]");
  assert_int_equal(es_metrics(rig.engine).state_version, open_version);
  assert_int_equal(es_metrics(rig.engine).open_step_transaction_count, 1);
  assert_int_equal(es_seq_len(rig.cache, 1), 2);
  FD_ASSERT_OK(fd_engine_commit_step_keep(rig.engine, st.tx, keep_ok, 2));
  assert_int_equal(es_seq_len(rig.cache, 1), 3);
  assert_int_equal(es_seq_len(rig.cache, 2), 3);
  FD_ASSERT_OK(fd_cache_validate(rig.cache));
}

/* Scheduler-managed mode: bulk prefill of the whole context, a verify step
 * within the commitment, and a request that finishes when the kept tokens
 * reach initial_context_tokens + max_new_tokens; growing past either is
 * refused. */
void test_scheduled_rows(void **state) {
  (void)state;
  fd_cache *cache = es_cache(kLayers, kKv, kDim, kBs, 32);
  fd_engine *engine = es_engine(cache, kQ);
  fd_scheduler_config sc;
  fd_scheduler_config_init(&sc);
  fd_scheduler *sched = NULL;
  FD_ASSERT_OK(fd_scheduler_create(&sc, &sched));
  const fd_request_spec spec = es_spec(7, 6, 4);
  FD_ASSERT_OK(fd_engine_submit_request(engine, &spec));
  uint64_t step_no = 0;
  /* Plans and applies a decision (admission, then the runnable ids). */
  auto replan = [&]() {
    fd_snapshot *snap = NULL;
    FD_ASSERT_OK(fd_engine_snapshot(engine, step_no++, NULL, 0, &snap));
    fd_decision *dec = NULL;
    FD_ASSERT_OK(fd_scheduler_plan(sched, snap, &dec));
    FD_ASSERT_OK(fd_engine_apply_decision(engine, sched, dec));
    fd_decision_destroy(dec);
    fd_snapshot_destroy(snap);
  };
  replan();
  std::vector<float> kv((size_t)kLayers * 7 * kKv * kDim, 0.1f);
  FD_ASSERT_FAILS(fd_engine_prefill_request_tokens(engine, 7, 7, kv.data(), kv.data()),
                  FD_ERR_INVALID_ARGUMENT, "past its 6 context tokens");
  assert_int_equal(es_seq_len(cache, 7), 0);
  FD_ASSERT_OK(fd_engine_prefill_request_tokens(engine, 7, 6, kv.data(), kv.data()));
  assert_int_equal(es_seq_len(cache, 7), 6);
  replan();
  const uint64_t id = 7;
  fd_engine_step st;
  st.struct_size = sizeof st;
  const uint32_t too_many = 5, three = 3;
  FD_ASSERT_FAILS(fd_engine_begin_step_multi(engine, &id, &too_many, 1, &st),
                  FD_ERR_INVALID_ARGUMENT, "token_counts[0] = 5");
  FD_ASSERT_OK(fd_engine_begin_step_multi(engine, &id, &three, 1, &st));
  const size_t qn = (size_t)kQ * kDim, kn = (size_t)kKv * kDim;
  std::vector<float> q(3 * qn, 0.5f), k(3 * kn, 0.25f), v(3 * kn, 1.f), out(3 * qn);
  for (uint32_t l = 0; l < kLayers; ++l)
    FD_ASSERT_OK(
        fd_engine_step_layer(engine, st.tx, l, q.data(), k.data(), v.data(), out.data(), NULL));
  const uint32_t keep = 3;
  FD_ASSERT_OK(fd_engine_commit_step_keep(engine, st.tx, &keep, 1));
  assert_int_equal(es_seq_len(cache, 7), 9);
  assert_int_equal(es_state(engine, 7), FD_ENGINE_REQUEST_ACTIVE);
  replan();
  const uint32_t one = 1;
  FD_ASSERT_OK(fd_engine_begin_step_multi(engine, &id, &one, 1, &st));
  for (uint32_t l = 0; l < kLayers; ++l)
    FD_ASSERT_OK(
        fd_engine_step_layer(engine, st.tx, l, q.data(), k.data(), v.data(), out.data(), NULL));
  FD_ASSERT_OK(fd_engine_commit_step(engine, st.tx));
  assert_int_equal(es_state(engine, 7), FD_ENGINE_REQUEST_FINISHED);
  FD_ASSERT_OK(fd_engine_validate(engine));
  fd_scheduler_destroy(sched);
  fd_engine_destroy(engine);
  fd_cache_destroy(cache);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bulk_prefill_matches_token_by_token),
      cmocka_unit_test(test_multi_token_step_matches_single_steps),
      cmocka_unit_test(test_keep_matches_accepted_prefix),
      cmocka_unit_test(test_errors_change_nothing),
      cmocka_unit_test(test_scheduled_rows),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
