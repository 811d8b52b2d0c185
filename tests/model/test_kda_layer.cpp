// One KDA sublayer (model/kda_layer.h) against the layer of docs/model.md
// written out token by token in double (projections, convolutions from zeros
// per sequence, SiLU, the L2 norms, the decay and write strength, the
// recurrence, the gated output norm, o_proj; no code shared with src/), and
// every gradient, the input's and each weight's, by central finite
// differences.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "model/kda_layer.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;

namespace {

constexpr int64_t B = 2, T = 19, d = 6, H = 2, K = 4, W = 3;

model::KdaDims dims() {
  model::KdaDims k;
  k.H = H, k.K = K, k.conv = W, k.norm_eps = 1e-5, k.chunk = 16;  // two chunks a sequence
  return k;
}

model::KdaWeights random_weights(uint64_t seed) {
  model::KdaWeights w;
  const int64_t HK = H * K;
  w.q = randn({HK, d}, seed + 1, DType::F64, 0.5);
  w.k = randn({HK, d}, seed + 2, DType::F64, 0.5);
  w.v = randn({HK, d}, seed + 3, DType::F64, 0.5);
  w.q_conv = randn({HK, W}, seed + 4, DType::F64, 0.6);
  w.k_conv = randn({HK, W}, seed + 5, DType::F64, 0.6);
  w.v_conv = randn({HK, W}, seed + 6, DType::F64, 0.6);
  w.a_log = randn({H}, seed + 7, DType::F64, 0.5);
  w.dt_bias = randn({HK}, seed + 8, DType::F64, 0.5);
  w.f_a = randn({K, d}, seed + 9, DType::F64, 0.5);
  w.f_b = randn({HK, K}, seed + 10, DType::F64, 0.5);
  w.b = randn({H, d}, seed + 11, DType::F64, 0.5);
  w.g_a = randn({K, d}, seed + 12, DType::F64, 0.5);
  w.g_b = randn({HK, K}, seed + 13, DType::F64, 0.5);
  w.o_norm = randn({K}, seed + 14, DType::F64, 0.5);
  w.o = randn({d, HK}, seed + 15, DType::F64, 0.5);
  return w;
}

std::vector<Tensor*> tensors(model::KdaWeights& w) {
  return {&w.q, &w.k, &w.v, &w.q_conv, &w.k_conv, &w.v_conv, &w.a_log, &w.dt_bias,
          &w.f_a, &w.f_b, &w.b, &w.g_a, &w.g_b, &w.o_norm, &w.o};
}
const char* const kNames[] = {"q_proj", "k_proj", "v_proj", "q_conv1d", "k_conv1d", "v_conv1d",
                              "A_log", "dt_bias", "f_a_proj", "f_b_proj", "b_proj", "g_a_proj",
                              "g_b_proj", "o_norm", "o_proj"};

double sig(double x) { return 1 / (1 + std::exp(-x)); }

// The layer, literally, on u [B T, d].
Tensor reference(const Tensor& u, model::KdaWeights& w) {
  const int64_t HK = H * K, N = B * T;
  auto W2 = [](const Tensor& m, int64_t r, int64_t c) { return at(m, r * m.dim(1) + c); };
  auto proj = [&](const Tensor& m, int64_t row, int64_t out) {  // (u m^T)[row, out]
    double s = 0;
    for (int64_t i = 0; i < d; ++i) s += at(u, row * d + i) * W2(m, out, i);
    return s;
  };
  Tensor y = Tensor::zeros({N, d}, DType::F64);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<std::vector<double>> S(size_t(H), std::vector<double>(size_t(K * K), 0.0));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = b * T + t;
      // q, k, v: the convolution over this sequence's tokens t - W + 1 .. t, then SiLU.
      auto conv = [&](const Tensor& m, const Tensor& cw, int64_t ch) {
        double p = 0;
        for (int64_t j = 0; j < W; ++j) {
          const int64_t src = t - W + 1 + j;
          if (src >= 0) p += W2(cw, ch, j) * proj(m, b * T + src, ch);
        }
        return p * sig(p);
      };
      std::vector<double> q(static_cast<size_t>(HK)), k(static_cast<size_t>(HK)), v(static_cast<size_t>(HK)), fa(static_cast<size_t>(K)), ga(static_cast<size_t>(K));
      for (int64_t c = 0; c < HK; ++c) q[size_t(c)] = conv(w.q, w.q_conv, c), k[size_t(c)] = conv(w.k, w.k_conv, c),
                                     v[size_t(c)] = conv(w.v, w.v_conv, c);
      for (int64_t j = 0; j < K; ++j) fa[size_t(j)] = proj(w.f_a, row, j), ga[size_t(j)] = proj(w.g_a, row, j);
      std::vector<double> out(static_cast<size_t>(HK));
      for (int64_t h = 0; h < H; ++h) {
        double nq = 0, nk = 0;
        for (int64_t c = 0; c < K; ++c) nq += q[size_t(h * K + c)] * q[size_t(h * K + c)], nk += k[size_t(h * K + c)] * k[size_t(h * K + c)];
        std::vector<double> qh(static_cast<size_t>(K)), kh(static_cast<size_t>(K)), g(static_cast<size_t>(K)), z(static_cast<size_t>(K));
        for (int64_t c = 0; c < K; ++c) {
          qh[size_t(c)] = q[size_t(h * K + c)] / std::sqrt(nq + 1e-6);
          kh[size_t(c)] = k[size_t(h * K + c)] / std::sqrt(nk + 1e-6);
          double f = 0, zz = 0;
          for (int64_t j = 0; j < K; ++j) f += fa[size_t(j)] * W2(w.f_b, h * K + c, j), zz += ga[size_t(j)] * W2(w.g_b, h * K + c, j);
          g[size_t(c)] = -std::exp(at(w.a_log, h)) * std::log1p(std::exp(f + at(w.dt_bias, h * K + c)));
          z[size_t(c)] = zz;
        }
        const double beta = sig(proj(w.b, row, h));
        std::vector<double>& s = S[size_t(h)];
        for (int64_t c = 0; c < K; ++c)
          for (int64_t e = 0; e < K; ++e) s[size_t(c * K + e)] *= std::exp(g[size_t(c)]);
        for (int64_t e = 0; e < K; ++e) {
          double pred = 0;
          for (int64_t c = 0; c < K; ++c) pred += s[size_t(c * K + e)] * kh[size_t(c)];
          for (int64_t c = 0; c < K; ++c) s[size_t(c * K + e)] += beta * kh[size_t(c)] * (v[size_t(h * K + e)] - pred);
        }
        std::vector<double> o(static_cast<size_t>(K));
        double ss = 0;
        for (int64_t e = 0; e < K; ++e) {
          for (int64_t c = 0; c < K; ++c) o[size_t(e)] += s[size_t(c * K + e)] * qh[size_t(c)];
          o[size_t(e)] /= std::sqrt(double(K));
          ss += o[size_t(e)] * o[size_t(e)];
        }
        for (int64_t e = 0; e < K; ++e)
          out[size_t(h * K + e)] = o[size_t(e)] / std::sqrt(ss / K + 1e-5) * at(w.o_norm, e) * sig(z[size_t(e)]);
      }
      for (int64_t i = 0; i < d; ++i) {
        double s = 0;
        for (int64_t c = 0; c < HK; ++c) s += out[size_t(c)] * W2(w.o, i, c);
        set(y, row * d + i, s);
      }
    }
  }
  return y;
}

}  // namespace

