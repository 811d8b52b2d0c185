// PLACEHOLDER (to be replaced by the real kernels): links, throws when called.
#include "kernels/cuda/embedding.h"
#include "core/error.h"

namespace attnres::kernels::cuda {

void embedding_forward(Tensor&, const Tensor&, const Tensor&) { fail("cuda::embedding_forward: not implemented yet"); }
void embedding_backward(Tensor&, const Tensor&, const Tensor&) { fail("cuda::embedding_backward: not implemented yet"); }

}  // namespace attnres::kernels::cuda
