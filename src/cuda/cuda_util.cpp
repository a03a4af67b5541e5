#include "cuda/cuda_util.hpp"

#include "core/error.hpp"

namespace fd {

void cuda_check(cudaError_t err, const char *what) {
  if (err == cudaSuccess) return;
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: leave the runtime clean for later calls
    fail(FD_ERR_OUT_OF_MEMORY, "%s failed: %s", what, cudaGetErrorString(err));
  }
  fail(FD_ERR_DEVICE, "%s failed: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

CudaDeviceScope::CudaDeviceScope(int32_t ordinal) {
  cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != ordinal) {
    cuda_check(cudaSetDevice(ordinal), "cudaSetDevice");
    changed_ = true;
  }
}

CudaDeviceScope::~CudaDeviceScope() {
  if (changed_) (void)cudaSetDevice(previous_);
}

void cuda_zero_fill_sync(void *p, size_t bytes, const char *what) {
  if (bytes == 0) return;
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags (clearing device memory)");
  cudaError_t e = cudaMemsetAsync(p, 0, bytes, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  (void)cudaStreamDestroy(s);  // after the synchronisation: nothing pending on it
  cuda_check(e, what);
}

}  // namespace fd
