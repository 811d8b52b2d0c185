// CPU mixture-of-experts routing and permutation (kernels/moe.h). Scores and
// gate weights in T (float or double); index arrays int32.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/moe.h"

namespace attnres::kernels::cpu {

// The choice and gate weights of N tokens over E experts: expert, gate [N, K]
// (before the capacity: kernels/moe.cpp's moe_assign_rows applies it).
template <typename T>
void moe_choose(const T* logits, const T* bias, int64_t N, int64_t E, const MoeRouteOptions& opt,
                int32_t* expert, T* gate);

template <typename T>
void moe_route_backward(T* dlogits, const T* dgate, const T* logits, const int32_t* expert,
                        int64_t N, int64_t E, const MoeRouteOptions& opt);

template <typename T>
double moe_balance(const T* logits, const std::vector<int64_t>& load, int64_t N, int64_t E,
                   int64_t K, bool sigmoid_router);
template <typename T>
void moe_balance_backward(T* dlogits, const T* logits, const std::vector<int64_t>& load, int64_t N,
                          int64_t E, int64_t K, bool sigmoid_router, double dscale);

template <typename T>
void moe_permute(T* x, const T* u, const int32_t* token, int64_t M, int64_t d);
template <typename T>
void moe_unpermute_add(T* du, const T* dx, const int32_t* row, int64_t N, int64_t K, int64_t d);

template <typename T>
void moe_combine(T* out, const T* y, const T* gate, const int32_t* row, const T* base, int64_t N,
                 int64_t K, int64_t d);
template <typename T>
void moe_combine_backward(T* dy, T* dgate, const T* dout, const T* y, const T* gate,
                          const int32_t* row, int64_t N, int64_t K, int64_t d);

}  // namespace attnres::kernels::cpu
