// The backend of CPU-only builds (backend/backend.hpp): no CUDA device exists,
// so every query answers "none" and every CUDA request is FD_ERR_NO_DEVICE.
// CMake compiles this file instead of src/cuda/ when CUDA is off; it is the
// only stand-in for the CUDA backend.
#include "backend/backend.hpp"

#include "attention/decode_problem.hpp"
#include "cache/kv_storage.hpp"
#include "core/error.hpp"
#include "ops/kv_append.hpp"

namespace fd {
namespace backend {

/* Device queries ----------------------------------------------------------- */

int32_t cuda_device_count() noexcept {
  return 0;
}

void require_cuda_device(int32_t ordinal) {
  fail(FD_ERR_NO_DEVICE, "CUDA device %d requested, but libflashdec was built without CUDA",
       ordinal);
}

bool is_cuda_device_memory(const void *, int32_t) noexcept {
  return false;
}

/* Attention ---------------------------------------------------------------- */

DecodeWorkList cuda_plan_decode(const DecodeProblem &problem, const int32_t *, bool) {
  require_cuda_device(problem.device_ordinal);
  return DecodeWorkList();
}

size_t cuda_decode_workspace_bytes(const DecodeProblem &problem, const DecodeWorkList &) {
  require_cuda_device(problem.device_ordinal);
  return 0;
}

void cuda_run_decode(const DecodeProblem &problem, const DecodeWorkList &) {
  require_cuda_device(problem.device_ordinal);
}

/* KV append ---------------------------------------------------------------- */

void cuda_kv_append(const AppendProblem &problem) {
  require_cuda_device(problem.device_ordinal);
}

/* Cache storage ------------------------------------------------------------ */

std::unique_ptr<KvStorage> make_cuda_kv_storage(const KvGeometry &, int32_t ordinal) {
  require_cuda_device(ordinal);
  return nullptr;
}

/* Device buffers ----------------------------------------------------------- */

void *cuda_alloc(int32_t ordinal, size_t, const char *) {
  require_cuda_device(ordinal);
  return nullptr;
}

void cuda_free(int32_t, void *) noexcept {}

void cuda_zero_fill_sync(int32_t ordinal, void *, size_t, const char *) {
  require_cuda_device(ordinal);
}

void cuda_sync_default_stream(int32_t ordinal, const char *) {
  require_cuda_device(ordinal);
}

}  // namespace backend
}  // namespace fd
