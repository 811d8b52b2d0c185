// Marks inline functions shared by the CPU and CUDA backends, so that one
// piece of math (a row's RMSNorm, an online-softmax merge, AdamW's update) is
// written once and the CPU tests check the GPU's math too.
#pragma once
#if defined(__CUDACC__)
#define ATTNRES_HD __host__ __device__ __forceinline__
#else
#define ATTNRES_HD inline
#endif
