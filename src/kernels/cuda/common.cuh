// Shared pieces of the CUDA kernels (included by kernels/cuda/*.cu only):
// the compute stream, element types, bf16 <-> fp32 conversion, reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/runtime.cuh"
#include "core/tensor.h"

namespace attnres::kernels::cuda {

using bf16 = __nv_bfloat16;

// Every kernel and copy runs on the runtime's compute stream.
inline cudaStream_t stream() { return ::attnres::cuda::compute_stream(); }

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

// ---- vector access ---------------------------------------------------------------
// N consecutive elements, aligned to their size: a 16-byte pack when
// N * sizeof(T) == 16, which the compiler turns into one 128-bit load/store.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};
template <int N, typename T>
__device__ __forceinline__ Vec<T, N> load(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}
template <int N, typename T>
__device__ __forceinline__ void store(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}
// Whether a pointer allows `bytes`-wide accesses (row slices of a tensor need not).
inline bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Blocks of `threads` for a grid-stride loop over `work` items: enough to fill
// the device (16 blocks per SM), no more. Only for loops whose results do not
// depend on the grid (no reductions).
inline int grid_for(int64_t work, int threads) {
  const int64_t cap = int64_t(::attnres::cuda::device_properties().multiProcessorCount) * 16;
  return static_cast<int>(std::max<int64_t>(1, std::min(ceil_div(work, threads), cap)));
}

// Sets the dynamic shared-memory limit of `kernel` when it needs more than the
// default 48 KiB (a cheap attribute write; doing it at each launch keeps the
// launchers free of static state).
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    ATTNRES_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(bytes)));
}

// ---- batched launches -----------------------------------------------------------
// One launch for many tensors (an optimizer step, a global norm): member i of
// the batch owns the blocks [first_block[i], first_block[i + 1]) and runs a
// grid-stride loop over its own elements with them, so each member's
// arithmetic is what a launch of its own with that many blocks would do.
struct BatchSlot {
  int member;          // this block's member
  int64_t tid, stride; // this thread's start and the stride within the member's blocks
};
template <typename Batch>
__device__ __forceinline__ BatchSlot batch_slot(const Batch& batch) {
  int i = 0;  // count is small (<= 64): a scan is cheap
  while (i + 1 < batch.count && batch.first_block[i + 1] <= int64_t(blockIdx.x)) ++i;
  const int64_t b = int64_t(blockIdx.x) - batch.first_block[i];
  return {i, b * blockDim.x + threadIdx.x,
          (batch.first_block[i + 1] - batch.first_block[i]) * blockDim.x};
}

// ---- elementwise launches -----------------------------------------------------
// Elements per 16-byte pack of T.
template <typename T>
constexpr int pack_of() { return static_cast<int>(16 / sizeof(T)); }


// Runs f.apply<W>(i) on the packs [i, i+W) and f.apply<1>(i) on the tail.
template <int W, typename F>
__global__ void elementwise_kernel(int64_t n, F f) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / W;
  for (int64_t k = tid; k < nv; k += stride) f.template apply<W>(k * W);
  if (W > 1)
    for (int64_t i = nv * W + tid; i < n; i += stride) f.template apply<1>(i);
}

// An elementwise op over n elements: 16-byte packs of W when every pointer is
// aligned for them (vec_ok; tensors can be row slices at any element offset),
// element by element otherwise. Each element gets the same arithmetic either
// way, so results do not depend on the alignment.
template <int W, typename F>
void launch_elementwise(int64_t n, bool vec_ok, const F& f) {
  constexpr int kT = 256;
  if (n <= 0) return;
  if (vec_ok)
    elementwise_kernel<W><<<grid_for(ceil_div(n, W), kT), kT, 0, stream()>>>(n, f);
  else
    elementwise_kernel<1><<<grid_for(n, kT), kT, 0, stream()>>>(n, f);
  ATTNRES_CUDA_CHECK_LAUNCH();
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
// A reduction over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. warp_op reduces over a warp; `scratch` holds 32
// values of shared memory. The order of operations is fixed by the launch
// shape, so results are deterministic.
template <typename T, typename WarpOp>
__device__ __forceinline__ T block_reduce(T v, T* scratch, T identity, WarpOp warp_op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_op(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int nwarps = blockDim.x >> 5;
  v = lane < nwarps ? scratch[lane] : identity;
  return warp_op(v);
}
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  return block_reduce(v, scratch, T(0), [](T x) { return warp_sum(x); });
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce(v, scratch, -INFINITY, [](float x) { return warp_max(x); });
}

}  // namespace attnres::kernels::cuda
