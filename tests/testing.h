// Shared test utilities: random tensors, finite differences, comparisons.
#pragma once
#include <catch2/catch.hpp>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "core/worst.h"

namespace attnres::testing {

// Fill with N(0, stddev) (never zeros), deterministic in `seed`.
inline void fill_normal(Tensor& t, uint64_t seed, double stddev = 1.0) {
  auto fill = [&](auto* p) {
    for (int64_t i = 0; i < t.numel(); ++i)
      p[i] = static_cast<std::remove_pointer_t<decltype(p)>>(stddev * random_normal(seed, 7, i));
  };
  if (t.dtype() == DType::F32) fill(t.data<float>());
  else if (t.dtype() == DType::F64) fill(t.data<double>());
  else throw Error("fill_normal: float tensors only");
}

inline Tensor randn(const Shape& shape, uint64_t seed, DType dtype = DType::F64, double stddev = 1.0) {
  Tensor t = Tensor::empty(shape, dtype);
  fill_normal(t, seed, stddev);
  return t;
}

// Random token ids in [0, vocab).
inline Tensor random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Tensor t = Tensor::empty({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>(random_u64(seed, 11, i) % static_cast<uint64_t>(vocab));
  return t;
}

// A learnable token stream over 64 ids: mostly a fixed successor of the
// previous token, sometimes a random one (training on it makes the loss fall).
inline std::vector<int32_t> learnable_tokens(uint64_t seed, int64_t n) {
  std::vector<int32_t> t;
  int32_t prev = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = random_u64(seed, 0, static_cast<uint64_t>(i));
    prev = r % 4 == 0 ? static_cast<int32_t>((r >> 8) % 64) : (prev * 5 + 3) % 64;
    t.push_back(prev);
  }
  return t;
}

// Value of element i as double, whatever the float dtype.
inline double at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::F32 ? t.data<float>()[i] : t.data<double>()[i];
}
inline void set(Tensor& t, int64_t i, double v) {
  if (t.dtype() == DType::F32) t.data<float>()[i] = static_cast<float>(v);
  else t.data<double>()[i] = v;
}

// Whether two tensors (on any device) hold the same bytes: bit-for-bit
// equality, NaNs included.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

// Tolerances that hold on every CPU. Which last bits a result carries depends
// on the host (vector width, FMA contraction, the BLAS kernel it dispatches
// to), and rounding error is relative to the size of the terms that produce a
// value, not to the value: O(1) terms that cancel to 1e-5 carry an error of
// O(1e-16) (fp64) or O(1e-7) (fp32), which is huge relative to 1e-5. So a
// value that can be near zero is compared with a margin scaled by its terms
// (approx_terms, scaled_diff); a relative-only tolerance (Approx(x).epsilon,
// max_rel_diff) is kept for values that are products or positive sums (norms,
// probabilities, losses), where the terms' size is the value's size.
// Bit-for-bit comparisons (same_bits) are only for two runs of one code path.

// Approx passing when |got - want| <= tol * scale, scale = the size of the
// terms `want` was computed from (e.g. sum |term|). Note Catch2's Approx has a
// default relative epsilon of ~1.2e-5 that .margin() alone does not remove.
inline Approx approx_terms(double want, double tol, double scale) {
  return Approx(want).epsilon(0).margin(tol * scale);
}

// The comparisons below fold element errors with nan_max (core/worst.h): a
// NaN or an infinity in either tensor, at any position, makes the result NaN
// or infinite, so that every `< tol` check on it fails
// (tests/core/test_testing_helpers.cpp).

// max |a - b| over max |b|: agreement judged against the tensor's scale, for
// tensors whose elements are sums that may cancel to ~0 (gradients, mixes,
// rotations). Two all-zero tensors agree (0); INFINITY when the sizes differ.
inline double scaled_diff(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return INFINITY;
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    num = nan_max(num, std::fabs(at(a, i) - at(b, i)));
    den = nan_max(den, std::fabs(at(b, i)));
  }
  return den > 0 || num != 0 ? num / den : 0.0;
}

// a + b elementwise, in double (the exact double of a is sum_of(a, a)).
inline Tensor sum_of(const Tensor& a, const Tensor& b) {
  Tensor s = Tensor::empty(a.shape(), DType::F64);
  for (int64_t i = 0; i < a.numel(); ++i) set(s, i, at(a, i) + at(b, i));
  return s;
}

// |a| elementwise, in double: feeds a reference computation to get the size
// of the terms behind each element (e.g. |x| |W|^T for x W^T).
inline Tensor abs_of(const Tensor& a) {
  Tensor s = Tensor::empty(a.shape(), DType::F64);
  for (int64_t i = 0; i < a.numel(); ++i) set(s, i, std::fabs(at(a, i)));
  return s;
}

// Largest |a-b| / max(|a|, |b|, floor) over all elements: for values whose
// size is their terms' size (see above).
inline double max_rel_diff(const Tensor& a, const Tensor& b, double floor = 1e-6) {
  if (a.numel() != b.numel()) return INFINITY;
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = at(a, i), y = at(b, i);
    worst = nan_max(worst, std::fabs(x - y) / std::max({std::fabs(x), std::fabs(y), floor}));
  }
  return worst;
}

// Central finite difference of scalar loss() w.r.t. every element of x (F64),
// compared with `analytic`. Returns the worst relative error, with an absolute
// floor so elements with tiny gradients don't dominate.
inline double fd_check(Tensor& x, const Tensor& analytic, const std::function<double()>& loss,
                       double h = 1e-6, double floor = 1e-7) {
  double worst = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    double orig = at(x, i);
    set(x, i, orig + h);
    double lp = loss();
    set(x, i, orig - h);
    double lm = loss();
    set(x, i, orig);
    double num = (lp - lm) / (2 * h);
    double ana = at(analytic, i);
    worst = nan_max(worst, std::fabs(num - ana) / std::max({std::fabs(num), std::fabs(ana), floor}));
  }
  return worst;
}

// Central differences of `loss` over every element of x, as a tensor (F64),
// for comparisons against an analytic gradient's scale (scaled_diff): an
// element whose gradient is tiny or exactly 0 has differences of rounding
// noise, which a per-element relative check would blow up.
inline Tensor fd_gradient(Tensor& x, const std::function<double()>& loss, double h = 1e-6) {
  Tensor g = Tensor::empty(x.shape(), DType::F64);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double orig = at(x, i);
    set(x, i, orig + h);
    const double lp = loss();
    set(x, i, orig - h);
    const double lm = loss();
    set(x, i, orig);
    set(g, i, (lp - lm) / (2 * h));
  }
  return g;
}

// sum(w * y) for a fixed random weighting w: a scalar loss whose gradient
// w.r.t. y is w, used to drive backward passes in tests.
inline double weighted_sum(const Tensor& y, const Tensor& w) {
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += at(y, i) * at(w, i);
  return s;
}

}  // namespace attnres::testing
