#include "kernels/mix_traffic.h"

#include "kernels/common.h"

namespace attnres::kernels {

MixBytes MixBytes::of(DType activations) {
  return {static_cast<double>(dtype_size(activations)),
          static_cast<double>(dtype_size(stat_dtype(activations))),
          static_cast<double>(dtype_size(grad_dtype(activations)))};
}

Traffic mix_source_rstd_traffic(int64_t rows, int64_t d, const MixBytes& b) {
  return {b.act * rows * d, b.stat * rows};
}

Traffic mix_forward_traffic(const MixQueries& s, const MixBytes& b) {
  const double N = s.rows, d = s.d, k = s.sources, Q = s.queries;
  Traffic t;
  t.read = b.act * k * N * d + b.stat * k * N + b.act * Q * d;  // sources, rstds, w
  t.written = b.act * Q * N * d + b.stat * Q * N * k;             // outputs, softmax weights
  if (s.lse) t.written += b.stat * Q * N;
  return t;
}

Traffic mix_backward_traffic(const MixQueries& s, const MixBytes& b, bool accumulate) {
  const double N = s.rows, d = s.d, k = s.sources, Q = s.queries;
  Traffic t;
  t.read = b.act * k * N * d + b.stat * k * N + b.act * Q * d  // sources, rstds, w
           + b.act * Q * N * d + b.stat * Q * N * k            // douts, softmax weights
           + b.grad * Q * d;                                    // dw (+=)
  if (s.lse) t.read += b.stat * Q * N;                          // dlse
  if (accumulate) t.read += b.act * k * N * d;                  // dsources (+=)
  t.written = b.act * k * N * d + b.grad * Q * d;               // dsources, dw
  return t;
}

Traffic mix_merge_norm_forward_traffic(const MixMerge& s, const MixBytes& b) {
  const double N = s.rows, d = s.d, m = s.recent;
  Traffic t;
  t.read = b.act * N * d + b.stat * N + b.act * m * N * d + 2 * b.act * d;  // o, lse, recent, w + gain
  t.written = b.act * N * d + b.stat * N * (2 * m + 2);                     // u, stats
  return t;
}

Traffic mix_merge_norm_backward_traffic(const MixMerge& s, const MixBytes& b) {
  const double N = s.rows, d = s.d, m = s.recent;
  Traffic t;
  t.read = 2 * b.act * N * d + b.act * m * N * d + b.stat * N * (2 * m + 2)  // du, o, recent, stats
           + 2 * b.act * d                                                // w, gain
           + b.act * m * N * d + 2 * b.grad * d;                          // drecent, dw, dgain (+=)
  t.written = b.act * N * d + b.stat * N + b.act * m * N * d + 2 * b.grad * d;  // d_o, dlse, drecent, dw, dgain
  return t;
}

}  // namespace attnres::kernels
