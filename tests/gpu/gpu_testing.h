// Helpers for the GPU tests: every CUDA op is compared with the CPU op on
// fresh random inputs (never zeros), with outputs poisoned beforehand so an
// element the kernel forgot to write shows up as NaN.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "core/device.h"
#include "core/tensor.h"
#include "testing.h"

namespace attnres::gpu_testing {

// Relative tolerances (||gpu - cpu|| / ||cpu||) by compute dtype.
constexpr double kTolF32 = 1e-5;
constexpr double kTolBF16 = 2e-2;
inline double tol(DType t) { return t == DType::BF16 ? kTolBF16 : kTolF32; }

// A host F32 tensor with N(0, stddev) entries.
inline Tensor randn_f32(const Shape& shape, uint64_t seed, double stddev = 1.0) {
  return testing::randn(shape, seed, DType::F32, stddev);
}

// Host F32 tensor -> device tensor of `dtype` (F32 or BF16). For BF16 the
// host tensor is rounded in place first, so CPU reference and GPU op read
// exactly the same values.
inline Tensor to_device(Tensor& host_f32, DType dtype) {
  if (dtype == DType::BF16) host_f32.copy_from(host_f32.to(DType::BF16).to(DType::F32));
  return host_f32.to(dtype).to(Device::CUDA);
}

// Device tensor (any float dtype) -> host F32.
inline Tensor to_host_f32(const Tensor& dev) {
  Tensor h = dev.to(Device::CPU);
  return h.dtype() == DType::F32 ? h : h.to(DType::F32);
}
// A device tensor's values in F64 on the host (through F32: bf16 values are
// exact there), for comparisons with the CPU reference run in F64.
inline Tensor host_f64(const Tensor& dev) { return to_host_f32(dev).to(DType::F64); }

// An uninitialised device tensor filled with NaN bit patterns.
inline Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, Device::CUDA);
  if (dtype == DType::BF16) cuda::fill_u32(t.raw(), 0x7fc07fc0u, t.nbytes() / 4);  // NaN pairs
  else cuda::fill_u32(t.raw(), 0x7fc00000u, t.nbytes() / 4);
  return t;
}

using testing::same_bits;  // (testing.h) any device

// A random host F32 reference of `shape` and the same values on the device as
// `dtype`; with `offset` the device tensor starts one element into its
// allocation (a misaligned slice: no 16-byte packs).
struct Pair {
  Tensor host, dev;
};
inline Pair random_pair(const Shape& shape, DType dtype, uint64_t seed, bool offset,
                        double stddev = 1.0) {
  const int64_t n = shape_numel(shape);
  Tensor h = randn_f32({n + 1}, seed, stddev);
  Tensor d = to_device(h, dtype);
  const int64_t b = offset ? 1 : 0;
  return {h.rows(b, n).clone().reshape(shape), d.rows(b, n).reshape(shape)};
}

// An uninitialised (NaN) device tensor of `shape`, misaligned when `offset`.
inline Tensor poisoned_at(const Shape& shape, DType dtype, bool offset) {
  const int64_t n = shape_numel(shape);
  return poisoned({n + 1}, dtype).rows(offset ? 1 : 0, n).reshape(shape);
}

// ||a - b|| / ||b|| over all elements (host tensors of any float dtype); NaN
// anywhere gives NaN, which fails every `< tol` check.
inline double rel_l2(const Tensor& a, const Tensor& b) {
  ATTNRES_CHECK(a.numel() == b.numel(), "rel_l2: sizes differ");
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = testing::at(a, i), y = testing::at(b, i);
    num += (x - y) * (x - y);
    den += y * y;
  }
  if (std::isnan(num)) return NAN;
  return std::sqrt(num / (den > 0 ? den : 1e-300));
}

