// The comparison helpers every other test relies on (tests/testing.h, and
// nan_max / worse from core/worst.h, which `attnres inspect compare` uses
// too). A comparison that lets a NaN through passes a broken kernel, so: a
// NaN or an infinity first, in the middle or last, in either tensor, must
// fail the check `< tol`; equal tensors give exactly 0; a real difference is
// reported with its size.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/worst.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

Tensor tensor_of(const std::vector<double>& v, DType dt) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, dt);
  for (size_t i = 0; i < v.size(); ++i) set(t, static_cast<int64_t>(i), v[i]);
  return t;
}

// What a test does with a comparison's result: passes when below tol.
bool passes(double diff) { return diff < 1e-3; }

}  // namespace

TEST_CASE("nan_max keeps a NaN wherever it comes, and worse() says when to replace", "[core]") {
  const std::vector<double> errors = {0.1, 0.3, 0.2};
  for (double bad : {kNaN, kInf}) {
    for (size_t at_i = 0; at_i <= errors.size(); ++at_i) {
      std::vector<double> e = errors;
      e.insert(e.begin() + static_cast<std::ptrdiff_t>(at_i), bad);
      double worst = 0;
      for (double x : e) worst = nan_max(worst, x);
      INFO("bad value " << bad << " at " << at_i);
      if (std::isnan(bad)) CHECK(std::isnan(worst));
      else CHECK(worst == kInf);
    }
  }
  double worst = 0;
  for (double x : errors) worst = nan_max(worst, x);
  CHECK(worst == 0.3);
  CHECK(worse(0.4, 0.3));
  CHECK_FALSE(worse(0.3, 0.3));
  CHECK_FALSE(worse(0.2, 0.3));
  CHECK(worse(kNaN, 0.3));
  CHECK_FALSE(worse(0.4, kNaN));
  CHECK_FALSE(worse(kNaN, kNaN));
}

TEST_CASE("scaled_diff and max_rel_diff fail on a NaN or an infinity anywhere, in either tensor",
          "[core]") {
  const std::vector<double> ones = {1, 1, 1, 1, 1};
  for (DType dt : {DType::F64, DType::F32})
    for (double bad : {kNaN, kInf, -kInf})
      for (int64_t pos : {0, 2, 4})
        for (bool in_ref : {false, true}) {
          Tensor a = tensor_of(ones, dt), b = tensor_of(ones, dt);
          set(in_ref ? b : a, pos, bad);
          INFO(dtype_name(dt) << ": " << bad << " at " << pos << " of the "
                              << (in_ref ? "reference" : "result"));
          CHECK_FALSE(passes(scaled_diff(a, b)));
          CHECK_FALSE(passes(max_rel_diff(a, b)));
        }
  // The example: [NaN, 0.1, 0.2] against ones once reported 0.9.
  const Tensor a = tensor_of({kNaN, 0.1, 0.2}, DType::F64), b = tensor_of({1, 1, 1}, DType::F64);
  CHECK(std::isnan(scaled_diff(a, b)));
  CHECK(std::isnan(max_rel_diff(a, b)));
  CHECK(std::isnan(scaled_diff(b, a)));
  CHECK(std::isnan(max_rel_diff(b, a)));
}

TEST_CASE("scaled_diff and max_rel_diff: 0 for equal tensors, the size of a real difference",
          "[core]") {
  for (DType dt : {DType::F64, DType::F32}) {
    INFO(dtype_name(dt));
    const Tensor b = tensor_of({0.5, -2, 1, 0.25}, dt);
    CHECK(scaled_diff(b, b.clone()) == 0);
    CHECK(max_rel_diff(b, b.clone()) == 0);
    const Tensor zeros = tensor_of({0, 0, 0}, dt);
    CHECK(scaled_diff(zeros, zeros.clone()) == 0);
    CHECK(max_rel_diff(zeros, zeros.clone()) == 0);
    // One element off by 0.5 (exact in fp32): |a - b| / max |b| = 0.5 / 2;
    // relative to the element: 0.5 / max(|1.5|, |1|).
    const Tensor a = tensor_of({0.5, -2, 1.5, 0.25}, dt);
    CHECK(scaled_diff(a, b) == 0.25);
    CHECK(max_rel_diff(a, b) == Approx(0.5 / 1.5).epsilon(1e-12));
    // The worst element wins wherever it is, the smaller ones around it.
    const Tensor c = tensor_of({0.75, -2, 1.125, 0.25}, dt);
    CHECK(scaled_diff(c, b) == 0.125);
    // Against zeros: any difference is infinitely large relative to them.
    CHECK(scaled_diff(tensor_of({0, 1e-3, 0}, dt), zeros) == kInf);
    // Sizes that differ never agree.
    CHECK(scaled_diff(zeros, b) == kInf);
    CHECK(max_rel_diff(zeros, b) == kInf);
  }
}

TEST_CASE("fd_check fails on a NaN in the analytic gradient or the loss, at any element", "[core]") {
  // loss = sum x_i^2 / 2: the gradient is x.
  Tensor x = tensor_of({0.5, -1, 2, 0.25}, DType::F64);
  auto loss = [&] {
    double s = 0;
    for (int64_t i = 0; i < x.numel(); ++i) s += at(x, i) * at(x, i) / 2;
    return s;
  };
  CHECK(fd_check(x, x.clone(), loss) < 1e-6);
  for (int64_t pos = 0; pos < x.numel(); ++pos) {
    INFO("element " << pos);
    Tensor grad = x.clone();
    set(grad, pos, kNaN);
    CHECK(std::isnan(fd_check(x, grad, loss)));
    set(grad, pos, at(x, pos) + 0.5);  // a wrong gradient is reported
    CHECK_FALSE(passes(fd_check(x, grad, loss)));
    // A loss that turns NaN when element `pos` moves.
    const double orig = at(x, pos);
    auto nan_loss = [&] { return at(x, pos) == orig ? loss() : kNaN; };
    CHECK(std::isnan(fd_check(x, x.clone(), nan_loss)));
  }
}
