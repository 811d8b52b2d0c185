// Causal grouped-query attention (GQA), scores scaled by 1/sqrt(hd).
// KV head j serves query heads [j*H/Hkv, (j+1)*H/Hkv).
#pragma once
#include <string>

#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels {

struct AttnShape {
  int64_t B, T, H, Hkv, hd;
};

// Which implementation runs attention on CUDA (training.attention_kernel).
// Auto: cuDNN's fused attention (kernels/cuda/attention_cudnn.h) where it runs
// the shape and dtype on the device, else ours; Own: ours; Cudnn: cuDNN, an
// error where it cannot run. CPU tensors always run the CPU kernels.
enum class AttentionKernel { Auto, Own, Cudnn };

// Whether `kernel` runs cuDNN for shape s in dtype dt on device dev. When it
// does not, `why` (if given) gets the reason; under Cudnn that is an error
// naming the shape and the reason.
bool attention_uses_cudnn(AttentionKernel kernel, const AttnShape& s, DType dt, Device dev,
                          std::string* why = nullptr);

// q [B*T, H*hd], k/v [B*T, Hkv*hd] (already RoPE'd), out [B*T, H*hd],
// lse [B, H, T]: log-sum-exp of each query row's scaled scores, saved so the
// backward pass can recompute probabilities without storing a T x T matrix.
void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttnShape& s, AttentionKernel kernel = AttentionKernel::Own);

// dq, dk, dv += gradients (store Set: = gradients).
void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttnShape& s, Store store = Store::Add,
                        AttentionKernel kernel = AttentionKernel::Own);

// Incremental decoding: one new query per sequence attends to positions
// [0, len) of the caches (the new token's k/v already written at len-1).
// q, out [B, H*hd]; k_cache, v_cache [B, Tmax, Hkv*hd]. s.T is ignored.
void attention_decode(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      int64_t len, const AttnShape& s);

}  // namespace attnres::kernels
