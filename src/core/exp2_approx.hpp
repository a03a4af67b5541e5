// exp2_approx(x) = 2^x for the softmax weights of the CUDA attention kernels
// and their merge. On the device it is the SFU's ex2.approx.ftz alone:
// relative error about 2^-22, results below 2^-126 flushed to zero, 2^-inf =
// 0, overflow to inf. exp2f adds a range check and two predicated multiplies
// per call to keep denormal results, which softmax weights never need. On
// the host (a plain C++ build of a header that includes this) it is
// std::exp2.
#pragma once

#include <cmath>

#include "core/host_device.hpp"

namespace fd {

FD_HD float exp2_approx(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

}  // namespace fd
