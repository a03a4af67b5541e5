/* Status strings, version queries, the thread-local last error, and loading
 * the library (with the CUDA runtime linked in statically) on a machine that
 * may have no GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <unistd.h>

#include "fd_test.h"

/* Every status with the name its string must start with. */
static const struct {
  fd_status status;
  const char *name;
} k_statuses[] = {
    {FD_OK, "FD_OK"},
    {FD_ERR_INVALID_ARGUMENT, "FD_ERR_INVALID_ARGUMENT"},
    {FD_ERR_OUT_OF_BLOCKS, "FD_ERR_OUT_OF_BLOCKS"},
    {FD_ERR_NOT_FOUND, "FD_ERR_NOT_FOUND"},
    {FD_ERR_INVALID_STATE, "FD_ERR_INVALID_STATE"},
    {FD_ERR_STALE_HANDLE, "FD_ERR_STALE_HANDLE"},
    {FD_ERR_UNSUPPORTED, "FD_ERR_UNSUPPORTED"},
    {FD_ERR_NO_DEVICE, "FD_ERR_NO_DEVICE"},
    {FD_ERR_DEVICE, "FD_ERR_DEVICE"},
    {FD_ERR_OUT_OF_MEMORY, "FD_ERR_OUT_OF_MEMORY"},
    {FD_ERR_INTERNAL, "FD_ERR_INTERNAL"},
    {FD_ERR_ALREADY_EXISTS, "FD_ERR_ALREADY_EXISTS"},
    {FD_ERR_INVARIANT, "FD_ERR_INVARIANT"},
};
enum { NUM_STATUSES = sizeof k_statuses / sizeof k_statuses[0] };

static void test_status_strings_name_each_status(void **state) {
  (void)state;
  for (int i = 0; i < NUM_STATUSES; ++i) {
    assert_int_equal(k_statuses[i].status, i); /* the table covers 0..12 in order */
    const char *s = fd_status_string(k_statuses[i].status);
    assert_non_null(s);
    size_t n = strlen(k_statuses[i].name);
    /* "NAME: text": the name, then a separator, so FD_ERR_DEVICE cannot pass
     * for a prefix of another name. */
    assert_memory_equal(s, k_statuses[i].name, n);
    assert_int_equal(s[n], ':');
    assert_true(strlen(s) > n + 2);
    /* Static: the same pointer every time. */
    assert_ptr_equal(s, fd_status_string(k_statuses[i].status));
  }
}

static void test_status_strings_are_distinct(void **state) {
  (void)state;
  for (int i = 0; i < NUM_STATUSES; ++i)
    for (int j = i + 1; j < NUM_STATUSES; ++j)
      assert_string_not_equal(fd_status_string(k_statuses[i].status),
                              fd_status_string(k_statuses[j].status));
}

static void test_unknown_status_gives_generic_string(void **state) {
  (void)state;
  const int unknown[] = {NUM_STATUSES, 13, 99, -1, 0x7fffffff, INT32_MIN};
  const char *generic = fd_status_string((fd_status)unknown[0]);
  assert_non_null(generic);
  assert_true(generic[0] != '\0');
  for (size_t u = 0; u < sizeof unknown / sizeof unknown[0]; ++u) {
    const char *s = fd_status_string((fd_status)unknown[u]);
    assert_non_null(s);
    assert_string_equal(s, generic);
    for (int i = 0; i < NUM_STATUSES; ++i)
      assert_string_not_equal(s, fd_status_string(k_statuses[i].status));
  }
}

static void test_version_matches_header(void **state) {
  (void)state;
  assert_int_equal(fd_version_number(), FD_VERSION_NUMBER);
  assert_int_equal(FD_VERSION_NUMBER,
                   FD_VERSION_MAJOR * 10000 + FD_VERSION_MINOR * 100 + FD_VERSION_PATCH);
  char expected[32];
  snprintf(expected, sizeof expected, "%d.%d.%d", FD_VERSION_MAJOR, FD_VERSION_MINOR,
           FD_VERSION_PATCH);
  assert_non_null(fd_version_string());
  assert_string_equal(fd_version_string(), expected);
  /* The compatibility check documented in flashdec.h holds for this build. */
  uint32_t rt = fd_version_number();
  assert_true(rt / 10000u == FD_VERSION_MAJOR && rt >= FD_VERSION_NUMBER);
}

