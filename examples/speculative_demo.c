/* Bulk prompt writes and one speculative-decoding verify step with the
 * FlashDec engine, on the CPU backend.
 *
 *   speculative_demo [--draft N] [--seed S]
 *
 * 1. Four requests get prompts of 5 to 64 tokens, each written with one call
 *    (fd_engine_prefill_request_tokens: one cache transaction per prompt,
 *    not one per token).
 * 2. A verify step carries, for every request, its last accepted token plus
 *    N draft tokens (fd_engine_begin_step_multi): each layer appends all of
 *    them and returns causal attention for each (token j sees the context
 *    and drafts 0..j).
 * 3. A stand-in for the sampler accepts a prefix of each request's drafts,
 *    and fd_engine_commit_step_keep keeps exactly those tokens; the rest are
 *    dropped and their blocks go back to the cache.
 *
 * The attention of the verify step is checked against the dense reference
 * (fd_reference_attention) over the same, RoPE-rotated, keys and values, and
 * the program prints what each stage did. Exit status 0 on success. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashdec.h"

enum { LAYERS = 2, KV_HEADS = 2, Q_HEADS = 8, DIM = 64, BLOCK = 16, REQUESTS = 4 };

#define CHECK(call)                                                                             \
  do {                                                                                          \
    fd_status s_ = (call);                                                                      \
    if (s_ != FD_OK) {                                                                          \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, fd_status_string(s_), \
              fd_last_error_message());                                                         \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

static uint64_t rng_state = 1;

static float uniform(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng_state >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static float *random_floats(size_t n) {
  float *p = malloc(n * sizeof *p);
  if (p == NULL) exit(1);
  for (size_t i = 0; i < n; ++i) p[i] = uniform();
  return p;
}

static int32_t seq_len(const fd_cache *cache, uint64_t id) {
  int32_t len = 0;
  CHECK(fd_cache_export(cache, &id, 1, 0, NULL, &len));
  return len;
}

static fd_cache_metrics cache_metrics(const fd_cache *cache) {
  fd_cache_metrics m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  CHECK(fd_cache_metrics_get(cache, &m));
  return m;
}

int main(int argc, char **argv) {
  uint32_t draft = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--draft") == 0) draft = (uint32_t)strtoul(argv[i + 1], NULL, 10);
    if (strcmp(argv[i], "--seed") == 0) rng_state = strtoull(argv[i + 1], NULL, 10);
  }
  if (draft < 1 || draft > 15) {
    fprintf(stderr, "--draft must be 1..15\n");
    return 2;
  }

  fd_cache_config cc;
  fd_cache_config_init(&cc);
  cc.num_layers = LAYERS;
  cc.num_kv_heads = KV_HEADS;
  cc.head_dim = DIM;
  cc.block_size = BLOCK;
  cc.max_blocks = 64;
  cc.dtype = FD_DTYPE_F32;
  fd_cache *cache = NULL;
  CHECK(fd_cache_create(&cc, &cache));
  fd_engine_config ec;
  fd_engine_config_init(&ec);
  ec.num_q_heads = Q_HEADS;
  fd_engine *engine = NULL;
  CHECK(fd_engine_create(cache, &ec, &engine));

  /* 1. Prompts, one transaction each. */
  const uint64_t ids[REQUESTS] = {11, 12, 13, 14};
  const uint32_t prompt[REQUESTS] = {5, 23, 63, 40};
  const uint64_t commits_before = cache_metrics(cache).transaction_commit_count;
  for (int r = 0; r < REQUESTS; ++r) {
    CHECK(fd_engine_add_request(engine, ids[r]));
    CHECK(fd_engine_admit(engine, ids[r]));
    const size_t n = (size_t)LAYERS * prompt[r] * KV_HEADS * DIM;
    float *k = random_floats(n), *v = random_floats(n);
    CHECK(fd_engine_prefill_request_tokens(engine, ids[r], prompt[r], k, v));
    free(k);
    free(v);
  }
  printf("prefill: %u+%u+%u+%u prompt tokens in %llu cache transactions\n", prompt[0], prompt[1],
         prompt[2], prompt[3],
         (unsigned long long)(cache_metrics(cache).transaction_commit_count - commits_before));

  /* 2. The verify step: 1 + draft tokens per request. */
  uint32_t counts[REQUESTS];
  uint32_t tokens = 0;
  for (int r = 0; r < REQUESTS; ++r) tokens += counts[r] = 1 + draft;
  fd_engine_step step;
  memset(&step, 0, sizeof step);
  step.struct_size = sizeof step;
  CHECK(fd_engine_begin_step_multi(engine, ids, counts, REQUESTS, &step));
  if (step.outcome != FD_STEP_OPENED) {
    fprintf(stderr, "the cache is too small for the verify step\n");
    return 1;
  }
  const size_t q_elems = (size_t)tokens * Q_HEADS * DIM, kv_elems = (size_t)tokens * KV_HEADS * DIM;
  float *out = malloc(q_elems * sizeof *out), *q_last = NULL;
  if (out == NULL) return 1;
  for (uint32_t l = 0; l < LAYERS; ++l) {
    float *q = random_floats(q_elems), *k = random_floats(kv_elems), *v = random_floats(kv_elems);
    CHECK(fd_engine_step_layer(engine, step.tx, l, q, k, v, out, NULL));
    free(k);
    free(v);
    if (l + 1 < LAYERS) {
      free(q);
    } else {
      q_last = q;
    }
  }

  /* Check the last layer against the dense reference: RoPE-rotated queries
   * (the engine rotates them at each token's position) over K/V read back
   * from the cache, which now holds the step's tokens. */
  int32_t positions[REQUESTS * 16], lens[REQUESTS], indptr[REQUESTS + 1];
  indptr[0] = 0;
  int32_t longest = 0;
  for (int r = 0; r < REQUESTS; ++r) {
    lens[r] = (int32_t)(prompt[r] + counts[r]);
    indptr[r + 1] = indptr[r] + (int32_t)counts[r];
    for (uint32_t j = 0; j < counts[r]; ++j)
      positions[indptr[r] + (int32_t)j] = (int32_t)(prompt[r] + j);
    if (lens[r] > longest) longest = lens[r];
  }
  CHECK(fd_rope_apply(FD_DTYPE_F32, q_last, tokens, Q_HEADS, DIM, positions, DIM, 10000.f));
  /* The step's transaction is open: read the cache through its block tables. */
  float *k_dense = calloc((size_t)REQUESTS * KV_HEADS * longest * DIM, sizeof(float));
  float *v_dense = calloc((size_t)REQUESTS * KV_HEADS * longest * DIM, sizeof(float));
  float *ref = malloc(q_elems * sizeof *ref);
  if (k_dense == NULL || v_dense == NULL || ref == NULL) return 1;
  {
    fd_tx_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK(fd_tx_get_info(cache, step.tx, &info));
    int32_t *tables = malloc((size_t)REQUESTS * info.max_blocks_per_seq * sizeof *tables);
    void *kc = NULL, *vc = NULL;
    int64_t st[4];
    if (tables == NULL) return 1;
    CHECK(fd_tx_block_tables(cache, step.tx, info.max_blocks_per_seq, tables));
    CHECK(fd_cache_layer_storage(cache, LAYERS - 1, &kc, &vc, st));
    for (int r = 0; r < REQUESTS; ++r)
      for (int32_t h = 0; h < KV_HEADS; ++h)
        for (int32_t t = 0; t < lens[r]; ++t)
          for (int32_t d = 0; d < DIM; ++d) {
            const int64_t off = tables[(size_t)r * info.max_blocks_per_seq + t / BLOCK] * st[0] +
                                h * st[1] + (t % BLOCK) * st[2] + d * st[3];
            const size_t dense = (((size_t)r * KV_HEADS + h) * longest + t) * DIM + d;
            k_dense[dense] = ((const float *)kc)[off];
            v_dense[dense] = ((const float *)vc)[off];
          }
    free(tables);
  }
  fd_reference_params rp;
  fd_reference_params_init(&rp);
  rp.dtype = FD_DTYPE_F32;
  rp.batch = REQUESTS;
  rp.num_q_heads = Q_HEADS;
  rp.num_kv_heads = KV_HEADS;
  rp.head_dim = DIM;
  rp.max_seq_len = (uint32_t)longest;
  rp.q = q_last;
  rp.q_indptr = indptr;
  rp.k = k_dense;
  rp.v = v_dense;
  rp.seq_lens = lens;
  rp.out = ref;
  CHECK(fd_reference_attention(&rp));
  double worst = 0;
  for (size_t i = 0; i < q_elems; ++i) {
    const double e = fabs((double)out[i] - ref[i]);
    if (!(e <= worst)) worst = e;
  }
  printf("verify: %u tokens (1 + %u drafts per request), max |engine - reference| = %.2e\n", tokens,
         draft, worst);

  /* 3. Accept a prefix of the drafts (a sampler would compare the verify
   * logits with the drafts; here the count is drawn) and keep those. */
  uint32_t keep[REQUESTS];
  for (int r = 0; r < REQUESTS; ++r) {
    keep[r] = 1 + (uint32_t)((uniform() + 1.0f) * 0.5f * (float)(draft + 1)) % (draft + 1);
  }
  const uint64_t free_before = cache_metrics(cache).free_blocks;
  CHECK(fd_engine_commit_step_keep(engine, step.tx, keep, REQUESTS));
  for (int r = 0; r < REQUESTS; ++r) {
    printf("request %llu: prompt %u, verified %u, kept %u -> seq_len %d\n",
           (unsigned long long)ids[r], prompt[r], counts[r], keep[r], seq_len(cache, ids[r]));
    if (seq_len(cache, ids[r]) != (int32_t)(prompt[r] + keep[r])) return 1;
  }
  printf("blocks returned by the dropped drafts: %llu\n",
         (unsigned long long)(cache_metrics(cache).free_blocks - free_before));
  CHECK(fd_cache_validate(cache));

  free(q_last);
  free(out);
  free(ref);
  free(k_dense);
  free(v_dense);
  fd_engine_destroy(engine);
  fd_cache_destroy(cache);
  if (!(worst < 1e-4)) {
    fprintf(stderr, "verify attention differs from the reference by %.2e\n", worst);
    return 1;
  }
  return 0;
}
