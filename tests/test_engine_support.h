/* Helpers shared by the engine suites (C++ only). Include after cmocka.h and
 * fd_test.h. */
#ifndef FD_TEST_ENGINE_SUPPORT_H
#define FD_TEST_ENGINE_SUPPORT_H

#include <cstring>
#include <vector>

#include "flashdec.h"

static inline fd_cache *es_cache(uint32_t layers, uint32_t kv, uint32_t d, uint32_t bs,
                                 uint32_t max_blocks, uint32_t prefix_capacity = 0) {
  fd_cache_config cfg;
  fd_cache_config_init(&cfg);
  cfg.num_layers = layers;
  cfg.num_kv_heads = kv;
  cfg.head_dim = d;
  cfg.block_size = bs;
  cfg.max_blocks = max_blocks;
  cfg.prefix_cache_capacity_blocks = prefix_capacity;
  cfg.dtype = FD_DTYPE_F32;
  fd_cache *c = NULL;
  FD_ASSERT_OK(fd_cache_create(&cfg, &c));
  return c;
}

static inline fd_engine *es_engine(fd_cache *c, uint32_t q_heads = 0) {
  fd_engine_config ec;
  fd_engine_config_init(&ec);
  ec.num_q_heads = q_heads;
  ec.cpu_threads = 1;
  fd_engine *e = NULL;
  FD_ASSERT_OK(fd_engine_create(c, &ec, &e));
  return e;
}

static inline fd_engine_metrics es_metrics(const fd_engine *e) {
  fd_engine_metrics m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  FD_ASSERT_OK(fd_engine_metrics_get(e, &m));
  return m;
}

static inline fd_cache_metrics es_cache_metrics(const fd_cache *c) {
  fd_cache_metrics m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  FD_ASSERT_OK(fd_cache_metrics_get(c, &m));
  return m;
}

static inline int32_t es_state(const fd_engine *e, uint64_t id) {
  int32_t s = -1;
  FD_ASSERT_OK(fd_engine_get_request_state(e, id, &s));
  return s;
}

static inline int32_t es_seq_len(const fd_cache *c, uint64_t id) {
  int32_t len = -1;
  FD_ASSERT_OK(fd_cache_export(c, &id, 1, 0, NULL, &len));
  return len;
}

/* The ids of one list of a decision (FD_DECISION_ADMIT, _REJECTED, ...). */
static inline std::vector<uint64_t> es_decision_ids(const fd_decision *d, int32_t which) {
  uint32_t n = 0;
  FD_ASSERT_OK(fd_decision_ids(d, which, NULL, 0, &n));
  std::vector<uint64_t> v(n);
  if (n) FD_ASSERT_OK(fd_decision_ids(d, which, v.data(), n, &n));
  return v;
}

static inline uint64_t es_version(const fd_cache *c) {
  uint64_t v = 0;
  FD_ASSERT_OK(fd_cache_state_version(c, &v));
  return v;
}

/* Runs one full step with zero-free random-ish data; returns the outcome. */
static inline int32_t es_step(fd_engine *e, const fd_cache *c, const std::vector<uint64_t> &ids,
                              uint32_t q_heads) {
  fd_cache_config cfg;
  cfg.struct_size = sizeof cfg;
  FD_ASSERT_OK(fd_cache_get_config(c, &cfg));
  fd_engine_step st;
  st.struct_size = sizeof st;
  FD_ASSERT_OK(fd_engine_begin_step(e, ids.data(), (uint32_t)ids.size(), &st));
  if (st.outcome != FD_STEP_OPENED) return st.outcome;
  const size_t n = ids.size();
  std::vector<float> q(n * q_heads * cfg.head_dim, 0.5f),
      k(n * cfg.num_kv_heads * cfg.head_dim, 0.25f), v(n * cfg.num_kv_heads * cfg.head_dim, 1.0f),
      out(n * q_heads * cfg.head_dim);
  for (uint32_t l = 0; l < cfg.num_layers; ++l) {
    FD_ASSERT_OK(fd_engine_step_layer(e, st.tx, l, q.data(), k.data(), v.data(), out.data(), NULL));
  }
  FD_ASSERT_OK(fd_engine_commit_step(e, st.tx));
  return st.outcome;
}

/* Prefills one token of zeros on every layer. */
static inline void es_prefill(fd_engine *e, const fd_cache *c, uint64_t id) {
  fd_cache_config cfg;
  cfg.struct_size = sizeof cfg;
  FD_ASSERT_OK(fd_cache_get_config(c, &cfg));
  std::vector<float> kv((size_t)cfg.num_layers * cfg.num_kv_heads * cfg.head_dim, 0.1f);
  FD_ASSERT_OK(fd_engine_prefill_request_layers(e, id, kv.data(), kv.data()));
}

static inline fd_request_spec es_spec(uint64_t id, uint32_t context, uint32_t new_tokens,
                                      const char *prefix = NULL) {
  fd_request_spec s;
  fd_request_spec_init(&s);
  s.id = id;
  s.submission_order = id;
  s.initial_context_tokens = context;
  s.max_new_tokens = new_tokens;
  s.prefix_id = prefix;
  return s;
}

#endif
