// CUDA AdamW (see kernels/adamw.h): one elementwise pass over p, g, m, v (F32),
// writing the bf16 copy of p in the same pass when asked.
//
// The per-element math is math::adamw_element, the CPU's own function,
// instantiated on RnFloat, a float whose arithmetic reproduces what the CPU
// build (g++) makes of that source for T = float, operation by operation:
// - no FMA contraction: nvcc would fuse `b1 * m + (1 - b1) * g` into one FMA
//   (one rounding where the C++ expression has two), so every operation is
//   the round-to-nearest intrinsic;
// - the promotion to double: in a g++ translation unit the unqualified
//   `sqrt(float)` in math.h resolves to ::sqrt(double) (libstdc++ puts the
//   float overload in std:: only), so the CPU computes
//     p = float(double(p) - double(lr * (m / bc1)) / (sqrt(double(v / bc2)) + eps))
//   with the denominator, the quotient and the subtraction in double. Under
//   nvcc, `using std::sqrt` makes the same line all-float. RnFloat's sqrt
//   returns an RnDouble, whose operators follow the C++ promotion rules.
// With it the result is bit-identical to the CPU's, whose AdamW loop is
// compiled without FMA contraction (src/CMakeLists.txt) on any host.
#include "kernels/cuda/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/math.h"

namespace attnres::kernels::cuda {

namespace {

struct RnFloat {
  float x;
  RnFloat() = default;
  __host__ __device__ constexpr RnFloat(float v) : x(v) {}  // NOLINT: implicit, as T(1) needs
};
struct RnDouble {  // a float expression promoted to double
  double x;
};

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ RnFloat operator+(RnFloat a, RnFloat b) { return __fadd_rn(a.x, b.x); }
__device__ __forceinline__ RnFloat operator-(RnFloat a, RnFloat b) { return __fsub_rn(a.x, b.x); }
__device__ __forceinline__ RnFloat operator*(RnFloat a, RnFloat b) { return __fmul_rn(a.x, b.x); }
__device__ __forceinline__ RnFloat operator/(RnFloat a, RnFloat b) { return __fdiv_rn(a.x, b.x); }
__device__ __forceinline__ RnDouble sqrt(RnFloat a) { return {__dsqrt_rn(static_cast<double>(a.x))}; }
__device__ __forceinline__ RnDouble operator+(RnDouble a, RnFloat b) {
  return {__dadd_rn(a.x, static_cast<double>(b.x))};
}
__device__ __forceinline__ RnDouble operator/(RnFloat a, RnDouble b) {
  return {__ddiv_rn(static_cast<double>(a.x), b.x)};
}
__device__ __forceinline__ RnFloat& operator-=(RnFloat& a, RnDouble b) {
  a.x = __double2float_rn(__dsub_rn(static_cast<double>(a.x), b.x));
  return a;
}
#else
// Host stand-ins, only so that the __host__ __device__ template instantiates.
inline RnFloat operator+(RnFloat a, RnFloat b) { return a.x + b.x; }
inline RnFloat operator-(RnFloat a, RnFloat b) { return a.x - b.x; }
inline RnFloat operator*(RnFloat a, RnFloat b) { return a.x * b.x; }
inline RnFloat operator/(RnFloat a, RnFloat b) { return a.x / b.x; }
inline RnDouble sqrt(RnFloat a) { return {std::sqrt(static_cast<double>(a.x))}; }
inline RnDouble operator+(RnDouble a, RnFloat b) { return {a.x + static_cast<double>(b.x)}; }
inline RnDouble operator/(RnFloat a, RnDouble b) { return {static_cast<double>(a.x) / b.x}; }
inline RnFloat& operator-=(RnFloat& a, RnDouble b) {
  a.x = static_cast<float>(static_cast<double>(a.x) - b.x);
  return a;
}
#endif
__host__ __device__ __forceinline__ RnFloat& operator*=(RnFloat& a, RnFloat b) { return a = a * b; }

struct Scalars {
  math::AdamWCoeffs<float> k;
  float grad_scale;
};

constexpr int kThreads = 256;
constexpr int W = 4;  // 16 bytes of each fp32 array (8 bytes of the bf16 copy)

// Up to kAdamBatch parameters per launch (a batched launch, common.cuh's
// batch_slot). Every element is updated by the same arithmetic whatever the
// blocks, so batching does not change a bit.
constexpr int kAdamBatch = 32;
struct AdamBatch {
  float* p[kAdamBatch];
  const float* g[kAdamBatch];
  float* m[kAdamBatch];
  float* v[kAdamBatch];
  bf16* p_lowp[kAdamBatch];  // or null
  int64_t n[kAdamBatch];
  float decay_factor[kAdamBatch];
  bool vec[kAdamBatch];  // every pointer aligned for 16-byte packs (8 for the bf16 copy)
  int64_t first_block[kAdamBatch + 1];
  int count;
};

template <int N>
__device__ __forceinline__ void update(int64_t i, float* p, const float* g, float* m, float* v,
                                       bf16* p_lowp, float decay_factor, const Scalars& s) {
  Vec<float, N> vp = load<N>(p + i), vm = load<N>(m + i), vv = load<N>(v + i);
  const Vec<float, N> vg = load<N>(g + i);
  Vec<bf16, N> lo;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    RnFloat pj = vp.v[j], mj = vm.v[j], vj = vv.v[j];
    // g * grad_scale rounded once, as scale_ would have left it in g.
    const RnFloat gj = RnFloat(vg.v[j]) * s.grad_scale;
    math::adamw_element<RnFloat>(pj, gj, mj, vj, s.k, RnFloat(decay_factor));
    vp.v[j] = pj.x;
    vm.v[j] = mj.x;
    vv.v[j] = vj.x;
    lo.v[j] = __float2bfloat16_rn(pj.x);
  }
  store<N>(p + i, vp);
  store<N>(m + i, vm);
  store<N>(v + i, vv);
  if (p_lowp) store<N>(p_lowp + i, lo);
}

__global__ void adamw_kernel(AdamBatch batch, Scalars s) {
  const BatchSlot slot = batch_slot(batch);
  const int t = slot.member;
  const int64_t tid = slot.tid, stride = slot.stride;
  float* p = batch.p[t];
  const float* g = batch.g[t];
  float* m = batch.m[t];
  float* v = batch.v[t];
  bf16* lo = batch.p_lowp[t];
  const int64_t n = batch.n[t];
  const float df = batch.decay_factor[t];
  int64_t tail = 0;
  if (batch.vec[t]) {
    const int64_t nv = n / W;
    for (int64_t k = tid; k < nv; k += stride) update<W>(k * W, p, g, m, v, lo, df, s);
    tail = nv * W;
  }
  for (int64_t i = tail + tid; i < n; i += stride) update<1>(i, p, g, m, v, lo, df, s);
}

}  // namespace

