// CUDA reductions and elementwise helpers (see kernels/reduce.h).
// sum_squares is deterministic: fixed per-block partials, summed in a fixed order.
#pragma once
#include <vector>

#include "core/span.h"
#include "core/tensor.h"

namespace attnres::kernels::cuda {
double sum_squares(const Tensor& x);
std::vector<double> sum_squares_each(Span<const Tensor> xs);
void scale_(Tensor& x, double s);
void add_(Tensor& y, const Tensor& x);
void add(Tensor& out, const Tensor& a, const Tensor& b);
bool all_finite(const Tensor& x);
void convert(Tensor& dst, const Tensor& src);  // F32 <-> BF16
}  // namespace attnres::kernels::cuda
