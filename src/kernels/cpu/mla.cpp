// CPU MLA expansion: copies, plus RoPE on the dr dims (kernels/cpu/rope.h).
// Every element is a copy or a sum in a fixed order, so the bits do not
// depend on the thread count.
#include "kernels/cpu/mla.h"

#include <algorithm>

#include "kernels/cpu/rope.h"

namespace attnres::kernels::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 15;
}

template <typename T>
void mla_expand_forward(T* qkv, const T* q, const T* kv, const T* kr, const MlaArgs& a) {
  const int64_t N = a.B * a.T, H = a.H, dqk = a.dn + a.dr, W = 2 * H * dqk + H * a.dv;
#pragma omp parallel for schedule(static) if (N * W >= kParallelMin)
  for (int64_t r = 0; r < N; ++r) {
    T* row = qkv + r * W;
    std::copy_n(q + r * H * dqk, H * dqk, row);  // the queries, as projected
    T* k = row + H * dqk;
    T* v = k + H * dqk;
    const T* kvr = kv + r * H * (a.dn + a.dv);
    for (int64_t h = 0; h < H; ++h) {
      const T* src = kvr + h * (a.dn + a.dv);
      std::copy_n(src, a.dn, k + h * dqk);                // k_n,h
      std::copy_n(kr + r * a.dr, a.dr, k + h * dqk + a.dn);  // k_r, every head's
      std::copy_n(src + a.dn, a.dv, v + h * a.dv);        // v_h
    }
  }
  // The 2H query and key heads lie side by side, dqk apart: rotate the last
  // dr dims of each (the keys' copies of k_r take the same rotation).
  if (a.rope_theta > 0 && a.dr > 0)
    for (int64_t h = 0; h < 2 * H; ++h)
      rope_rotate(qkv + h * dqk + a.dn, W, a.B, a.T, 1, a.dr, a.rope_theta, a.pos0, false);
}

template <typename T>
void mla_expand_backward(T* dq, T* dkv, T* dkr, const T* dqkv, const MlaArgs& a) {
  const int64_t N = a.B * a.T, H = a.H, dqk = a.dn + a.dr, W = 2 * H * dqk + H * a.dv;
#pragma omp parallel for schedule(static) if (N * W >= kParallelMin)
  for (int64_t r = 0; r < N; ++r) {
    const T* row = dqkv + r * W;
    std::copy_n(row, H * dqk, dq + r * H * dqk);
    const T* dk = row + H * dqk;
    const T* dv = dk + H * dqk;
    T* dkvr = dkv + r * H * (a.dn + a.dv);
    T* dkrr = dkr + r * a.dr;
    std::fill_n(dkrr, a.dr, T(0));
    for (int64_t h = 0; h < H; ++h) {
      std::copy_n(dk + h * dqk, a.dn, dkvr + h * (a.dn + a.dv));
      std::copy_n(dv + h * a.dv, a.dv, dkvr + h * (a.dn + a.dv) + a.dn);
      for (int64_t i = 0; i < a.dr; ++i) dkrr[i] += dk[h * dqk + a.dn + i];  // shared k_r
    }
  }
  // Rotating back is linear and the same for every head at one position, so
  // k_r's gradient sums the heads' first and rotates once.
  if (a.rope_theta > 0 && a.dr > 0) {
    for (int64_t h = 0; h < H; ++h)
      rope_rotate(dq + h * dqk + a.dn, H * dqk, a.B, a.T, 1, a.dr, a.rope_theta, a.pos0, true);
    rope_rotate(dkr, a.dr, a.B, a.T, 1, a.dr, a.rope_theta, a.pos0, true);
  }
}

#define ATTNRES_MLA_INSTANTIATE(T)                                                    \
  template void mla_expand_forward<T>(T*, const T*, const T*, const T*, const MlaArgs&); \
  template void mla_expand_backward<T>(T*, T*, T*, const T*, const MlaArgs&);
ATTNRES_MLA_INSTANTIATE(float)
ATTNRES_MLA_INSTANTIATE(double)
#undef ATTNRES_MLA_INSTANTIATE

}  // namespace attnres::kernels::cpu
