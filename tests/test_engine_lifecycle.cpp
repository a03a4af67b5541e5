/* Decode engine, unscheduled mode (S8): lifecycle, step numerics against the
 * dense reference, backpressure, automatic abort on failures inside a step,
 * prefill, and every error path with its status, message and no mutation. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cmath>
#include <map>
#include <vector>

#include "fd_test.h"
#include "test_engine_support.h"

namespace {

void test_create_errors(void **) {
  fd_cache *c = es_cache(1, 2, 8, 4, 8);
  fd_engine_config ec;
  fd_engine_config_init(&ec);
  fd_engine *e = (fd_engine *)0x1;
  FD_ASSERT_FAILS(fd_engine_create(NULL, &ec, &e), FD_ERR_INVALID_ARGUMENT, "cache");
  ec.num_q_heads = 3;
  FD_ASSERT_FAILS(fd_engine_create(c, &ec, &e), FD_ERR_INVALID_ARGUMENT,
                  "num_q_heads 3 must be a positive multiple");
  ec.num_q_heads = 4;
  ec.rotary_dim = 5;
  FD_ASSERT_FAILS(fd_engine_create(c, &ec, &e), FD_ERR_INVALID_ARGUMENT, "rotary_dim 5");
  ec.rotary_dim = 10;
  FD_ASSERT_FAILS(fd_engine_create(c, &ec, &e), FD_ERR_INVALID_ARGUMENT, "rotary_dim 10");
  ec.rotary_dim = 0;
  ec.rope_base = -1.f;
  FD_ASSERT_FAILS(fd_engine_create(c, &ec, &e), FD_ERR_INVALID_ARGUMENT, "rope_base");
  ec.rope_base = 10000.f;
  ec.sm_scale = -2.f;
  FD_ASSERT_FAILS(fd_engine_create(c, &ec, &e), FD_ERR_INVALID_ARGUMENT, "sm_scale");
  ec.sm_scale = 0.f;
  ec.struct_size = 4;
  FD_ASSERT_FAILS(fd_engine_create(c, &ec, &e), FD_ERR_INVALID_ARGUMENT, "struct_size");
  // A cache with an open transaction.
  uint64_t id = 1;
  FD_ASSERT_OK(fd_cache_add_request(c, id));
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, &id, 1, &tx));
  FD_ASSERT_FAILS(fd_engine_create(c, NULL, &e), FD_ERR_INVALID_STATE, "open transaction");
  assert_ptr_equal(e, (fd_engine *)0x1);
  FD_ASSERT_OK(fd_tx_abort(c, tx));
  FD_ASSERT_OK(fd_engine_create(c, NULL, &e));  // NULL config: defaults
  fd_engine_destroy(e);
  fd_engine_destroy(NULL);
  fd_cache_destroy(c);
}

void test_lifecycle(void **) {
  fd_cache *c = es_cache(1, 2, 8, 4, 8);
  fd_engine *e = es_engine(c);
  assert_int_equal(es_state(e, 5), FD_ENGINE_REQUEST_UNKNOWN);
  FD_ASSERT_OK(fd_engine_add_request(e, 5));
  FD_ASSERT_OK(fd_engine_add_request(e, 5));  // no-op
  assert_int_equal(es_state(e, 5), FD_ENGINE_REQUEST_WAITING);
  FD_ASSERT_OK(fd_engine_add_request(e, 6));
  FD_ASSERT_OK(fd_engine_add_request(e, 7));
  fd_engine_metrics m = es_metrics(e);
  assert_int_equal(m.waiting_request_count, 3);
  assert_int_equal(m.scheduler_managed, 0);
  FD_ASSERT_OK(fd_engine_admit(e, 5));
  FD_ASSERT_OK(fd_engine_admit(e, 5));        // no-op
  FD_ASSERT_OK(fd_engine_add_request(e, 5));  // active: no-op
  assert_int_equal(es_state(e, 5), FD_ENGINE_REQUEST_ACTIVE);
  int32_t cs = -1;
  FD_ASSERT_OK(fd_cache_request_state(c, 5, &cs));
  assert_int_equal(cs, FD_REQUEST_ACTIVE);
  FD_ASSERT_OK(fd_engine_admit(e, 6));
  FD_ASSERT_OK(fd_engine_finish(e, 5));
  FD_ASSERT_OK(fd_engine_cancel(e, 6));
  FD_ASSERT_OK(fd_engine_cancel(e, 7));  // waiting: never reaches the cache
  FD_ASSERT_OK(fd_cache_request_state(c, 7, &cs));
  assert_int_equal(cs, FD_REQUEST_UNKNOWN);
  m = es_metrics(e);
  assert_int_equal(m.waiting_request_count, 0);
  assert_int_equal(m.active_request_count, 0);
  assert_int_equal(m.finished_request_count, 1);
  assert_int_equal(m.cancelled_request_count, 2);
  FD_ASSERT_OK(fd_engine_validate(e));

  // Errors change nothing.
  const uint64_t version = m.state_version;
  FD_ASSERT_FAILS(fd_engine_add_request(e, 5), FD_ERR_INVALID_STATE, "request 5 is finished");
  FD_ASSERT_FAILS(fd_engine_admit(e, 99), FD_ERR_NOT_FOUND, "unknown request 99");
  FD_ASSERT_FAILS(fd_engine_admit(e, 6), FD_ERR_INVALID_STATE, "request 6 is cancelled");
  FD_ASSERT_FAILS(fd_engine_finish(e, 5), FD_ERR_INVALID_STATE, "already finished");
  FD_ASSERT_FAILS(fd_engine_cancel(e, 7), FD_ERR_INVALID_STATE, "already cancelled");
  FD_ASSERT_FAILS(fd_engine_finish(e, 98), FD_ERR_NOT_FOUND, "unknown request 98");
  FD_ASSERT_FAILS(fd_engine_get_request_state(e, 5, NULL), FD_ERR_INVALID_ARGUMENT, "state");
  // An id terminal in the cache is refused before the engine records it.
  FD_ASSERT_OK(fd_cache_add_request(c, 50));
  FD_ASSERT_OK(fd_cache_finish_request(c, 50));
  FD_ASSERT_FAILS(fd_engine_add_request(e, 50), FD_ERR_INVALID_STATE, "finished in the cache");
  assert_int_equal(es_state(e, 50), FD_ENGINE_REQUEST_UNKNOWN);
  m = es_metrics(e);
  assert_int_equal(m.state_version, version);
  assert_int_equal(m.finished_request_count, 1);
  fd_engine_metrics tiny;
  tiny.struct_size = 4;
  FD_ASSERT_FAILS(fd_engine_metrics_get(e, &tiny), FD_ERR_INVALID_ARGUMENT, "struct_size");
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

// Expected attention of one row, from the test's own K/V history.
struct History {
  std::vector<float> k, v;  // [tokens][kv][d], K rotated
};

void rope(std::vector<float> &x, uint32_t heads, uint32_t d, int32_t pos) {
  FD_ASSERT_OK(fd_rope_apply(FD_DTYPE_F32, x.data(), 1, heads, d, &pos, d, 10000.f));
}

void test_step_matches_reference(void **) {
  const uint32_t L = 2, kv = 2, qh = 4, d = 8, bs = 4;
  fd_cache *c = es_cache(L, kv, d, bs, 16);
  fd_engine *e = es_engine(c, qh);
  fd_test_rng rng = {7};
  std::vector<uint64_t> ids = {11, 12};
  std::map<uint64_t, std::vector<History>> hist;
  for (uint64_t id : ids) {
    FD_ASSERT_OK(fd_engine_add_request(e, id));
    FD_ASSERT_OK(fd_engine_admit(e, id));
    hist[id].resize(L);
  }
  auto randv = [&](size_t n) {
    std::vector<float> x(n);
    for (float &f : x) f = fd_test_normal(&rng);
    return x;
  };
  // Prefill 3 tokens into request 11.
  for (int t = 0; t < 3; ++t) {
    std::vector<float> k = randv(L * kv * d), v = randv(L * kv * d);
    FD_ASSERT_OK(fd_engine_prefill_request_layers(e, 11, k.data(), v.data()));
    for (uint32_t l = 0; l < L; ++l) {
      std::vector<float> kl(k.begin() + l * kv * d, k.begin() + (l + 1) * kv * d);
      rope(kl, kv, d, t);
      hist[11][l].k.insert(hist[11][l].k.end(), kl.begin(), kl.end());
      hist[11][l].v.insert(hist[11][l].v.end(), v.begin() + l * kv * d,
                           v.begin() + (l + 1) * kv * d);
    }
  }
  assert_int_equal(es_seq_len(c, 11), 3);
  assert_int_equal(es_metrics(e).prefill_token_count, 3);
  double worst = 0;
  for (int step = 0; step < 6; ++step) {
    fd_engine_step st;
    st.struct_size = sizeof st;
    FD_ASSERT_OK(fd_engine_begin_step(e, ids.data(), 2, &st));
    assert_int_equal(st.outcome, FD_STEP_OPENED);
    assert_int_equal(st.batch, 2);
    for (uint32_t l = 0; l < L; ++l) {
      std::vector<float> q = randv(2 * qh * d), k = randv(2 * kv * d), v = randv(2 * kv * d);
      const std::vector<float> q_in = q;
      std::vector<float> out(2 * qh * d, NAN);
      FD_ASSERT_OK(
          fd_engine_step_layer(e, st.tx, l, q.data(), k.data(), v.data(), out.data(), NULL));
      assert_memory_equal(q.data(), q_in.data(), q.size() * sizeof(float));  // not modified
      for (int r = 0; r < 2; ++r) {
        History &h = hist[ids[r]][l];
        const int32_t pos = (int32_t)(h.k.size() / (kv * d));
        std::vector<float> kr(k.begin() + r * kv * d, k.begin() + (r + 1) * kv * d);
        std::vector<float> qr(q.begin() + r * qh * d, q.begin() + (r + 1) * qh * d);
        rope(kr, kv, d, pos);
        rope(qr, qh, d, pos);
        h.k.insert(h.k.end(), kr.begin(), kr.end());
        h.v.insert(h.v.end(), v.begin() + r * kv * d, v.begin() + (r + 1) * kv * d);
        const uint32_t len = pos + 1;
        // Dense layout [1, kv, len, d] from the token-major history.
        std::vector<float> kd(kv * len * d), vd(kv * len * d), ref(qh * d);
        for (uint32_t t = 0; t < len; ++t)
          for (uint32_t hh = 0; hh < kv; ++hh)
            for (uint32_t x = 0; x < d; ++x) {
              kd[(hh * len + t) * d + x] = h.k[(t * kv + hh) * d + x];
              vd[(hh * len + t) * d + x] = h.v[(t * kv + hh) * d + x];
            }
        int32_t sl = (int32_t)len;
        FD_ASSERT_OK(fd_reference_attention_dense(FD_DTYPE_F32, 1, qh, kv, d, len, qr.data(),
                                                  kd.data(), vd.data(), &sl, 0.f, ref.data()));
        for (uint32_t i = 0; i < qh * d; ++i) {
          worst = fmax(worst, fabs((double)ref[i] - out[r * qh * d + i]));
        }
      }
    }
    FD_ASSERT_OK(fd_engine_commit_step(e, st.tx));
    FD_ASSERT_OK(fd_engine_validate(e));
  }
  assert_true(worst < 1e-4);
  assert_int_equal(es_seq_len(c, 11), 9);
  assert_int_equal(es_seq_len(c, 12), 6);
  fd_engine_metrics m = es_metrics(e);
  assert_int_equal(m.completed_step_count, 6);
  assert_int_equal(m.appended_token_count, 12);
  assert_int_equal(m.transaction_layer_step_count, 12);
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

void test_backpressure(void **) {
  fd_cache *c = es_cache(1, 1, 4, 2, 2);
  fd_engine *e = es_engine(c);
  std::vector<uint64_t> ids = {1, 2};
  for (uint64_t id : ids) {
    FD_ASSERT_OK(fd_engine_add_request(e, id));
    FD_ASSERT_OK(fd_engine_admit(e, id));
  }
  assert_int_equal(es_step(e, c, ids, 1), FD_STEP_OPENED);
  assert_int_equal(es_step(e, c, ids, 1), FD_STEP_OPENED);
  const uint64_t cache_version = es_version(c);
  const fd_engine_metrics before = es_metrics(e);
  fd_engine_step st;
  st.struct_size = sizeof st;
  FD_ASSERT_OK(fd_engine_begin_step(e, ids.data(), 2, &st));
  assert_int_equal(st.outcome, FD_STEP_BACKPRESSURE);
  assert_int_equal(st.needed_blocks, 2);
  assert_int_equal(st.free_blocks, 0);
  const fd_engine_metrics after = es_metrics(e);
  assert_int_equal(after.backpressure_count, before.backpressure_count + 1);
  assert_int_equal(after.state_version, before.state_version);
  assert_int_equal(after.open_step_transaction_count, 0);
  assert_int_equal(es_version(c), cache_version);
  assert_int_equal(es_cache_metrics(c).open_transaction_count, 0);
  // Cancelling one frees its block: the other proceeds.
  FD_ASSERT_OK(fd_engine_cancel(e, 1));
  std::vector<uint64_t> two = {2};
  assert_int_equal(es_step(e, c, two, 1), FD_STEP_OPENED);
  assert_int_equal(es_seq_len(c, 2), 3);
  FD_ASSERT_OK(fd_engine_validate(e));
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

void test_step_errors_change_nothing(void **) {
  fd_cache *c = es_cache(2, 1, 4, 2, 8);
  fd_engine *e = es_engine(c);
  FD_ASSERT_OK(fd_engine_add_request(e, 1));
  FD_ASSERT_OK(fd_engine_admit(e, 1));
  FD_ASSERT_OK(fd_engine_add_request(e, 2));  // waiting
  fd_engine_step st;
  st.struct_size = sizeof st;
  st.outcome = 77;
  uint64_t dup[2] = {1, 1}, unknown = 9, waiting = 2, one = 1;
  const uint64_t version = es_version(c);
  FD_ASSERT_FAILS(fd_engine_begin_step(e, NULL, 1, &st), FD_ERR_INVALID_ARGUMENT, "request_ids");
  FD_ASSERT_FAILS(fd_engine_begin_step(e, dup, 0, &st), FD_ERR_INVALID_ARGUMENT, "count");
  FD_ASSERT_FAILS(fd_engine_begin_step(e, dup, 2, &st), FD_ERR_INVALID_ARGUMENT, "twice");
  FD_ASSERT_FAILS(fd_engine_begin_step(e, &unknown, 1, &st), FD_ERR_NOT_FOUND, "unknown request 9");
  FD_ASSERT_FAILS(fd_engine_begin_step(e, &waiting, 1, &st), FD_ERR_INVALID_STATE,
                  "request 2 is waiting");
  FD_ASSERT_FAILS(fd_engine_begin_step(e, &one, 1, NULL), FD_ERR_INVALID_ARGUMENT, "step");
  fd_engine_step small;
  small.struct_size = 8;
  FD_ASSERT_FAILS(fd_engine_begin_step(e, &one, 1, &small), FD_ERR_INVALID_ARGUMENT, "struct_size");
  assert_int_equal(st.outcome, 77);
  assert_int_equal(es_version(c), version);
  fd_tx none = {1, version};
  FD_ASSERT_FAILS(fd_engine_commit_step(e, none), FD_ERR_INVALID_STATE, "no step is open");
  FD_ASSERT_FAILS(fd_engine_abort_step(e, none), FD_ERR_INVALID_STATE, "no step is open");
  FD_ASSERT_FAILS(fd_engine_step_layer(e, none, 0, &st, &st, &st, &st, NULL), FD_ERR_INVALID_STATE,
                  "no step is open");

  // With a step open, lifecycle changes are refused and nothing changes.
  FD_ASSERT_OK(fd_engine_begin_step(e, &one, 1, &st));
  assert_int_equal(st.outcome, FD_STEP_OPENED);
  const fd_engine_metrics open_m = es_metrics(e);
  assert_int_equal(open_m.open_step_transaction_count, 1);
  FD_ASSERT_FAILS(fd_engine_add_request(e, 3), FD_ERR_INVALID_STATE, "while a step is open");
  FD_ASSERT_FAILS(fd_engine_admit(e, 2), FD_ERR_INVALID_STATE, "while a step is open");
  FD_ASSERT_FAILS(fd_engine_finish(e, 1), FD_ERR_INVALID_STATE, "while a step is open");
  FD_ASSERT_FAILS(fd_engine_cancel(e, 1), FD_ERR_INVALID_STATE, "while a step is open");
  FD_ASSERT_FAILS(fd_engine_begin_step(e, &one, 1, &st), FD_ERR_INVALID_STATE,
                  "while a step is open");
  float buf[64] = {0};
  FD_ASSERT_FAILS(fd_engine_prefill_request_layers(e, 1, buf, buf), FD_ERR_INVALID_STATE,
                  "while a step is open");
  fd_tx stale = st.tx;
  stale.cache_version += 1;
  FD_ASSERT_FAILS(fd_engine_step_layer(e, stale, 0, buf, buf, buf, buf + 32, NULL),
                  FD_ERR_STALE_HANDLE, "is not the open step");
  FD_ASSERT_FAILS(fd_engine_commit_step(e, stale), FD_ERR_STALE_HANDLE, "is not the open step");
  FD_ASSERT_FAILS(fd_engine_abort_step(e, stale), FD_ERR_STALE_HANDLE, "is not the open step");
  FD_ASSERT_FAILS(fd_engine_commit_step(e, st.tx), FD_ERR_INVALID_STATE, "run 0 of 2 layers");
  const fd_engine_metrics still = es_metrics(e);
  assert_int_equal(still.open_step_transaction_count, 1);
  assert_int_equal(still.state_version, open_m.state_version);
  assert_int_equal(still.transaction_abort_count, 0);
  FD_ASSERT_OK(fd_engine_validate(e));
  FD_ASSERT_OK(fd_engine_abort_step(e, st.tx));
  assert_int_equal(es_metrics(e).transaction_abort_count, 1);
  assert_int_equal(es_seq_len(c, 1), 0);
  FD_ASSERT_OK(fd_engine_validate(e));
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

void test_failure_inside_step_aborts_token(void **) {
  fd_cache *c = es_cache(3, 1, 4, 2, 8);
  fd_engine *e = es_engine(c);
  uint64_t id = 1;
  FD_ASSERT_OK(fd_engine_add_request(e, id));
  FD_ASSERT_OK(fd_engine_admit(e, id));
  assert_int_equal(es_step(e, c, {1}, 1), FD_STEP_OPENED);
  assert_int_equal(es_step(e, c, {1}, 1), FD_STEP_OPENED);  // seq_len 2: next needs a block
  const fd_cache_metrics before = es_cache_metrics(c);
  float buf[16] = {0}, out[16];
  for (int kind = 0; kind < 3; ++kind) {
    fd_engine_step st;
    st.struct_size = sizeof st;
    FD_ASSERT_OK(fd_engine_begin_step(e, &id, 1, &st));
    assert_int_equal(st.needed_blocks, 1);
    FD_ASSERT_OK(fd_engine_step_layer(e, st.tx, 0, buf, buf, buf, out, NULL));
    if (kind == 0) {
      FD_ASSERT_FAILS(fd_engine_step_layer(e, st.tx, 2, buf, buf, buf, out, NULL),
                      FD_ERR_INVALID_ARGUMENT, "step requires layer 1, got layer 2");
    } else if (kind == 1) {
      FD_ASSERT_FAILS(fd_engine_step_layer(e, st.tx, 1, buf, NULL, buf, out, NULL),
                      FD_ERR_INVALID_ARGUMENT, "step aborted");
    } else {
      FD_ASSERT_FAILS(fd_engine_step_layer(e, st.tx, 1, buf, buf, buf, NULL, NULL),
                      FD_ERR_INVALID_ARGUMENT, "out_attention");
    }
    // The whole token is gone: no open step, seq_len and blocks as before.
    const fd_engine_metrics m = es_metrics(e);
    assert_int_equal(m.open_step_transaction_count, 0);
    assert_int_equal(m.transaction_abort_count, (uint64_t)kind + 1);
    assert_int_equal(es_seq_len(c, 1), 2);
    const fd_cache_metrics after = es_cache_metrics(c);
    assert_int_equal(after.free_blocks, before.free_blocks);
    assert_int_equal(after.open_transaction_count, 0);
    FD_ASSERT_FAILS(fd_engine_commit_step(e, st.tx), FD_ERR_INVALID_STATE, "no step is open");
    FD_ASSERT_OK(fd_engine_validate(e));
  }
  assert_int_equal(es_step(e, c, {1}, 1), FD_STEP_OPENED);
  assert_int_equal(es_seq_len(c, 1), 3);
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

void test_prefill_errors(void **) {
  fd_cache *c = es_cache(2, 1, 4, 2, 1);
  fd_engine *e = es_engine(c);
  float buf[16] = {0};
  FD_ASSERT_OK(fd_engine_add_request(e, 1));
  FD_ASSERT_FAILS(fd_engine_prefill_request_layers(e, 9, buf, buf), FD_ERR_NOT_FOUND,
                  "unknown request 9");
  FD_ASSERT_FAILS(fd_engine_prefill_request_layers(e, 1, buf, buf), FD_ERR_INVALID_STATE,
                  "request 1 is waiting");
  FD_ASSERT_OK(fd_engine_admit(e, 1));
  FD_ASSERT_FAILS(fd_engine_prefill_request_layers(e, 1, NULL, buf), FD_ERR_INVALID_ARGUMENT, "k");
  FD_ASSERT_OK(fd_engine_prefill_request_layers(e, 1, buf, buf));
  FD_ASSERT_OK(fd_engine_prefill_request_layers(e, 1, buf, buf));
  // The only block is full: the third token needs a block that is not free.
  const uint64_t version = es_version(c);
  FD_ASSERT_FAILS(fd_engine_prefill_request_layers(e, 1, buf, buf), FD_ERR_OUT_OF_BLOCKS, "");
  assert_int_equal(es_seq_len(c, 1), 2);
  assert_int_equal(es_metrics(e).prefill_token_count, 2);
  assert_int_equal(es_version(c), version);
  FD_ASSERT_OK(fd_engine_validate(e));
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

void test_destroy_aborts_open_step(void **) {
  fd_cache *c = es_cache(1, 1, 4, 2, 4);
  fd_engine *e = es_engine(c);
  uint64_t id = 1;
  FD_ASSERT_OK(fd_engine_add_request(e, id));
  FD_ASSERT_OK(fd_engine_admit(e, id));
  fd_engine_step st;
  st.struct_size = sizeof st;
  FD_ASSERT_OK(fd_engine_begin_step(e, &id, 1, &st));
  assert_int_equal(es_cache_metrics(c).open_transaction_count, 1);
  fd_engine_destroy(e);
  const fd_cache_metrics m = es_cache_metrics(c);
  assert_int_equal(m.open_transaction_count, 0);
  assert_int_equal(m.free_blocks, 4);
  FD_ASSERT_OK(fd_cache_validate(c));
  fd_cache_destroy(c);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_errors),
      cmocka_unit_test(test_lifecycle),
      cmocka_unit_test(test_step_matches_reference),
      cmocka_unit_test(test_backpressure),
      cmocka_unit_test(test_step_errors_change_nothing),
      cmocka_unit_test(test_failure_inside_step_aborts_token),
      cmocka_unit_test(test_prefill_errors),
      cmocka_unit_test(test_destroy_aborts_open_step),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
