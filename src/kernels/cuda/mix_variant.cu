// CUDA depth Mix of the residual variants and DenseFormer's averages
// (kernels/mix_variant.h; the CPU reference is kernels/cpu/mix_variant.cpp,
// whose arithmetic this follows step for step, in fp32).
//
// One warp per (token row, head): the lanes stride over the head's d / H
// channels, each of the k source dots is a warp sum, and the k logits and
// weights live in shared memory (k <= 64). The ablation rows are a
// correctness-first kernel, not a tuned one: every source row is read twice
// in the forward (the dots, then the weighted sum; the second pass hits L1 or
// L2 for small rows) and three times in the backward, so it moves about 2k
// (forward) and 4k (backward) rows of DRAM traffic against the two-phase
// kernels' ~k / G (kernels/cuda/mix.cu); `bench --variants` measures it.
//
// A shared query's and the scalars' gradients are sums over rows: each warp
// writes its row's terms to a scratch buffer, and column_sum_kernel adds the
// rows column by column in row order in double (deterministic, independent
// of the launch shape), then into dquery.
#include "kernels/cuda/mix_variant.h"

#include "kernels/cuda/common.cuh"
#include "kernels/math.h"

namespace attnres::kernels::cuda {

namespace {

constexpr int kMaxSources = 64;  // by-value pointers, and the shared-memory logits
constexpr int kWarps = 4;        // per block: 4 (row, head) pairs

template <typename T>
struct Sources {
  const T* v[kMaxSources];
};
template <typename T>
struct DSources {
  T* dv[kMaxSources];
};

struct Form {
  int logits;  // MixLogits
  bool sigmoid, key_norm;
  int heads;
};
Form device_form(const MixForm& f) {
  return {static_cast<int>(f.logits), f.score == MixScore::Sigmoid, f.key_norm,
          static_cast<int>(f.heads)};
}
constexpr int kQuery = static_cast<int>(MixLogits::Query);
constexpr int kRowQueries = static_cast<int>(MixLogits::RowQueries);
constexpr int kWeights = static_cast<int>(MixLogits::Weights);
__device__ __forceinline__ bool scalar_logits(const Form& f) {
  return f.logits != kQuery && f.logits != kRowQueries;
}

// dL/dlogit_j from dL/da_j = da (s = sum_i a_i da_i), by the score.
__device__ __forceinline__ float dlogit(const Form& f, float a, float da, float s) {
  return f.logits == kWeights ? da : f.sigmoid ? a * (1.0f - a) * da : a * (da - s);
}

// The query of row n, head h (none for scalar logits and weights).
template <typename T>
__device__ __forceinline__ const T* query_of(const T* query, const Form& f, int64_t n, int h,
                                             int64_t d, int64_t dh) {
  if (scalar_logits(f)) return nullptr;
  return query + (f.logits == kRowQueries ? n * d : 0) + h * dh;
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    forward_kernel(T* out, float* weights, const T* query, Sources<T> src, int k, int64_t N,
                   int64_t d, Form f, float eps) {
  __shared__ float a_sh[kWarps][kMaxSources];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t pair = int64_t(blockIdx.x) * kWarps + warp;
  if (pair >= N * f.heads) return;  // whole warps: no barrier below
  const int64_t n = pair / f.heads;
  const int h = static_cast<int>(pair % f.heads);
  const int64_t dh = d / f.heads, off = n * d + h * dh;
  const T* q = query_of(query, f, n, h, d, dh);
  float* a = a_sh[warp];
  float m = -INFINITY;
  for (int j = 0; j < k; ++j) {
    float z;
    if (q) {
      float dot = 0.0f, ss = 0.0f;
      for (int64_t c = lane; c < dh; c += 32) {
        const float v = to_f32(src.v[j][off + c]);
        dot = fmaf(to_f32(q[c]), v, dot);
        ss = fmaf(v, v, ss);
      }
      dot = warp_sum(dot);
      ss = warp_sum(ss);
      z = dot * (f.key_norm ? math::rstd_from_sum_sq(ss, static_cast<long long>(dh), eps) : 1.0f);
    } else {
      z = to_f32(query[j]);
    }
    m = fmaxf(m, z);
    if (lane == 0) a[j] = z;
  }
  __syncwarp();
  // Every lane computes the same weights from the same logits (k is small).
  if (f.logits == kWeights) {
    // the weights as they are
  } else if (f.sigmoid) {
    if (lane == 0)
      for (int j = 0; j < k; ++j) a[j] = math::sigmoid(a[j]);
  } else if (lane == 0) {
    float l = 0.0f;
    for (int j = 0; j < k; ++j) l += (a[j] = expf(a[j] - m));
    const float inv = 1.0f / l;
    for (int j = 0; j < k; ++j) a[j] *= inv;
  }
  __syncwarp();
  for (int j = lane; j < k; j += 32) weights[pair * k + j] = a[j];
  for (int64_t c = lane; c < dh; c += 32) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc = fmaf(a[j], to_f32(src.v[j][off + c]), acc);
    out[off + c] = from_f32<T>(acc);
  }
}

// Per (row, head), as the CPU reference (cpu/mix_variant.cpp) writes it out:
// da_j = g . v_j; dlogit_j from the score; dv_j += a_j g + cw_j q + cv_j v_j;
// a shared query's terms cw_j v_j into scratch [N, d], the scalars' dlogit_j
// into scratch [N, k]; a row query's straight into dquery.
template <typename T, typename G>
__global__ void __launch_bounds__(kWarps * 32)
    backward_kernel(DSources<T> dsrc, G* dquery_rows, float* scratch, const T* dout,
                    const T* query, Sources<T> src, const float* weights, int k, int64_t N,
                    int64_t d, Form f, float eps) {
  __shared__ float da_sh[kWarps][kMaxSources], qv_sh[kWarps][kMaxSources],
      r_sh[kWarps][kMaxSources];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t pair = int64_t(blockIdx.x) * kWarps + warp;
  if (pair >= N * f.heads) return;
  const int64_t n = pair / f.heads;
  const int h = static_cast<int>(pair % f.heads);
  const int64_t dh = d / f.heads, off = n * d + h * dh;
  const T* q = query_of(query, f, n, h, d, dh);
  const float* a = weights + pair * k;
  float s = 0.0f;  // sum_i a_i da_i
  for (int j = 0; j < k; ++j) {
    float da = 0.0f, qv = 0.0f, ss = 0.0f;
    for (int64_t c = lane; c < dh; c += 32) {
      const float v = to_f32(src.v[j][off + c]);
      da = fmaf(to_f32(dout[off + c]), v, da);
      if (q) {
        qv = fmaf(to_f32(q[c]), v, qv);
        ss = fmaf(v, v, ss);
      }
    }
    da = warp_sum(da);
    qv = warp_sum(qv);
    ss = warp_sum(ss);
    if (lane == 0) {
      da_sh[warp][j] = da;
      qv_sh[warp][j] = qv;
      r_sh[warp][j] = q && f.key_norm ? math::rstd_from_sum_sq(ss, static_cast<long long>(dh), eps) : 1.0f;
    }
    s += a[j] * da;
  }
  __syncwarp();
  // Every read of the row's sources is done: dsources (which may alias each
  // other) are written below, source after source, each element by one lane.
  for (int j = 0; j < k; ++j) {
    const float aj = a[j], da = da_sh[warp][j];
    const float dz = dlogit(f, aj, da, s);
    if (!q) {
      if (lane == 0) scratch[n * k + j] = dz;
      for (int64_t c = lane; c < dh; c += 32) {
        T* dv = dsrc.dv[j] + off + c;
        *dv = from_f32<T>(to_f32(*dv) + aj * to_f32(dout[off + c]));
      }
      continue;
    }
    const float r = r_sh[warp][j];
    const float cw = dz * r;
    const float cv = f.key_norm ? math::mix_backward_coefs(dz, r, qv_sh[warp][j], float(dh)).cv : 0.0f;
    for (int64_t c = lane; c < dh; c += 32) {
      const float v = to_f32(src.v[j][off + c]);
      T* dv = dsrc.dv[j] + off + c;
      *dv = from_f32<T>(to_f32(*dv) + aj * to_f32(dout[off + c]) + cw * to_f32(q[c]) + cv * v);
    }
  }
  // The query's terms sum_j cw_j v_j, per channel (after the loop above, in
  // source order, as the CPU's).
  if (q) {
    for (int64_t c = lane; c < dh; c += 32) {
      float t = 0.0f;
      for (int j = 0; j < k; ++j)
        t = fmaf(dlogit(f, a[j], da_sh[warp][j], s) * r_sh[warp][j], to_f32(src.v[j][off + c]), t);
      if (f.logits == kRowQueries) {
        G* dq = dquery_rows + off + c;
        *dq = from_f32<G>(to_f32(*dq) + t);
      } else {
        scratch[off + c] = t;
      }
    }
  }
}

// dst[c] += sum over rows r (in order, in double) of rows[r * cols + c].
template <typename G>
__global__ void column_sum_kernel(G* dst, const float* rows, int64_t R, int64_t cols) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  double sum = 0.0;
  for (int64_t r = 0; r < R; ++r) sum += rows[r * cols + c];
  dst[c] = from_f32<G>(to_f32(dst[c]) + static_cast<float>(sum));
}

int blocks_for(int64_t N, const MixForm& f) {
  return static_cast<int>(ceil_div(N * f.heads, kWarps));
}

template <typename T>
Sources<T> source_ptrs(Span<const Tensor> sources, const char* op) {
  if (sources.size() > static_cast<size_t>(kMaxSources))
    fail(op, ": ", sources.size(), " sources; the CUDA kernel takes at most ", kMaxSources);
  Sources<T> s{};
  for (size_t j = 0; j < sources.size(); ++j) s.v[j] = dptr<T>(sources[j]);
  return s;
}

}  // namespace

