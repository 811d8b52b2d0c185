// CUDA RMSNorm (see kernels/rmsnorm.h).
//
// Forward: one block per row; the row's sum of squares is a block reduction
// (fixed order), then y = x * rstd * g in the CPU's operation order.
// Backward: one warp per row (the row's reduction is a warp shuffle, no block
// barrier), 8 warps per block, 8 rows per warp. Per row:
// dot = sum_k dy_k g_k x_k, then dx_j (+)= r g_j dy_j - x_j r^3 dot / d.
// dgain is deterministic without atomics: a lane owns the same columns in
// every row, so it adds its columns' dy_j x_j r over the warp's rows (in row
// order) into the warp's accumulator row (fp32, in shared memory when it
// fits); the block sums its warps' rows in warp order into one partial row,
// and a second kernel sums the blocks' partial rows in block order (in double,
// a fixed tree) into dgain. Every order depends on N and d only.
//
// (A first version gave each 32-row chunk one block whose threads spanned the
// columns: at d = 768 that is a single warp per block walking 32 rows with
// two block reductions each, and it ran at 20% of the memory floor on an H100.)
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

constexpr int kMaxThreads = 256;
// Backward: rows per warp, warps per block (fewer when their dgain rows would
// not fit in shared memory), and the shared memory we use without an opt-in.
constexpr int64_t kRowsPerWarp = 8;
constexpr int kBackwardWarps = 8;
constexpr int64_t kSmemLimit = 48 * 1024;

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
  constexpr int N = kVec ? pack_of<T>() : 1;
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

// Backward: one warp per row. A block of `warps` warps takes warps *
// kRowsPerWarp consecutive rows, warp w the rows w, w + warps, ... of them.
// partial: [gridDim.x, d] fp32 (the block's dgain contribution), or null (no
// dgain). acc: per-warp accumulator rows, `warps` x d floats in dynamic shared
// memory when they fit, else this block's slice of a global scratch buffer.
template <typename T, bool kVec>
__global__ void rmsnorm_backward_kernel(T* dx, float* partial, float* acc_global, const T* dy,
                                        const T* x, const float* rstd, const T* gain,
                                        int64_t N_rows, int64_t d, bool accumulate) {
  extern __shared__ float acc_smem[];
  constexpr int W = kVec ? pack_of<T>() : 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t packs = d / W;  // kVec only when W divides d
  float* acc_block = acc_global ? acc_global + int64_t(blockIdx.x) * warps * d : acc_smem;
  float* acc = partial ? acc_block + int64_t(warp) * d : nullptr;
  if (acc)  // each lane zeroes the elements it accumulates below: no warp sync needed
    for (int64_t k = lane; k < packs; k += 32)
#pragma unroll
      for (int e = 0; e < W; ++e) acc[k * W + e] = 0.f;

  const int64_t row0 = int64_t(blockIdx.x) * warps * kRowsPerWarp;
  const int64_t row_end =
      row0 + int64_t(warps) * kRowsPerWarp < N_rows ? row0 + int64_t(warps) * kRowsPerWarp : N_rows;
  for (int64_t row = row0 + warp; row < row_end; row += warps) {
    const T* xr = x + row * d;
    const T* dyr = dy + row * d;
    T* dxr = dx + row * d;
    const float r = rstd[row];

    float dot = 0;  // sum_k dy_k g_k x_k
#pragma unroll 4
    for (int64_t k = lane; k < packs; k += 32) {
      RowPack<T, W> p;
      p.load_x_g(xr, gain, k * W);
      const Vec<T, W> vdy = load<W>(dyr + k * W);
#pragma unroll
      for (int e = 0; e < W; ++e) {
        const float dyv = to_f32(vdy.v[e]);
        dot += gain ? dyv * p.g[e] * p.x[e] : dyv * p.x[e];
      }
    }
    dot = warp_sum(dot);  // the same fixed shuffle tree in every lane
    const float c3 = r * r * r * dot / static_cast<float>(d);

    // Second read of the row (an L1 hit for a row of a few KiB). Each lane
    // reads dy_j before writing dx_j, so dx may even alias dy.
#pragma unroll 4
    for (int64_t k = lane; k < packs; k += 32) {
      RowPack<T, W> p;
      p.load_x_g(xr, gain, k * W);
      const Vec<T, W> vdy = load<W>(dyr + k * W);
      Vec<T, W> vdx;
      if (accumulate) vdx = load<W>(dxr + k * W);
#pragma unroll
      for (int e = 0; e < W; ++e) {
        const float dyv = to_f32(vdy.v[e]);
        float grad = gain ? r * p.g[e] * dyv - c3 * p.x[e] : r * dyv - c3 * p.x[e];
        if (accumulate) grad += to_f32(vdx.v[e]);
        vdx.v[e] = from_f32<T>(grad);
        if (acc) acc[k * W + e] += dyv * p.x[e] * r;  // lane-owned columns: no race
      }
      store<W>(dxr + k * W, vdx);
    }
  }

  if (!partial) return;
  // The block's partial row: its warps' rows summed in warp order.
  __syncthreads();
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float s = 0.f;
    for (int w = 0; w < warps; ++w) s += acc_block[int64_t(w) * d + j];
    partial[int64_t(blockIdx.x) * d + j] = s;
  }
}

