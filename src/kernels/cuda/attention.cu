// PLACEHOLDER (to be replaced by the real kernels): links, throws when called.
#include "kernels/cuda/attention.h"
#include "core/error.h"

namespace attnres::kernels::cuda {

void attention_forward(Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttnShape&) { fail("cuda::attention_forward: not implemented yet"); }
void attention_backward(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttnShape&) { fail("cuda::attention_backward: not implemented yet"); }
void attention_decode(Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, const AttnShape&) { fail("cuda::attention_decode: not implemented yet"); }

}  // namespace attnres::kernels::cuda
