// CUDA reductions and elementwise helpers (see kernels/reduce.h).
//
// Elementwise ops read and write 16-byte packs when every pointer is aligned
// for them (tensors can be row slices at any element offset), with a scalar
// tail; otherwise they run element by element. Either way each element gets
// the same arithmetic, so the results do not depend on the alignment.
//
// sum_squares is deterministic: the grid size depends only on n, each thread
// accumulates a fixed set of elements in double (the same set whether the
// loads are vector or scalar), each block sums its threads in a fixed tree
// order, and one final block sums the per-block partials in a fixed order.
#include "kernels/cuda/reduce.h"

#include <algorithm>
#include <cstdint>

#include "core/device.h"
#include "kernels/cuda/common.cuh"

namespace attnres::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// Runs f.apply<W>(i) on packs [i, i+W) and f.apply<1>(i) on the tail.
template <int W, typename F>
__global__ void elementwise_kernel(int64_t n, F f) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / W;
  for (int64_t k = tid; k < nv; k += stride) f.template apply<W>(k * W);
  if (W > 1)
    for (int64_t i = nv * W + tid; i < n; i += stride) f.template apply<1>(i);
}

template <int W, typename F>
void launch_elementwise(int64_t n, bool vec_ok, const F& f) {
  if (n <= 0) return;
  if (vec_ok)
    elementwise_kernel<W><<<grid_for(ceil_div(n, W), kThreads), kThreads, 0, stream()>>>(n, f);
  else
    elementwise_kernel<1><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(n, f);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

template <typename T>
constexpr int pack_of() { return static_cast<int>(16 / sizeof(T)); }

// ---- elementwise functors -----------------------------------------------------

template <typename T>
struct ScaleOp {
  T* x;
  float s;
  template <int W>
  __device__ void apply(int64_t i) const {
    Vec<T, W> a = load<W>(x + i);
#pragma unroll
    for (int j = 0; j < W; ++j) a.v[j] = from_f32<T>(to_f32(a.v[j]) * s);
    store<W>(x + i, a);
  }
};

template <typename T>
struct AddOp {  // out = a + b (out may be a)
  T* out;
  const T* a;
  const T* b;
  template <int W>
  __device__ void apply(int64_t i) const {
    Vec<T, W> va = load<W>(a + i);
    const Vec<T, W> vb = load<W>(b + i);
#pragma unroll
    for (int j = 0; j < W; ++j) va.v[j] = from_f32<T>(to_f32(va.v[j]) + to_f32(vb.v[j]));
    store<W>(out + i, va);
  }
};

template <typename T>
struct FiniteOp {
  const T* x;
  int* flag;
  template <int W>
  __device__ void apply(int64_t i) const {
    const Vec<T, W> a = load<W>(x + i);
    bool ok = true;
#pragma unroll
    for (int j = 0; j < W; ++j) ok &= static_cast<bool>(isfinite(to_f32(a.v[j])));
    if (!ok) *flag = 1;  // every writer stores the same value
  }
};

template <typename S, typename D>
struct ConvertOp {
  D* dst;
  const S* src;
  template <int W>
  __device__ void apply(int64_t i) const {
    const Vec<S, W> a = load<W>(src + i);
    Vec<D, W> b;
#pragma unroll
    for (int j = 0; j < W; ++j) b.v[j] = from_f32<D>(to_f32(a.v[j]));
    store<W>(dst + i, b);
  }
};

// ---- sum of squares -------------------------------------------------------------

constexpr int kSumThreads = 256;
constexpr int64_t kSumMaxBlocks = 1024;  // the final pass is one block of this many threads
constexpr int64_t kSumPerThread = 16;    // target elements per thread before the grid is capped

// Depends on n only (never on the device), so the summation order is fixed.
int64_t sum_blocks(int64_t n) {
  return std::max<int64_t>(1, std::min(ceil_div(n, kSumThreads * kSumPerThread), kSumMaxBlocks));
}

// Thread `tid` owns the packs k = tid, tid + stride, ... of W elements (and then
// the tail elements nv*W + tid, ...), whether it loads them as packs or not.
template <typename T, bool kVec>
__global__ void sum_squares_partial(const T* x, int64_t n, double* partial) {
  __shared__ double scratch[32];
  constexpr int W = pack_of<T>();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / W;
  double s = 0;
  for (int64_t k = tid; k < nv; k += stride) {
    Vec<T, W> a;
    if (kVec) {
      a = load<W>(x + k * W);
    } else {
#pragma unroll
      for (int j = 0; j < W; ++j) a.v[j] = x[k * W + j];
    }
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const double e = to_f32(a.v[j]);
      s += e * e;
    }
  }
  for (int64_t i = nv * W + tid; i < n; i += stride) {
    const double e = to_f32(x[i]);
    s += e * e;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials(const double* partial, int n, double* out) {
  __shared__ double scratch[32];
  double s = threadIdx.x < n ? partial[threadIdx.x] : 0.0;
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *out = s;
}

// Queues the sum of squares of x into *out (device memory); no wait.
template <typename T>
void sum_squares_t(const T* x, int64_t n, double* out) {
  const int64_t blocks = sum_blocks(n);
  Tensor buf = Tensor::empty({blocks}, DType::F64, Device::CUDA);
  double* partial = static_cast<double*>(buf.raw());
  if (aligned(x, 16))
    sum_squares_partial<T, true><<<blocks, kSumThreads, 0, stream()>>>(x, n, partial);
  else
    sum_squares_partial<T, false><<<blocks, kSumThreads, 0, stream()>>>(x, n, partial);
  ATTNRES_CUDA_CHECK_LAUNCH();
  sum_partials<<<1, kSumMaxBlocks, 0, stream()>>>(partial, static_cast<int>(blocks), out);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

void queue_sum_squares(const Tensor& x, double* out) {
  if (x.numel() == 0) {
    ATTNRES_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream()));
    return;
  }
  dispatch_float(x, "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    sum_squares_t<T>(dptr<T>(x), x.numel(), out);
  });
}

}  // namespace

