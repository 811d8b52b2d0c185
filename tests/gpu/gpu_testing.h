// Helpers for the GPU tests: every CUDA op is compared with the CPU op on
// fresh random inputs (never zeros), with outputs poisoned beforehand so an
// element the kernel forgot to write shows up as NaN.
#pragma once
#include <cmath>
#include <cstdint>

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

}  // namespace attnres::gpu_testing
