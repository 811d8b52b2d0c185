// Grouped linear layers (kernels/grouped_matmul.h) on the CPU: each group's
// rows against the product written out in double (an empty group and a
// one-row group included), and every operand that does not fit refused,
// named, before any backend runs (the CUDA path hands raw pointers to cuBLAS).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "kernels/grouped_matmul.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;

namespace {

constexpr int64_t K = 5, N = 3;
const std::vector<int64_t> kOffsets = {0, 4, 4, 5, 9};  // groups of 4, 0, 1 and 4 rows

struct Case {
  Tensor x, dy;
  std::vector<Tensor> w;
};

Case make_case(DType dt) {
  Case c;
  const int64_t M = kOffsets.back();
  c.x = randn({M, K}, 11, dt);
  c.dy = randn({M, N}, 12, dt);
  for (size_t g = 0; g + 1 < kOffsets.size(); ++g) c.w.push_back(randn({N, K}, 20 + g, dt));
  return c;
}

// The group of row r.
size_t group_of(int64_t r) {
  size_t g = 0;
  while (kOffsets[g + 1] <= r) ++g;
  return g;
}

}  // namespace

TEST_CASE("grouped matmul: each group's rows are x W_g^T, dx = dy W_g, dw_g += dy_g^T x_g",
          "[kernels][moe]") {
  const Case c = make_case(DType::F64);
  const int64_t M = kOffsets.back();
  Tensor y = Tensor::empty({M, N}, DType::F64);
  kernels::grouped_matmul_forward(y, c.x, Span<const Tensor>(c.w.data(), c.w.size()), kOffsets);
  Tensor dx = randn({M, K}, 13, DType::F64);
  const Tensor dx0 = dx.clone();
  std::vector<Tensor> dw;
  for (size_t g = 0; g < c.w.size(); ++g) dw.push_back(randn({N, K}, 30 + g, DType::F64));
  std::vector<Tensor> dw0;
  for (const auto& t : dw) dw0.push_back(t.clone());
  kernels::grouped_matmul_backward(&dx, Span<Tensor>(dw.data(), dw.size()), c.dy, c.x,
                                   Span<const Tensor>(c.w.data(), c.w.size()), kOffsets,
                                   kernels::Store::Add);
  for (int64_t r = 0; r < M; ++r) {
    const Tensor& w = c.w[group_of(r)];
    for (int64_t n = 0; n < N; ++n) {
      double want = 0, scale = 0;
      for (int64_t k = 0; k < K; ++k) {
        want += at(c.x, r * K + k) * at(w, n * K + k);
        scale += std::abs(at(c.x, r * K + k) * at(w, n * K + k));
      }
      CHECK(at(y, r * N + n) == approx_terms(want, 1e-13, scale));
    }
    for (int64_t k = 0; k < K; ++k) {
      double want = at(dx0, r * K + k), scale = std::abs(want);
      for (int64_t n = 0; n < N; ++n) {
        want += at(c.dy, r * N + n) * at(w, n * K + k);
        scale += std::abs(at(c.dy, r * N + n) * at(w, n * K + k));
      }
      CHECK(at(dx, r * K + k) == approx_terms(want, 1e-13, scale));
    }
  }
  for (size_t g = 0; g < c.w.size(); ++g)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        double want = at(dw0[g], n * K + k), scale = std::abs(want);
        for (int64_t r = kOffsets[g]; r < kOffsets[g + 1]; ++r) {
          want += at(c.dy, r * N + n) * at(c.x, r * K + k);
          scale += std::abs(at(c.dy, r * N + n) * at(c.x, r * K + k));
        }
        INFO("group " << g << " (" << kOffsets[g + 1] - kOffsets[g] << " rows)");
        CHECK(at(dw[g], n * K + k) == approx_terms(want, 1e-13, scale));
      }
}

TEST_CASE("grouped matmul: a misfit y, dy, dx or dw is refused with its name", "[kernels][moe]") {
  const Case c = make_case(DType::F32);
  const int64_t M = kOffsets.back();
  const Span<const Tensor> w(c.w.data(), c.w.size());
  auto dws = [&](Shape shape, DType dt) {
    std::vector<Tensor> out;
    for (size_t g = 0; g < c.w.size(); ++g) out.push_back(Tensor::zeros(shape, dt));
    return out;
  };
  Tensor y_short = Tensor::empty({M - 1, N}, DType::F32);
  REQUIRE_THROWS_WITH(kernels::grouped_matmul_forward(y_short, c.x, w, kOffsets),
                      Catch::Contains("y has shape"));
  Tensor y_f64 = Tensor::empty({M, N}, DType::F64);
  REQUIRE_THROWS_WITH(kernels::grouped_matmul_forward(y_f64, c.x, w, kOffsets),
                      Catch::Contains("y is F64"));
  auto dw = dws({N, K}, DType::F32);
  const Tensor dy_wide = Tensor::zeros({M, N + 1}, DType::F32);
  REQUIRE_THROWS_WITH(kernels::grouped_matmul_backward(nullptr, Span<Tensor>(dw.data(), dw.size()),
                                                       dy_wide, c.x, w, kOffsets, kernels::Store::Set),
                      Catch::Contains("dy has shape"));
  Tensor dx_narrow = Tensor::zeros({M, K - 1}, DType::F32);
  REQUIRE_THROWS_WITH(kernels::grouped_matmul_backward(&dx_narrow, {}, c.dy, c.x, w, kOffsets,
                                                       kernels::Store::Set),
                      Catch::Contains("dx has shape"));
  auto dw_t = dws({K, N}, DType::F32);  // transposed
  REQUIRE_THROWS_WITH(kernels::grouped_matmul_backward(nullptr, Span<Tensor>(dw_t.data(), dw_t.size()),
                                                       c.dy, c.x, w, kOffsets, kernels::Store::Set),
                      Catch::Contains("dw has shape"));
  auto dw_f64 = dws({N, K}, DType::F64);
  REQUIRE_THROWS_WITH(kernels::grouped_matmul_backward(nullptr, Span<Tensor>(dw_f64.data(), dw_f64.size()),
                                                       c.dy, c.x, w, kOffsets, kernels::Store::Set),
                      Catch::Contains("dw is F64"));
  // A misfit in an empty group's dw is refused too (no GEMM would touch it).
  dw[1] = Tensor::zeros({N, K + 1}, DType::F32);
  REQUIRE_THROWS_WITH(kernels::grouped_matmul_backward(nullptr, Span<Tensor>(dw.data(), dw.size()),
                                                       c.dy, c.x, w, kOffsets, kernels::Store::Set),
                      Catch::Contains("dw has shape"));
}
