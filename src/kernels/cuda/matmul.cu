// PLACEHOLDER (to be replaced by the real kernels): links, throws when called.
#include "kernels/cuda/matmul.h"
#include "core/error.h"

namespace attnres::kernels::cuda {

void matmul_forward(Tensor&, const Tensor&, const Tensor&, bool) { fail("cuda::matmul_forward: not implemented yet"); }
void matmul_backward(Tensor*, Tensor*, const Tensor&, const Tensor&, const Tensor&) { fail("cuda::matmul_backward: not implemented yet"); }

}  // namespace attnres::kernels::cuda
