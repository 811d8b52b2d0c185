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
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace attnres::cuda {

// True when this binary was built with the CUDA backend.
bool compiled();
// Number of visible CUDA devices; 0 without a driver, a GPU or a CUDA build.
int device_count();
// Makes visible device `index` this process's GPU: every stream, allocation
// and kernel of the process then uses it (device 0 when never called). Call
// before any other device work; once the runtime has started on a device,
// choosing another one throws InternalError. Choosing by index (not by
// restricting CUDA_VISIBLE_DEVICES) also works after a CUDA-aware MPI has
// initialised CUDA inside MPI_Init.
void select_device(int index);
// The PCI bus id of this process's GPU ("0000:18:00.0"): the same physical
// GPU has the same id in every process, whatever devices each one sees.
std::string pci_bus_id();
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB, 132 SMs)" for this process's GPU.
std::string device_description();
// Datasheet peak dense FLOP/s of this process's GPU for bf16 tensor-core
// math (bf16 = true) or plain fp32, looked up from its name; 0 when unknown.
// For MFU.
double peak_dense_flops(bool bf16);

// Device memory from the caching allocator (stream-ordered on the compute
// stream; freed blocks stay cached in the pool for reuse).
void* alloc(size_t bytes);
void release(void* p);

enum class Side { Host, Device };
// Copies `bytes` and waits for them (and for all earlier work on the compute
// stream) when the destination is host memory.
void copy(void* dst, Side dst_side, const void* src, Side src_side, size_t bytes);
// The same without waiting: queued on the compute stream. A host side must
// be pinned (HostBuffer) for the copy to overlap anything, and must not be
// touched until synchronize() (device -> host) or until later work on the
// compute stream is known to have run (host -> device).
void copy_async(void* dst, Side dst_side, const void* src, Side src_side, size_t bytes);
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

// Host memory for staging device data through the host. `pinned`: page-
// locked (cudaHostAlloc), so that copies to and from it run at full bandwidth
// and asynchronously (copy_async), where pageable memory goes through the
// driver's own bounce buffer a chunk at a time; pinning is slow, so keep and
// reuse such buffers. Not pinned (or in a process without a CUDA device):
// plain host memory, and no CUDA call.
class HostBuffer {
 public:
  HostBuffer(size_t bytes, bool pinned);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool pinned() const { return pinned_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_ = false;
};

// Points in time on the compute stream (CUDA events), to time device work
// without synchronising it: mark() records a point after everything queued
// so far; seconds(a, b) waits until point b has passed and returns the GPU
// time between points a and b. The host's clock would time the queueing of
// kernels, which runs ahead of the GPU. Only where there is a CUDA device.
class StreamClock {
 public:
  StreamClock();
  ~StreamClock();
  StreamClock(const StreamClock&) = delete;
  StreamClock& operator=(const StreamClock&) = delete;
  // Forgets the points (their events are reused).
  void reset();
  int mark();
  double seconds(int a, int b) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
// CUDA graphs (docs/cuda.md, "CUDA graphs"): the step captured once, replayed.
// ---------------------------------------------------------------------------

// Results that device ops would read back at once, deferred: the embedding's
// check of its token ids, the cross-entropy's loss and check of its targets.
// A captured CUDA graph cannot wait for the device mid-way, so while a
// DeferredChecks is active on this thread (DeferScope) those ops write their
// results into its slots (claimed in call order, at capture) and return
// without waiting; collect() then reads every slot back with one copy after
// each run of the captured work.
class DeferredChecks {
 public:
  // Room for `capacity` results (an op claiming one more throws).
  explicit DeferredChecks(size_t capacity);
  ~DeferredChecks();
  DeferredChecks(const DeferredChecks&) = delete;
  DeferredChecks& operator=(const DeferredChecks&) = delete;
  // Waits for the work queued on the compute stream, copies the slots back,
  // then throws the error that the first flagged slot's op throws eagerly (in
  // claim order, with its message), else returns the values the ops would
  // have returned (the losses), in claim order.
  std::vector<double> collect();
  // Slots claimed so far.
  size_t claimed() const;

  struct Impl;  // core/cuda/graph.cu
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Makes `checks` this thread's active DeferredChecks for the scope's lifetime
// (the previous one, usually none, afterwards).
class DeferScope {
 public:
  explicit DeferScope(DeferredChecks& checks);
  ~DeferScope();
  DeferScope(const DeferScope&) = delete;
  DeferScope& operator=(const DeferScope&) = delete;

 private:
  DeferredChecks* previous_;
};

// A CUDA graph of the work one function queues on the compute stream.
// capture() runs `work` with the stream capturing (nothing runs on the GPU:
// kernels, copies, allocations and frees are recorded) and instantiates the
// graph; a failure (an op that cannot be captured, such as a wait for the
// device) ends the capture and throws. launch() queues one run of it on the
// compute stream, with the pointers and launch arguments of the capture.
class StreamGraph {
 public:
  StreamGraph();
  ~StreamGraph();
  StreamGraph(const StreamGraph&) = delete;
  StreamGraph& operator=(const StreamGraph&) = delete;
  void capture(const std::function<void()>& work);
  void launch();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Waits for the compute stream, then hands back to the driver the memory
// pool's cached free blocks and the physical memory idle graphs keep for their
// allocations (mapped again at their next launch). A graph's allocations come
// from its own memory, the eager work's from the pool: without this, work run
// eagerly beside a graph (the eager steps before its capture, evaluation) would
// hold the activations' memory twice.
void trim_memory_pool();

// Marks the region an external profiler records when it is started with
// profiling off (`ncu --profile-from-start off`): cudaProfilerStart / Stop.
// No effect otherwise, and none in a process without a CUDA device.
void profiler_start();
void profiler_stop();

}  // namespace attnres::cuda