TEST_CASE("a KDA sublayer = the layer written out token by token", "[model][kda]") {
  const Tensor u = randn({B * T, d}, 5);
  model::KdaWeights w = random_weights(100);
  Tensor y = Tensor::empty({B * T, d}, DType::F64);
  model::KdaActs a;
  model::kda_layer_forward(y, a, u, w, dims(), B, T);
  const Tensor want = reference(u, w);
  int64_t bad = 0;
  for (int64_t i = 0; i < want.numel(); ++i)
    bad += !(std::fabs(at(y, i) - at(want, i)) <= 1e-11 * (1 + std::fabs(at(want, i))));
  CHECK(bad == 0);
}

TEST_CASE("a KDA sublayer's backward matches finite differences (input and every weight)",
          "[model][kda]") {
  Tensor u = randn({B * T, d}, 6);
  model::KdaWeights w = random_weights(200);
  const Tensor wy = randn({B * T, d}, 7);
  auto loss = [&] {
    Tensor y = Tensor::empty({B * T, d}, DType::F64);
    model::KdaActs a;
    model::kda_layer_forward(y, a, u, w, dims(), B, T);
    return weighted_sum(y, wy);
  };
  Tensor y = Tensor::empty({B * T, d}, DType::F64);
  model::KdaActs a;
  model::kda_layer_forward(y, a, u, w, dims(), B, T);
  model::KdaWeights grad;
  std::vector<Tensor*> gw = tensors(grad), ws = tensors(w);
  for (size_t i = 0; i < ws.size(); ++i) *gw[i] = Tensor::zeros(ws[i]->shape(), DType::F64);
  Tensor du = Tensor::empty(u.shape(), DType::F64);
  model::kda_layer_backward(du, grad, a, u, wy, w, dims(), B, T);
  std::vector<Tensor*> xs = ws;
  std::vector<const Tensor*> gs(gw.begin(), gw.end());
  std::vector<std::string> names(std::begin(kNames), std::end(kNames));
  xs.push_back(&u);
  gs.push_back(&du);
  names.push_back("the input u");
  for (size_t n = 0; n < xs.size(); ++n) {
    const Tensor fd = fd_gradient(*xs[n], loss);
    int64_t bad = 0;
    for (int64_t i = 0; i < fd.numel(); ++i)
      bad += !(std::fabs(at(*gs[n], i) - at(fd, i)) <= 1e-6 * (1 + std::fabs(at(fd, i))));
    INFO(names[n] << ": " << bad << " of " << fd.numel() << " elements off");
    CHECK(bad == 0);
  }
}
