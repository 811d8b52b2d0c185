// CUDA MLA expansion (see kernels/mla.h): copies, and RoPE on the dr dims of
// every query and of k_r. The dispatcher (kernels/mla.cpp) checks the shapes.
#pragma once
#include "core/tensor.h"
#include "kernels/mla.h"

namespace attnres::kernels::cuda {
void mla_expand_forward(Tensor& qkv, const Tensor& q, const Tensor& kv, const Tensor& kr,
                        const MlaShape& s, double rope_theta, int64_t pos0);
void mla_expand_backward(Tensor& dq, Tensor& dkv, Tensor& dkr, const Tensor& dqkv,
                         const MlaShape& s, double rope_theta, int64_t pos0);
}  // namespace attnres::kernels::cuda
