// One KDA sublayer (model/kda_layer.h) against the layer of docs/model.md
// written out token by token in double (tests/model/reference.h
// kda_attention: projections, convolutions from zeros per sequence, SiLU,
// the L2 norms, the decay and write strength, the recurrence, the gated
// output norm, o_proj; no code shared with src/), and every gradient, the
// input's and each weight's, by central finite differences.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "model/kda_layer.h"
#include "model/reference.h"
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
// Their names under model.layers.L.self_attn. (tensors() order).
const char* const kNames[] = {"q_proj.weight", "k_proj.weight", "v_proj.weight",
                              "q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight", "A_log",
                              "dt_bias", "f_a_proj.weight", "f_b_proj.weight", "b_proj.weight",
                              "g_a_proj.weight", "g_b_proj.weight", "o_norm.weight", "o_proj.weight"};

// The layer as tests/model/reference.h writes it out (docs/model.md, token
// by token), reading these weights by their Kimi names as layer 0's.
Tensor reference_layer(const Tensor& u, model::KdaWeights& w) {
  model::ModelConfig c;
  c.kda.heads = H, c.kda.head_dim = K, c.kda.conv_size = W, c.norm_eps = 1e-5;
  const std::vector<Tensor*> ts = tensors(w);
  const reference::ParamFn P = [&](const std::string& name) {
    for (size_t i = 0; i < ts.size(); ++i)
      if (name == std::string("model.layers.0.self_attn.") + kNames[i])
        return reference::Vec(ts[i]->data<double>(), ts[i]->data<double>() + ts[i]->numel());
    FAIL("no tensor " << name);
    return reference::Vec();
  };
  Tensor y = Tensor::empty({B * T, d}, DType::F64);
  for (int64_t b = 0; b < B; ++b) {
    reference::Seq ub(T);
    for (int64_t t = 0; t < T; ++t)
      ub[size_t(t)] = reference::Vec(u.data<double>() + (b * T + t) * d, u.data<double>() + (b * T + t + 1) * d);
    const reference::Seq yb = reference::kda_attention(c, P, 0, ub);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < d; ++i) set(y, (b * T + t) * d + i, yb[size_t(t)][size_t(i)]);
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
  const Tensor want = reference_layer(u, w);
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
