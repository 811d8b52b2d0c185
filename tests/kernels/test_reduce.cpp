// Reductions and elementwise helpers: sum_squares (exact order, thread-count
// independent), scale_, add_, add, all_finite, errors.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/reduce.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
namespace kern = attnres::kernels;

TEST_CASE("sum_squares matches a long double sum", "[kernels]") {
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t((1 << 14) + 3), int64_t(100003)}) {
    for (DType dt : {DType::F32, DType::F64}) {
      Tensor x = randn({n}, 1, dt);
      long double ref = 0;
      for (int64_t i = 0; i < n; ++i) ref += static_cast<long double>(at(x, i)) * at(x, i);
      REQUIRE(kern::sum_squares(x) == Approx(static_cast<double>(ref)).epsilon(1e-12));
    }
  }
}

TEST_CASE("sum_squares gives identical bits with 1 and 2 threads", "[kernels]") {
  const int saved = omp_get_max_threads();
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor x = randn({300001}, 2, dt);
    omp_set_num_threads(1);
    const double one = kern::sum_squares(x);
    omp_set_num_threads(2);
    const double two = kern::sum_squares(x);
    REQUIRE(std::memcmp(&one, &two, sizeof(double)) == 0);
  }
  omp_set_num_threads(saved);
}

TEST_CASE("scale_, add_ and add are elementwise", "[kernels]") {
  for (int64_t n : {int64_t(7), int64_t(70001)}) {  // serial and parallel paths
    Tensor a = randn({n}, 3), b = randn({n}, 4);
    Tensor s = a.clone();
    kern::scale_(s, -0.375);
    Tensor y = a.clone();
    kern::add_(y, b);
    Tensor out = Tensor::empty({n}, DType::F64);
    kern::add(out, a, b);
    for (int64_t i = 0; i < n; ++i) {
      REQUIRE(at(s, i) == at(a, i) * -0.375);
      REQUIRE(at(y, i) == at(a, i) + at(b, i));
      REQUIRE(at(out, i) == at(a, i) + at(b, i));
    }
  }
  Tensor a32 = randn({13}, 5, DType::F32), b32 = randn({13}, 6, DType::F32);
  Tensor o32 = Tensor::empty({13}, DType::F32);
  kern::add(o32, a32, b32);
  for (int64_t i = 0; i < 13; ++i) REQUIRE(o32.data<float>()[i] == a32.data<float>()[i] + b32.data<float>()[i]);
}

TEST_CASE("all_finite finds NaN and infinities anywhere", "[kernels]") {
  const double bad[] = {std::numeric_limits<double>::quiet_NaN(),
                        std::numeric_limits<double>::infinity(),
                        -std::numeric_limits<double>::infinity()};
  for (int64_t n : {int64_t(1), int64_t(13), int64_t(70001)}) {
    for (DType dt : {DType::F32, DType::F64}) {
      Tensor x = randn({n}, 7, dt, 1e30);  // huge but finite (in float too: < 3.4e38)
      REQUIRE(kern::all_finite(x));
      for (int64_t pos : {int64_t(0), n / 2, n - 1})
        for (double b : bad) {
          Tensor y = x.clone();
          set(y, pos, b);
          REQUIRE_FALSE(kern::all_finite(y));
        }
    }
  }
  REQUIRE(kern::all_finite(Tensor::zeros({0}, DType::F32)));
}

TEST_CASE("reduce helpers reject mismatched tensors", "[kernels]") {
  Tensor a = randn({3, 4}, 8), b = randn({4, 3}, 9);
  REQUIRE_THROWS_AS(kern::add_(a, b), Error);
  REQUIRE_THROWS_WITH(kern::add_(a, b), Catch::Contains("add_: x has shape [4, 3], y has [3, 4]"));
  Tensor b32 = randn({3, 4}, 10, DType::F32);
  REQUIRE_THROWS_WITH(kern::add_(a, b32), Catch::Contains("add_: x is F32, y is F64"));
  Tensor out = Tensor::empty({12}, DType::F64), b_ok = randn({3, 4}, 11);
  REQUIRE_THROWS_WITH(kern::add(out, a, b_ok), Catch::Contains("add: out has shape [12]"));
  Tensor ids = Tensor::zeros({4}, DType::I32);
  REQUIRE_THROWS_WITH(kern::sum_squares(ids), Catch::Contains("sum_squares: the CPU kernels take F32 or F64, got I32"));
}