/* ------------------------------------------------------------------------ */
/* fd_last_error_message */

static void test_failure_sets_message_success_keeps_it(void **state) {
  (void)state;
  FD_ASSERT_FAILS(fd_cuda_device_count(NULL), FD_ERR_INVALID_ARGUMENT, "count");
  const char *after_failure = fd_last_error_message();
  char copy[256];
  snprintf(copy, sizeof copy, "%s", after_failure);
  int32_t n = -1;
  FD_ASSERT_OK(fd_cuda_device_count(&n));
  assert_string_equal(fd_last_error_message(), copy);
  FD_ASSERT_OK(fd_cuda_device_count(&n));
  assert_string_equal(fd_last_error_message(), copy);
}

/* Two threads step through a fixed script, handing a turn back and forth:
 *   A fails ("count ...")  -> B (fresh) still sees "" and fails its own way
 *   ("config ...") -> A still sees its own message, not B's; B likewise.
 * The main thread's own failure ("params ...") is seen by neither. */
typedef struct handoff {
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  int turn; /* which step may run next */
  char a_message[256];
  char b_seen_before[256];
  char b_message[256];
  char a_seen_after[256];
  char b_seen_after[256];
  int a_status, b_status;
} handoff;

static void wait_turn(handoff *h, int turn) {
  pthread_mutex_lock(&h->mutex);
  while (h->turn != turn) pthread_cond_wait(&h->cond, &h->mutex);
  pthread_mutex_unlock(&h->mutex);
}

static void pass_turn(handoff *h, int turn) {
  pthread_mutex_lock(&h->mutex);
  h->turn = turn;
  pthread_cond_broadcast(&h->cond);
  pthread_mutex_unlock(&h->mutex);
}

static void *thread_a(void *arg) {
  handoff *h = arg;
  wait_turn(h, 0);
  h->a_status = fd_cuda_device_count(NULL);
  snprintf(h->a_message, sizeof h->a_message, "%s", fd_last_error_message());
  pass_turn(h, 1);
  wait_turn(h, 2);
  snprintf(h->a_seen_after, sizeof h->a_seen_after, "%s", fd_last_error_message());
  pass_turn(h, 3);
  return NULL;
}

static void *thread_b(void *arg) {
  handoff *h = arg;
  wait_turn(h, 1);
  snprintf(h->b_seen_before, sizeof h->b_seen_before, "%s", fd_last_error_message());
  /* A different failure, with a different message. */
  fd_cache *cache = NULL;
  h->b_status = fd_cache_create(NULL, &cache);
  snprintf(h->b_message, sizeof h->b_message, "%s", fd_last_error_message());
  pass_turn(h, 2);
  wait_turn(h, 3);
  snprintf(h->b_seen_after, sizeof h->b_seen_after, "%s", fd_last_error_message());
  return NULL;
}

static void test_last_error_is_thread_local(void **state) {
  (void)state;
  handoff h;
  memset(&h, 0, sizeof h);
  pthread_mutex_init(&h.mutex, NULL);
  pthread_cond_init(&h.cond, NULL);

  /* The main thread has a failure of its own, which neither thread sees. */
  FD_ASSERT_FAILS(fd_decode(NULL), FD_ERR_INVALID_ARGUMENT, "params");
  char main_message[256];
  snprintf(main_message, sizeof main_message, "%s", fd_last_error_message());

  pthread_t a, b;
  assert_int_equal(pthread_create(&a, NULL, thread_a, &h), 0);
  assert_int_equal(pthread_create(&b, NULL, thread_b, &h), 0);
  assert_int_equal(pthread_join(a, NULL), 0);
  assert_int_equal(pthread_join(b, NULL), 0);

  assert_int_equal(h.a_status, FD_ERR_INVALID_ARGUMENT);
  assert_int_equal(h.b_status, FD_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(h.a_message, "count"));
  assert_non_null(strstr(h.b_message, "config"));
  assert_string_not_equal(h.a_message, h.b_message);
  /* B started after A and the main thread failed, and saw neither. */
  assert_string_equal(h.b_seen_before, "");
  /* Each kept its own message across the other's failure. */
  assert_string_equal(h.a_seen_after, h.a_message);
  assert_string_equal(h.b_seen_after, h.b_message);
  /* And the main thread's is untouched by both. */
  assert_string_equal(fd_last_error_message(), main_message);
  assert_non_null(strstr(main_message, "params"));

  pthread_cond_destroy(&h.cond);
  pthread_mutex_destroy(&h.mutex);
}

