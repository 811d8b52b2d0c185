// The CUDA runtime as the rest of the program sees it: device discovery,
// device memory, copies. Declared in every build (no CUDA headers here);
// defined by core/cuda/runtime.cu when the CUDA backend is compiled, and by
// core/nocuda.cpp otherwise, where device_count() is 0 and the rest throws.
//
// Ordering: all device work runs on one compute stream (core/cuda/runtime.cuh),
// so memory released by the host can be reused by the next kernel without a
// synchronisation: the allocator is stream-ordered on that stream.
#pragma once
#include <cstddef>
#include <string>

namespace attnres::cuda {

// True when this binary was built with the CUDA backend.
bool compiled();
// Number of visible CUDA devices; 0 without a driver, a GPU or a CUDA build.
int device_count();
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB, 132 SMs)" for device i.
std::string device_description(int i);
// Datasheet peak dense FLOP/s of device i for bf16 tensor-core math (bf16 =
// true) or plain fp32, looked up from its name; 0 when unknown. For MFU.
double peak_dense_flops(int i, bool bf16);

// Device memory from the caching allocator (stream-ordered on the compute
// stream; freed blocks stay cached in the pool for reuse).
void* alloc(size_t bytes);
void release(void* p);

enum class Side { Host, Device };
// Copies `bytes` and waits for them (and for all earlier work on the compute
// stream) when the destination is host memory.
void copy(void* dst, Side dst_side, const void* src, Side src_side, size_t bytes);
// Sets `bytes` bytes to 0 on the compute stream.
void zero(void* p, size_t bytes);
// Fills `count` 4-byte words with `pattern` (tests poison outputs with NaN bits).
void fill_u32(void* p, unsigned pattern, size_t count);
// Waits for all work on the compute stream; reports asynchronous kernel errors.
// A no-op in a process that has no CUDA device.
void synchronize();

struct MemoryStats {
  size_t in_use = 0;    // bytes held by live tensors
  size_t peak = 0;      // high-water mark of in_use
  size_t reserved = 0;  // bytes the pool holds from the driver (in use + cached)
};
MemoryStats memory_stats();
// Starts a new high-water mark: peak = in_use.
void reset_peak_memory();
// Bytes of device memory the driver can still give this process (what the
// CUDA context, the pool and other processes hold is not free).
size_t free_memory();

// Marks the region an external profiler records when it is started with
// profiling off (`ncu --profile-from-start off`): cudaProfilerStart / Stop.
// No effect otherwise, and none in a process without a CUDA device.
void profiler_start();
void profiler_stop();

}  // namespace attnres::cuda
