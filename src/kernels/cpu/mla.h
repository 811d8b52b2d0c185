// CPU MLA expansion (kernels/mla.h) on raw row-major arrays.
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu {

struct MlaArgs {
  int64_t B, T, H, dn, dr, dv;
  double rope_theta;  // 0: no rotation
  int64_t pos0;
};

// qkv [N, 2 H (dn + dr) + H dv] from q [N, H (dn + dr)], kv [N, H (dn + dv)], kr [N, dr].
template <typename T>
void mla_expand_forward(T* qkv, const T* q, const T* kv, const T* kr, const MlaArgs& a);

// dq, dkv, dkr (as q, kv, kr) written from dqkv.
template <typename T>
void mla_expand_backward(T* dq, T* dkv, T* dkr, const T* dqkv, const MlaArgs& a);

}  // namespace attnres::kernels::cpu
