// Causal grouped-query attention (GQA), scores scaled by 1/sqrt(hd), values
// of width dv per head (hd unless given).
// KV head j serves query heads [j*H/Hkv, (j+1)*H/Hkv).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels {

// hd: the query and key width per head (the scores' scale is 1/sqrt(hd));
// vd: the value width per head, 0 for hd (MLA's differs: model/mla_layer.h).
struct AttnShape {
  int64_t B, T, H, Hkv, hd;
  int64_t vd = 0;
  int64_t dv() const { return vd > 0 ? vd : hd; }
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

// q, k and v are the column blocks of one tensor qkv [B*T, (H + Hkv) hd + Hkv dv]:
// each token's row holds its H query heads, then its Hkv key heads, then its
// Hkv value heads (already RoPE'd), as one GEMM with the joined [Wq; Wk; Wv]
// writes them (model/attention.cpp); their row stride is the joint row's.
// out [B*T, H*dv]; lse [B, H, T]: log-sum-exp of each query row's scaled
// scores, saved so the backward pass can recompute probabilities without
// storing a T x T matrix.
void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttnShape& s,
                       AttentionKernel kernel = AttentionKernel::Own);

// dqkv (qkv's layout): its q, k and v blocks += gradients (store Set: =).
void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const AttnShape& s, Store store = Store::Add,
                        AttentionKernel kernel = AttentionKernel::Own);

// The columns of qkv's row: H query heads, then Hkv key heads, then Hkv value heads.
inline int64_t qkv_width(const AttnShape& s) { return (s.H + s.Hkv) * s.hd + s.Hkv * s.dv(); }
// Those three blocks' widths (the rows of Wq, Wk, Wv in the joint weight).
inline std::vector<int64_t> qkv_row_blocks(const AttnShape& s) {
  return {s.H * s.hd, s.Hkv * s.hd, s.Hkv * s.dv()};
}
// Where q, k and v start, from the first element of qkv (or of dqkv): their
// rows are the joint row's, so each is a strided view of the tensor.
template <typename T>
struct QkvBlocks {
  T *q, *k, *v;
};
template <typename T>
QkvBlocks<T> qkv_blocks(T* base, const AttnShape& s) {
  return {base, base + s.H * s.hd, base + (s.H + s.Hkv) * s.hd};
}

// Incremental decoding: one new query per sequence attends to positions
// [0, len) of the caches (the new token's k/v already written at len-1).
// q [B, H*hd], out [B, H*dv]; k_cache [B, Tmax, Hkv*hd], v_cache [B, Tmax,
// Hkv*dv]. s.T is ignored.
void attention_decode(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      int64_t len, const AttnShape& s);

}  // namespace attnres::kernels
