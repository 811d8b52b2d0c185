// CPU parts of a KDA layer around its core (kernels/kda.h): the short
// causal convolution with SiLU, the per-head L2 norm, the decay gate, the
// write strength and the gated output norm, forward and backward.
//
// Rows run in parallel in fixed blocks of kRows; a parameter's gradient is
// summed per block, then over the blocks in order, so its bits do not depend
// on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/kda.h"
#include "kernels/math.h"

namespace attnres::kernels::cpu {

namespace {

constexpr int64_t kRows = 256;

// f(block, first row, end row) for the blocks of kRows rows, in parallel.
template <typename F>
void row_blocks(int64_t N, F f) {
  const int64_t blocks = (N + kRows - 1) / kRows;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) f(b, b * kRows, std::min(N, (b + 1) * kRows));
}

// dst[i] (+)= the sum over blocks, in order, of partial[b * n + i].
template <typename T>
void add_blocks(T* dst, const std::vector<T>& partial, int64_t n) {
  const int64_t blocks = static_cast<int64_t>(partial.size()) / n;
  for (int64_t i = 0; i < n; ++i) {
    T s = 0;
    for (int64_t b = 0; b < blocks; ++b) s += partial[size_t(b * n + i)];
    dst[i] += s;
  }
}

template <typename T>
T put(T old, T v, bool accumulate) { return accumulate ? old + v : v; }

// The filters transposed to [W, Ch] (tap j's weights of every channel in a
// row), so the loops below run over channels innermost and vectorise.
template <typename T>
std::vector<T> taps_by_row(const T* w, int64_t Ch, int64_t W) {
  std::vector<T> wt(size_t(W * Ch));
  for (int64_t c = 0; c < Ch; ++c)
    for (int64_t j = 0; j < W; ++j) wt[size_t(j * Ch + c)] = w[c * W + j];
  return wt;
}

// Row r's (token t of its sequence) pre-activations, every channel: p[c] =
// sum_j w[c, j] x[t - W + 1 + j, c] over the taps inside the sequence, j
// ascending (the order the CUDA kernel's conv_pre adds in).
template <typename T>
void conv_row(T* p, const T* x, const std::vector<T>& wt, int64_t r, int64_t t, int64_t Ch,
              int64_t W) {
  std::fill(p, p + Ch, T(0));
  for (int64_t j = 0; j < W; ++j) {
    const int64_t back = W - 1 - j;  // x[t - back]
    if (back > t) continue;
    const T* wj = &wt[size_t(j * Ch)];
    const T* xr = x + (r - back) * Ch;
    for (int64_t c = 0; c < Ch; ++c) p[c] += wj[c] * xr[c];
  }
}

}  // namespace

template <typename T>
void kda_conv_forward(T* y, const T* x, const T* w, int64_t B, int64_t Tn, int64_t Ch, int64_t W) {
  const std::vector<T> wt = taps_by_row(w, Ch, W);
  row_blocks(B * Tn, [&](int64_t, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* yr = y + r * Ch;
      conv_row(yr, x, wt, r, r % Tn, Ch, W);
      for (int64_t c = 0; c < Ch; ++c) yr[c] = math::silu(yr[c]);
    }
  });
}

