// Muon's update from the dispatched ops (kernels/muon.h). Every step is a
// GEMM or an elementwise op of kernels/matmul.h and kernels/reduce.h, in a
// fixed order, so the result is deterministic on either device.
#include "kernels/muon.h"

#include <algorithm>
#include <cmath>

#include "kernels/common.h"
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

void newton_schulz5(Tensor& x_out, const Tensor& u, DType iterate) {
  ATTNRES_CHECK(u.ndim() == 2 && x_out.shape() == u.shape() && x_out.dtype() == u.dtype() &&
                    x_out.device() == u.device(),
                "newton_schulz5: x ", x_out.describe(), " for u ", u.describe());
  const int64_t m = u.dim(0), n = u.dim(1), k = std::min(m, n);
  x_out.copy_from(u);
  scale_(x_out, 1.0 / (std::sqrt(sum_squares(u)) + 1e-7));
  Tensor x = x_out;
  if (iterate != u.dtype()) {
    x = Tensor::empty(u.shape(), iterate, u.device());
    convert(x, x_out);
  }
  Tensor A = like(x, {k, k}), AA = like(x, {k, k}), BX = like(x, {m, n});
  // X^T X comes from matmul's weight gradient, which accumulates in the
  // gradient dtype: fp32 for bf16 x, then rounded into A.
  Tensor A_acc = grad_dtype(x.dtype()) == x.dtype() ? A : Tensor::empty({k, k}, grad_dtype(x.dtype()), x.device());
  for (int i = 0; i < kMuonSteps; ++i) {
    if (m <= n) {
      matmul_forward(A, x, x);  // X X^T
    } else {
      A_acc.zero_();  // dw accumulates: X^T X
      matmul_backward(nullptr, &A_acc, x, x, A, Store::Set);
      if (A_acc.dtype() != A.dtype()) convert(A, A_acc);
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
  if (iterate != u.dtype()) convert(x_out, x);
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
  const bool bf16 = w.is_cuda() && w_lowp && w_lowp->dtype() == DType::BF16;
  newton_schulz5(x, u, bf16 ? DType::BF16 : u.dtype());
  const double rms = 0.2 * std::sqrt(static_cast<double>(std::max(w.dim(0), w.dim(1))));
  scale_(w, 1.0 - st.lr * st.weight_decay);
  scale_(x, -st.lr * rms);
  add_(w, x);
  if (w_lowp) convert(*w_lowp, w);
}

}  // namespace attnres::kernels
