// One KDA sublayer (Kimi Delta Attention, docs/model.md "KDA layer"), from
// the sublayer's normed input u [N, d] to its output y [N, d]: the q, k, v
// projections each through the short causal convolution and SiLU, q and k
// L2-normalised per head, the decay and write strength from their low-rank
// and linear paths, the chunkwise delta-rule core (kernels/kda.h), the gated
// output norm and o_proj. Built from the ops of kernels/kda.h and GEMMs; the
// model's KDA layers call it (model/attention.cpp).
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "model/params.h"

namespace attnres::model {

struct KdaDims {
  int64_t H = 0, K = 0;  // heads, and K = V channels per head
  int64_t conv = 4;      // the convolutions' width
  double norm_eps = 1e-5;  // the output norm's (model.norm_eps)
  int64_t chunk = 64;
};

// The layer's tensors, Kimi Linear's names (self_attn.*) beside each; the
// same struct holds their gradients.
struct KdaWeights {
  Tensor q, k, v;                  // q_proj, k_proj, v_proj [H K, d]
  Tensor q_conv, k_conv, v_conv;   // q_conv1d, k_conv1d, v_conv1d [H K, conv] ([H K, 1, conv])
  Tensor a_log;                    // A_log [H] ([1, 1, H, 1])
  Tensor dt_bias;                  // dt_bias [H K]
  Tensor f_a, f_b;                 // f_a_proj [K, d], f_b_proj [H K, K]
  Tensor b;                        // b_proj [H, d]
  Tensor g_a, g_b;                 // g_a_proj [K, d], g_b_proj [H K, K]
  Tensor o_norm;                   // o_norm [K]
  Tensor o;                        // o_proj [d, H K]
};

// What the forward keeps for the backward (all [N, *]): the projections
// before the convolutions, the q and k rows before their norms, the decay
// path, the write strength, the core's output and the gate.
struct KdaActs {
  Tensor pq, pk, pv;   // u W^T, before the convolutions
  Tensor cq, ck, cv;   // after convolution and SiLU
  Tensor qn, kn;       // cq, ck L2-normalised per head
  Tensor fa, f, g;     // the decay's low-rank path, its output, the decay
  Tensor beta;         // sigmoid(u W_b^T)
  Tensor core, ga, z;  // the core's output; the gate's low-rank path and output
  Tensor gated;        // the output norm's result, o_proj's input
};

// What decoding one sequence keeps of a KDA layer between tokens (generate,
// one token at a time): the recurrent state after the tokens so far, and
// each convolution's input window, its last W - 1 rows the projections of
// the W - 1 tokens before (zeros before the sequence's start) and its last
// row the new token's.
struct KdaCache {
  Tensor state;           // [1, H, K, K]
  Tensor win_q, win_k, win_v;  // [W, H K] each
};

// The layer's tensors of a model's KdaParams, as the ops take them: each
// parameter's `of` (&Param::value or &Param::grad), the convolutions seen
// [H K, W] and A_log [H] (views, no copies).
KdaWeights kda_weights(const KdaParams& p, Tensor Param::*of);

// Everything up to o_proj's input (a.gated): what recomputation redoes.
// With a cache, u is one new token (B = T = 1): the convolutions read the
// cached windows and the core takes one step of the recurrence from the
// cached state (kernels/kda.h, kda_recurrent_forward), both updated.
void kda_layer_core(KdaActs& a, const Tensor& u, const KdaWeights& w, const KdaDims& d, int64_t B,
                    int64_t T, KdaCache* cache = nullptr);

// An empty cache (zero state and windows) for one sequence.
KdaCache kda_new_cache(const KdaDims& d, DType dtype, Device device);

// y = the layer of u (plus `residual` when given; y may be it).
void kda_layer_forward(Tensor& y, KdaActs& a, const Tensor& u, const KdaWeights& w,
                       const KdaDims& d, int64_t B, int64_t T, const Tensor* residual = nullptr);

// du (written) from dy; the weights' gradients added into `grad`.
void kda_layer_backward(Tensor& du, KdaWeights& grad, const KdaActs& a, const Tensor& u,
                        const Tensor& dy, const KdaWeights& w, const KdaDims& d, int64_t B,
                        int64_t T);

}  // namespace attnres::model
