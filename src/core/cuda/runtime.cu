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

#include <cstdint>
#include <cstdio>
#include <string>
#include <mutex>
#include <unordered_map>

#include "core/cuda/runtime.cuh"
#include "core/device.h"

namespace attnres::cuda {

namespace {

class Runtime {
 public:
  Runtime() {
    int n = 0;
    ATTNRES_CUDA_CHECK(cudaGetDeviceCount(&n));
    if (n == 0) fail("no CUDA device found");
    ATTNRES_CUDA_CHECK(cudaSetDevice(0));
    ATTNRES_CUDA_CHECK(cudaGetDeviceProperties(&props_, 0));
    ATTNRES_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    ATTNRES_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
    ATTNRES_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, 0));
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

  cudaStream_t compute() const { return compute_; }
  cudaStream_t comm() const { return comm_; }
  const cudaDeviceProp& props() const { return props_; }

  void* alloc(size_t bytes) {
    void* p = nullptr;
    cudaError_t err = cudaMallocAsync(&p, bytes, compute_);
    if (err != cudaSuccess) {
      cudaGetLastError();
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
  cudaDeviceProp props_{};
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  std::mutex mu_;
  size_t in_use_ = 0, peak_ = 0;
  std::unordered_map<void*, size_t> sizes_bytes_;
};

Runtime& runtime() {
  static Runtime rt;  // see runtime.cuh for why this is process-wide
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

std::string device_description(int i) {
  cudaDeviceProp p{};
  ATTNRES_CUDA_CHECK(cudaGetDeviceProperties(&p, i));
  char buf[320];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.1f GiB, %d SMs)", p.name, p.major, p.minor,
                p.totalGlobalMem / 1073741824.0, p.multiProcessorCount);
  return buf;
}

double peak_dense_flops(int i, bool bf16) {
  cudaDeviceProp p{};
  ATTNRES_CUDA_CHECK(cudaGetDeviceProperties(&p, i));
  const std::string name = p.name;
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  // SXM parts (the PCIe H100 is slower: 756 / 51 TFLOP/s).
  if (has("H100") && has("PCIe")) return bf16 ? 756e12 : 51e12;
  if (has("H100") || has("H200") || has("GH200")) return bf16 ? 989e12 : 67e12;
  if (has("A100")) return bf16 ? 312e12 : 19.5e12;
  return 0;
}

cudaStream_t compute_stream() { return runtime().compute(); }
cudaStream_t comm_stream() { return runtime().comm(); }
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
size_t free_memory() {
  runtime();  // the context, streams and pool first: what they take is not free
  size_t free = 0, total = 0;
  ATTNRES_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
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
