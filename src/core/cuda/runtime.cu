// core/device.h on CUDA: one compute stream, one communication stream and a
// caching allocator, created on first use.
//
// The allocator is the driver's stream-ordered memory pool (cudaMallocAsync)
// with its release threshold raised to "never": freed blocks stay in the pool
// and are handed out again without a cudaMalloc/cudaFree round trip (which
// would synchronise the device). Allocation and release are ordered on the
// compute stream, so a block released by the host while a kernel still reads
// it is only reused by work queued after that kernel.
#include <cuda_profiler_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cuda/runtime.cuh"
#include "core/device.h"

namespace attnres::cuda {

namespace {

class Runtime {
 public:
  explicit Runtime(int device) : device_(device) {
    int n = 0;
    ATTNRES_CUDA_CHECK(cudaGetDeviceCount(&n));
    if (n == 0) fail("no CUDA device found");
    if (device >= n)
      fail("CUDA device ", device, " was chosen but only ", n, " are visible");
    ATTNRES_CUDA_CHECK(cudaSetDevice(device));
    ATTNRES_CUDA_CHECK(cudaGetDeviceProperties(&props_, device));
    ATTNRES_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    ATTNRES_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
    ATTNRES_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, device));
    uint64_t keep_all = UINT64_MAX;
    ATTNRES_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_all));
  }
  ~Runtime() {
    // At exit the driver may already be shutting down: ignore errors here.
    cudaStreamSynchronize(compute_);
    cudaStreamDestroy(comm_);
    cudaStreamDestroy(compute_);
  }
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int device() const { return device_; }
  cudaStream_t compute() const { return compute_; }
  cudaStream_t comm() const { return comm_; }
  const cudaDeviceProp& props() const { return props_; }

  void* alloc(size_t bytes) {
    void* p = nullptr;
    const cudaError_t err = cudaMallocAsync(&p, bytes, compute_);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // clears a non-sticky error; a sticky one stays
      // Only cudaErrorMemoryAllocation is "out of memory" (bad input: exit 2).
      // Anything else, e.g. a sticky illegal address left by an earlier
      // kernel and reported here by the next call, is an internal error.
      if (err != cudaErrorMemoryAllocation)
        fail_internal("cudaMallocAsync of ", bytes, " bytes failed: ", cudaGetErrorName(err), " (",
                      cudaGetErrorString(err), "); an error left by earlier device work may be "
                      "reported here: CUDA_LAUNCH_BLOCKING=1 finds the kernel that caused it");
      MemoryStats s = stats();
      fail("out of GPU memory allocating ", bytes / 1048576.0, " MiB (", s.in_use / 1073741824.0,
           " GiB in use by tensors, peak ", s.peak / 1073741824.0, " GiB, pool ",
           s.reserved / 1073741824.0, " GiB): ", cudaGetErrorString(err),
           ". Reduce training.micro_batch_size or training.seq_len.");
    }
    std::lock_guard<std::mutex> lock(mu_);
    in_use_ += bytes;
    sizes_bytes_[p] = bytes;
    if (in_use_ > peak_) peak_ = in_use_;
    return p;
  }
  void release(void* p) {
    if (!p) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sizes_bytes_.find(p);
      if (it != sizes_bytes_.end()) {
        in_use_ -= it->second;
        sizes_bytes_.erase(it);
      }
    }
    cudaFreeAsync(p, compute_);  // no throw: called from destructors
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = in_use_;
  }
  void trim() {
    ATTNRES_CUDA_CHECK(cudaStreamSynchronize(compute_));
    ATTNRES_CUDA_CHECK(cudaDeviceGraphMemTrim(device_));  // graphs' memory, mapped again at launch
    ATTNRES_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
  }
  MemoryStats stats() {
    MemoryStats s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s.in_use = in_use_;
      s.peak = peak_;
    }
    uint64_t reserved = 0;
    if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess)
      s.reserved = reserved;
    return s;
  }

 private:
  int device_ = 0;
  cudaDeviceProp props_{};
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  std::mutex mu_;
  size_t in_use_ = 0, peak_ = 0;
  std::unordered_map<void*, size_t> sizes_bytes_;
};

// The device select_device() chose, read once when the runtime starts, and
// whether it has started (select_device refuses to switch after that). Part
// of the process-wide runtime, like the runtime object itself.
std::atomic<int> g_chosen_device{0};
std::atomic<bool> g_started{false};

Runtime& runtime() {
  static Runtime rt(g_chosen_device.load());  // see runtime.cuh for why this is process-wide
  g_started.store(true);
  return rt;
}

cudaMemcpyKind kind(Side dst, Side src) {
  if (src == Side::Host) return dst == Side::Host ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice;
  return dst == Side::Host ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
}

__global__ void fill_u32_kernel(unsigned* p, unsigned pattern, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = pattern;
}

}  // namespace

bool compiled() { return true; }

int device_count() {
  int n = 0;
  // No driver / no GPU is not an error here: callers skip GPU work.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the error
    return 0;
  }
  return n;
}

void select_device(int index) {
  if (g_started.load()) {
    ATTNRES_CHECK(runtime().device() == index, "select_device(", index,
                  ") after the CUDA runtime started on device ", runtime().device());
    return;
  }
  const int n = device_count();
  if (index < 0 || index >= n) fail("CUDA device ", index, " was chosen but ", n, " are visible");
  // Current for this thread now (a CUDA-aware MPI initialised after this
  // sees it), and for the runtime when it starts.
  ATTNRES_CUDA_CHECK(cudaSetDevice(index));
  g_chosen_device.store(index);
}

