// FD_HD marks the small inline functions that the host code and the CUDA
// kernels share (the decode work list, the variant policy, the FP8
// quantisation rule): __host__ __device__ under nvcc, plain inline in every
// other compiler. This is a portability macro, not a backend choice: both
// backends compile the same definitions.
#pragma once

#if defined(__CUDACC__)
#define FD_HD __host__ __device__ __forceinline__
#else
#define FD_HD inline
#endif
