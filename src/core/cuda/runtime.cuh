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

#include <cstdint>

#include "core/error.h"

namespace attnres::cuda {

// The stream all compute kernels and copies run on (non-blocking w.r.t. the
// legacy default stream).
cudaStream_t compute_stream();
// A second stream for communication (NCCL), ordered against compute with events.
cudaStream_t comm_stream();
// Whether a CUDA graph is capturing the compute stream (core/device.h,
// StreamGraph): work queued now does not run, and waits for it must not be made.
bool compute_stream_capturing();
// Properties of the current device (cached).
const cudaDeviceProp& device_properties();

// A result an op's kernels leave on the device for the host: a value (a loss)
// and the first flagged position (~0 when none; kernels lower it with
// atomicMin, so it does not depend on their order).
struct DeviceStatus {
  double value;
  unsigned long long bad;
};
// What a flagged position means: ids[bad] is outside [0, vocab), the error
// "<op>: <noun> id <ids[bad]> at position <bad> is outside the vocabulary [0, vocab)".
struct IdCheck {
  const char* op;
  const char* noun;
  const int32_t* ids;  // device memory
  int64_t vocab;
};

// The DeviceStatus of one op call (core/cuda/graph.cu): a slot of this
// thread's active DeferredChecks (core/device.h) when there is one, else its
// own device memory; set to value 0, nothing flagged, on the compute stream.
class StatusSlot {
 public:
  // `value`: the op returns the slot's value (DeferredChecks::collect too).
  StatusSlot(const IdCheck& check, bool value);
  ~StatusSlot();
  StatusSlot(const StatusSlot&) = delete;
  StatusSlot& operator=(const StatusSlot&) = delete;
  DeviceStatus* get() const { return slot_; }
  // Eagerly: waits for the kernels, throws the check's error if a position
  // was flagged, else returns the value. Deferred: returns 0 at once (the
  // check and the value come with DeferredChecks::collect()).
  double settle() const;

 private:
  IdCheck check_;
  DeviceStatus* slot_ = nullptr;
  bool owned_ = false;
};

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