template <typename T>
void kda_conv_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t B, int64_t Tn,
                       int64_t Ch, int64_t W, bool accumulate) {
  const int64_t N = B * Tn;
  const std::vector<T> wt = taps_by_row(w, Ch, W);
  // dp = dy silu'(p), then dx[t'] = sum_j w[c, j] dp[t' + W - 1 - j] within the
  // sequence, and dw[c, j] = sum_t dp[t] x[t - W + 1 + j].
  std::vector<T> dp(size_t(N * Ch));
  row_blocks(N, [&](int64_t, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* pr = &dp[size_t(r * Ch)];
      conv_row(pr, x, wt, r, r % Tn, Ch, W);
      for (int64_t c = 0; c < Ch; ++c) pr[c] = dy[r * Ch + c] * math::silu_grad(pr[c]);
    }
  });
  // Per block, dw's partial sums as [W, Ch] (tap-major, as wt).
  const int64_t blocks = (N + kRows - 1) / kRows;
  std::vector<T> partial(size_t(blocks * W * Ch), T(0));
  row_blocks(N, [&](int64_t blk, int64_t r0, int64_t r1) {
    T* pw = &partial[size_t(blk * W * Ch)];
    std::vector<T> s(static_cast<size_t>(Ch));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % Tn;
      const T* dpr = &dp[size_t(r * Ch)];
      std::fill(s.begin(), s.end(), T(0));
      for (int64_t j = 0; j < W; ++j) {
        const int64_t ahead = W - 1 - j;  // dp[t + ahead]
        const T* wj = &wt[size_t(j * Ch)];
        if (t + ahead < Tn) {
          const T* dpa = &dp[size_t((r + ahead) * Ch)];
          for (int64_t c = 0; c < Ch; ++c) s[size_t(c)] += wj[c] * dpa[c];
        }
        if (ahead <= t) {
          const T* xr = x + (r - ahead) * Ch;
          T* pj = pw + j * Ch;
          for (int64_t c = 0; c < Ch; ++c) pj[c] += dpr[c] * xr[c];
        }
      }
      for (int64_t c = 0; c < Ch; ++c) dx[r * Ch + c] = put(dx[r * Ch + c], s[size_t(c)], accumulate);
    }
  });
  // Over the blocks in order, into dw's [Ch, W].
  for (int64_t c = 0; c < Ch; ++c)
    for (int64_t j = 0; j < W; ++j) {
      T sum = 0;
      for (int64_t b = 0; b < blocks; ++b) sum += partial[size_t((b * W + j) * Ch + c)];
      dw[c * W + j] += sum;
    }
}

template <typename T>
void kda_l2norm_forward(T* y, const T* x, int64_t rows, int64_t K, T eps) {
  row_blocks(rows, [&](int64_t, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T ss = 0;
      for (int64_t c = 0; c < K; ++c) ss += x[r * K + c] * x[r * K + c];
      const T inv = T(1) / std::sqrt(ss + eps);
      for (int64_t c = 0; c < K; ++c) y[r * K + c] = x[r * K + c] * inv;
    }
  });
}

template <typename T>
void kda_l2norm_backward(T* dx, const T* dy, const T* x, int64_t rows, int64_t K, T eps,
                         bool accumulate) {
  // y = x r, r = (|x|^2 + eps)^(-1/2): dx = r (dy - y (y . dy)).
  row_blocks(rows, [&](int64_t, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T ss = 0, yd = 0;
      for (int64_t c = 0; c < K; ++c) ss += x[r * K + c] * x[r * K + c];
      const T inv = T(1) / std::sqrt(ss + eps);
      for (int64_t c = 0; c < K; ++c) yd += x[r * K + c] * inv * dy[r * K + c];
      for (int64_t c = 0; c < K; ++c)
        dx[r * K + c] = put(dx[r * K + c], inv * (dy[r * K + c] - x[r * K + c] * inv * yd), accumulate);
    }
  });
}

namespace {

// exp(A_log_h): each head's decay rate, once per call.
template <typename T>
std::vector<T> head_rates(const T* a_log, int64_t H) {
  std::vector<T> ea(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) ea[size_t(h)] = std::exp(a_log[h]);
  return ea;
}

}  // namespace

template <typename T>
void kda_decay_forward(T* g, const T* f, const T* a_log, const T* dt_bias, int64_t N, int64_t H,
                       int64_t K) {
  const int64_t HK = H * K;
  const std::vector<T> ea = head_rates(a_log, H);
  row_blocks(N, [&](int64_t, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < HK; ++c)
        g[r * HK + c] = -ea[size_t(c / K)] * math::softplus(f[r * HK + c] + dt_bias[c]);
  });
}

template <typename T>
void kda_decay_backward(T* df, T* da_log, T* ddt_bias, const T* dg, const T* f, const T* a_log,
                        const T* dt_bias, int64_t N, int64_t H, int64_t K, bool accumulate) {
  // g = -e^a softplus(u), u = f + dt_bias: dg/du = -e^a sigmoid(u), dg/da = g.
  const int64_t HK = H * K, blocks = (N + kRows - 1) / kRows;
  std::vector<T> pdt(size_t(blocks * HK), T(0)), pa(size_t(blocks * H), T(0));
  const std::vector<T> eas = head_rates(a_log, H);
  row_blocks(N, [&](int64_t blk, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < HK; ++c) {
        const T ea = eas[size_t(c / K)], u = f[r * HK + c] + dt_bias[c];
        const T d = dg[r * HK + c], du = -d * ea * math::sigmoid(u);
        df[r * HK + c] = put(df[r * HK + c], du, accumulate);
        pdt[size_t(blk * HK + c)] += du;
        pa[size_t(blk * H + c / K)] += d * (-ea * math::softplus(u));
      }
  });
  add_blocks(ddt_bias, pdt, HK);
  add_blocks(da_log, pa, H);
}

