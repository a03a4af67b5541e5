/* Shared helpers for the GPU suites (tests/gpu_*): the device check every
 * suite's main() starts with, and a CUDA runtime check for test bodies.
 * Include after the headers fd_test.h needs (<stdarg.h>, <stddef.h>,
 * <setjmp.h>, <stdint.h>, <cmocka.h>). */
#ifndef FD_GPU_TEST_H
#define FD_GPU_TEST_H

#include <cuda_runtime_api.h>
#include <stdio.h>

#include "fd_test.h"

/* The exit status ctest reads as "skipped" (SKIP_RETURN_CODE 77 in
 * tests/CMakeLists.txt). */
#define FD_GPU_TEST_SKIPPED 77

/* Fails the current test, naming the call and the CUDA error, when `expr`
 * (a CUDA runtime call) does not return cudaSuccess. */
#define CUDA_OK(expr)                                                                            \
  do {                                                                                           \
    cudaError_t cuda_ok_e_ = (expr);                                                             \
    if (cuda_ok_e_ != cudaSuccess) {                                                             \
      print_error("%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(cuda_ok_e_)); \
      fail();                                                                                    \
    }                                                                                            \
  } while (0)

/* Stream-ordered transfers for test bodies. A plain cudaMemset / cudaMemcpy
 * runs on the legacy default stream, which a cudaStreamNonBlocking stream
 * does not wait for, and a pageable cudaMemcpy to the device may return
 * before the bytes land: a library call on the test's non-blocking stream
 * could then read the old bytes, or have its results overwritten by a late
 * fill (issue 11: seen only with other GPU work running at the same time).
 * Each helper enqueues on `stream` (NULL: the legacy default stream) and
 * waits for that stream, so on return the bytes are in place for work on any
 * stream, earlier work on `stream` is done, and host buffers may be reused.
 * Use them, not the plain calls, for every fill and copy in a GPU test. */
static inline cudaError_t fd_gpu_upload(cudaStream_t stream, void *dst, const void *src,
                                        size_t bytes) {
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream);
  return e != cudaSuccess ? e : cudaStreamSynchronize(stream);
}

static inline cudaError_t fd_gpu_download(cudaStream_t stream, void *dst, const void *src,
                                          size_t bytes) {
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream);
  return e != cudaSuccess ? e : cudaStreamSynchronize(stream);
}

static inline cudaError_t fd_gpu_fill(cudaStream_t stream, void *dst, int byte, size_t bytes) {
  cudaError_t e = cudaMemsetAsync(dst, byte, bytes, stream);
  return e != cudaSuccess ? e : cudaStreamSynchronize(stream);
}

/* Returns 1 when libflashdec sees a CUDA device. Otherwise prints the visible
 * "SKIPPED: ..." line (a skip must never pass silently) and returns 0; main()
 * then returns FD_GPU_TEST_SKIPPED:
 *
 *   if (!fd_gpu_test_device_present()) return FD_GPU_TEST_SKIPPED;
 */
static inline int fd_gpu_test_device_present(void) {
  int32_t n = 0;
  if (fd_cuda_device_count(&n) != FD_OK || n == 0) {
    printf("SKIPPED: no CUDA device (fd_cuda_device_count reported %d)\n", (int)n);
    fflush(stdout);
    return 0;
  }
  return 1;
}

#endif /* FD_GPU_TEST_H */
