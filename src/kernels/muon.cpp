// Muon's update from the dispatched ops (kernels/muon.h). Every step is a
// GEMM or an elementwise op of kernels/matmul.h and kernels/reduce.h, in a
// fixed order, so the result is deterministic on either device.
#include "kernels/muon.h"

#include <algorithm>
#include <cmath>

#include "kernels/matmul.h"
#include "kernels/reduce.h"

namespace attnres::kernels {

namespace {

Tensor like(const Tensor& t, const Shape& shape) { return Tensor::empty(shape, t.dtype(), t.device()); }

// out = s t (a new tensor).
Tensor scaled(const Tensor& t, double s) {
  Tensor out = t.clone();
  scale_(out, s);
  return out;
}

}  // namespace

void newton_schulz5(Tensor& x, const Tensor& u) {
  ATTNRES_CHECK(u.ndim() == 2 && x.shape() == u.shape() && x.dtype() == u.dtype() &&
                    x.device() == u.device(),
                "newton_schulz5: x ", x.describe(), " for u ", u.describe());
  const int64_t m = u.dim(0), n = u.dim(1), k = std::min(m, n);
  x.copy_from(u);
  scale_(x, 1.0 / (std::sqrt(sum_squares(u)) + 1e-7));
  Tensor A = like(u, {k, k}), AA = like(u, {k, k}), BX = like(u, {m, n});
  for (int i = 0; i < kMuonSteps; ++i) {
    if (m <= n) {
      matmul_forward(A, x, x);  // X X^T
    } else {
      A.zero_();  // dw accumulates: X^T X
      matmul_backward(nullptr, &A, x, x, A, Store::Set);
    }
    matmul_forward(AA, A, A);  // A A^T = A A (A symmetric)
    scale_(AA, kMuonC);
    add_(AA, scaled(A, kMuonB));  // B = b A + c A A
    if (m <= n)
      matmul_backward(&BX, nullptr, AA, x, x, Store::Set);  // B X
    else
      matmul_forward(BX, x, AA);  // X B^T = X B
    scale_(x, kMuonA);
    add_(x, BX);
  }
}

void muon_update(Tensor& w, const Tensor& g, Tensor& buf, const MuonStep& st, Tensor* w_lowp) {
  ATTNRES_CHECK(w.ndim() == 2 && g.shape() == w.shape() && buf.shape() == w.shape() &&
                    g.dtype() == w.dtype(),
                "muon_update: w ", w.describe(), ", g ", g.describe(), ", buf ", buf.describe());
  const Tensor gs = scaled(g, st.grad_scale);  // a bf16 run's gradients are fp32, as w
  scale_(buf, st.momentum);
  add_(buf, gs);                      // buf = mu buf + g
  Tensor u = scaled(buf, st.momentum);
  add_(u, gs);                        // u = g + mu buf
  Tensor x = like(w, w.shape());
  newton_schulz5(x, u);
  const double rms = 0.2 * std::sqrt(static_cast<double>(std::max(w.dim(0), w.dim(1))));
  scale_(w, 1.0 - st.lr * st.weight_decay);
  scale_(x, -st.lr * rms);
  add_(w, x);
  if (w_lowp) convert(*w_lowp, w);
}

}  // namespace attnres::kernels
