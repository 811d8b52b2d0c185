// CPU causal grouped-query attention on raw row-major arrays.
//
// qkv, dqkv: [B*T, (H + Hkv) hd + Hkv dv], each row a token's H query heads,
// then its Hkv key heads (hd wide), then its Hkv value heads (dv wide;
// kernels/attention.h); out, dout: [B*T, H*dv]; lse: [B, H, T]. Query head
// h reads KV head h / (H/Hkv).
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu {

// out = softmax(mask(q k^T / sqrt(hd))) v per head; lse = log-sum-exp of each
// query row's scaled, masked scores.
template <typename T>
void attention_forward(T* out, T* lse, const T* qkv, int64_t B, int64_t Tlen, int64_t H,
                       int64_t Hkv, int64_t hd, int64_t dv);

// dqkv's q, k and v blocks += gradients (accumulate false: =), probabilities
// recomputed from q, k and lse.
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse,
                        int64_t B, int64_t Tlen, int64_t H, int64_t Hkv, int64_t hd,
                        int64_t dv, bool accumulate = true);

// One query per sequence over cache positions [0, len):
// q [B, H*hd], out [B, H*dv]; k_cache [B, Tmax, Hkv*hd], v_cache [B, Tmax, Hkv*dv].
template <typename T>
void attention_decode(T* out, const T* q, const T* k_cache, const T* v_cache, int64_t B,
                      int64_t Tmax, int64_t len, int64_t H, int64_t Hkv, int64_t hd, int64_t dv);

}  // namespace attnres::kernels::cpu
