// CPU RMSNorm over the last dim of a row-major [N, d] activation.
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu {

// y = x * rstd * gain, rstd[i] = 1/sqrt(mean(x[i,:]^2) + eps). gain may be
// nullptr (no gain). y may alias x.
template <typename T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* gain, int64_t N, int64_t d, T eps);

// dx += dL/dx; if dgain != nullptr (requires gain), dgain += dL/dgain with the
// row reduction done in a fixed order independent of the thread count.
template <typename T>
void rmsnorm_backward(T* dx, T* dgain, const T* dy, const T* x, const T* rstd, const T* gain,
                      int64_t N, int64_t d, bool accumulate_dx = true);

}  // namespace attnres::kernels::cpu
