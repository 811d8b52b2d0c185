// PLACEHOLDER (to be replaced by the real kernels): links, throws when called.
#include "kernels/cuda/swiglu.h"
#include "core/error.h"

namespace attnres::kernels::cuda {

void swiglu_forward(Tensor&, const Tensor&, const Tensor&) { fail("cuda::swiglu_forward: not implemented yet"); }
void swiglu_backward(Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&) { fail("cuda::swiglu_backward: not implemented yet"); }

}  // namespace attnres::kernels::cuda
