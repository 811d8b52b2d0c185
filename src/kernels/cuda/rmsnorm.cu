// CUDA RMSNorm (see kernels/rmsnorm.h).
//
// Forward: one block per row; the row's sum of squares is a block reduction
// (fixed order), then y = x * rstd * g in the CPU's operation order.
// Backward: one block per chunk of kRowChunk rows, taking the rows in order;
// the threads span the columns, so each thread owns the same columns in every
// row. Per row: dot = sum_k dy_k g_k x_k (block reduction), then
//   dx_j += r g_j dy_j - x_j r^3 dot / d.
// dgain is deterministic without atomics: each thread adds its columns'
// dy_j x_j r over the chunk's rows, in row order, into a per-chunk partial row
// (fp32, in shared memory when it fits); a second kernel sums the partial rows
// of all chunks in chunk order (in double) and adds the result into dgain.
//
// Rows are read and written in 16-byte packs when the tensors' pointers and d
// allow it (rows can be slices at any offset), element by element otherwise.
#include "kernels/cuda/rmsnorm.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/math.h"

namespace attnres::kernels::cuda {

namespace {

constexpr int64_t kRowChunk = 32;     // rows per backward block (and per dgain partial)
constexpr int kMaxThreads = 256;
constexpr int64_t kSmemLimit = 48 * 1024;  // dynamic shared memory without an opt-in

// Threads per row: about 4 packs per thread, a whole number of warps.
int threads_for(int64_t packs) {
  const int64_t t = ceil_div(ceil_div(packs, 4), 32) * 32;
  return static_cast<int>(std::max<int64_t>(32, std::min<int64_t>(t, kMaxThreads)));
}

// One pack of a row (N = W for the vector path, 1 for the scalar one); gain
// may be null.
template <typename T, int N>
struct RowPack {
  float x[N], g[N];
  __device__ __forceinline__ void load_x_g(const T* xr, const T* gain, int64_t j) {
    const Vec<T, N> vx = load<N>(xr + j);
#pragma unroll
    for (int e = 0; e < N; ++e) x[e] = to_f32(vx.v[e]);
    if (gain) {
      const Vec<T, N> vg = load<N>(gain + j);
#pragma unroll
      for (int e = 0; e < N; ++e) g[e] = to_f32(vg.v[e]);
    }
  }
};

template <typename T, bool kVec>
__global__ void rmsnorm_forward_kernel(T* y, float* rstd, const T* x, const T* gain, int64_t d,
                                       float eps) {
  __shared__ float scratch[32];
  constexpr int N = kVec ? static_cast<int>(16 / sizeof(T)) : 1;
  const int64_t row = blockIdx.x;
  const T* xr = x + row * d;
  T* yr = y + row * d;
  const int64_t packs = d / N;  // kVec only when N divides d

  float ss = 0;
  for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
    const Vec<T, N> v = load<N>(xr + k * N);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float a = to_f32(v.v[e]);
      ss += a * a;
    }
  }
  ss = block_sum(ss, scratch);
  const float r = math::rstd_from_sum_sq<float>(ss, d, eps);
  if (threadIdx.x == 0) rstd[row] = r;

  for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
    RowPack<T, N> p;
    p.load_x_g(xr, gain, k * N);
    Vec<T, N> out;
#pragma unroll
    for (int e = 0; e < N; ++e) out.v[e] = from_f32<T>(gain ? p.x[e] * r * p.g[e] : p.x[e] * r);
    store<N>(yr + k * N, out);
  }
}

