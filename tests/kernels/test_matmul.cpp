// Linear layer y = x W^T on BLAS: forward vs a triple loop, gradients vs
// finite differences, optional gradients, accumulation, precision, errors.
#include <catch2/catch.hpp>

#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
namespace kern = attnres::kernels;

namespace {

// Reference y = x W^T, in double.
Tensor naive_xwt(const Tensor& x, const Tensor& w) {
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
  Tensor y = Tensor::zeros({M, N}, DType::F64);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t l = 0; l < K; ++l) s += at(x, i * K + l) * at(w, j * K + l);
      set(y, i * N + j, s);
    }
  return y;
}

}  // namespace

TEST_CASE("matmul forward matches a triple loop, and accumulate adds", "[kernels]") {
  const int64_t M = 7, N = 5, K = 12;
  Tensor x = randn({M, K}, 1), w = randn({N, K}, 2);
  Tensor y = Tensor::empty({M, N}, DType::F64);
  kern::matmul_forward(y, x, w);
  Tensor ref = naive_xwt(x, w);
  REQUIRE(scaled_diff(y, ref) < 1e-14);

  Tensor y0 = randn({M, N}, 3);
  Tensor acc = y0.clone();
  kern::matmul_forward(acc, x, w, &acc);  // the residual is y itself: accumulate
  const Tensor terms = naive_xwt(abs_of(x), abs_of(w));  // sum |x_il w_jl| per element
  for (int64_t i = 0; i < acc.numel(); ++i)
    REQUIRE(at(acc, i) == approx_terms(at(y0, i) + at(ref, i), 1e-14, std::fabs(at(y0, i)) + at(terms, i)));
  // A separate residual: the product rounded, then added (as add_), bit for
  // bit, and the residual left as it was.
  Tensor r = y0.clone(), yr = Tensor::empty({M, N}, DType::F64);
  kern::matmul_forward(yr, x, w, &r);
  Tensor two_step = y.clone();
  kern::add_(two_step, y0);
  REQUIRE(same_bits(yr, two_step));
  REQUIRE(same_bits(r, y0));

  // Non-accumulating forward overwrites whatever was in y (even NaN).
  Tensor dirty = Tensor::empty({M, N}, DType::F64);
  for (int64_t i = 0; i < dirty.numel(); ++i) set(dirty, i, NAN);
  kern::matmul_forward(dirty, x, w);
  REQUIRE(max_rel_diff(dirty, ref) < 1e-13);
}

TEST_CASE("matmul backward matches finite differences", "[kernels]") {
  const int64_t M = 7, N = 5, K = 12;
  Tensor x = randn({M, K}, 4), w = randn({N, K}, 5), wt = randn({M, N}, 6);
  auto loss = [&] {
    Tensor y = Tensor::empty({M, N}, DType::F64);
    kern::matmul_forward(y, x, w);
    return weighted_sum(y, wt);
  };
  Tensor dx = Tensor::zeros({M, K}, DType::F64), dw = Tensor::zeros({N, K}, DType::F64);
  kern::matmul_backward(&dx, &dw, wt, x, w);
  REQUIRE(fd_check(x, dx, loss) < 1e-6);
  REQUIRE(fd_check(w, dw, loss) < 1e-6);

  // Either gradient alone gives the same values.
  Tensor dx_only = Tensor::zeros({M, K}, DType::F64), dw_only = Tensor::zeros({N, K}, DType::F64);
  kern::matmul_backward(&dx_only, nullptr, wt, x, w);
  kern::matmul_backward(nullptr, &dw_only, wt, x, w);
  REQUIRE(max_rel_diff(dx_only, dx) == 0);
  REQUIRE(max_rel_diff(dw_only, dw) == 0);
}

