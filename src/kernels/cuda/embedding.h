// CUDA embedding (see kernels/embedding.h). weight/out F32 or BF16; dweight F32
// for BF16 dout. Token ids are checked on the device; an id outside [0, V)
// throws naming the position and id. The backward is deterministic (no float
// atomics): each table row sums its positions in a fixed order.
#pragma once
#include "core/tensor.h"

namespace attnres::kernels::cuda {
void embedding_forward(Tensor& out, const Tensor& weight, const Tensor& tokens);
void embedding_backward(Tensor& dweight, const Tensor& dout, const Tensor& tokens);
}  // namespace attnres::kernels::cuda
