// CUDA LM head fused with softmax cross-entropy (see kernels/cross_entropy.h
// and the CPU reference kernels/cpu/cross_entropy.cpp).
//
// The [N, V] logits of a batch (16384 x 50304 fp32 = 3.3 GB) never exist
// whole: rows are processed R at a time (R from a fixed memory budget, see
// chunk_rows), each chunk in four steps on the compute stream:
//
//   1. GEMM      logits[R, V] = h_chunk w^T           fp32 or bf16 output (cuBLASLt,
//                                                     fp32 accumulation either way)
//   2. row pass  one block per row: max and sum of exp (online, one read), the
//                row's loss (fp64, into a per-row buffer), then, in place,
//                dlogits = grad_scale (softmax - onehot) (second read, one write)
//   3. GEMM      dh_chunk += dlogits w                (beta = 1; 0 for Store::Set)
//   4. GEMM      dw       += dlogits^T h_chunk        (beta = 1, fp32 dw)
//
// Logits (the `logits` argument): fp32 by default, so the loss and the softmax
// see the GEMM's fp32 result and an fp32 run matches the CPU; bf16 on request
// (training.logits, a bf16 run only), which halves their bytes (a bf16 logit
// near 30 is off by up to 0.06; the row pass still computes in fp32). For BF16
// h/w the GEMMs of steps 3-4 need bf16 dlogits: over fp32 logits the row pass
// writes them over the first half of each fp32 row (a bf16 matrix with row
// stride 2V), over bf16 logits element for element; no second buffer either way.
//
// DRAM traffic per chunk (BF16 h/w), with E = 4 (fp32 logits) or 2 (bf16):
// E RV (GEMM 1 writes) + E RV (the row pass reads the row; its second read
// hits L2, see kRowThreads) + 2RV (dlogits) + 2RV + 2RV (GEMMs 3, 4 read
// dlogits) + 8Vd (dw read and written) + small: 14 RV bytes of logit traffic
// with fp32 logits, 10 RV with bf16. FLOPs: 6 R V d (three GEMMs). At V =
// 50304, d = 768 the GEMMs (~3.8 TFLOP for N = 16384) and the logit traffic
// (~11.5 GB fp32, ~8.2 GB bf16) are of the same order.
//
// Loss: each row's -log p[target] is written as a double; one block sums the
// N values in a fixed order (deterministic), and one 16-byte copy brings the
// total and the first invalid target position back to the host.
//
// Targets: an id outside [0, V) is recorded by the row pass with an atomicMin
// over positions (the smallest offending position, whatever the block order)
// and reported after the launch, like the CPU does. The row of a bad id gets
// loss 0 and no one-hot term; dh / dw may then have been updated before the
// error is thrown (the step is abandoned anyway).
#include "kernels/cuda/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/device.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"

