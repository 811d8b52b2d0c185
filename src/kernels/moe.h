// Mixture-of-experts routing and the token permutation around the experts
// (docs/model.md, "Mixture of experts").
//
// A MoE layer sends each of its N token rows to K of E experts. From the
// router's logits r = u W_r^T [N, E] come the scores:
//   sigmoid  s = sigmoid(r)            (DeepSeek-V3, Kimi)
//   softmax  s = softmax(r) over E     (Mixtral, Qwen-MoE)
// The K experts with the largest s + b are chosen (b: the per-expert bias of
// auxiliary-loss-free balancing, for the choice only; none: 0), ties going to
// the lower expert index. A token's slots j = 0..K-1 hold its chosen experts
// in ascending index: the order in which their outputs are added. Each slot's
// gate weight is g_j = scale s_j / (s_1 + ... + s_K) over the chosen.
//
// With a capacity C > 0 an expert takes at most C rows of the microbatch:
// slots are taken in token order (and a token's slots in ascending expert
// index), and a slot that finds its expert full is dropped: it adds nothing,
// and its weight is not given to the token's other slots (GShard's rule).
//
// The kept slots become M rows grouped by expert, in token order within an
// expert (a stable sort): expert e's rows are [offsets[e], offsets[e + 1]),
// so each expert's SwiGLU is a pair of GEMMs over consecutive rows.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace attnres::kernels {

enum class MoeRouter { Sigmoid, Softmax };

struct MoeRouteOptions {
  MoeRouter router = MoeRouter::Sigmoid;
  int64_t top_k = 1;
  double scale = 1.0;    // the routed scaling factor
  int64_t capacity = 0;  // rows per expert at most; 0: no limit (dropless)
};

// The routing of one microbatch. Tensors live where the logits do; the
// counts are on the host (they size the expert GEMMs).
struct MoeRouting {
  int64_t N = 0, E = 0, K = 0;
  Tensor expert;  // I32 [N, K]: slot (t, j)'s expert, ascending in j
  Tensor gate;    // [N, K], the logits' dtype: its weight g (0 when dropped)
  Tensor row;     // I32 [N, K]: its row among the M kept, -1 when dropped
  Tensor token;   // I32 [M]: the token of each kept row
  std::vector<int64_t> offsets;  // [E + 1]: expert e's rows [offsets[e], offsets[e + 1])
  std::vector<int64_t> load;     // [E]: slots that chose e (dropped ones included)
  int64_t dropped = 0;           // slots past their expert's capacity
  int64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }  // M
};

// The routing of `logits` [N, E] (F32 or F64); `bias` [E] (same dtype) or
// nullptr.
void moe_route(MoeRouting& r, const Tensor& logits, const Tensor* bias,
               const MoeRouteOptions& opt);

// dlogits [N, E] = dL/dlogits from dgate [N, K] = dL/dg, through the gate
// weights' normalisation and the score function; an unchosen expert's logit
// gets 0 (the choice is piecewise constant), and so does the bias.
void moe_route_backward(Tensor& dlogits, const Tensor& dgate, const Tensor& logits,
                        const MoeRouting& r, const MoeRouteOptions& opt);

// The balance term of the auxiliary loss, sum_e f_e P_e: f_e the share of
// the N K chosen slots that chose e, P_e the mean over tokens of e's
// normalised score (softmax: s_e; sigmoid: s_e / sum over all E of s). The
// loss is aux_loss_coef E times it (1 at perfect balance: f = P = 1 / E).
double moe_balance(const Tensor& logits, const MoeRouting& r, MoeRouter router);
// dlogits += dscale d(sum_e f_e P_e) / dlogits (f counts, not differentiated).
void moe_balance_backward(Tensor& dlogits, const Tensor& logits, const MoeRouting& r,
                          MoeRouter router, double dscale);

// x [M, d] = the kept rows of u [N, d], in the routing's order.
void moe_permute(Tensor& x, const Tensor& u, const MoeRouting& r);
// du [N, d] += for each token, its kept slots' rows of dx [M, d] in slot order.
void moe_unpermute_add(Tensor& du, const Tensor& dx, const MoeRouting& r);

// out [N, d] = base + sum over a token's kept slots, in slot order, of
// g_j y[row_j] (y [M, d]: the experts' outputs), summed in fp32 (or fp64)
// and rounded once; base [N, d] may be nullptr (0) or out itself.
void moe_combine(Tensor& out, const Tensor& y, const MoeRouting& r, const Tensor* base);
// dy [M, d] = g dout[token] (Set); dgate [N, K] = dout[t] . y[row] (0 when dropped).
void moe_combine_backward(Tensor& dy, Tensor& dgate, const Tensor& dout, const Tensor& y,
                          const MoeRouting& r);

}  // namespace attnres::kernels
