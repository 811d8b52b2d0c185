// PLACEHOLDER (to be replaced by the real kernels): links, throws when called.
#include "kernels/cuda/reduce.h"
#include "core/error.h"

namespace attnres::kernels::cuda {

double sum_squares(const Tensor&) { fail("cuda::sum_squares: not implemented yet"); }
void scale_(Tensor&, double) { fail("cuda::scale_: not implemented yet"); }
void add_(Tensor&, const Tensor&) { fail("cuda::add_: not implemented yet"); }
void add(Tensor&, const Tensor&, const Tensor&) { fail("cuda::add: not implemented yet"); }
bool all_finite(const Tensor&) { fail("cuda::all_finite: not implemented yet"); }
void convert(Tensor&, const Tensor&) { fail("cuda::convert: not implemented yet"); }

}  // namespace attnres::kernels::cuda
