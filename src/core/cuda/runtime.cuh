// CUDA-side companion of core/device.h, for .cu files only: the streams every
// kernel launches on and the error-checking macros.
//
// Why a process-wide runtime: a CUDA context, its streams and its memory pool
// already are process-wide state owned by the driver. Wrapping them in one
// lazily created object (created on first use, destroyed at exit, never
// reassigned) gives every op the same stream without threading a handle
// through each of the model's hundreds of kernel calls.
#pragma once
#include <cuda_runtime.h>

#include "core/error.h"

namespace attnres::cuda {

// The stream all compute kernels and copies run on (non-blocking w.r.t. the
// legacy default stream).
cudaStream_t compute_stream();
// A second stream for communication (NCCL), ordered against compute with events.
cudaStream_t comm_stream();
// Properties of the current device (cached).
const cudaDeviceProp& device_properties();

}  // namespace attnres::cuda

// Checks a CUDA runtime call; a failure throws attnres::InternalError naming the file,
// line and the failing call.
#define ATTNRES_CUDA_CHECK(call)                                                     \
  do {                                                                               \
    cudaError_t err_ = (call);                                                       \
    if (err_ != cudaSuccess)                                                         \
      ::attnres::fail_internal(__FILE__, ":", __LINE__, ": ", #call, " failed: ",             \
                      cudaGetErrorName(err_), " (", cudaGetErrorString(err_), ")"); \
  } while (0)

// After a kernel launch: reports launch-configuration errors at the launch site.
// (Errors inside the kernel surface at the next synchronising call.)
#define ATTNRES_CUDA_CHECK_LAUNCH() ATTNRES_CUDA_CHECK(cudaGetLastError())