TEST_CASE("matmul backward accumulates, and float32 agrees with float64", "[kernels]") {
  const int64_t M = 9, N = 11, K = 13;
  Tensor x = randn({M, K}, 7), w = randn({N, K}, 8), dy = randn({M, N}, 9);
  Tensor dx = Tensor::zeros({M, K}, DType::F64), dw = Tensor::zeros({N, K}, DType::F64);
  kern::matmul_backward(&dx, &dw, dy, x, w);
  Tensor dx1 = dx.clone(), dw1 = dw.clone();
  kern::matmul_backward(&dx, &dw, dy, x, w);
  REQUIRE(scaled_diff(dx, sum_of(dx1, dx1)) < 1e-14);
  REQUIRE(scaled_diff(dw, sum_of(dw1, dw1)) < 1e-14);

  Tensor x32 = x.to(DType::F32), w32 = w.to(DType::F32), dy32 = dy.to(DType::F32);
  Tensor y = Tensor::empty({M, N}, DType::F64), y32 = Tensor::empty({M, N}, DType::F32);
  kern::matmul_forward(y, x, w);
  kern::matmul_forward(y32, x32, w32);
  // Sums of K terms of size ~1 can cancel: compare against the tensor's scale.
  REQUIRE(scaled_diff(y32, y) < 1e-6);
  Tensor dx32 = Tensor::zeros({M, K}, DType::F32), dw32 = Tensor::zeros({N, K}, DType::F32);
  kern::matmul_backward(&dx32, &dw32, dy32, x32, w32);
  REQUIRE(scaled_diff(dx32, dx1) < 1e-6);
  REQUIRE(scaled_diff(dw32, dw1) < 1e-6);
}

TEST_CASE("matmul over W's row blocks gives the bits of one GEMM per block", "[kernels]") {
  // The joint [Wq; Wk; Wv] (model.cpp): on the CPU y's column blocks, dw's
  // row blocks and dx (summed block after block into dx) must be exactly
  // what a GEMM per projection, on tensors of its own, gives.
  const int64_t M = 70, K = 24, blocks[3] = {16, 8, 8}, N = 32;
  // Column block [n0, n0 + b) of a [M, N] tensor, as a tensor of its own.
  auto cols = [&](const Tensor& t, int64_t n0, int64_t b) {
    Tensor out = Tensor::empty({M, b}, t.dtype());
    for (int64_t r = 0; r < M; ++r)
      for (int64_t c = 0; c < b; ++c) set(out, r * b + c, at(t, r * N + n0 + c));
    return out;
  };
  for (DType dt : {DType::F64, DType::F32})
    for (kern::Store st : {kern::Store::Set, kern::Store::Add}) {
      INFO(dtype_name(dt) << (st == kern::Store::Set ? " Set" : " Add"));
      const Tensor x = randn({M, K}, 30).to(dt), w = randn({N, K}, 31).to(dt);
      const Tensor dy = randn({M, N}, 32).to(dt), dx0 = randn({M, K}, 33).to(dt);
      Tensor y = Tensor::empty({M, N}, dt);
      kern::matmul_forward(y, x, w, nullptr, {blocks[0], blocks[1], blocks[2]});
      Tensor dx = st == kern::Store::Set ? Tensor::empty({M, K}, dt) : dx0.clone();
      if (st == kern::Store::Set)
        for (int64_t i = 0; i < dx.numel(); ++i) set(dx, i, NAN);  // must be overwritten
      Tensor dw = randn({N, K}, 34).to(dt);
      kern::matmul_backward(&dx, &dw, dy, x, w, st, {blocks[0], blocks[1], blocks[2]});
      // The same per block, each on tensors of its own.
      Tensor dx_want = st == kern::Store::Set ? Tensor::zeros({M, K}, dt) : dx0.clone();
      const Tensor dw0 = randn({N, K}, 34).to(dt);
      int64_t n0 = 0;
      for (int64_t b : blocks) {
        const Tensor wb = w.rows(n0, b).clone();
        Tensor yb = Tensor::empty({M, b}, dt), dwb = dw0.rows(n0, b).clone();
        kern::matmul_forward(yb, x, wb);
        kern::matmul_backward(&dx_want, &dwb, cols(dy, n0, b), x, wb);
        CHECK(same_bits(cols(y, n0, b), yb));
        CHECK(same_bits(dw.rows(n0, b), dwb));
        n0 += b;
      }
      CHECK(same_bits(dx, dx_want));
      // And dx is the sum, against float64 with each element's own terms.
      Tensor ref = Tensor::zeros({M, K}, DType::F64), terms = Tensor::zeros({M, K}, DType::F64);
      kern::matmul_backward(&ref, nullptr, dy.to(DType::F64), x.to(DType::F64), w.to(DType::F64));
      kern::matmul_backward(&terms, nullptr, abs_of(dy.to(DType::F64)), abs_of(x.to(DType::F64)),
                            abs_of(w.to(DType::F64)));
      const double eps = dt == DType::F64 ? 1e-14 : 1e-6;
      for (int64_t i = 0; i < dx.numel(); ++i) {
        const double base = st == kern::Store::Add ? at(dx0, i) : 0.0;
        REQUIRE(at(dx, i) == approx_terms(base + at(ref, i), eps, std::fabs(base) + at(terms, i)));
      }
    }
  // The blocks must cover W's rows exactly.
  Tensor x = randn({4, 3}, 35), w = randn({5, 3}, 36), dy = randn({4, 5}, 37), dx = randn({4, 3}, 38);
  REQUIRE_THROWS_WITH(kern::matmul_backward(&dx, nullptr, dy, x, w, kern::Store::Set, {2, 2}),
                      Catch::Contains("matmul_backward: w's row blocks sum to 4 rows, w has 5"));
  REQUIRE_THROWS_WITH(kern::matmul_backward(&dx, nullptr, dy, x, w, kern::Store::Set, {6, -1}),
                      Catch::Contains("a row block of w has -1 rows"));
  Tensor y = randn({4, 5}, 39);
  REQUIRE_THROWS_WITH(kern::matmul_forward(y, x, w, nullptr, {1, 1}),
                      Catch::Contains("matmul_forward: w's row blocks sum to 2 rows, w has 5"));
}