double sum_squares(const Tensor& x) { return sum_squares_each(Span<const Tensor>(&x, 1))[0]; }

std::vector<double> sum_squares_each(Span<const Tensor> xs) {
  std::vector<double> out(xs.size(), 0.0);
  if (xs.empty()) return out;
  Tensor results = Tensor::empty({static_cast<int64_t>(xs.size())}, DType::F64, Device::CUDA);
  double* r = static_cast<double*>(results.raw());
  for (size_t i = 0; i < xs.size(); ++i) queue_sum_squares(xs[i], r + i);
  ::attnres::cuda::copy(out.data(), ::attnres::cuda::Side::Host, r, ::attnres::cuda::Side::Device,
                        sizeof(double) * xs.size());  // the one wait
  return out;
}

void scale_(Tensor& x, double s) {
  dispatch_float(x, "scale_", [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = pack_of<T>();
    T* p = dptr<T>(x);
    // Like the CPU: the factor is rounded to float once.
    launch_elementwise<W>(x.numel(), aligned(p, 16), ScaleOp<T>{p, static_cast<float>(s)});
  });
}

void add_(Tensor& y, const Tensor& x) { add(y, y, x); }

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  dispatch_float(a, "add", [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = pack_of<T>();
    T* po = dptr<T>(out);
    const T* pa = dptr<T>(a);
    const T* pb = dptr<T>(b);
    const bool vec = aligned(po, 16) && aligned(pa, 16) && aligned(pb, 16);
    launch_elementwise<W>(a.numel(), vec, AddOp<T>{po, pa, pb});
  });
}

bool all_finite(const Tensor& x) {
  if (x.numel() == 0) return true;
  Tensor flag = Tensor::zeros({1}, DType::I32, Device::CUDA);
  int* f = static_cast<int*>(flag.raw());
  dispatch_float(x, "all_finite", [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = pack_of<T>();
    const T* p = dptr<T>(x);
    launch_elementwise<W>(x.numel(), aligned(p, 16), FiniteOp<T>{p, f});
  });
  int host = 0;
  ::attnres::cuda::copy(&host, ::attnres::cuda::Side::Host, f, ::attnres::cuda::Side::Device,
                        sizeof(int));
  return host == 0;
}

void convert(Tensor& dst, const Tensor& src) {
  const int64_t n = src.numel();
  if (src.dtype() == DType::F32 && dst.dtype() == DType::BF16) {
    const float* s = dptr<float>(src);
    bf16* d = dptr<bf16>(dst);
    // Packs of 4: 16 bytes of floats in, 8 bytes of bf16 out.
    launch_elementwise<4>(n, aligned(s, 16) && aligned(d, 8), ConvertOp<float, bf16>{d, s});
  } else if (src.dtype() == DType::BF16 && dst.dtype() == DType::F32) {
    const bf16* s = dptr<bf16>(src);
    float* d = dptr<float>(dst);
    launch_elementwise<4>(n, aligned(s, 8) && aligned(d, 16), ConvertOp<bf16, float>{d, s});
  } else if (src.dtype() == dst.dtype()) {
    dst.copy_from(src);
  } else {
    fail("convert: the CUDA kernels convert F32 <-> BF16, got ", dtype_name(src.dtype()), " -> ",
         dtype_name(dst.dtype()));
  }
}

}  // namespace attnres::kernels::cuda
