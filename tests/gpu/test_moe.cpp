// CUDA mixture-of-experts routing, permutation and combine (kernels/moe.h)
// against the CPU ops on the same random inputs: both routers, with and
// without the aux-free bias, dropless and with a capacity that drops; the
// rows in F32 and BF16; every backward, and the balance term; the experts'
// grouped GEMMs against the CPU's GEMM per group.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "gpu_testing.h"
#include "kernels/cuda/grouped_matmul.h"
#include "kernels/grouped_matmul.h"
#include "kernels/moe.h"

using namespace attnres;
using namespace attnres::gpu_testing;
namespace kern = attnres::kernels;
using kern::MoeRouteOptions;
using kern::MoeRouter;
using kern::MoeRouting;

namespace {

std::vector<int32_t> ints(const Tensor& t) {
  const Tensor h = t.to(Device::CPU);
  return std::vector<int32_t>(h.data<int32_t>(), h.data<int32_t>() + h.numel());
}

// Whether the two choices of token t may differ: the CPU's K-th and
// (K+1)-th keys (score + bias) within 1e-5, where expf against exp may
// order them otherwise. Away from such near-ties the choices must be equal.
bool near_tie(const Tensor& logits, const Tensor* bias, const MoeRouteOptions& o, int64_t t) {
  const int64_t E = logits.dim(1);
  std::vector<double> key(static_cast<size_t>(E));
  double z = 0, m = -INFINITY;
  for (int64_t e = 0; e < E; ++e) m = std::max<double>(m, logits.data<float>()[t * E + e]);
  for (int64_t e = 0; e < E; ++e) z += std::exp(logits.data<float>()[t * E + e] - m);
  for (int64_t e = 0; e < E; ++e) {
    const double r = logits.data<float>()[t * E + e];
    key[e] = (o.router == MoeRouter::Sigmoid ? 1 / (1 + std::exp(-r)) : std::exp(r - m) / z) +
             (bias ? bias->data<float>()[e] : 0.0);
  }
  std::sort(key.begin(), key.end(), std::greater<double>());
  return key[o.top_k - 1] - key[o.top_k] < 1e-5;
}

}  // namespace

TEST_CASE("cuda moe routing, permutation and combine match the CPU", "[gpu][moe]") {
  struct Case {
    const char* name;
    int64_t N, E, K;
    MoeRouter router;
    bool bias;
    double capacity_factor;
  };
  const Case cases[] = {{"sigmoid, bias, dropless", 37, 8, 2, MoeRouter::Sigmoid, true, 0},
                        {"softmax, capacity 1", 64, 6, 3, MoeRouter::Softmax, false, 1.0},
                        {"sigmoid, 64 experts, top 6, capacity 0.5", 129, 64, 6,
                         MoeRouter::Sigmoid, true, 0.5},
                        {"softmax, top 1", 5, 3, 1, MoeRouter::Softmax, false, 0}};
  for (const Case& c : cases)
    for (DType dt : {DType::F32, DType::BF16}) {
      INFO(c.name << ", rows " << dtype_name(dt));
      const int64_t d = 40;
      MoeRouteOptions o;
      o.router = c.router;
      o.top_k = c.K;
      o.scale = 1.5;
      o.capacity = c.capacity_factor > 0
                       ? static_cast<int64_t>(std::ceil(c.capacity_factor * c.N * c.K / c.E))
                       : 0;
      Tensor logits = randn_f32({c.N, c.E}, 1, 1.5);
      Tensor bias = randn_f32({c.E}, 2, 0.1);
      const Tensor logits_dev = logits.to(Device::CUDA), bias_dev = bias.to(Device::CUDA);

      MoeRouting rc, rg;
      kern::moe_route(rc, logits, c.bias ? &bias : nullptr, o);
      kern::moe_route(rg, logits_dev, c.bias ? &bias_dev : nullptr, o);
      const auto ec = ints(rc.expert), eg = ints(rg.expert);
      bool same = true;
      for (int64_t t = 0; t < c.N; ++t)
        for (int64_t j = 0; j < c.K; ++j)
          if (ec[t * c.K + j] != eg[t * c.K + j]) {
            same = false;
            CHECK(near_tie(logits, c.bias ? &bias : nullptr, o, t));
          }
      if (!same) continue;  // a near-tie went the other way: the rest differs by design
      CHECK(ints(rg.row) == ints(rc.row));
      CHECK(ints(rg.token) == ints(rc.token));
      CHECK(rg.offsets == rc.offsets);
      CHECK(rg.load == rc.load);
      CHECK(rg.dropped == rc.dropped);
      if (c.capacity_factor > 0) CHECK(rc.dropped > 0);  // the capacity is exercised
      CHECK(rel_l2(to_host_f32(rg.gate), rc.gate) < 1e-6);

      // Rows: permute, the experts' outputs combined onto a base, and back.
      const int64_t M = rc.rows();
      Pair u = random_pair({c.N, d}, dt, 3, false);
      Pair y = random_pair({M, d}, dt, 4, false);
      Pair base = random_pair({c.N, d}, dt, 5, false);
      Tensor x = poisoned({M, d}, dt), xc = Tensor::empty({M, d});
      kern::moe_permute(x, u.dev, rg);
      kern::moe_permute(xc, u.host, rc);
      CHECK(rel_l2(to_host_f32(x), xc) == 0);  // a gather: exact

      Tensor out = poisoned({c.N, d}, dt), outc = Tensor::empty({c.N, d});
      kern::moe_combine(out, y.dev, rg, &base.dev);
      kern::moe_combine(outc, y.host, rc, &base.host);
      CHECK(rel_l2(to_host_f32(out), outc) < tol(dt));

      Pair dout = random_pair({c.N, d}, dt, 6, false);
      Tensor dy = poisoned({M, d}, dt), dyc = Tensor::empty({M, d});
      Tensor dgate = poisoned({c.N, c.K}, DType::F32), dgatec = Tensor::empty({c.N, c.K});
      kern::moe_combine_backward(dy, dgate, dout.dev, y.dev, rg);
      kern::moe_combine_backward(dyc, dgatec, dout.host, y.host, rc);
      CHECK(rel_l2(to_host_f32(dy), dyc) < tol(dt));
      CHECK(rel_l2(to_host_f32(dgate), dgatec) < tol(dt));

      Pair dx = random_pair({M, d}, dt, 7, false);
      Pair du = random_pair({c.N, d}, dt, 8, false);
      kern::moe_unpermute_add(du.dev, dx.dev, rg);
      kern::moe_unpermute_add(du.host, dx.host, rc);
      CHECK(rel_l2(to_host_f32(du.dev), du.host) < tol(dt));

      // The router's backward and the auxiliary loss's balance term (F32).
      Tensor dg = randn_f32({c.N, c.K}, 9);
      Tensor dl = poisoned({c.N, c.E}, DType::F32), dlc = Tensor::empty({c.N, c.E});
      kern::moe_route_backward(dl, dg.to(Device::CUDA), logits_dev, rg, o);
      kern::moe_route_backward(dlc, dg, logits, rc, o);
      CHECK(rel_l2(to_host_f32(dl), dlc) < 1e-5);
      const double bc = kern::moe_balance(logits, rc, c.router);
      const double bg = kern::moe_balance(logits_dev, rg, c.router);
      CHECK(std::isfinite(bg));
      CHECK(std::abs(bg - bc) <= 1e-6 * std::abs(bc) + 1e-12);
      kern::moe_balance_backward(dl, logits_dev, rg, c.router, 0.7);
      kern::moe_balance_backward(dlc, logits, rc, c.router, 0.7);
      CHECK(rel_l2(to_host_f32(dl), dlc) < 1e-5);
    }
}

