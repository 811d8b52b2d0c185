// Shared pieces of the CUDA kernels (included by kernels/cuda/*.cu only):
// the compute stream, element types, bf16 <-> fp32 conversion, reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/runtime.cuh"
#include "core/tensor.h"

namespace attnres::kernels::cuda {

using bf16 = __nv_bfloat16;

// Every kernel and copy runs on the runtime's compute stream.
inline cudaStream_t stream() { return ::attnres::cuda::compute_stream(); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Typed device pointer of a CUDA tensor; T is float, bf16 (F32 / BF16),
// int32_t (I32) or double (F64).
template <typename T> constexpr DType dtype_of_device();
template <> constexpr DType dtype_of_device<float>() { return DType::F32; }
template <> constexpr DType dtype_of_device<bf16>() { return DType::BF16; }
template <> constexpr DType dtype_of_device<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of_device<double>() { return DType::F64; }

template <typename T>
T* dptr(const Tensor& t) {
  ATTNRES_CHECK(t.defined() && t.is_cuda(), "expected a CUDA tensor, got ", t.describe());
  ATTNRES_CHECK(t.dtype() == dtype_of_device<T>(), "tensor is ", dtype_name(t.dtype()),
                ", accessed as ", dtype_name(dtype_of_device<T>()));
  return static_cast<T*>(t.raw());
}
template <typename T>
T* dptr_or_null(const Tensor* t) { return t ? dptr<T>(*t) : nullptr; }

// Run fn(float{}) or fn(bf16{}) for an F32 or BF16 CUDA tensor.
template <typename Fn>
void dispatch_float(const Tensor& t, const char* op, Fn&& fn) {
  switch (t.dtype()) {
    case DType::F32: fn(float{}); return;
    case DType::BF16: fn(bf16{}); return;
    default: fail(op, ": the CUDA kernels take F32 or BF16, got ", dtype_name(t.dtype()));
  }
}

// ---- element conversion: all arithmetic is fp32 --------------------------------
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }

// ---- reductions ---------------------------------------------------------------
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. `scratch` holds 32 values of shared memory. The order of
// additions is fixed by the launch shape, so results are deterministic.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int nwarps = blockDim.x >> 5;
  v = lane < nwarps ? scratch[lane] : T(0);
  return warp_sum(v);
}

}  // namespace attnres::kernels::cuda
