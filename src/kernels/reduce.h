// Reductions and elementwise helpers: global grad norm, residual adds.
#pragma once
#include <vector>

#include "core/span.h"
#include "core/tensor.h"

namespace attnres::kernels {

// sum(x^2) accumulated in double in a fixed order (fixed-size blocks, blocks
// summed serially), so the result does not depend on the thread count.
double sum_squares(const Tensor& x);
// sum_squares of each tensor (same bits as one call each), with a single wait
// for the device when they live on a GPU instead of one per tensor (the
// global gradient norm reads ~100 tensors per step). All on one device.
std::vector<double> sum_squares_each(Span<const Tensor> xs);

void scale_(Tensor& x, double s);                          // x *= s
void add_(Tensor& y, const Tensor& x);                     // y += x
void add(Tensor& out, const Tensor& a, const Tensor& b);   // out = a + b
// True if every element is finite.
bool all_finite(const Tensor& x);
// dst = src converted to dst's dtype (same shape and device; F32 <-> BF16 on
// CUDA rounds to nearest even).
void convert(Tensor& dst, const Tensor& src);

}  // namespace attnres::kernels
