// PLACEHOLDER (to be replaced by the real kernels): links, throws when called.
#include "kernels/cuda/adamw.h"
#include "core/error.h"

namespace attnres::kernels::cuda {

void adamw_update(Tensor&, const Tensor&, Tensor&, Tensor&, double, double, double, double, double, double, double, Tensor*) { fail("cuda::adamw_update: not implemented yet"); }

}  // namespace attnres::kernels::cuda
