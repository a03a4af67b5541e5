/* A minimal downstream program built against an installed FlashDec, through
 * either the CMake package (flashdec::flashdec) or pkg-config. It checks the
 * header/runtime version rule, one failure path and one real decode:
 * three tokens whose V rows are all equal must attend to exactly that row;
 * the same decode through a plan gives the same bits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flashdec.h>

#define CHECK(expr)                                                                  \
  do {                                                                               \
    fd_status s_ = (expr);                                                           \
    if (s_ != FD_OK) {                                                               \
      fprintf(stderr, "consumer: %s failed: %s (%s)\n", #expr, fd_status_string(s_), \
              fd_last_error_message());                                              \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

enum { HEADS = 2, DIM = 8, TOKENS = 3 };

int main(void) {
  /* The compatibility rule documented in flashdec.h: before 1.0 the minor
   * version must match too. */
  uint32_t rt = fd_version_number();
  int same = FD_VERSION_MAJOR == 0 ? rt / 100u == FD_VERSION_NUMBER / 100u
                                   : rt / 10000u == FD_VERSION_MAJOR;
  if (!same || rt < FD_VERSION_NUMBER) {
    fprintf(stderr, "consumer: runtime %s is not compatible with header %d.%d.%d\n",
            fd_version_string(), FD_VERSION_MAJOR, FD_VERSION_MINOR, FD_VERSION_PATCH);
    return 1;
  }

  fd_cache *cache = NULL;
  if (fd_cache_create(NULL, &cache) != FD_ERR_INVALID_ARGUMENT || cache != NULL ||
      fd_last_error_message()[0] == '\0') {
    fprintf(stderr, "consumer: fd_cache_create(NULL) did not fail cleanly\n");
    return 1;
  }

  fd_cache_config config;
  fd_cache_config_init(&config);
  config.num_kv_heads = HEADS;
  config.head_dim = DIM;
  config.block_size = 2;
  config.max_blocks = 4;
  config.dtype = FD_DTYPE_F32;
  CHECK(fd_cache_create(&config, &cache));

  const uint64_t id = 7;
  float k[HEADS * DIM], v[HEADS * DIM];
  int status = 0;
  if (fd_cache_add_request(cache, id) != FD_OK) status = 1;
  for (int t = 0; t < TOKENS && status == 0; ++t) {
    for (int i = 0; i < HEADS * DIM; ++i) {
      k[i] = (float)((i * 7 + t * 3) % 5) - 2.0f;
      v[i] = (float)i; /* the same V for every token */
    }
    if (fd_cache_append(cache, &id, 1, k, v, NULL) != FD_OK) status = 1;
  }
  int32_t table[4], seq_len = 0;
  void *kc = NULL, *vc = NULL;
  int64_t strides[4];
  if (status == 0 && (fd_cache_export(cache, &id, 1, 4, table, &seq_len) != FD_OK ||
                      fd_cache_layer_storage(cache, 0, &kc, &vc, strides) != FD_OK))
    status = 1;

  float q[HEADS * DIM], out[HEADS * DIM];
  for (int i = 0; i < HEADS * DIM; ++i) q[i] = (float)(i % 3) - 1.0f;
  fd_decode_params p;
  fd_decode_params_init(&p);
  p.q_dtype = FD_DTYPE_F32;
  p.kv_dtype = FD_DTYPE_F32;
  p.out_dtype = FD_DTYPE_F32;
  p.batch = 1;
  p.num_q_heads = HEADS;
  p.num_kv_heads = HEADS;
  p.head_dim = DIM;
  p.block_size = config.block_size;
  p.num_blocks = config.max_blocks;
  p.max_blocks_per_seq = 4;
  p.q = q;
  p.k_cache = kc;
  p.v_cache = vc;
  p.stride_block = strides[0];
  p.stride_head = strides[1];
  p.stride_token = strides[2];
  p.stride_dim = strides[3];
  p.block_tables = table;
  p.seq_lens = &seq_len;
  p.out = out;
  if (status == 0 && fd_decode(&p) != FD_OK) status = 1;
  /* The same call through a plan (0.2): made once from the host lengths,
   * run as every layer would; its output bits equal fd_decode's. */
  float planned[HEADS * DIM];
  fd_decode_plan *plan = NULL;
  size_t workspace = 0;
  if (status == 0 && (fd_decode_plan_create(&p, &seq_len, &plan) != FD_OK ||
                      fd_decode_plan_workspace_size(plan, &workspace) != FD_OK))
    status = 1;
  p.out = planned;
  p.workspace = workspace > 0 ? malloc(workspace) : NULL;
  p.workspace_size = p.workspace != NULL ? workspace : 0;
  if (status == 0 && fd_decode_run(plan, &p) != FD_OK) status = 1;
  free(p.workspace);
  fd_decode_plan_destroy(plan);
  if (status == 0 && memcmp(planned, out, sizeof out) != 0) {
    fprintf(stderr, "consumer: fd_decode_run differs from fd_decode\n");
    status = 1;
  }
  if (status != 0) {
    fprintf(stderr, "consumer: cache/decode call failed: %s\n", fd_last_error_message());
    fd_cache_destroy(cache);
    return 1;
  }
  fd_cache_destroy(cache);

  if (seq_len != TOKENS) {
    fprintf(stderr, "consumer: seq_len %d, expected %d\n", (int)seq_len, TOKENS);
    return 1;
  }
  for (int i = 0; i < HEADS * DIM; ++i) {
    float diff = out[i] - (float)i;
    if (diff > 1e-4f || diff < -1e-4f) {
      fprintf(stderr, "consumer: out[%d] = %g, expected %d\n", i, (double)out[i], i);
      return 1;
    }
  }
  printf("consumer: OK with libflashdec %s\n", fd_version_string());
  return 0;
}
