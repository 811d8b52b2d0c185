// PLACEHOLDER (to be replaced by the real kernels): links, throws when called.
#include "kernels/cuda/mix.h"
#include "core/error.h"

namespace attnres::kernels::cuda {

void mix_source_rstd(Tensor&, const Tensor&, float) { fail("cuda::mix_source_rstd: not implemented yet"); }
void mix_forward(Tensor&, Tensor&, const Tensor&, Span<const Tensor>, Span<const Tensor>) { fail("cuda::mix_forward: not implemented yet"); }
void mix_backward(Span<Tensor>, Tensor&, const Tensor&, const Tensor&, Span<const Tensor>, Span<const Tensor>, const Tensor&) { fail("cuda::mix_backward: not implemented yet"); }

}  // namespace attnres::kernels::cuda