void mix_variant_forward(Tensor& out, Tensor& weights, const Tensor& query,
                         Span<const Tensor> sources, const MixForm& form, float eps) {
  const char* op = "mix_variant_forward";
  const int64_t N = sources[0].dim(0), d = sources[0].dim(1);
  const int k = static_cast<int>(sources.size());
  dispatch_float(sources[0], op, [&](auto tag) {
    using T = decltype(tag);
    forward_kernel<T><<<blocks_for(N, form), kWarps * 32, 0, stream()>>>(
        dptr<T>(out), dptr<float>(weights), dptr<T>(query), source_ptrs<T>(sources, op), k, N, d,
        device_form(form), eps);
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

void mix_variant_backward(Span<Tensor> dsources, Tensor& dquery, const Tensor& dout,
                          const Tensor& query, Span<const Tensor> sources, const Tensor& weights,
                          const MixForm& form, float eps) {
  const char* op = "mix_variant_backward";
  const int64_t N = sources[0].dim(0), d = sources[0].dim(1);
  const int k = static_cast<int>(sources.size());
  const bool rows = form.logits == MixLogits::RowQueries;
  const int64_t cols = form.logits == MixLogits::Query ? d : k;
  Tensor scratch;
  if (!rows) scratch = Tensor::empty({N, cols}, DType::F32, Device::CUDA);
  dispatch_float(sources[0], op, [&](auto tag) {
    using T = decltype(tag);
    DSources<T> ds{};
    for (size_t j = 0; j < dsources.size(); ++j) ds.dv[j] = dptr<T>(dsources[j]);
    auto launch = [&](auto gtag) {
      using G = decltype(gtag);
      backward_kernel<T, G><<<blocks_for(N, form), kWarps * 32, 0, stream()>>>(
          ds, rows ? dptr<G>(dquery) : nullptr, rows ? nullptr : dptr<float>(scratch),
          dptr<T>(dout), dptr<T>(query), source_ptrs<T>(sources, op), dptr<float>(weights), k, N,
          d, device_form(form), eps);
      ATTNRES_CUDA_CHECK_LAUNCH();
      if (!rows) {
        column_sum_kernel<G><<<static_cast<int>(ceil_div(cols, 256)), 256, 0, stream()>>>(
            dptr<G>(dquery), dptr<float>(scratch), N, cols);
        ATTNRES_CUDA_CHECK_LAUNCH();
      }
    };
    // A row query's gradient has the rows' dtype; a shared query's, the
    // scalars' and the weights' the parameters' gradient dtype.
    if (dquery.dtype() == DType::BF16) launch(bf16{});
    else launch(float{});
  });
}

}  // namespace attnres::kernels::cuda