// partial: [n_chunks, d] fp32, or null (no dgain). acc_in_smem: accumulate the
// chunk's partial row in dynamic shared memory (d floats) and write it once;
// otherwise accumulate in place in `partial` (each thread owns its columns).
template <typename T, bool kVec>
__global__ void rmsnorm_backward_kernel(T* dx, float* partial, const T* dy, const T* x,
                                        const float* rstd, const T* gain, int64_t N_rows,
                                        int64_t d, bool acc_in_smem) {
  extern __shared__ float smem_acc[];
  __shared__ float scratch[32];
  constexpr int N = kVec ? static_cast<int>(16 / sizeof(T)) : 1;
  const int64_t packs = d / N;
  const int64_t row0 = int64_t(blockIdx.x) * kRowChunk;
  const int64_t row1 = row0 + kRowChunk < N_rows ? row0 + kRowChunk : N_rows;
  float* acc = nullptr;
  if (partial) {
    acc = acc_in_smem ? smem_acc : partial + int64_t(blockIdx.x) * d;
    for (int64_t k = threadIdx.x; k < packs; k += blockDim.x)
#pragma unroll
      for (int e = 0; e < N; ++e) acc[k * N + e] = 0.f;
  }

  for (int64_t row = row0; row < row1; ++row) {
    const T* xr = x + row * d;
    const T* dyr = dy + row * d;
    T* dxr = dx + row * d;
    const float r = rstd[row];

    float dot = 0;  // sum_k dy_k g_k x_k
    for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
      RowPack<T, N> p;
      p.load_x_g(xr, gain, k * N);
      const Vec<T, N> vdy = load<N>(dyr + k * N);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float dyv = to_f32(vdy.v[e]);
        dot += gain ? dyv * p.g[e] * p.x[e] : dyv * p.x[e];
      }
    }
    dot = block_sum(dot, scratch);
    const float c3 = r * r * r * dot / static_cast<float>(d);

    for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
      RowPack<T, N> p;
      p.load_x_g(xr, gain, k * N);
      const Vec<T, N> vdy = load<N>(dyr + k * N);
      Vec<T, N> vdx = load<N>(dxr + k * N);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float dyv = to_f32(vdy.v[e]);
        const float grad = gain ? r * p.g[e] * dyv - c3 * p.x[e] : r * dyv - c3 * p.x[e];
        vdx.v[e] = from_f32<T>(to_f32(vdx.v[e]) + grad);
        if (acc) acc[k * N + e] += dyv * p.x[e] * r;
      }
      store<N>(dxr + k * N, vdx);
    }
  }

  if (partial && acc_in_smem) {
    float* out = partial + int64_t(blockIdx.x) * d;
    for (int64_t k = threadIdx.x; k < packs; k += blockDim.x)
#pragma unroll
      for (int e = 0; e < N; ++e) out[k * N + e] = acc[k * N + e];
  }
}

// dgain[j] += sum over chunks c (in order) of partial[c, j].
__global__ void dgain_reduce_kernel(float* dgain, const float* partial, int64_t n_chunks,
                                    int64_t d) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  double s = 0;
  for (int64_t c = 0; c < n_chunks; ++c) s += static_cast<double>(partial[c * d + j]);
  dgain[j] += static_cast<float>(s);
}

}  // namespace

void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor* gain, float eps) {
  const int64_t N = x.dim(0), d = x.dim(1);
  if (N == 0) return;
  float* pr = dptr<float>(rstd);
  dispatch_float(x, "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = 16 / sizeof(T);
    T* py = dptr<T>(y);
    const T* px = dptr<T>(x);
    const T* pg = dptr_or_null<T>(gain);
    const bool vec = d % W == 0 && aligned(py, 16) && aligned(px, 16) && (!pg || aligned(pg, 16));
    if (vec)
      rmsnorm_forward_kernel<T, true>
          <<<static_cast<unsigned>(N), threads_for(d / W), 0, stream()>>>(py, pr, px, pg, d, eps);
    else
      rmsnorm_forward_kernel<T, false><<<static_cast<unsigned>(N), threads_for(d), 0, stream()>>>(py, pr, px, pg, d, eps);
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

void rmsnorm_backward(Tensor& dx, Tensor* dgain, const Tensor& dy, const Tensor& x,
                      const Tensor& rstd, const Tensor* gain) {
  const int64_t N = x.dim(0), d = x.dim(1);
  if (N == 0 || d == 0) return;
  const float* pr = dptr<float>(rstd);
  float* pdg = dgain ? dptr<float>(*dgain) : nullptr;
  const int64_t n_chunks = ceil_div(N, kRowChunk);
  Tensor partial_buf;
  float* partial = nullptr;
  if (pdg) {
    partial_buf = Tensor::empty({n_chunks, d}, DType::F32, Device::CUDA);
    partial = static_cast<float*>(partial_buf.raw());
  }
  const bool acc_in_smem = pdg && d * int64_t(sizeof(float)) <= kSmemLimit;
  const size_t smem = acc_in_smem ? static_cast<size_t>(d) * sizeof(float) : 0;

  dispatch_float(x, "rmsnorm_backward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = 16 / sizeof(T);
    T* pdx = dptr<T>(dx);
    const T* pdy = dptr<T>(dy);
    const T* px = dptr<T>(x);
    const T* pg = dptr_or_null<T>(gain);
    const bool vec = d % W == 0 && aligned(pdx, 16) && aligned(pdy, 16) && aligned(px, 16) &&
                     (!pg || aligned(pg, 16));
    if (vec)
      rmsnorm_backward_kernel<T, true><<<static_cast<unsigned>(n_chunks), threads_for(d / W), smem, stream()>>>(
          pdx, partial, pdy, px, pr, pg, N, d, acc_in_smem);
    else
      rmsnorm_backward_kernel<T, false><<<static_cast<unsigned>(n_chunks), threads_for(d), smem, stream()>>>(
          pdx, partial, pdy, px, pr, pg, N, d, acc_in_smem);
    ATTNRES_CUDA_CHECK_LAUNCH();
  });

  if (pdg) {
    dgain_reduce_kernel<<<static_cast<unsigned>(ceil_div(d, 256)), 256, 0, stream()>>>(pdg, partial, n_chunks, d);
    ATTNRES_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace attnres::kernels::cuda