// dgain[j] += sum over the partial rows (in row order, in double) of
// partial[., j]. A block takes 32 columns; its 8 warps take every 8th partial
// row (a 32-column row piece is one coalesced 128-byte read), then the 8
// slice sums are added in slice order: a fixed tree, the same bits every run.
constexpr int kReduceSlices = 8;
__global__ void __launch_bounds__(32 * kReduceSlices)
    dgain_reduce_kernel(float* dgain, const float* partial, int64_t n_rows, int64_t d) {
  __shared__ double slice_sum[kReduceSlices][32];
  const int lane = threadIdx.x & 31, slice = threadIdx.x >> 5;
  const int64_t j = int64_t(blockIdx.x) * 32 + lane;
  double s = 0;
  if (j < d)
    for (int64_t c = slice; c < n_rows; c += kReduceSlices)
      s += static_cast<double>(partial[c * d + j]);
  slice_sum[slice][lane] = s;
  __syncthreads();
  if (slice != 0 || j >= d) return;
  for (int k = 1; k < kReduceSlices; ++k) s += slice_sum[k][lane];
  dgain[j] += static_cast<float>(s);
}

}  // namespace

void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor* gain, float eps) {
  const int64_t N = x.dim(0), d = x.dim(1);
  if (N == 0) return;
  float* pr = dptr<float>(rstd);
  dispatch_float(x, "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = pack_of<T>();
    T* py = dptr<T>(y);
    const T* px = dptr<T>(x);
    const T* pg = dptr_or_null<T>(gain);
    const bool vec = d % W == 0 && aligned(py, 16) && aligned(px, 16) && (!pg || aligned(pg, 16));
    const auto kernel = vec ? rmsnorm_forward_kernel<T, true> : rmsnorm_forward_kernel<T, false>;
    kernel<<<static_cast<unsigned>(N), threads_for(vec ? d / W : d), 0, stream()>>>(py, pr, px, pg,
                                                                                   d, eps);
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

void rmsnorm_backward(Tensor& dx, Tensor* dgain, const Tensor& dy, const Tensor& x,
                      const Tensor& rstd, const Tensor* gain, Store dx_store) {
  const int64_t N = x.dim(0), d = x.dim(1);
  if (N == 0 || d == 0) return;
  const float* pr = dptr<float>(rstd);
  float* pdg = dgain ? dptr<float>(*dgain) : nullptr;
  // Warps per block: as many (up to 8) as have a dgain row in shared memory.
  const int64_t row_bytes = d * int64_t(sizeof(float));
  const bool acc_in_smem = !pdg || row_bytes <= kSmemLimit;
  const int warps =
      pdg && acc_in_smem
          ? static_cast<int>(std::min<int64_t>(kBackwardWarps, kSmemLimit / row_bytes))
          : kBackwardWarps;
  const int64_t blocks = ceil_div(N, warps * kRowsPerWarp);
  const size_t smem = pdg && acc_in_smem ? static_cast<size_t>(warps * row_bytes) : 0;
  Tensor partial_buf, scratch_buf;
  float* partial = nullptr;
  float* scratch = nullptr;
  if (pdg) {
    partial_buf = Tensor::empty({blocks, d}, DType::F32, Device::CUDA);
    partial = static_cast<float*>(partial_buf.raw());
    if (!acc_in_smem) {  // d > 12288: the warps' accumulator rows live in global memory
      scratch_buf = Tensor::empty({blocks * warps, d}, DType::F32, Device::CUDA);
      scratch = static_cast<float*>(scratch_buf.raw());
    }
  }
  const bool accumulate = dx_store == Store::Add;

  dispatch_float(x, "rmsnorm_backward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = pack_of<T>();
    T* pdx = dptr<T>(dx);
    const T* pdy = dptr<T>(dy);
    const T* px = dptr<T>(x);
    const T* pg = dptr_or_null<T>(gain);
    const bool vec = d % W == 0 && aligned(pdx, 16) && aligned(pdy, 16) && aligned(px, 16) &&
                     (!pg || aligned(pg, 16));
    const auto kernel = vec ? rmsnorm_backward_kernel<T, true> : rmsnorm_backward_kernel<T, false>;
    kernel<<<static_cast<unsigned>(blocks), warps * 32, smem, stream()>>>(
        pdx, partial, scratch, pdy, px, pr, pg, N, d, accumulate);
    ATTNRES_CUDA_CHECK_LAUNCH();
  });

  if (pdg) {
    dgain_reduce_kernel<<<static_cast<unsigned>(ceil_div(d, 32)), 32 * kReduceSlices, 0,
                          stream()>>>(pdg, partial, blocks, d);
    ATTNRES_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace attnres::kernels::cuda
