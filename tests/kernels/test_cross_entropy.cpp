// Fused LM head + softmax cross-entropy on the CPU: the loss against a plain
// per-row log-softmax, gradients against finite differences (float64), more
// rows than one chunk, accumulation, float32 vs float64, bad targets.
#include <catch2/catch.hpp>
#include <cmath>

#include "kernels/cross_entropy.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
namespace kern = attnres::kernels;

namespace {

// sum_n -log softmax(h_n W^T)[t_n], written out directly in double.
double naive_loss(const Tensor& h, const Tensor& w, const Tensor& targets) {
  const int64_t N = h.dim(0), d = h.dim(1), V = w.dim(0);
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> z(static_cast<size_t>(V));
    double mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t c = 0; c < d; ++c) s += at(h, n * d + c) * at(w, v * d + c);
      z[v] = s;
      mx = std::max(mx, s);
    }
    double sum = 0;
    for (double x : z) sum += std::exp(x - mx);
    total += mx + std::log(sum) - z[targets.data<int32_t>()[n]];
  }
  return total;
}

}  // namespace

TEST_CASE("cross-entropy loss matches a per-row log-softmax, over several chunks", "[kernels]") {
  // 300 rows: more than the CPU kernel's 128-row chunk, with a ragged last chunk.
  for (int64_t N : {int64_t(1), int64_t(7), int64_t(300)}) {
    INFO("N = " << N);
    const int64_t d = 9, V = 23;
    Tensor h = randn({N, d}, 1 + N), w = randn({V, d}, 2 + N);
    Tensor t = random_tokens(N, V, 3 + N);
    REQUIRE(kern::lm_head_cross_entropy(h, w, t, nullptr, nullptr, 0.0) ==
            Approx(naive_loss(h, w, t)).epsilon(1e-12));
  }
}

TEST_CASE("cross-entropy gradients match finite differences (float64)", "[kernels]") {
  const int64_t N = 150, d = 6, V = 11;  // two chunks
  Tensor h = randn({N, d}, 4), w = randn({V, d}, 5);
  Tensor t = random_tokens(N, V, 6);
  const double scale = 0.37;
  Tensor dh = Tensor::zeros({N, d}, DType::F64), dw = Tensor::zeros({V, d}, DType::F64);
  const double loss = kern::lm_head_cross_entropy(h, w, t, &dh, &dw, scale);
  REQUIRE(loss == Approx(naive_loss(h, w, t)).epsilon(1e-12));
  auto f = [&]() { return scale * kern::lm_head_cross_entropy(h, w, t, nullptr, nullptr, 0.0); };
  CHECK(fd_check(h, dh, f, 1e-5, 1e-7) < 1e-6);
  CHECK(fd_check(w, dw, f, 1e-5, 1e-7) < 1e-6);
}

TEST_CASE("cross-entropy accumulates into dh and dw, and float32 agrees with float64", "[kernels]") {
  const int64_t N = 40, d = 16, V = 37;
  Tensor h = randn({N, d}, 7), w = randn({V, d}, 8, DType::F64, 0.3);
  Tensor t = random_tokens(N, V, 9);
  Tensor dh = Tensor::zeros({N, d}, DType::F64), dw = Tensor::zeros({V, d}, DType::F64);
  const double l64 = kern::lm_head_cross_entropy(h, w, t, &dh, &dw, 1.0);

  // Starting from random gradients adds the same amounts.
  Tensor dh0 = randn({N, d}, 10), dw0 = randn({V, d}, 11);
  Tensor dh_acc = dh0.clone(), dw_acc = dw0.clone();
  kern::lm_head_cross_entropy(h, w, t, &dh_acc, &dw_acc, 1.0);
  REQUIRE(scaled_diff(dh_acc, sum_of(dh0, dh)) < 1e-14);  // sums that may cancel
  REQUIRE(scaled_diff(dw_acc, sum_of(dw0, dw)) < 1e-14);

  Tensor h32 = h.to(DType::F32), w32 = w.to(DType::F32);
  Tensor dh32 = Tensor::zeros({N, d}), dw32 = Tensor::zeros({V, d});
  const double l32 = kern::lm_head_cross_entropy(h32, w32, t, &dh32, &dw32, 1.0);
  CHECK(l32 == Approx(l64).epsilon(1e-5));
  CHECK(scaled_diff(dh32, dh) < 1e-5);
  CHECK(scaled_diff(dw32, dw) < 1e-5);
}

TEST_CASE("cross-entropy rejects targets outside the vocabulary", "[kernels]") {
  Tensor h = randn({4, 3}, 12), w = randn({5, 3}, 13);
  Tensor t = Tensor::from_vector(std::vector<int32_t>{0, 4, 5, 1}, {4});
  REQUIRE_THROWS_WITH(kern::lm_head_cross_entropy(h, w, t, nullptr, nullptr, 0.0),
                      Catch::Contains("target id 5 at position 2") &&
                          Catch::Contains("outside the vocabulary [0, 5)"));
  Tensor neg = Tensor::from_vector(std::vector<int32_t>{-1, 0, 0, 0}, {4});
  REQUIRE_THROWS_WITH(kern::lm_head_cross_entropy(h, w, neg, nullptr, nullptr, 0.0),
                      Catch::Contains("target id -1 at position 0"));
}

TEST_CASE("cross-entropy keeps bf16 logits to bf16 inputs on cuda", "[kernels]") {
  Tensor h = randn({4, 3}, 14).to(DType::F32), w = randn({5, 3}, 15).to(DType::F32);
  Tensor t = Tensor::from_vector(std::vector<int32_t>{0, 4, 2, 1}, {4});
  REQUIRE_THROWS_WITH(
      kern::lm_head_cross_entropy(h, w, t, nullptr, nullptr, 0.0, kern::Store::Add, DType::BF16),
      Catch::Contains("bf16 logits need BF16 h and w on cuda, got F32 on cpu"));
  REQUIRE_THROWS_WITH(
      kern::lm_head_cross_entropy(h, w, t, nullptr, nullptr, 0.0, kern::Store::Add, DType::F64),
      Catch::Contains("logits must be F32 or BF16, got F64"));
}
