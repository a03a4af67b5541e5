/* decode_demo: a decode workload end to end through the public C API.
 *
 * A paged KV cache (4 layers, 8 KV heads, head_dim 128, blocks of 16 tokens,
 * bf16) serves a batch of requests. Every step generates one token for every
 * active request:
 *
 *   fd_tx_begin                       one transaction for the whole batch
 *   fd_decode_plan_create             plan the step's attention once, from the
 *                                     exact effective seq_lens (new token included)
 *   for each layer:
 *     fd_tx_write_layer_rope          rotate q and k, append k and v
 *     fd_decode_run                   paged attention over the block tables
 *   fd_decode_plan_destroy
 *   fd_tx_commit                      publish the token
 *
 * Requests that reached their length are finished and new ones take their
 * place, each with a short prompt written through the same transactions
 * (fd_tx_write_layer, no decode). Random numbers stand in for the model: the
 * demo shows the data flow, not a language model.
 *
 * Checks (any failure exits non-zero): every call's status, the cache's
 * invariants (fd_cache_validate) each step, the CPU attention against the
 * dense reference on sampled steps, and, when a CUDA device is present and the
 * library has the CUDA backend, fd_decode (plan and run in one call) on the
 * GPU against the CPU output.
 *
 * usage: decode_demo [--steps N] [--batch B] [--seed S]
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <flashdec.h>

#if FLASHDEC_EXAMPLE_CUDA
#include <cuda_runtime_api.h>
#endif

/* ------------------------------------------------------------------------ */
/* Model shape */

enum {
  NUM_LAYERS = 4,
  NUM_KV_HEADS = 8,
  NUM_Q_HEADS = 32, /* grouped-query attention: 4 query heads per KV head */
  HEAD_DIM = 128,
  BLOCK_SIZE = 16,
  MAX_PROMPT = 24,    /* prompt tokens of a new request: 1..MAX_PROMPT */
  MAX_GENERATED = 48, /* tokens a request generates: 4..MAX_GENERATED */
  REFERENCE_EVERY = 8 /* check against the dense reference every N steps */
};
static const float kRopeBase = 10000.0f;

/* ------------------------------------------------------------------------ */
/* Helpers */

#define FAIL(...)                 \
  do {                            \
    fprintf(stderr, "FAILED: ");  \
    fprintf(stderr, __VA_ARGS__); \
    fprintf(stderr, "\n");        \
    exit(1);                      \
  } while (0)

/* Every API call goes through CHECK: a failure prints the status and the
 * thread's last error message, then exits. */
#define CHECK(expr)                                                                           \
  do {                                                                                        \
    fd_status check_status_ = (expr);                                                         \
    if (check_status_ != FD_OK)                                                               \
      FAIL("%s:%d: %s -> %s: %s", __FILE__, __LINE__, #expr, fd_status_string(check_status_), \
           fd_last_error_message());                                                          \
  } while (0)

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (p == NULL) FAIL("out of memory (%zu bytes)", bytes);
  return p;
}

