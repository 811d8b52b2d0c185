// CUDA reductions and elementwise helpers (see kernels/reduce.h).
//
// Elementwise ops run through launch_elementwise (common.cuh).
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

// Many tensors per launch: the global gradient norm reads ~100 tensors per
// step, most of them small, and two launches each would leave the GPU idle
// between tiny kernels. A batch holds up to kSumBatch tensors of one dtype;
// tensor i gets sum_blocks(n_i) consecutive blocks of the partial kernel and
// block i of the final kernel, so every tensor is summed exactly as it would
// be alone (same blocks, same order, same bits).
constexpr int kSumBatch = 64;

template <typename T>
struct SumBatch {
  const T* x[kSumBatch];
  int64_t n[kSumBatch];
  int64_t first_block[kSumBatch + 1];  // tensor i owns blocks [first_block[i], first_block[i + 1])
  bool vec[kSumBatch];                 // 16-byte aligned: packs as single loads
  int count;
};

// Thread `tid` of a tensor's blocks owns the packs k = tid, tid + stride, ...
// of W elements (and then the tail elements nv*W + tid, ...), whether it
// loads them as packs or not. Block sums into partial[blockIdx.x].
template <typename T>
__global__ void sum_squares_partials(SumBatch<T> batch, double* partial) {
  __shared__ double scratch[32];
  constexpr int W = pack_of<T>();
  const BatchSlot slot = batch_slot(batch);
  const int i = slot.member;
  const int64_t tid = slot.tid, stride = slot.stride;
  const T* x = batch.x[i];
  const int64_t n = batch.n[i];
  const int64_t nv = n / W;
  const bool vec = batch.vec[i];
  double s = 0;
  for (int64_t k = tid; k < nv; k += stride) {
    Vec<T, W> a;
    if (vec) {
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
  for (int64_t k = nv * W + tid; k < n; k += stride) {
    const double e = to_f32(x[k]);
    s += e * e;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// Block i (kSumMaxBlocks threads) adds tensor i's block partials: out[i].
template <typename T>
__global__ void sum_partials(SumBatch<T> batch, const double* partial, double* out) {
  __shared__ double scratch[32];
  const int64_t first = batch.first_block[blockIdx.x];
  const int64_t blocks = batch.first_block[blockIdx.x + 1] - first;
  double s = threadIdx.x < blocks ? partial[first + threadIdx.x] : 0.0;
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// Queues the sums of squares of xs (one dtype, at most kSumBatch tensors)
// into out[0 .. xs.size()) (device memory); no wait.
template <typename T>
void queue_sum_squares(Span<const Tensor> xs, double* out) {
  SumBatch<T> batch{};
  batch.count = static_cast<int>(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const int64_t n = xs[i].numel();
    batch.x[i] = n > 0 ? dptr<T>(xs[i]) : nullptr;
    batch.n[i] = n;
    batch.vec[i] = aligned(batch.x[i], 16);
    batch.first_block[i + 1] = batch.first_block[i] + sum_blocks(n);
  }
  const int64_t blocks = batch.first_block[xs.size()];
  Tensor buf = Tensor::empty({blocks}, DType::F64, Device::CUDA);
  double* partial = static_cast<double*>(buf.raw());
  sum_squares_partials<T><<<static_cast<unsigned>(blocks), kSumThreads, 0, stream()>>>(batch,
                                                                                       partial);
  ATTNRES_CUDA_CHECK_LAUNCH();
  sum_partials<T><<<static_cast<unsigned>(xs.size()), kSumMaxBlocks, 0, stream()>>>(batch, partial,
                                                                                     out);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

}  // namespace

double sum_squares(const Tensor& x) {
  if (x.numel() == 0) return 0.0;  // no launch, no wait
  return sum_squares_each(Span<const Tensor>(&x, 1))[0];
}

std::vector<double> sum_squares_each(Span<const Tensor> xs) {
  std::vector<double> out(xs.size(), 0.0);
  if (xs.empty()) return out;
  Tensor results = Tensor::empty({static_cast<int64_t>(xs.size())}, DType::F64, Device::CUDA);
  double* r = static_cast<double*>(results.raw());
  // Batches of consecutive tensors of one dtype, at most kSumBatch each.
  for (size_t i = 0; i < xs.size();) {
    size_t j = i + 1;
    while (j < xs.size() && j - i < size_t(kSumBatch) && xs[j].dtype() == xs[i].dtype()) ++j;
    dispatch_float(xs[i], "sum_squares", [&](auto tag) {
      queue_sum_squares<decltype(tag)>(xs.subspan(i, j - i), r + i);
    });
    i = j;
  }
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
