#include "kernels/cuda/device.h"

#include <cstdio>

#include "kernels/cuda/check.h"

namespace attnres::cuda {

int device_count() {
  int n = 0;
  // No driver / no GPU is not an error here: the caller skips GPU work.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}

std::string device_description(int i) {
  cudaDeviceProp p{};
  ATTNRES_CUDA_CHECK(cudaGetDeviceProperties(&p, i));
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.1f GiB)", p.name, p.major, p.minor,
                p.totalGlobalMem / 1073741824.0);
  return buf;
}

namespace {
__global__ void axpy_kernel(const float* a, const float* b, float s, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] * s + b[i];
}

// RAII device buffer.
struct DeviceBuffer {
  float* p = nullptr;
  explicit DeviceBuffer(size_t n) { ATTNRES_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float))); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};
}  // namespace

std::vector<float> axpy_on_device(const std::vector<float>& a, const std::vector<float>& b, float s) {
  ATTNRES_CHECK(a.size() == b.size(), "axpy_on_device: size mismatch");
  const int n = static_cast<int>(a.size());
  DeviceBuffer da(n), db(n), dout(n);
  ATTNRES_CUDA_CHECK(cudaMemcpy(da.p, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  ATTNRES_CUDA_CHECK(cudaMemcpy(db.p, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  axpy_kernel<<<(n + 255) / 256, 256>>>(da.p, db.p, s, dout.p, n);
  ATTNRES_CUDA_CHECK(cudaGetLastError());
  std::vector<float> out(n);
  ATTNRES_CUDA_CHECK(cudaMemcpy(out.data(), dout.p, n * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace attnres::cuda