template <typename T>
void kda_beta_forward(T* beta, const T* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) beta[i] = math::sigmoid(b[i]);
}

template <typename T>
void kda_beta_backward(T* db, const T* dbeta, const T* beta, int64_t n, bool accumulate) {
  for (int64_t i = 0; i < n; ++i) db[i] = put(db[i], dbeta[i] * beta[i] * (T(1) - beta[i]), accumulate);
}

template <typename T>
void kda_out_gate_forward(T* y, const T* o, const T* w, const T* z, int64_t rows, int64_t K, T eps) {
  row_blocks(rows, [&](int64_t, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T ss = 0;
      for (int64_t c = 0; c < K; ++c) ss += o[r * K + c] * o[r * K + c];
      const T rs = math::rstd_from_sum_sq(ss, K, eps);
      for (int64_t c = 0; c < K; ++c)
        y[r * K + c] = o[r * K + c] * rs * w[c] * math::sigmoid(z[r * K + c]);
    }
  });
}

template <typename T>
void kda_out_gate_backward(T* d_o, T* dw, T* dz, const T* dy, const T* o, const T* w, const T* z,
                           int64_t rows, int64_t K, T eps, bool accumulate) {
  // n = o rs, s = sigmoid(z), y = n w s: dn = dy w s, dw += dy n s,
  // dz = dy n w s (1 - s), do = rs (dn - n (n . dn) / K).
  const int64_t blocks = (rows + kRows - 1) / kRows;
  std::vector<T> pw(size_t(blocks * K), T(0));
  row_blocks(rows, [&](int64_t blk, int64_t r0, int64_t r1) {
    std::vector<T> dn(static_cast<size_t>(K));
    for (int64_t r = r0; r < r1; ++r) {
      T ss = 0;
      for (int64_t c = 0; c < K; ++c) ss += o[r * K + c] * o[r * K + c];
      const T rs = math::rstd_from_sum_sq(ss, K, eps);
      T ndn = 0;
      for (int64_t c = 0; c < K; ++c) {
        const T n = o[r * K + c] * rs, s = math::sigmoid(z[r * K + c]), d = dy[r * K + c];
        dn[size_t(c)] = d * w[c] * s;
        ndn += n * dn[size_t(c)];
        pw[size_t(blk * K + c)] += d * n * s;
        dz[r * K + c] = put(dz[r * K + c], d * n * w[c] * s * (T(1) - s), accumulate);
      }
      for (int64_t c = 0; c < K; ++c)
        d_o[r * K + c] = put(d_o[r * K + c], rs * (dn[size_t(c)] - o[r * K + c] * rs * ndn / T(K)),
                             accumulate);
    }
  });
  add_blocks(dw, pw, K);
}

#define ATTNRES_KDA_PARTS(T)                                                                       \
  template void kda_conv_forward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t);  \
  template void kda_conv_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t,      \
                                     int64_t, int64_t, bool);                                      \
  template void kda_l2norm_forward<T>(T*, const T*, int64_t, int64_t, T);                          \
  template void kda_l2norm_backward<T>(T*, const T*, const T*, int64_t, int64_t, T, bool);         \
  template void kda_decay_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t); \
  template void kda_decay_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, int64_t, \
                                      int64_t, int64_t, bool);                                     \
  template void kda_beta_forward<T>(T*, const T*, int64_t);                                        \
  template void kda_beta_backward<T>(T*, const T*, const T*, int64_t, bool);                       \
  template void kda_out_gate_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, T);    \
  template void kda_out_gate_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,      \
                                         int64_t, int64_t, T, bool);
ATTNRES_KDA_PARTS(float)
ATTNRES_KDA_PARTS(double)
#undef ATTNRES_KDA_PARTS

}  // namespace attnres::kernels::cpu