/* splitmix64: deterministic from --seed. */
static uint64_t g_rng;
static uint64_t rng_next(void) {
  uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static int rng_range(int lo, int hi) {
  return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1));
}
static float rng_normal(void) {
  float u1 = (float)(rng_next() >> 40) * (1.0f / 16777216.0f);
  float u2 = (float)(rng_next() >> 40) * (1.0f / 16777216.0f);
  if (u1 < 1e-7f) u1 = 1e-7f;
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

/* bfloat16: the upper half of a binary32, rounded to nearest even. */
static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static void fill_normal(uint16_t *x, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) x[i] = f32_to_bf16(scale * rng_normal());
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
/* Nearest-rank percentile of a sorted list. */
static double percentile(const double *sorted, int n, double p) {
  int rank = (int)ceil(p / 100.0 * n);
  if (rank < 1) rank = 1;
  return sorted[rank - 1];
}

/* Largest per-(row, head) relative L2 error of `got` against `want`, both
 * bf16 [rows, NUM_Q_HEADS, HEAD_DIM]. */
static double max_relative_error(const uint16_t *got, const uint16_t *want, uint32_t rows) {
  double worst = 0.0;
  for (uint32_t rh = 0; rh < rows * NUM_Q_HEADS; ++rh) {
    double diff = 0.0, norm = 0.0;
    for (int d = 0; d < HEAD_DIM; ++d) {
      double g = bf16_to_f32(got[rh * HEAD_DIM + d]), w = bf16_to_f32(want[rh * HEAD_DIM + d]);
      diff += (g - w) * (g - w);
      norm += w * w;
    }
    double rel = sqrt(diff) / (sqrt(norm) + 1e-6);
    if (rel > worst) worst = rel;
  }
  return worst;
}

/* ------------------------------------------------------------------------ */
/* Options */

typedef struct options {
  int steps, batch;
  uint64_t seed;
} options;

static void usage(const char *argv0) {
  fprintf(stderr, "usage: %s [--steps N] [--batch B] [--seed S]\n", argv0);
  exit(2);
}

static options parse_options(int argc, char **argv) {
  options o = {64, 8, 1};
  for (int i = 1; i < argc; ++i) {
    if (i + 1 >= argc) usage(argv[0]);
    char *end = NULL;
    long long value = strtoll(argv[i + 1], &end, 10);
    if (end == argv[i + 1] || *end != '\0') usage(argv[0]);
    if (strcmp(argv[i], "--steps") == 0 && value >= 1 && value <= 1000000)
      o.steps = (int)value;
    else if (strcmp(argv[i], "--batch") == 0 && value >= 1 && value <= 256)
      o.batch = (int)value;
    else if (strcmp(argv[i], "--seed") == 0 && value >= 0)
      o.seed = (uint64_t)value;
    else
      usage(argv[0]);
    ++i;
  }
  return o;
}

/* ------------------------------------------------------------------------ */
/* Requests */

typedef struct slot {
  uint64_t id;
  int generated, target;
} slot;

/* Adds a request and writes its prompt, one transaction per prompt token
 * (K/V of every layer, no attention: a prefill stand-in). */
static void start_request(fd_cache *cache, slot *s, uint64_t id, uint16_t *k, uint16_t *v) {
  s->id = id;
  s->generated = 0;
  s->target = rng_range(4, MAX_GENERATED);
  CHECK(fd_cache_add_request(cache, id));
  int prompt = rng_range(1, MAX_PROMPT);
  for (int t = 0; t < prompt; ++t) {
    fd_tx tx;
    CHECK(fd_tx_begin(cache, &id, 1, &tx));
    for (uint32_t layer = 0; layer < NUM_LAYERS; ++layer) {
      fill_normal(k, NUM_KV_HEADS * HEAD_DIM, 1.0f);
      fill_normal(v, NUM_KV_HEADS * HEAD_DIM, 1.0f);
      CHECK(fd_tx_write_layer(cache, tx, layer, k, v, NULL));
    }
    CHECK(fd_tx_commit(cache, tx));
  }
}

/* ------------------------------------------------------------------------ */
/* Dense reference: gathers each row's K/V from the paged layer storage and
 * runs fd_reference_attention_dense. */

static void reference_decode(const fd_decode_params *p, uint16_t *out) {
  int32_t max_len = 0;
  for (uint32_t r = 0; r < p->batch; ++r)
    if (p->seq_lens[r] > max_len) max_len = p->seq_lens[r];
  size_t row_elems = (size_t)NUM_KV_HEADS * (size_t)max_len * HEAD_DIM;
  uint16_t *k = xmalloc(p->batch * row_elems * sizeof *k);
  uint16_t *v = xmalloc(p->batch * row_elems * sizeof *v);
  memset(k, 0, p->batch * row_elems * sizeof *k);
  memset(v, 0, p->batch * row_elems * sizeof *v);
  const uint16_t *kc = p->k_cache, *vc = p->v_cache;
  for (uint32_t r = 0; r < p->batch; ++r)
    for (int32_t t = 0; t < p->seq_lens[r]; ++t) {
      int32_t block = p->block_tables[r * p->max_blocks_per_seq + (uint32_t)t / BLOCK_SIZE];
      int32_t offset = t % BLOCK_SIZE;
      for (int h = 0; h < NUM_KV_HEADS; ++h)
        for (int d = 0; d < HEAD_DIM; ++d) {
          int64_t src = block * p->stride_block + h * p->stride_head + offset * p->stride_token +
                        d * p->stride_dim;
          size_t dst = r * row_elems + ((size_t)h * (size_t)max_len + (size_t)t) * HEAD_DIM + d;
          k[dst] = kc[src];
          v[dst] = vc[src];
        }
    }
  CHECK(fd_reference_attention_dense(FD_DTYPE_BF16, p->batch, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM,
                                     (uint32_t)max_len, p->q, k, v, p->seq_lens, 0.0f, out));
  free(k);
  free(v);
}

/* ------------------------------------------------------------------------ */
/* GPU comparison: the cache lives in host memory, so the layer's K/V, the
 * tables, seq_lens and q are copied to the device, decoded there and the
 * result compared with the CPU output. (A GPU deployment would create the
 * cache with device = CUDA and decode in place.) */

#if FLASHDEC_EXAMPLE_CUDA
#define CUDA_CHECK(expr)                                                                    \
  do {                                                                                      \
    cudaError_t cuda_status_ = (expr);                                                      \
    if (cuda_status_ != cudaSuccess)                                                        \
      FAIL("%s:%d: %s -> %s", __FILE__, __LINE__, #expr, cudaGetErrorString(cuda_status_)); \
  } while (0)

typedef struct gpu_state {
  cudaStream_t stream;
  void *k, *v, *q, *out, *workspace;
  int32_t *tables, *seq_lens;
  size_t layer_bytes, workspace_bytes;
  double worst_error;
  long decodes;
} gpu_state;

static void gpu_init(gpu_state *g, size_t layer_bytes, uint32_t batch, uint32_t table_capacity) {
  memset(g, 0, sizeof *g);
  g->layer_bytes = layer_bytes;
  size_t act = (size_t)batch * NUM_Q_HEADS * HEAD_DIM * sizeof(uint16_t);
  CUDA_CHECK(cudaStreamCreate(&g->stream));
  CUDA_CHECK(cudaMalloc(&g->k, layer_bytes));
  CUDA_CHECK(cudaMalloc(&g->v, layer_bytes));
  CUDA_CHECK(cudaMalloc(&g->q, act));
  CUDA_CHECK(cudaMalloc(&g->out, act));
  CUDA_CHECK(cudaMalloc((void **)&g->tables, (size_t)batch * table_capacity * sizeof(int32_t)));
  CUDA_CHECK(cudaMalloc((void **)&g->seq_lens, batch * sizeof(int32_t)));
}

static void gpu_decode_and_compare(gpu_state *g, const fd_decode_params *cpu,
                                   const uint16_t *cpu_out, uint16_t *gpu_out) {
  size_t act = (size_t)cpu->batch * NUM_Q_HEADS * HEAD_DIM * sizeof(uint16_t);
  size_t table_bytes = (size_t)cpu->batch * cpu->max_blocks_per_seq * sizeof(int32_t);
  CUDA_CHECK(
      cudaMemcpyAsync(g->k, cpu->k_cache, g->layer_bytes, cudaMemcpyHostToDevice, g->stream));
  CUDA_CHECK(
      cudaMemcpyAsync(g->v, cpu->v_cache, g->layer_bytes, cudaMemcpyHostToDevice, g->stream));
  CUDA_CHECK(cudaMemcpyAsync(g->q, cpu->q, act, cudaMemcpyHostToDevice, g->stream));
  CUDA_CHECK(cudaMemcpyAsync(g->tables, cpu->block_tables, table_bytes, cudaMemcpyHostToDevice,
                             g->stream));
  CUDA_CHECK(cudaMemcpyAsync(g->seq_lens, cpu->seq_lens, cpu->batch * sizeof(int32_t),
                             cudaMemcpyHostToDevice, g->stream));
  fd_decode_params p = *cpu;
  p.q = g->q;
  p.k_cache = g->k;
  p.v_cache = g->v;
  p.block_tables = g->tables;
  p.seq_lens = g->seq_lens;
  p.out = g->out;
  p.device.type = FD_DEVICE_CUDA;
  p.device.ordinal = 0;
  p.stream = (fd_stream)g->stream;
  p.cpu_threads = 0;
  /* Split-KV needs scratch; size it for the longest sequence seen so far. */
  size_t need = 0;
  CHECK(fd_decode_workspace_size(&p, &need));
  if (need > g->workspace_bytes) {
    if (g->workspace != NULL) CUDA_CHECK(cudaFree(g->workspace));
    CUDA_CHECK(cudaMalloc(&g->workspace, need));
    g->workspace_bytes = need;
  }
  p.workspace = g->workspace;
  p.workspace_size = g->workspace_bytes;
  CHECK(fd_decode(&p));
  CUDA_CHECK(cudaMemcpyAsync(gpu_out, g->out, act, cudaMemcpyDeviceToHost, g->stream));
  CUDA_CHECK(cudaStreamSynchronize(g->stream));
  double err = max_relative_error(gpu_out, cpu_out, cpu->batch);
  if (err > g->worst_error) g->worst_error = err;
  if (err > 1e-2) FAIL("GPU and CPU decode differ: relative L2 error %.3g > 1e-2", err);
  ++g->decodes;
}

static void gpu_free(gpu_state *g) {
  cudaFree(g->k);
  cudaFree(g->v);
  cudaFree(g->q);
  cudaFree(g->out);
  cudaFree(g->tables);
  cudaFree(g->seq_lens);
  cudaFree(g->workspace);
  cudaStreamDestroy(g->stream);
}
#endif

/* ------------------------------------------------------------------------ */

int main(int argc, char **argv) {
  const options opt = parse_options(argc, argv);
  g_rng = opt.seed;
  const uint32_t batch = (uint32_t)opt.batch;

  int32_t devices = 0;
  CHECK(fd_cuda_device_count(&devices));
#if FLASHDEC_EXAMPLE_CUDA
  const int use_gpu = devices > 0;
#else
  const int use_gpu = 0;
#endif
  printf("FlashDec %s decode demo: %d steps, batch %u, seed %llu\n", fd_version_string(), opt.steps,
         batch, (unsigned long long)opt.seed);
  if (use_gpu)
    printf(
        "CUDA devices: %d; attention runs on the CPU and on GPU 0 and the outputs are compared\n",
        (int)devices);
  else
    printf("CUDA devices: %d; running on the CPU%s\n", (int)devices,
#if FLASHDEC_EXAMPLE_CUDA
           ""
#else
           " (this build has no CUDA support in the demo)"
#endif
    );

  /* Enough blocks for a full batch of the longest requests, plus slack. */
  const uint32_t blocks_per_request = (MAX_PROMPT + MAX_GENERATED + BLOCK_SIZE - 1) / BLOCK_SIZE;
  fd_cache_config config;
  fd_cache_config_init(&config);
  config.num_layers = NUM_LAYERS;
  config.num_kv_heads = NUM_KV_HEADS;
  config.head_dim = HEAD_DIM;
  config.block_size = BLOCK_SIZE;
  config.max_blocks = batch * blocks_per_request + batch;
  config.dtype = FD_DTYPE_BF16;
  fd_cache *cache = NULL;
  CHECK(fd_cache_create(&config, &cache));
  printf("cache: %u layers, %u KV heads, head_dim %u, block %u tokens, %u blocks, bf16\n",
         config.num_layers, config.num_kv_heads, config.head_dim, config.block_size,
         config.max_blocks);

  /* Per-step buffers. */
  const size_t q_elems = (size_t)batch * NUM_Q_HEADS * HEAD_DIM;
  const size_t kv_elems = (size_t)batch * NUM_KV_HEADS * HEAD_DIM;
  /* The step's inputs for every layer are drawn before the step's clock starts:
   * the timings cover FlashDec's work, not the random number generator. */
  uint16_t *q = xmalloc(NUM_LAYERS * q_elems * sizeof *q);
  uint16_t *q_rot = xmalloc(q_elems * sizeof *q_rot);
  uint16_t *out = xmalloc(q_elems * sizeof *out), *ref = xmalloc(q_elems * sizeof *ref);
  uint16_t *k = xmalloc(NUM_LAYERS * kv_elems * sizeof *k);
  uint16_t *v = xmalloc(NUM_LAYERS * kv_elems * sizeof *v);
  uint64_t *ids = xmalloc(batch * sizeof *ids);
  int32_t *seq_lens = xmalloc(batch * sizeof *seq_lens);
  const uint32_t table_capacity = blocks_per_request + 1;
  int32_t *tables = xmalloc((size_t)batch * table_capacity * sizeof *tables);
  double *step_seconds = xmalloc((size_t)opt.steps * sizeof *step_seconds);
  slot *slots = xmalloc(batch * sizeof *slots);

#if FLASHDEC_EXAMPLE_CUDA
  gpu_state gpu;
  uint16_t *gpu_out = xmalloc(q_elems * sizeof *gpu_out);
  const size_t layer_bytes =
      (size_t)config.max_blocks * NUM_KV_HEADS * BLOCK_SIZE * HEAD_DIM * sizeof(uint16_t);
  if (use_gpu) gpu_init(&gpu, layer_bytes, batch, table_capacity);
#endif

  uint64_t next_id = 1;
  for (uint32_t r = 0; r < batch; ++r) start_request(cache, &slots[r], next_id++, k, v);

  long tokens = 0, finished = 0, reference_checks = 0;
  double worst_reference_error = 0.0, decode_seconds = 0.0;
  double check_seconds = 0.0; /* reference and GPU checks, kept out of the step times */
  for (int step = 0; step < opt.steps; ++step) {
    for (uint32_t r = 0; r < batch; ++r) ids[r] = slots[r].id;
    fill_normal(q, NUM_LAYERS * q_elems, 1.0f);
    fill_normal(k, NUM_LAYERS * kv_elems, 1.0f);
    fill_normal(v, NUM_LAYERS * kv_elems, 1.0f);
    const double t0 = now_seconds();
    check_seconds = 0.0;

    fd_tx tx;
    CHECK(fd_tx_begin(cache, ids, batch, &tx));
    fd_tx_info info;
    info.struct_size = sizeof info;
    CHECK(fd_tx_get_info(cache, tx, &info));
    if (info.max_blocks_per_seq > table_capacity)
      FAIL("a row needs %u blocks, more than the %u planned", info.max_blocks_per_seq,
           table_capacity);
    /* Tables include the token being written; seq_lens are effective (+1). */
    CHECK(fd_tx_block_tables(cache, tx, info.max_blocks_per_seq, tables));
    CHECK(fd_tx_get_rows(cache, tx, batch, NULL, NULL, NULL, NULL, seq_lens));

    /* The step's decode parameters: what every layer shares is set once.
     * Element types: q, K/V and out are each named (bf16 here, as the
     * cache). The plan is made for this batch, these heads, head_dim and
     * device, from the exact lengths; every layer then only runs. */
    fd_decode_params p;
    fd_decode_params_init(&p);
    p.batch = batch;
    p.num_q_heads = NUM_Q_HEADS;
    p.num_kv_heads = NUM_KV_HEADS;
    p.head_dim = HEAD_DIM;
    p.q_dtype = FD_DTYPE_BF16;
    p.kv_dtype = FD_DTYPE_BF16;
    p.out_dtype = FD_DTYPE_BF16;
    p.layout = FD_LAYOUT_TOKEN_MAJOR;
    p.block_size = BLOCK_SIZE;
    p.num_blocks = config.max_blocks;
    p.max_blocks_per_seq = info.max_blocks_per_seq;
    p.block_tables = tables;
    p.seq_lens = seq_lens;
    p.q = q_rot;
    p.out = out;
    fd_decode_plan *plan = NULL;
    const double p0 = now_seconds();
    CHECK(fd_decode_plan_create(&p, seq_lens, &plan));
    decode_seconds += now_seconds() - p0;
    size_t plan_workspace = 0;
    CHECK(fd_decode_plan_workspace_size(plan, &plan_workspace));
    if (plan_workspace != 0) FAIL("a CPU plan needs no workspace, got %zu bytes", plan_workspace);

    for (uint32_t layer = 0; layer < NUM_LAYERS; ++layer) {
      CHECK(fd_tx_write_layer_rope(cache, tx, layer, q + layer * q_elems, NUM_Q_HEADS,
                                   k + layer * kv_elems, v + layer * kv_elems, HEAD_DIM, kRopeBase,
                                   q_rot, NULL));

      /* The layer's K/V: base pointers and element strides. */
      void *k_cache = NULL, *v_cache = NULL;
      int64_t strides[4];
      CHECK(fd_cache_layer_storage(cache, layer, &k_cache, &v_cache, strides));
      p.k_cache = k_cache;
      p.v_cache = v_cache;
      p.stride_block = strides[0];
      p.stride_head = strides[1];
      p.stride_token = strides[2];
      p.stride_dim = strides[3];
      const double d0 = now_seconds();
      CHECK(fd_decode_run(plan, &p));
      decode_seconds += now_seconds() - d0;

      /* out would feed the rest of the layer (projection, MLP); here it is
       * only checked. */
      const double c0 = now_seconds();
      if (step % REFERENCE_EVERY == 0 || step == opt.steps - 1) {
        reference_decode(&p, ref);
        double err = max_relative_error(out, ref, batch);
        if (err > worst_reference_error) worst_reference_error = err;
        if (err > 1e-2)
          FAIL("step %d layer %u: fd_decode_run differs from the dense reference (%.3g)", step,
               layer, err);
        ++reference_checks;
      }
#if FLASHDEC_EXAMPLE_CUDA
      if (use_gpu) gpu_decode_and_compare(&gpu, &p, out, gpu_out);
#endif
      check_seconds += now_seconds() - c0;
    }
    fd_decode_plan_destroy(plan);
    CHECK(fd_tx_commit(cache, tx));
    step_seconds[step] = now_seconds() - t0 - check_seconds;
    tokens += batch;

    /* Finished requests leave; new ones take their slots. */
    for (uint32_t r = 0; r < batch; ++r) {
      if (++slots[r].generated < slots[r].target) continue;
      const uint64_t done = slots[r].id;
      CHECK(fd_cache_finish_request(cache, done));
      int32_t state = -1;
      CHECK(fd_cache_request_state(cache, done, &state));
      if (state != FD_REQUEST_FINISHED)
        FAIL("request %llu is not finished", (unsigned long long)done);
      ++finished;
      start_request(cache, &slots[r], next_id++, k, v);
    }
    CHECK(fd_cache_validate(cache));
  }

  /* Report. */
  fd_cache_metrics m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  CHECK(fd_cache_metrics_get(cache, &m));
  double total = 0.0;
  for (int s = 0; s < opt.steps; ++s) total += step_seconds[s];
  qsort(step_seconds, (size_t)opt.steps, sizeof *step_seconds, compare_doubles);

  printf("\nrequests: %ld finished, %llu active (ids up to %llu)\n", finished,
         (unsigned long long)m.active_request_count, (unsigned long long)(next_id - 1));
  printf("blocks: %llu used of %llu (utilization %.1f%%), %llu free\n",
         (unsigned long long)m.used_blocks, (unsigned long long)m.max_blocks,
         100.0 * m.block_utilization, (unsigned long long)m.free_blocks);
  printf("tokens: %llu active, %llu reserved, internal fragmentation %.1f%%\n",
         (unsigned long long)m.active_tokens, (unsigned long long)m.reserved_tokens,
         100.0 * m.internal_fragmentation_ratio);
  printf("allocator: %llu allocations (%llu fresh, %llu reused), %llu frees\n",
         (unsigned long long)m.allocation_count, (unsigned long long)m.fresh_allocation_count,
         (unsigned long long)m.reuse_count, (unsigned long long)m.free_count);
  printf("transactions: %llu begun, %llu committed, %llu aborted, %llu layer writes\n",
         (unsigned long long)m.transaction_begin_count,
         (unsigned long long)m.transaction_commit_count,
         (unsigned long long)m.transaction_abort_count,
         (unsigned long long)m.transaction_layer_write_count);
  printf("memory: %llu bytes per block, %llu bytes of KV allocated\n",
         (unsigned long long)m.bytes_per_block, (unsigned long long)m.allocated_kv_bytes);
  printf(
      "\ntiming (CPU, %d steps x %d layers): %.1f tokens/s; step latency p50 %.3f ms, "
      "p90 %.3f ms, p99 %.3f ms, mean %.3f ms; decode plan + run %.1f%% of the time\n",
      opt.steps, NUM_LAYERS, (double)tokens / total, 1e3 * percentile(step_seconds, opt.steps, 50),
      1e3 * percentile(step_seconds, opt.steps, 90), 1e3 * percentile(step_seconds, opt.steps, 99),
      1e3 * total / opt.steps, 100.0 * decode_seconds / total);
  printf(
      "checks: %ld layer decodes vs the dense reference (worst relative error %.2e); "
      "cache invariants after every step\n",
      reference_checks, worst_reference_error);
#if FLASHDEC_EXAMPLE_CUDA
  if (use_gpu) {
    printf("GPU: %ld layer decodes compared with the CPU (worst relative error %.2e)\n",
           gpu.decodes, gpu.worst_error);
    gpu_free(&gpu);
  }
  free(gpu_out);
#endif

  fd_cache_destroy(cache);
  free(q);
  free(q_rot);
  free(out);
  free(ref);
  free(k);
  free(v);
  free(ids);
  free(seq_lens);
  free(tables);
  free(step_seconds);
  free(slots);
  printf("decode_demo: OK\n");
  return 0;
}