void adamw_update_each(Span<const AdamWTensors> params, const AdamWStep& step,
                       const AdamWScalars& sc) {
  // The scalars are rounded to float once, as the CPU's float path does.
  const Scalars s{sc.as<float>(), static_cast<float>(step.grad_scale)};
  for (size_t b0 = 0; b0 < params.size(); b0 += kAdamBatch) {
    AdamBatch batch{};
    batch.count = static_cast<int>(std::min<size_t>(kAdamBatch, params.size() - b0));
    for (int i = 0; i < batch.count; ++i) {
      const AdamWTensors& t = params[b0 + i];
      const int64_t n = t.p->numel();
      batch.p[i] = n ? dptr<float>(*t.p) : nullptr;
      batch.g[i] = n ? dptr<float>(*t.g) : nullptr;
      batch.m[i] = n ? dptr<float>(*t.m) : nullptr;
      batch.v[i] = n ? dptr<float>(*t.v) : nullptr;
      batch.p_lowp[i] = n ? dptr_or_null<bf16>(t.p_lowp) : nullptr;
      batch.n[i] = n;
      batch.decay_factor[i] = static_cast<float>(t.decay ? sc.decay_factor : 1.0);
      batch.vec[i] = aligned(batch.p[i], 16) && aligned(batch.g[i], 16) &&
                     aligned(batch.m[i], 16) && aligned(batch.v[i], 16) &&
                     (batch.p_lowp[i] == nullptr || aligned(batch.p_lowp[i], 8));
      // Enough blocks to fill the device for a big tensor (as a launch of its
      // own would have), one for a small one.
      const int64_t work = batch.vec[i] ? ceil_div(n, W) : n;
      batch.first_block[i + 1] = batch.first_block[i] + grid_for(work, kThreads);
    }
    adamw_kernel<<<static_cast<unsigned>(batch.first_block[batch.count]), kThreads, 0, stream()>>>(
        batch, s);
    ATTNRES_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace attnres::kernels::cuda