TEST_CASE("cuda grouped expert GEMMs match the CPU's GEMM per group", "[gpu][moe]") {
  // 5 experts of w [N, K] over M rows, one group empty and one of a single
  // row; the CPU runs a matmul per group on the same (bf16-rounded) values.
  const int64_t N = 48, K = 40;
  const std::vector<int64_t> offsets = {0, 7, 7, 30, 31, 52};
  const int64_t M = offsets.back(), G = static_cast<int64_t>(offsets.size()) - 1;
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtype_name(dt));
    Pair x = random_pair({M, K}, dt, 11, false), dy = random_pair({M, N}, dt, 12, false);
    std::vector<Tensor> wc, wg, dwc, dwg;
    for (int64_t g = 0; g < G; ++g) {
      Pair w = random_pair({N, K}, dt, 20 + static_cast<uint64_t>(g), false);
      wc.push_back(w.host);
      wg.push_back(w.dev);
      Tensor acc = randn_f32({N, K}, 40 + static_cast<uint64_t>(g));  // dw accumulates into it
      dwc.push_back(acc.clone());
      dwg.push_back(acc.to(Device::CUDA));  // F32: the gradient dtype of F32 and BF16 weights
    }
    Tensor y = poisoned({M, N}, dt), yc = Tensor::empty({M, N});
    kern::grouped_matmul_forward(y, x.dev, wg, offsets);
    kern::grouped_matmul_forward(yc, x.host, wc, offsets);
    CHECK(rel_l2(to_host_f32(y), yc) < tol(dt));

    for (kern::Store store : {kern::Store::Set, kern::Store::Add}) {
      INFO((store == kern::Store::Set ? "dx set" : "dx add"));
      Pair dx = random_pair({M, K}, dt, 13, false);
      if (store == kern::Store::Set) dx.dev = poisoned({M, K}, dt);
      kern::grouped_matmul_backward(&dx.dev, dwg, dy.dev, x.dev, wg, offsets, store);
      kern::grouped_matmul_backward(&dx.host, dwc, dy.host, x.host, wc, offsets, store);
      CHECK(rel_l2(to_host_f32(dx.dev), dx.host) < tol(dt));
      for (int64_t g = 0; g < G; ++g) CHECK(rel_l2(to_host_f32(dwg[g]), dwc[g]) < tol(dt));
    }
  }
}

TEST_CASE("cuda grouped GEMM: each type mix is decided once, as documented, and stays", "[gpu][moe]") {
  // F32 / F32 and BF16 / BF16 are documented for cublasGemmGroupedBatchedEx
  // (and probed); BF16 inputs into an F32 C (a bf16 run's dw) are not: per
  // expert, whatever ran before. ATTNRES_MOE_GROUPED_GEMM=0 turns all off.
  const char* env = std::getenv("ATTNRES_MOE_GROUPED_GEMM");
  const bool off = env && std::string(env) == "0";
  for (int round = 0; round < 2; ++round) {
    INFO("ask " << round + 1);
    CHECK(kern::cuda::uses_grouped_gemm(DType::F32, DType::F32) == !off);
    CHECK(kern::cuda::uses_grouped_gemm(DType::BF16, DType::BF16) == !off);
    CHECK_FALSE(kern::cuda::uses_grouped_gemm(DType::BF16, DType::F32));
  }
}
