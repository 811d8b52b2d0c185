// Muon (optimizer.type = "muon", docs/model.md section 4) against a float64
// transcription of its definition, written here on plain vectors with the
// transposes made explicitly (src/ never makes them): the Newton-Schulz
// quintic on wide, tall and square matrices, and whole optimizer steps of a
// real model's table (a MoE model: attention, dense MLP, routed and shared
// experts, router, embedding, head, gains, queries) with momentum,
// Nesterov, clipping and decay acting, which tensors take Muon, and the
// AdamW half of the table equal to optimizer.type = "adamw"'s.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/muon.h"
#include "kernels/reduce.h"
#include "model/model_testing.h"
#include "model/params.h"
#include "testing.h"
#include "train/optimizer.h"

using namespace attnres;
using namespace attnres::testing;

namespace {

// A row-major m x n matrix in double.
struct Mat {
  int64_t m = 0, n = 0;
  std::vector<double> a;
  double& operator()(int64_t i, int64_t j) { return a[static_cast<size_t>(i * n + j)]; }
  double operator()(int64_t i, int64_t j) const { return a[static_cast<size_t>(i * n + j)]; }
};
Mat zeros(int64_t m, int64_t n) { return {m, n, std::vector<double>(static_cast<size_t>(m * n))}; }
Mat matmul(const Mat& x, const Mat& y) {
  Mat out = zeros(x.m, y.n);
  for (int64_t i = 0; i < x.m; ++i)
    for (int64_t j = 0; j < y.n; ++j)
      for (int64_t k = 0; k < x.n; ++k) out(i, j) += x(i, k) * y(k, j);
  return out;
}
Mat transpose(const Mat& x) {
  Mat out = zeros(x.n, x.m);
  for (int64_t i = 0; i < x.m; ++i)
    for (int64_t j = 0; j < x.n; ++j) out(j, i) = x(i, j);
  return out;
}

// The definition: X = G / (||G||_F + 1e-7), transposed when m > n; five
// times A = X X^T, B = b A + c A A, X = a X + B X; transposed back.
Mat ref_newton_schulz(const Mat& g) {
  double sq = 0;
  for (double v : g.a) sq += v * v;
  Mat x = g;
  for (double& v : x.a) v /= std::sqrt(sq) + 1e-7;
  const bool tall = g.m > g.n;
  if (tall) x = transpose(x);
  for (int s = 0; s < 5; ++s) {
    const Mat A = matmul(x, transpose(x)), AA = matmul(A, A);
    Mat B = zeros(A.m, A.n);
    for (size_t i = 0; i < B.a.size(); ++i) B.a[i] = -4.7750 * A.a[i] + 2.0315 * AA.a[i];
    const Mat BX = matmul(B, x);
    for (size_t i = 0; i < x.a.size(); ++i) x.a[i] = 3.4445 * x.a[i] + BX.a[i];
  }
  return tall ? transpose(x) : x;
}

Mat mat_of(const Tensor& t) {
  Mat out = zeros(t.dim(0), t.dim(1));
  for (int64_t i = 0; i < t.numel(); ++i) out.a[static_cast<size_t>(i)] = at(t, i);
  return out;
}

double max_abs_diff(const Tensor& t, const std::vector<double>& want) {
  double worst = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double d = std::fabs(at(t, i) - want[static_cast<size_t>(i)]);
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}

// Names that take Muon, decided here from the definition (the 2-D weights
// inside the layers but the routers): src/ decides with its own rule.
bool ref_takes_muon(const std::string& name, int ndim) {
  const bool in_layer = name.rfind("model.layers.", 0) == 0;
  const bool router = name.find("mlp.gate.weight") != std::string::npos;
  return ndim == 2 && in_layer && !router;
}

}  // namespace

TEST_CASE("newton_schulz5 is the quintic of the definition, wide, tall and square",
          "[train][muon]") {
  for (auto [m, n] : {std::pair<int64_t, int64_t>{3, 5}, {7, 4}, {4, 4}, {1, 6}, {9, 1}}) {
    INFO(m << " x " << n);
    const Tensor g = randn({m, n}, 17 + m * 10 + n, DType::F64, 0.3);
    Tensor x = Tensor::empty({m, n}, DType::F64);
    kernels::newton_schulz5(x, g);
    const Mat want = ref_newton_schulz(mat_of(g));
    CHECK(max_abs_diff(x, want.a) < 1e-12);
    // Roughly orthogonal rows (or columns): singular values near 1 (0.7-1.2).
    const Mat xm = mat_of(x);
    const Mat gram = m <= n ? matmul(xm, transpose(xm)) : matmul(transpose(xm), xm);
    for (int64_t i = 0; i < gram.m; ++i) {
      CHECK(gram(i, i) > 0.3);
      CHECK(gram(i, i) < 1.6);
    }
  }
}

