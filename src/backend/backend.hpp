// The one seam between the library and its CUDA backend. Everything outside
// src/cuda (cache, engine, attention front end, append front end, the public
// device query) reaches CUDA only through these functions. CMake builds
// exactly one implementation, and CMakeLists.txt is the only place that
// chooses:
//   - CUDA builds: src/cuda/ -- device_cuda.cpp (device queries, device
//     buffers), decode_cuda.cpp (attention), append_cuda.cpp (append),
//     kv_storage_cuda.cpp (cache storage), all on the one set of CUDA helpers
//     in cuda/cuda_util.hpp (cuda_check, CudaDeviceScope, cuda_zero_fill_sync);
//   - CPU-only builds: src/nocuda/backend_nocuda.cpp, where no device exists:
//     queries answer 0 / false, cuda_free does nothing, and every other
//     request is FD_ERR_NO_DEVICE ("... built without CUDA").
// No other file tests for CUDA with the preprocessor or includes a CUDA
// header: a caller needs no #if, because the CPU-only backend answers every
// function.
//
// The CPU backend is always built and needs no seam: the front ends call it
// directly (attention/decode_cpu.cpp, ops/kv_append_cpu.cpp,
// cache/cpu_kv_storage.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "attention/decode_work.hpp"
#include "flashdec.h"

namespace fd {

struct DecodeProblem;
struct AppendProblem;
struct KvGeometry;
class KvStorage;

namespace backend {

// --- Device queries --------------------------------------------------------

// Usable CUDA devices; 0 without a driver, a device or CUDA (never throws).
int32_t cuda_device_count() noexcept;

// Throws FD_ERR_NO_DEVICE unless `ordinal` names a usable device.
void require_cuda_device(int32_t ordinal);

// True when `p` points to device (or managed) memory of CUDA device
// `ordinal`. A pure query (no host sync) that is legal inside any stream
// capture; always false without CUDA.
bool is_cuda_device_memory(const void *p, int32_t ordinal) noexcept;

// --- Attention ---------------------------------------------------------------

// Checks what the CUDA kernels limit (dtypes, head_dim, block size, group
// size, alignment; FD_ERR_UNSUPPORTED naming the parameter) and decides the
// split-KV work list from host-known values: `host_seq_lens` (batch exact
// lengths, may be null), else the problem's max_seq_len hint; the problem's
// num_splits; and, when `limit_by_workspace`, the workspace it names.
DecodeWorkList cuda_plan_decode(const DecodeProblem &problem, const int32_t *host_seq_lens,
                                bool limit_by_workspace);

// Workspace bytes a work list needs (0 when it has no partials).
size_t cuda_decode_workspace_bytes(const DecodeProblem &problem, const DecodeWorkList &work);

// Enqueues the attention (and merge) kernels of `work` on problem.stream:
// no allocation, no host sync, no device read (except FD_DECODE_CHECK_INDICES).
// The workspace has been checked against cuda_decode_workspace_bytes.
void cuda_run_decode(const DecodeProblem &problem, const DecodeWorkList &work);

// --- KV append (fd_kv_append / fd_rope_kv_append on CUDA) ------------------

// Checks what only CUDA limits, copies the index arrays to the host and
// synchronises the stream to check them, then enqueues the kernel.
void cuda_kv_append(const AppendProblem &problem);

// --- Cache storage -----------------------------------------------------------

// Device storage of a cache on CUDA device `ordinal` (FD_ERR_NO_DEVICE
// without one; FD_ERR_OUT_OF_MEMORY when it does not fit).
std::unique_ptr<KvStorage> make_cuda_kv_storage(const KvGeometry &geometry, int32_t ordinal);

// --- Device buffers (engine scratch) -----------------------------------------

// Device memory of `ordinal` (at least 16 bytes); FD_ERR_OUT_OF_MEMORY /
// FD_ERR_DEVICE naming `what`.
void *cuda_alloc(int32_t ordinal, size_t bytes, const char *what);
// Frees memory from cuda_alloc (null ignored). Never throws.
void cuda_free(int32_t ordinal, void *p) noexcept;
// Zero-fills device memory and waits for the fill on a private stream
// (creation paths only; see docs/cuda-streams.md).
void cuda_zero_fill_sync(int32_t ordinal, void *p, size_t bytes, const char *what);
// Waits for the legacy default stream of `ordinal` (FD_ERR_DEVICE on an
// error of the work queued there).
void cuda_sync_default_stream(int32_t ordinal, const char *what);

}  // namespace backend
}  // namespace fd