namespace attnres::kernels::cuda {

namespace {

// Budget of the logits buffer of one chunk. At V = 50304 this is 5248 rows of
// fp32 logits or 10624 of bf16: large enough that the dw GEMM (K = R) amortises its read and write of
// the fp32 dw (8 V d bytes per chunk: 0.3 GB at d = 768) over many rows, small
// enough to leave the activations their memory. (At 512 MiB the dw traffic of
// a 16K-token batch was ~2 GB, ~0.7 ms on an H100.)
constexpr int64_t kChunkBytes = int64_t(1) << 30;
// Row pass: one block of 1024 threads per row, and one block per SM. Pass 2
// re-reads the row that pass 1 just read; with several resident blocks per
// SM the rows in flight (e.g. 4 x 132 rows x 200 KB at V = 50304) overflow
// the L2 and pass 2 reads DRAM again, while one block per SM keeps ~27 MB in
// flight (half that with bf16 logits) and pass 2 mostly hits L2. Residency is held at one block by asking
// for more than half of an SM's shared memory (the kernel does not use it).
constexpr int kRowThreads = 1024;

size_t residency_limiting_smem() {
  const cudaDeviceProp& p = ::attnres::cuda::device_properties();
  return std::min<size_t>(p.sharedMemPerMultiprocessor / 2 + 1024, p.sharedMemPerBlockOptin);
}

int64_t chunk_rows(int64_t N, int64_t V, int64_t logit_bytes) {
  if (V == 0) return N;
  int64_t r = std::max<int64_t>(1, kChunkBytes / (V * logit_bytes));
  if (r >= 128) r = r / 128 * 128;  // whole GEMM tiles
  return std::min(r, N);
}

// The loss sum and the first position with an invalid target (~0 if none),
// read back by the host in one copy: ::attnres::cuda::DeviceStatus.
using Status = ::attnres::cuda::DeviceStatus;

// One block per logit row of the chunk. LogitT is the logits' dtype (float or
// bf16); every value is widened to fp32 as it is read, so the arithmetic is
// the same for both. VEC = 16 / sizeof(LogitT) reads 16-byte packs (needs V a
// multiple of VEC so every row starts 16-byte aligned), VEC = 1 reads scalars.
// OutT is the dlogits dtype: LogitT (overwrites the logits element for
// element) or, over fp32 logits, bf16 (written over the first half of the
// row's bytes: element c of the bf16 row lies in fp32 element c / 2).
template <typename LogitT, typename OutT, int VEC>
__global__ void __launch_bounds__(kRowThreads)
    ce_row_kernel(LogitT* logits, int64_t V, const int32_t* targets, int64_t row0,
                  double* row_loss, Status* status, bool grads, double grad_scale) {
  __shared__ float scratch[32];
  const int64_t i = blockIdx.x;  // row within the chunk
  const int64_t n = row0 + i;    // row within the batch
  LogitT* l = logits + i * V;
  const int32_t t = targets[n];
  const bool valid = t >= 0 && t < V;
  // Read before pass 2 overwrites the row (the block reductions below order it).
  float target_logit = 0.0f;
  if (threadIdx.x == 0) {
    if (valid) target_logit = to_f32(l[t]);
    else atomicMin(&status->bad, static_cast<unsigned long long>(n));
  }

  // Pass 1: this thread's running max m and sum s of exp(x - m), one read.
  float m = -INFINITY, s = 0.0f;
#pragma unroll 4
  for (int64_t c = int64_t(threadIdx.x) * VEC; c < V; c += int64_t(blockDim.x) * VEC) {
    const Vec<LogitT, VEC> q = load<VEC>(l + c);
    float x[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) x[e] = to_f32(q.v[e]);
    float mx = x[0];
#pragma unroll
    for (int e = 1; e < VEC; ++e) mx = fmaxf(mx, x[e]);
    const float nm = fmaxf(m, mx);
    float add = 0.0f;
#pragma unroll
    for (int e = 0; e < VEC; ++e) add += expf(x[e] - nm);
    s = s * expf(m - nm) + add;  // expf(-inf) = 0 on the first element
    m = nm;
  }
  const float M = block_max(m, scratch);
  // Threads that saw no element (m = -inf) add nothing.
  const float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), scratch);

  if (threadIdx.x == 0)
    row_loss[n] = valid ? static_cast<double>(M) + log(static_cast<double>(S)) -
                              static_cast<double>(target_logit)
                        : 0.0;
  if (!grads) return;

  // Pass 2: dlogits = grad_scale softmax - grad_scale onehot, written as OutT
  // at the same element index; the softmax scale is grad_scale / S formed in
  // double, as the CPU does. Tiles of kUnroll vectors per thread keep several
  // loads in flight before the (bf16) barrier.
  const float scale = static_cast<float>(grad_scale / static_cast<double>(S));
  const float gs = static_cast<float>(grad_scale);
  OutT* out = reinterpret_cast<OutT*>(l);
  constexpr int kUnroll = 4;
  const int64_t tile = int64_t(blockDim.x) * VEC * kUnroll;
  for (int64_t base = 0; base < V; base += tile) {
    Vec<LogitT, VEC> x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = base + (int64_t(u) * blockDim.x + threadIdx.x) * VEC;
      if (c < V) x[u] = load<VEC>(l + c);
    }
    if constexpr (sizeof(OutT) < sizeof(LogitT)) {
      // The bf16 writes of tile j land in fp32 elements [j tile/2, (j+1) tile/2),
      // which other threads read in tiles <= j, and never in later tiles' reads
      // (those start at (j+1) tile). So all reads up to this tile must be done.
      __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = base + (int64_t(u) * blockDim.x + threadIdx.x) * VEC;
      if (c >= V) continue;
      Vec<OutT, VEC> o;  // as many bytes as read, or half of them (fp32 -> bf16)
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        float p = expf(to_f32(x[u].v[e]) - M) * scale;
        if (c + e == t) p -= gs;
        o.v[e] = from_f32<OutT>(p);
      }
      store<VEC>(out + c, o);
    }
  }
}