std::string pci_bus_id() {
  char buf[64] = {};
  ATTNRES_CUDA_CHECK(cudaDeviceGetPCIBusId(buf, sizeof buf, runtime().device()));
  return buf;
}

std::string device_description() {
  const cudaDeviceProp& p = runtime().props();
  char buf[320];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.1f GiB, %d SMs)", p.name, p.major, p.minor,
                p.totalGlobalMem / 1073741824.0, p.multiProcessorCount);
  return buf;
}

double peak_dense_flops(bool bf16) {
  const std::string name = runtime().props().name;
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  // SXM parts (the PCIe H100 is slower: 756 / 51 TFLOP/s).
  if (has("H100") && has("PCIe")) return bf16 ? 756e12 : 51e12;
  if (has("H100") || has("H200") || has("GH200")) return bf16 ? 989e12 : 67e12;
  if (has("A100")) return bf16 ? 312e12 : 19.5e12;
  return 0;
}

cudaStream_t compute_stream() { return runtime().compute(); }
cudaStream_t comm_stream() { return runtime().comm(); }
bool compute_stream_capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ATTNRES_CUDA_CHECK(cudaStreamIsCapturing(runtime().compute(), &status));
  return status != cudaStreamCaptureStatusNone;
}
const cudaDeviceProp& device_properties() { return runtime().props(); }

void* alloc(size_t bytes) { return runtime().alloc(bytes == 0 ? 1 : bytes); }
void release(void* p) { runtime().release(p); }

void copy(void* dst, Side dst_side, const void* src, Side src_side, size_t bytes) {
  if (bytes == 0) return;
  cudaStream_t s = runtime().compute();
  ATTNRES_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind(dst_side, src_side), s));
  // A host destination (or a pageable host source) must be complete before
  // the caller touches its memory again.
  if (dst_side == Side::Host || src_side == Side::Host) ATTNRES_CUDA_CHECK(cudaStreamSynchronize(s));
}

void copy_async(void* dst, Side dst_side, const void* src, Side src_side, size_t bytes) {
  if (bytes == 0) return;
  ATTNRES_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind(dst_side, src_side), runtime().compute()));
}

void zero(void* p, size_t bytes) {
  if (bytes) ATTNRES_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, runtime().compute()));
}

void fill_u32(void* p, unsigned pattern, size_t count) {
  if (!count) return;
  fill_u32_kernel<<<1024, 256, 0, runtime().compute()>>>(static_cast<unsigned*>(p), pattern, count);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void synchronize() {
  if (device_count() == 0) return;  // nothing can have been queued
  ATTNRES_CUDA_CHECK(cudaStreamSynchronize(runtime().compute()));
}

MemoryStats memory_stats() { return runtime().stats(); }
void reset_peak_memory() { runtime().reset_peak(); }
void trim_memory_pool() { runtime().trim(); }
size_t free_memory() {
  runtime();  // the context, streams and pool first: what they take is not free
  size_t free = 0, total = 0;
  ATTNRES_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

HostBuffer::HostBuffer(size_t bytes, bool pinned) : bytes_(bytes) {
  if (bytes == 0) return;
  if (pinned && device_count() > 0) {
    runtime();  // on this process's device
    ATTNRES_CUDA_CHECK(cudaHostAlloc(&data_, bytes, cudaHostAllocDefault));
    pinned_ = true;
  } else {
    data_ = std::malloc(bytes);
    if (!data_) fail("out of host memory allocating ", bytes, " bytes");
  }
}

HostBuffer::~HostBuffer() {
  if (pinned_) cudaFreeHost(data_);  // no throw: a destructor
  else std::free(data_);
}

struct StreamClock::Impl {
  std::vector<cudaEvent_t> events;  // created on demand, reused after reset()
  size_t used = 0;
  ~Impl() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
};

StreamClock::StreamClock() : impl_(std::make_unique<Impl>()) { runtime(); }
StreamClock::~StreamClock() = default;

void StreamClock::reset() { impl_->used = 0; }

int StreamClock::mark() {
  if (impl_->used == impl_->events.size()) {
    cudaEvent_t e = nullptr;
    ATTNRES_CUDA_CHECK(cudaEventCreate(&e));  // with timing
    impl_->events.push_back(e);
  }
  ATTNRES_CUDA_CHECK(cudaEventRecord(impl_->events[impl_->used], runtime().compute()));
  return static_cast<int>(impl_->used++);
}

double StreamClock::seconds(int a, int b) const {
  ATTNRES_CHECK(a >= 0 && b >= 0 && static_cast<size_t>(std::max(a, b)) < impl_->used,
                "StreamClock: no point ", std::max(a, b));
  cudaEvent_t from = impl_->events[static_cast<size_t>(a)];
  cudaEvent_t to = impl_->events[static_cast<size_t>(b)];
  ATTNRES_CUDA_CHECK(cudaEventSynchronize(to));
  float ms = 0;
  ATTNRES_CUDA_CHECK(cudaEventElapsedTime(&ms, from, to));
  return ms * 1e-3;
}

void profiler_start() {
  if (device_count() == 0) return;
  // Work queued before the region stays out of it.
  synchronize();
  ATTNRES_CUDA_CHECK(cudaProfilerStart());
}

void profiler_stop() {
  if (device_count() == 0) return;
  synchronize();
  ATTNRES_CUDA_CHECK(cudaProfilerStop());
}

}  // namespace attnres::cuda