TEST_CASE("matmul handles empty dims", "[kernels]") {
  Tensor x = randn({3, 0}, 10), w = randn({4, 0}, 11);
  Tensor y = randn({3, 4}, 12);
  kern::matmul_forward(y, x, w);  // empty sum
  for (int64_t i = 0; i < y.numel(); ++i) REQUIRE(at(y, i) == 0.0);
  Tensor x0 = randn({0, 5}, 13), w5 = randn({4, 5}, 14), y0 = Tensor::empty({0, 4}, DType::F64);
  kern::matmul_forward(y0, x0, w5);
  Tensor dw = Tensor::zeros({4, 5}, DType::F64);
  kern::matmul_backward(nullptr, &dw, y0, x0, w5);
  for (int64_t i = 0; i < dw.numel(); ++i) REQUIRE(at(dw, i) == 0.0);
}

TEST_CASE("matmul rejects mismatched shapes and dtypes", "[kernels]") {
  Tensor x = randn({3, 4}, 15), w = randn({5, 4}, 16), y = Tensor::empty({3, 5}, DType::F64);
  Tensor w_bad = randn({5, 3}, 17);
  REQUIRE_THROWS_AS(kern::matmul_forward(y, x, w_bad), Error);
  REQUIRE_THROWS_WITH(kern::matmul_forward(y, x, w_bad), Catch::Contains("matmul_forward: inner dims differ"));
  Tensor y_bad = Tensor::empty({5, 3}, DType::F64);
  REQUIRE_THROWS_WITH(kern::matmul_forward(y_bad, x, w), Catch::Contains("y has shape [5, 3], expected [3, 5]"));
  Tensor w32 = w.to(DType::F32);
  REQUIRE_THROWS_WITH(kern::matmul_forward(y, x, w32), Catch::Contains("w is F32, expected F64"));
  Tensor dx = Tensor::zeros({3, 4}, DType::F64), dw_bad = Tensor::zeros({4, 5}, DType::F64);
  REQUIRE_THROWS_WITH(kern::matmul_backward(&dx, &dw_bad, y, x, w),
                      Catch::Contains("matmul_backward: dw has shape [4, 5], expected [5, 4]"));
  Tensor dy_bad = randn({3, 4}, 18);
  REQUIRE_THROWS_WITH(kern::matmul_backward(&dx, nullptr, dy_bad, x, w), Catch::Contains("dy has shape"));
}
