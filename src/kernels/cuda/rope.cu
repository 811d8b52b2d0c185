// PLACEHOLDER (to be replaced by the real kernels): links, throws when called.
#include "kernels/cuda/rope.h"
#include "core/error.h"

namespace attnres::kernels::cuda {

void rope_rotate(Tensor&, int64_t, int64_t, int64_t, int64_t, float, int64_t, bool) { fail("cuda::rope_rotate: not implemented yet"); }

}  // namespace attnres::kernels::cuda