// Sum of the N per-row losses in a fixed order (thread t takes rows t, t +
// blockDim, ... in order, then a fixed tree): the same bits every run.
__global__ void __launch_bounds__(1024) sum_loss_kernel(const double* row_loss, int64_t N,
                                                        Status* status) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) s += row_loss[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) status->value = s;
}

// T: the dtype of h, w and dh (and of the dlogits the GEMMs read); LogitT: of
// the logits (float, or bf16 when T is bf16).
template <typename T, typename LogitT>
double run(const Tensor& h, const Tensor& w, const Tensor& targets, Tensor* dh, Tensor* dw,
           double grad_scale, Store dh_store) {
  const int64_t N = h.dim(0), d = h.dim(1), V = w.dim(0);
  const bool grads = dh || dw;
  const DType ab = h.dtype();
  const T* hp = dptr<T>(h);
  const T* wp = dptr<T>(w);
  const int32_t* tp = dptr<int32_t>(targets);

  const DType logit_dtype = dtype_of_device<LogitT>();
  const int64_t R = chunk_rows(N, V, int64_t(sizeof(LogitT)));
  Tensor logits = Tensor::empty({R, V}, logit_dtype, Device::CUDA);
  Tensor row_loss = Tensor::empty({N}, DType::F64, Device::CUDA);
  // Read back at the end (or after the graph ran, when the step is captured).
  const ::attnres::cuda::StatusSlot slot({"lm_head_cross_entropy", "target", tp, V}, /*value=*/true);
  Status* status = slot.get();

  LogitT* L = dptr<LogitT>(logits);
  // dlogits: in place, T elements, row stride = the logit row's bytes.
  const int64_t ld_dl = V * int64_t(sizeof(LogitT) / sizeof(T));
  constexpr int kVec = pack_of<LogitT>();
  const auto row_kernel =
      V % kVec == 0 ? ce_row_kernel<LogitT, T, kVec> : ce_row_kernel<LogitT, T, 1>;
  const size_t row_smem = residency_limiting_smem();
  allow_smem(row_kernel, row_smem);
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t rows = std::min(R, N - r0);
    const T* hc = hp + r0 * d;
    // 1. logits[rows, V] = h_chunk w^T
    gemm(false, true, rows, V, d, ab, hc, d, wp, d, 0.0f, logit_dtype, L, V);
    // 2. loss per row; dlogits in place
    row_kernel<<<static_cast<unsigned>(rows), kRowThreads, row_smem, stream()>>>(
        L, V, tp, r0, row_loss.data<double>(), status, grads, grad_scale);
    ATTNRES_CUDA_CHECK_LAUNCH();
    if (!grads) continue;
    // 3. dh_chunk[rows, d] (+)= dlogits[rows, V] w[V, d]  (chunks own disjoint rows)
    if (dh)
      gemm(false, false, rows, d, V, ab, L, ld_dl, wp, d, dh_store == Store::Add ? 1.0f : 0.0f,
           dh->dtype(), dptr<T>(*dh) + r0 * d, d);
    // 4. dw[V, d] += dlogits^T[V, rows] h_chunk[rows, d]
    if (dw) gemm(true, false, V, d, rows, ab, L, ld_dl, hc, d, 1.0f, dw->dtype(), dw->raw(), d);
  }

  sum_loss_kernel<<<1, 1024, 0, stream()>>>(row_loss.data<double>(), N, status);
  ATTNRES_CUDA_CHECK_LAUNCH();
  return slot.settle();  // waits for the chunks (unless deferred)
}

}  // namespace

double lm_head_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets, Tensor* dh,
                             Tensor* dw, double grad_scale, Store dh_store, DType logits) {
  if (h.dim(0) == 0) return 0.0;
  double loss = 0.0;
  dispatch_float(h, "lm_head_cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    // BF16 logits come with BF16 h/w only (checked by the dispatcher).
    if constexpr (std::is_same_v<T, bf16>)
      if (logits == DType::BF16) {
        loss = run<T, bf16>(h, w, targets, dh, dw, grad_scale, dh_store);
        return;
      }
    loss = run<T, float>(h, w, targets, dh, dw, grad_scale, dh_store);
  });
  return loss;
}

}  // namespace attnres::kernels::cuda