// ---------------------------------------------------------------------------
// Element-wise bound for BF16 results (in addition to rel_l2 < kTolBF16).
// ---------------------------------------------------------------------------
// A whole-tensor relative L2 of 2e-2 lets a few entirely wrong elements pass
// (4 wrong elements of the tensor's typical size in 10^4 give 2e-2), so every
// BF16 comparison of an op against its CPU reference also bounds each element:
//
//   |gpu_i - ref_i| <= 2^-8 (c_ref |ref_i| + c_terms s_i) + kBf16Floor
//
// Why this holds for a correct kernel. The inputs are bf16 values, exactly
// the same on both sides (to_device rounds the host copy in place); the CPU
// reference computes from them in fp64 (or fp32) and is exact to far below
// 2^-8. So the only differences are the GPU's own roundings:
// - a bf16 output is rounded once: at most 2^-8 |exact| (8 significant bits,
//   round to nearest even: unit roundoff 2^-8). c_ref = 2 covers it twice
//   over, with room for the fp32 value's own small deviation;
// - fp32 arithmetic and accumulation in another order than the reference's:
//   at most ~n 2^-24 x (the sum of the magnitudes of the n terms summed into
//   the element), 2^-23 per term where tensor cores truncate; far below 2^-8
//   unless n is large, so it goes into the terms part with a small c_terms
//   (a product, like a norm's or SwiGLU's output, has no terms part: its
//   fp32 error is relative to itself, inside c_ref);
// - a kernel that rounds an intermediate to bf16 (attention's P and dS fed to
//   the tensor cores, the cross-entropy's dlogits and bf16 logits): up to 2^-8
//   of every term summed after that rounding, i.e. 2^-8 x (sum of the terms'
//   magnitudes), c_terms >= 1 on those terms.
// s_i is the sum of the magnitudes of the terms summed into element i where
// the test can compute it (the reference op run on |inputs|, e.g. |x| |W|^T),
// or, where it cannot (terms inside a fused kernel, like attention's dS), a
// tensor-wide scale: the largest |increment| of a gradient (the gradient
// proper, without the random values it was accumulated onto), or the largest
// |element| of a freshly written output. That stand-in is sound in practice,
// not as a worst case: roundings of many terms of varying sign add like a
// random walk, about 2^-8 sqrt(sum of term^2), which is of the order of the
// element's typical size, and the largest element of a tensor of 10^3 or more
// is several times its typical size. Each call site says which it uses.
// kBf16Floor: an absolute floor for elements whose exact value and terms are
// ~0 (every test's inputs are O(1): N(0, sigma), sigma in [0.3, 9]).
//
// The whole-model comparisons (test_model_gpu.cpp) keep the L2 check only:
// there errors compound through layers and optimizer steps, and no per-element
// bound follows from one rounding per op.
constexpr double kBf16Unit = 1.0 / 256;  // 2^-8
constexpr double kBf16Floor = 1e-6;

namespace detail {
// Counts the elements of `got` outside bound(i) of `ref` (non-finite values
// and mismatched sizes always fail); "" when none, else what failed and the
// worst element, for CHECK(... == "") to print.
template <typename Bound>
std::string elements_outside(const Tensor& got, const Tensor& ref, const Bound& bound) {
  if (got.numel() != ref.numel())
    return "sizes differ: " + std::to_string(got.numel()) + " vs " + std::to_string(ref.numel());
  int64_t bad = 0, worst_i = -1;
  double worst = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double g = testing::at(got, i), r = testing::at(ref, i), b = bound(i);
    const double ratio = std::fabs(g - r) / b;
    const bool ok = std::isfinite(g) && std::isfinite(r) && ratio <= 1;
    if (!ok) ++bad;
    if (!ok && (worst_i < 0 || !(ratio <= worst))) {
      worst = ratio;
      worst_i = i;
    }
  }
  if (bad == 0) return "";
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%lld of %lld elements outside the bf16 bound; worst: element %lld, gpu %.8g, "
                "reference %.8g, bound %.3g (error / bound %.3g)",
                (long long)bad, (long long)ref.numel(), (long long)worst_i,
                testing::at(got, worst_i), testing::at(ref, worst_i), bound(worst_i), worst);
  return buf;
}
}  // namespace detail

// With the per-element terms s_i = terms[i] (a host tensor shaped like ref).
// F32 runs ("" always): they are held to kTolF32 by rel_l2.
inline std::string bf16_outliers(DType dt, const Tensor& got, const Tensor& ref, double c_ref,
                                 const Tensor& terms, double c_terms) {
  if (dt != DType::BF16) return "";
  if (terms.numel() != ref.numel()) return "terms and reference sizes differ";
  return detail::elements_outside(got, ref, [&](int64_t i) {
    return kBf16Unit * (c_ref * std::fabs(testing::at(ref, i)) +
                        c_terms * std::fabs(testing::at(terms, i))) +
           kBf16Floor;
  });
}

// With one tensor-wide scale s_i = scale for every element.
inline std::string bf16_outliers(DType dt, const Tensor& got, const Tensor& ref, double c_ref,
                                 double scale, double c_terms) {
  if (dt != DType::BF16) return "";
  return detail::elements_outside(got, ref, [&](int64_t i) {
    return kBf16Unit * (c_ref * std::fabs(testing::at(ref, i)) + c_terms * scale) + kBf16Floor;
  });
}

// Helpers for the scales, on host tensors of any float dtype.
// max |a_i|.
inline double max_abs(const Tensor& a) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(testing::at(a, i)));
  return m;
}
// a - b elementwise, in F64: the increment of a gradient accumulated onto b.
inline Tensor minus(const Tensor& a, const Tensor& b) {
  ATTNRES_CHECK(a.numel() == b.numel(), "minus: sizes differ");
  Tensor d = Tensor::empty(a.shape(), DType::F64);
  for (int64_t i = 0; i < a.numel(); ++i)
    d.data<double>()[i] = testing::at(a, i) - testing::at(b, i);
  return d;
}
// max |a_i - b_i|: the largest increment of a gradient accumulated onto b.
inline double max_increment(const Tensor& a, const Tensor& b) { return max_abs(minus(a, b)); }

}  // namespace attnres::gpu_testing