/* Both threads fail at the same time, over and over, each with its own
 * message; each must always read back its own. */
typedef struct racer {
  int use_cache; /* 1: fd_cache_create(NULL), 0: fd_cuda_device_count(NULL) */
  int mismatches;
} racer;

static void *race(void *arg) {
  racer *r = arg;
  const char *expected = r->use_cache ? "config" : "count";
  const char *other = r->use_cache ? "count" : "config";
  for (int i = 0; i < 20000; ++i) {
    fd_cache *cache = NULL;
    fd_status s = r->use_cache ? fd_cache_create(NULL, &cache) : fd_cuda_device_count(NULL);
    const char *m = fd_last_error_message();
    if (s != FD_ERR_INVALID_ARGUMENT || strstr(m, expected) == NULL || strstr(m, other) != NULL)
      ++r->mismatches;
  }
  return NULL;
}

static void test_last_error_concurrent_failures(void **state) {
  (void)state;
  racer a = {0, 0}, b = {1, 0};
  pthread_t ta, tb;
  assert_int_equal(pthread_create(&ta, NULL, race, &a), 0);
  assert_int_equal(pthread_create(&tb, NULL, race, &b), 0);
  assert_int_equal(pthread_join(ta, NULL), 0);
  assert_int_equal(pthread_join(tb, NULL), 0);
  assert_int_equal(a.mismatches, 0);
  assert_int_equal(b.mismatches, 0);
}

static void *fresh_thread_message(void *arg) {
  const char *m = fd_last_error_message();
  *(int *)arg = (m != NULL && m[0] == '\0');
  return NULL;
}

static void test_fresh_thread_has_empty_message(void **state) {
  (void)state;
  FD_ASSERT_FAILS(fd_cuda_device_count(NULL), FD_ERR_INVALID_ARGUMENT, "count");
  int empty = 0;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, fresh_thread_message, &empty), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_true(empty);
}

/* ------------------------------------------------------------------------ */
/* CUDA presence */

/* The library loaded (this program links it) whether or not it contains the
 * CUDA backend; without a GPU it reports zero devices and no error. */
static void test_cuda_device_count_without_gpu(void **state) {
  (void)state;
  int32_t count = -1;
  FD_ASSERT_OK(fd_cuda_device_count(&count));
  assert_true(count >= 0);
  int has_driver_node = access("/dev/nvidiactl", F_OK) == 0 || access("/dev/nvidia0", F_OK) == 0;
  if (!has_driver_node) assert_int_equal(count, 0);
  print_message("fd_cuda_device_count: %d (NVIDIA device nodes %s)\n", (int)count,
                has_driver_node ? "present" : "absent");
  /* Asking twice gives the same answer (the query leaves no sticky state). */
  int32_t again = -1;
  FD_ASSERT_OK(fd_cuda_device_count(&again));
  assert_int_equal(again, count);
}

static void test_cuda_device_count_null(void **state) {
  (void)state;
  FD_ASSERT_FAILS(fd_cuda_device_count(NULL), FD_ERR_INVALID_ARGUMENT, "count");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_strings_name_each_status),
      cmocka_unit_test(test_status_strings_are_distinct),
      cmocka_unit_test(test_unknown_status_gives_generic_string),
      cmocka_unit_test(test_version_matches_header),
      cmocka_unit_test(test_failure_sets_message_success_keeps_it),
      cmocka_unit_test(test_last_error_is_thread_local),
      cmocka_unit_test(test_last_error_concurrent_failures),
      cmocka_unit_test(test_fresh_thread_has_empty_message),
      cmocka_unit_test(test_cuda_device_count_without_gpu),
      cmocka_unit_test(test_cuda_device_count_null),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
