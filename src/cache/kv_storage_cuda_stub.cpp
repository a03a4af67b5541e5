// Placeholder for the CUDA cache storage until the CUDA backend provides
// make_cuda_kv_storage() (declared in cache/kv_storage.hpp) from src/cuda,
// together with the header cuda/kv_storage_cuda.hpp. That header's presence
// in a CUDA build switches this stub off, so adding the CUDA storage needs no
// edit in src/cache.
#include "cache/kv_storage.hpp"
#include "core/device.hpp"
#include "core/error.hpp"

#if !FLASHDEC_HAVE_CUDA || !__has_include("cuda/kv_storage_cuda.hpp")

namespace fd {

std::unique_ptr<KvStorage> make_cuda_kv_storage(const KvGeometry &, int32_t ordinal) {
  require_cuda_device(ordinal);  // FD_ERR_NO_DEVICE without a usable device
  fail(FD_ERR_UNSUPPORTED, "CUDA cache storage is not available in this version");
}

}  // namespace fd

#endif
