// Causal GQA attention through cuDNN's fused flash-attention engines (see
// attention_cudnn.cu for the graph and why it is built the way it is). Same
// contract as kernels::attention_forward / attention_backward; BF16 only.
#pragma once
#include <cstddef>
#include <string>

#include "core/tensor.h"
#include "kernels/attention.h"  // AttnShape {B, T, H, Hkv, hd}
#include "kernels/store.h"

namespace attnres::kernels::cuda::cudnn {

// "" when cuDNN's fused attention runs this shape and dtype on the current device, else the
// reason in a few words ("this build has no cuDNN", "head dim 80 not supported", "fp32", ...).
// Cheap after the first call per shape (the answer is cached with the plans).
std::string sdpa_unsupported(const AttnShape& s, DType dt);

// Same contract as kernels::attention_forward / attention_backward (kernels/attention.h):
// causal GQA, scale 1/sqrt(hd); qkv [B*T, (H + 2 Hkv) hd] holds q | k | v as column blocks
// (q at column 0, k at H hd, v at (H + Hkv) hd; all three with the joint row stride), out
// [B*T, H hd] contiguous; bf16 on CUDA, 16-byte aligned (then so are the k and v blocks:
// hd % 8 == 0). lse [B, H, T] fp32 = natural-log log-sum-exp of each query row's scaled
// scores. Backward: dqkv has qkv's layout, dout out's; dqkv's q, k and v blocks are written
// (Store::Set) or added to (Store::Add: cuDNN writes one temporary joint dqkv, then one add
// over the whole tensor). Throws where sdpa_unsupported(s, dt) is not "".
void sdpa_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttnShape& s);
void sdpa_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                   const Tensor& lse, const AttnShape& s, Store store);

// Device bytes one call of this shape allocates besides its arguments, the larger of the
// forward and the backward (engine workspace, the backward's fp32 dq accumulator and row sums
// of dO * out, and with Store::Add the bf16 temporary joint dqkv [B*T, (H + 2 Hkv) hd]): for
// the memory planner. 0 when unsupported. Builds the plans on first use.
size_t sdpa_workspace_bytes(const AttnShape& s, DType dt);

}  // namespace attnres::kernels::cuda::cudnn