TEST_CASE("optimizer.type muon: Muon for the layers' matrices, AdamW for the rest",
          "[train][muon]") {
  // A MoE model: layer 0 dense, layer 1 with 3 routed experts and a shared one.
  model::ModelConfig cfg = testing::with_moe(
      testing::resized(testing::tiny(model::ResidualMode::Block, 2, 0, false, 2), 11, 8, 2, 1, 10),
      3, 2, 1);
  train::OptimizerConfig oc;
  oc.type = train::OptimizerType::Muon;
  oc.momentum = 0.9;
  oc.weight_decay = 0.1;
  oc.grad_clip = 1.0;
  train::OptimizerConfig adam = oc;
  adam.type = train::OptimizerType::AdamW;

  model::ParamTable muon_t = model::make_params(cfg, DType::F64);
  model::ParamTable adam_t = model::make_params(cfg, DType::F64);
  muon_t.init(5);
  adam_t.init(5);
  train::Optimizer muon(muon_t, oc), adamw(adam_t, adam);

  // Which tensors take Muon: the src/ rule against the definition, and some by name.
  int n_muon = 0;
  for (const auto& p : muon_t.all()) {
    INFO(p.name);
    CHECK(train::Optimizer::takes_muon(p) == ref_takes_muon(p.name, p.value.ndim()));
    n_muon += train::Optimizer::takes_muon(p);
  }
  CHECK(train::Optimizer::takes_muon(muon_t.get("model.layers.1.mlp.experts.2.down_proj.weight")));
  CHECK(train::Optimizer::takes_muon(muon_t.get("model.layers.1.mlp.shared_experts.up_proj.weight")));
  CHECK(train::Optimizer::takes_muon(muon_t.get("model.layers.0.self_attn.k_proj.weight")));
  CHECK(!train::Optimizer::takes_muon(muon_t.get("model.layers.1.mlp.gate.weight")));
  CHECK(!train::Optimizer::takes_muon(muon_t.get("model.embed_tokens.weight")));
  CHECK(!train::Optimizer::takes_muon(muon_t.get("lm_head.weight")));
  CHECK(n_muon == 4 + 3 + 4 + 3 * 3 + 3);  // attention x2, dense MLP, experts, shared

  // The reference's state: weights and momentum buffers of the Muon matrices.
  const auto& ps = muon_t.all();
  std::vector<Mat> w(ps.size()), buf(ps.size());
  for (size_t i = 0; i < ps.size(); ++i)
    if (train::Optimizer::takes_muon(ps[i])) {
      w[i] = mat_of(ps[i].value);
      buf[i] = zeros(w[i].m, w[i].n);
    }
  // Steps with norms below the clip and far above it, the lr changing.
  const double norm_over_clip[] = {0.5, 4.0, 1.5, 0.7};
  for (int k = 0; k < 4; ++k) {
    const double lr = 0.02 * (1 + 0.5 * k);
    double sq = 0;
    std::vector<Tensor> grads;
    for (size_t i = 0; i < ps.size(); ++i) {
      grads.push_back(randn(ps[i].value.shape(), 100 * (k + 1) + i, DType::F64));
      for (int64_t j = 0; j < grads.back().numel(); ++j) sq += at(grads.back(), j) * at(grads.back(), j);
    }
    const double s = norm_over_clip[k] * oc.grad_clip / std::sqrt(sq);
    for (size_t i = 0; i < ps.size(); ++i) {
      Tensor g = grads[i].clone();
      kernels::scale_(g, s);
      muon_t.all()[i].grad.copy_from(g);
      adam_t.all()[i].grad.copy_from(g);
    }
    const double norm = muon.grad_norm();
    CHECK(norm == Approx(norm_over_clip[k] * oc.grad_clip).epsilon(1e-12));
    muon.step(lr, norm);
    adamw.step(lr, adamw.grad_norm());
    const double clip = norm > oc.grad_clip ? oc.grad_clip / (norm + 1e-6) : 1.0;
    for (size_t i = 0; i < ps.size(); ++i) {
      INFO("step " << k + 1 << ", " << ps[i].name);
      if (!train::Optimizer::takes_muon(ps[i])) {
        // AdamW's half: the same bits as an AdamW optimizer's.
        CHECK(same_bits(ps[i].value, adam_t.all()[i].value));
        continue;
      }
      // buf = mu buf + g; u = g + mu buf; w = w (1 - lr wd) - lr 0.2 sqrt(max(m, n)) NS(u).
      Mat g = mat_of(muon_t.all()[i].grad), u = zeros(g.m, g.n);
      for (size_t j = 0; j < g.a.size(); ++j) {
        g.a[j] *= clip;
        buf[i].a[j] = oc.momentum * buf[i].a[j] + g.a[j];
        u.a[j] = g.a[j] + oc.momentum * buf[i].a[j];
      }
      const Mat o = ref_newton_schulz(u);
      const double scale = 0.2 * std::sqrt(static_cast<double>(std::max(g.m, g.n)));
      for (size_t j = 0; j < w[i].a.size(); ++j)
        w[i].a[j] = w[i].a[j] * (1 - lr * oc.weight_decay) - lr * scale * o.a[j];
      CHECK(max_abs_diff(ps[i].value, w[i].a) < 1e-12);
    }
    // The momentum buffers are the optimizer's state, under their own names.
    const auto state = muon.state_tensors();
    for (size_t i = 0; i < ps.size(); ++i)
      if (train::Optimizer::takes_muon(ps[i])) {
        CHECK(state[i].name == "momentum_buffer." + ps[i].name);
        CHECK(max_abs_diff(state[i].tensor, buf[i].a) < 1e-12);
        CHECK(!state[ps.size() + i].tensor.defined());
      } else {
        CHECK(state[i].name == "exp_avg." + ps[i].name);
      }
  }
  // Muon holds one buffer per matrix where AdamW holds two.
  int64_t muon_elems = 0;
  for (const auto& p : ps)
    if (train::Optimizer::takes_muon(p)) muon_elems += p.value.numel();
  CHECK(adamw.state_bytes() - muon.state_bytes() == muon_elems * 8);
}
