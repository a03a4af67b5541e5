/* Parity scenario, C reference: the steps are those of main() below; the
 * Python, Rust and Go bindings run the same steps and
 * bindings/run-tests.sh diffs the four outputs byte for byte.
 *
 * Floats are printed as the hex bits of binary32 (exact in every language);
 * doubles of the metrics with "%.6f". Data comes from splitmix64 mapped to
 * (m - 2^23) / 2^23 with m the top 24 bits: exactly representable, so every
 * language produces identical inputs. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashdec.h"

enum { LAYERS = 2, KV_HEADS = 2, Q_HEADS = 4, HEAD_DIM = 8, BLOCK = 4, MAX_BLOCKS = 16 };
#define SEED 20240601u
#define MAX_ROWS 3

static uint64_t rng_state = SEED;

static uint64_t splitmix64(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void fill(float *x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = (float)((int32_t)(splitmix64() >> 40) - 8388608) / 8388608.0f;
}

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* FNV-1a 64 over the little-endian bytes of the binary32 bits. */
static uint64_t hash_floats(const float *x, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u = bits(x[i]);
    for (int b = 0; b < 4; ++b) {
      h ^= (u >> (8 * b)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

static void die(const char *what, fd_status s) {
  printf("FATAL %s: %s: %s\n", what, fd_status_string(s), fd_last_error_message());
  exit(1);
}
#define OK(expr)                      \
  do {                                \
    fd_status s_ = (expr);            \
    if (s_ != FD_OK) die(#expr, s_);  \
  } while (0)

static void print_i32s(const char *label, const int32_t *x, uint32_t n) {
  printf(" %s", label);
  for (uint32_t i = 0; i < n; ++i) printf("%s%" PRId32, i ? "," : "=", x[i]);
}

static void print_error(const char *what, fd_status s) {
  printf("error %s status=%d %s | %s\n", what, (int)s, fd_status_string(s), fd_last_error_message());
}

int main(void) {
  printf("version %s %" PRIu32 "\n", fd_version_string(), fd_version_number());
  fd_cache_config cfg;
  fd_cache_config_init(&cfg);
  cfg.num_layers = LAYERS;
  cfg.num_kv_heads = KV_HEADS;
  cfg.head_dim = HEAD_DIM;
  cfg.block_size = BLOCK;
  cfg.max_blocks = MAX_BLOCKS;
  cfg.dtype = FD_DTYPE_F32;
  fd_cache *cache = NULL;
  OK(fd_cache_create(&cfg, &cache));
  const uint64_t all[MAX_ROWS] = {11, 22, 33};
  for (int i = 0; i < MAX_ROWS; ++i) OK(fd_cache_add_request(cache, all[i]));

  float k[MAX_ROWS * KV_HEADS * HEAD_DIM], v[MAX_ROWS * KV_HEADS * HEAD_DIM];
  float q[MAX_ROWS * Q_HEADS * HEAD_DIM], out[MAX_ROWS * Q_HEADS * HEAD_DIM];
  for (int step = 0; step < 6; ++step) {
    const uint64_t two[2] = {11, 33};
    const uint64_t *ids = step % 3 == 2 ? two : all;
    const uint32_t n = step % 3 == 2 ? 2 : 3;
    fd_tx tx;
    OK(fd_tx_begin(cache, ids, n, &tx));
    uint64_t rid[MAX_ROWS];
    int32_t pos[MAX_ROWS], blk[MAX_ROWS], off[MAX_ROWS], eff[MAX_ROWS];
    OK(fd_tx_get_rows(cache, tx, n, rid, pos, blk, off, eff));
    printf("step %d tx=%" PRIu64 " rows=%u", step, tx.id, n);
    print_i32s("positions", pos, n);
    print_i32s("blocks", blk, n);
    print_i32s("offsets", off, n);
    print_i32s("effective", eff, n);
    printf("\n");
    for (uint32_t layer = 0; layer < LAYERS; ++layer) {
      fill(k, (size_t)n * KV_HEADS * HEAD_DIM);
      fill(v, (size_t)n * KV_HEADS * HEAD_DIM);
      OK(fd_tx_write_layer(cache, tx, layer, k, v, NULL));
    }
    OK(fd_tx_commit(cache, tx));

    uint32_t stride = 0;
    OK(fd_cache_max_blocks_per_seq(cache, ids, n, &stride));
    int32_t tables[MAX_ROWS * MAX_BLOCKS], lens[MAX_ROWS];
    OK(fd_cache_export(cache, ids, n, stride, tables, lens));
    printf("export stride=%u", stride);
    print_i32s("lens", lens, n);
    print_i32s("tables", tables, n * stride);
    printf("\n");
    /* One plan per step from the exported host lengths, run for every layer
     * (the bindings call their decode; the bits are the same). */
    fd_decode_params p;
    fd_decode_params_init(&p);
    p.q_dtype = FD_DTYPE_F32;
    p.kv_dtype = FD_DTYPE_F32;
    p.out_dtype = FD_DTYPE_F32;
    p.layout = FD_LAYOUT_TOKEN_MAJOR;
    p.batch = n;
    p.num_q_heads = Q_HEADS;
    p.num_kv_heads = KV_HEADS;
    p.head_dim = HEAD_DIM;
    p.block_size = BLOCK;
    p.num_blocks = MAX_BLOCKS;
    p.max_blocks_per_seq = stride;
    p.cpu_threads = 1;
    void *kc = NULL, *vc = NULL;
    int64_t strides[4];
    OK(fd_cache_layer_storage(cache, 0, &kc, &vc, strides));
    p.stride_block = strides[0];
    p.stride_head = strides[1];
    p.stride_token = strides[2];
    p.stride_dim = strides[3];
    fd_decode_plan *plan = NULL;
    OK(fd_decode_plan_create(&p, lens, &plan));
    size_t workspace = 0;
    OK(fd_decode_plan_workspace_size(plan, &workspace));
    void *scratch = workspace > 0 ? malloc(workspace) : NULL;
    if (workspace > 0 && scratch == NULL) {
      fprintf(stderr, "out of memory\n");
      return 1;
    }
    p.workspace = scratch;
    p.workspace_size = workspace;
    for (uint32_t layer = 0; layer < LAYERS; ++layer) {
      OK(fd_cache_layer_storage(cache, layer, &kc, &vc, strides));
      fill(q, (size_t)n * Q_HEADS * HEAD_DIM);
      p.q = q;
      p.k_cache = kc;
      p.v_cache = vc;
      p.block_tables = tables;
      p.seq_lens = lens;
      p.out = out;
      OK(fd_decode_run(plan, &p));
      const size_t count = (size_t)n * Q_HEADS * HEAD_DIM;
      printf("decode step=%d layer=%u hash=%016" PRIx64 " first=%08" PRIx32 " last=%08" PRIx32 "\n",
             step, layer, hash_floats(out, count), bits(out[0]), bits(out[count - 1]));
    }
    free(scratch);
    fd_decode_plan_destroy(plan);
  }

  /* Forced errors: a layer written out of order, a second abort, and adding a
   * finished request again. */
  fd_tx tx;
  const uint64_t one[1] = {11};
  OK(fd_tx_begin(cache, one, 1, &tx));
  fill(k, KV_HEADS * HEAD_DIM);
  fill(v, KV_HEADS * HEAD_DIM);
  print_error("write_layer", fd_tx_write_layer(cache, tx, 1, k, v, NULL));
  OK(fd_tx_abort(cache, tx));
  print_error("abort", fd_tx_abort(cache, tx));
  OK(fd_cache_add_request(cache, 99));
  OK(fd_cache_finish_request(cache, 99));
  print_error("add_request", fd_cache_add_request(cache, 99));

  OK(fd_cache_finish_request(cache, 22));
  OK(fd_cache_cancel_request(cache, 33));
  const uint64_t probe[5] = {11, 22, 33, 99, 44};
  printf("states");
  for (int i = 0; i < 5; ++i) {
    int32_t st = -1;
    OK(fd_cache_request_state(cache, probe[i], &st));
    printf(" %" PRIu64 "=%d", probe[i], (int)st);
  }
  printf("\n");

  fd_cache_metrics m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  OK(fd_cache_metrics_get(cache, &m));
#define U(f) printf("metric %s %" PRIu64 "\n", #f, m.f)
#define D(f) printf("metric %s %.6f\n", #f, m.f)
#include "parity_metrics.inc"
#undef U
#undef D
  fd_status vs = fd_cache_validate(cache);
  printf("validate %s\n", vs == FD_OK ? "ok" : fd_last_error_message());
  fd_cache_destroy(cache);
  printf("done\n");
  return 0;
}
