// Kimi Delta Attention's core (KDA, the linear attention of Kimi Linear;
// docs/model.md "KDA layer", step 5): a gated delta rule with a decay per key
// channel, run per training sequence from a zero state.
//
// Per sequence b and head h, with a K x V state S (fp32 or fp64):
//   S <- Diag(exp(g_t)) S                       (decay, g_t [K] <= 0)
//   S <- S + beta_t k_t (v_t - S^T k_t)^T       (the delta update)
//   o_t = scale S^T q_t
// q and k are the L2-normalised rows (the layer normalises them first), beta_t
// one number per head. Layout: rows are tokens (N = B T, sequence b = rows
// [b T, b T + T)); q, k and g are [N, H K], v and o [N, H V], beta [N, H];
// head h owns channels [h K, h K + K) (and [h V, h V + V)), Kimi's order.
//
// Training runs the chunkwise form (kda_forward / kda_backward): chunks of C
// tokens (64), the state carried between chunks, and inside a chunk the WY
// representation: with Gamma_i the chunk's cumulative log-decay up to row i,
//   A_ij = sum_c k_ic k_jc exp(Gamma_ic - Gamma_jc)   (j < i)
//   P_ij = sum_c q_ic k_jc exp(Gamma_ic - Gamma_jc)   (j <= i)
//   (I + Diag(beta) A) U = Diag(beta) (V - (exp(Gamma) . K) S_0)
//   O = scale ((exp(Gamma) . Q) S_0 + P U)
//   S_C = Diag(exp(Gamma_C)) S_0 + (exp(Gamma_C - Gamma) . K)^T U
// (the triangular system solved by forward substitution). The only
// exponentials taken are the tokens' decays exp(g_t) <= 1: every
// exp(Gamma_i - Gamma_j), j <= i, is the product of the decays of rows
// j + 1 .. i, so it never overflows however strong the decay (a chunk whose
// cumulative log-decay falls far below -88, where exp(Gamma_j) alone would
// underflow and a b_i / b_j form give inf / inf, stays finite and exact,
// without clamping the gates). The pairs of A and P across 16-row
// sub-chunks factor through the sub-chunk's last earlier row r
// (exp(Gamma_i - Gamma_r) exp(Gamma_r - Gamma_j), both <= 1) and run as
// GEMMs; the pairs inside a sub-chunk take their factors one by one.
// kda_recurrent_forward is the token-by-token form: the reference the tests
// compare against, the benchmark's baseline and decoding's step.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "kernels/store.h"

namespace attnres::kernels {

struct KdaShape {
  int64_t B = 0, T = 0, H = 0, K = 0, V = 0;
  int64_t chunk = 64;  // a multiple of 16 (the sub-chunk)
};

// o [N, H V] = the chunkwise form above, from a zero state per sequence.
void kda_forward(Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                 const Tensor& beta, const KdaShape& s, double scale);

// Gradients of sum(dout . o) with respect to q, k, v, g and beta (added into
// them, or written with Store::Set). Saved from the forward: nothing but its
// inputs. The backward runs the chunks' state recurrence again (keeping the
// C-row chunks' start states of one head at a time, (T / C) K V numbers, in
// a work buffer), then goes back over the chunks, recomputing each chunk's
// A, P and U from its start state.
void kda_backward(Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta,
                  const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& g, const Tensor& beta, const KdaShape& s, double scale,
                  Store store = Store::Add);

// The token-by-token recurrence. state [B, H, K, V] (optional): the state
// each sequence starts from (zeros when absent), and on return the state
// after its last token (decoding carries it from token to token).
void kda_recurrent_forward(Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& g, const Tensor& beta, const KdaShape& s, double scale,
                           Tensor* state = nullptr);

// The recurrence's gradients, token by token backwards from a zero state
// (kda_backward's arguments): the benchmark's baseline for the chunkwise
// backward and a second reference for it. CPU only: nothing trains with it.
void kda_recurrent_backward(Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta,
                            const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& g, const Tensor& beta, const KdaShape& s, double scale,
                            Store store = Store::Add);

// ---- the layer's per-token parts (docs/model.md "KDA layer", steps 1-4 and 6;
// kernels/cpu/kda_parts.cpp). Rows are tokens; heads of K channels are
// consecutive column blocks. Backward functions add into parameter
// gradients and add into (Store::Add) or write (Set) the input's.

// Causal depthwise convolution and SiLU over each sequence of T rows:
// y[t, c] = silu(sum_j w[c, j] x[t - W + 1 + j, c]), rows before the
// sequence's start 0. x, y [B T, Ch], w [Ch, W].
void kda_conv_forward(Tensor& y, const Tensor& x, const Tensor& w, int64_t B, int64_t T);
void kda_conv_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                       int64_t B, int64_t T, Store dx_store = Store::Add);

// Per head: y = x / sqrt(|x|^2 + eps) over its K channels (eps 1e-6 in the layer).
void kda_l2norm_forward(Tensor& y, const Tensor& x, int64_t K, double eps);
void kda_l2norm_backward(Tensor& dx, const Tensor& dy, const Tensor& x, int64_t K, double eps,
                         Store dx_store = Store::Add);

// The decay: g = -exp(a_log[h]) softplus(f + dt_bias) for channel c of head
// h; f, g [N, H K], a_log [H], dt_bias [H K].
void kda_decay_forward(Tensor& g, const Tensor& f, const Tensor& a_log, const Tensor& dt_bias,
                       int64_t K);
void kda_decay_backward(Tensor& df, Tensor& da_log, Tensor& ddt_bias, const Tensor& dg,
                        const Tensor& f, const Tensor& a_log, const Tensor& dt_bias, int64_t K,
                        Store df_store = Store::Add);

// The write strength: beta = sigmoid(b), b and beta [N, H]; its backward
// from beta (db = dbeta beta (1 - beta)).
void kda_beta_forward(Tensor& beta, const Tensor& b);
void kda_beta_backward(Tensor& db, const Tensor& dbeta, const Tensor& beta, Store db_store = Store::Add);

// The output gate, per head: y = RMSNorm_K(o) . w . sigmoid(z), w [K] shared
// by the heads; o, z, y [N, H K].
void kda_out_gate_forward(Tensor& y, const Tensor& o, const Tensor& w, const Tensor& z, int64_t K,
                          double eps);
void kda_out_gate_backward(Tensor& d_o, Tensor& dw, Tensor& dz, const Tensor& dy, const Tensor& o,
                           const Tensor& w, const Tensor& z, int64_t K, double eps,
                           Store store = Store::Add);

}  // namespace attnres::kernels
