// CUDA mixture-of-experts routing and permutation (see kernels/moe.h). The
// routing's statistics (logits, gate weights and their gradients) are F32;
// the token rows F32 or BF16, combined in fp32.
#pragma once
#include "core/tensor.h"
#include "kernels/moe.h"

namespace attnres::kernels::cuda {

// The choice and gate weights (before the capacity, which the dispatcher
// applies on the host): expert I32 [N, K], gate [N, K] from logits [N, E].
void moe_choose(Tensor& expert, Tensor& gate, const Tensor& logits, const Tensor* bias,
                const MoeRouteOptions& opt);
// gate = 0 where row < 0 (a slot past its expert's capacity).
void moe_zero_dropped(Tensor& gate, const Tensor& row);

void moe_route_backward(Tensor& dlogits, const Tensor& dgate, const Tensor& logits,
                        const MoeRouting& r, const MoeRouteOptions& opt);
double moe_balance(const Tensor& logits, const MoeRouting& r, MoeRouter router);
void moe_balance_backward(Tensor& dlogits, const Tensor& logits, const MoeRouting& r,
                          MoeRouter router, double dscale);

void moe_permute(Tensor& x, const Tensor& u, const MoeRouting& r);
void moe_unpermute_add(Tensor& du, const Tensor& dx, const MoeRouting& r);
void moe_combine(Tensor& out, const Tensor& y, const MoeRouting& r, const Tensor* base);
void moe_combine_backward(Tensor& dy, Tensor& dgate, const Tensor& dout, const Tensor& y,
                          const MoeRouting& r);

}  // namespace attnres::kernels::cuda
