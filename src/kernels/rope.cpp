// RoPE dispatcher: argument checks and dtype dispatch.
#include "kernels/rope.h"

#include "kernels/common.h"
#include "kernels/dispatch.h"
#include "kernels/cpu/rope.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/rope.h"
#endif

namespace attnres::kernels {

namespace {

void check_rope(const char* op, const Tensor& x, int64_t B, int64_t T, int64_t n_heads,
                int64_t head_dim, float theta, int64_t pos0) {
  if (!x.defined()) fail(op, ": x is undefined");
  if (B < 0 || T < 0 || n_heads < 0 || head_dim < 0 || pos0 < 0)
    fail(op, ": negative size (B=", B, ", T=", T, ", n_heads=", n_heads, ", head_dim=", head_dim,
         ", pos0=", pos0, ")");
  if (head_dim % 2 != 0) fail(op, ": head_dim must be even, got ", head_dim);
  if (!(theta > 0)) fail(op, ": theta must be > 0, got ", theta);
  if (x.ndim() != 2 || x.dim(0) != B * T || x.dim(1) < n_heads * head_dim)
    fail(op, ": x has shape ", shape_str(x.shape()), ", expected [B*T, W] = [", B * T,
         ", W] with W >= n_heads*head_dim = ", n_heads * head_dim);
}

void rope_apply(const char* op, Tensor& x, int64_t B, int64_t T, int64_t n_heads, int64_t head_dim,
                float theta, int64_t pos0, bool inverse) {
  check_rope(op, x, B, T, n_heads, head_dim, theta, pos0);
  ATTNRES_CUDA_DISPATCH(x, op, cuda::rope_rotate(x, B, T, n_heads, head_dim, theta, pos0, inverse));
  dispatch_cpu_float(x, op, [&](auto tag) {
    using U = decltype(tag);
    cpu::rope_rotate<U>(x.data<U>(), x.dim(1), B, T, n_heads, head_dim,
                        static_cast<double>(theta), pos0, inverse);
  });
}

}  // namespace

void rope_forward(Tensor& x, int64_t B, int64_t T, int64_t n_heads, int64_t head_dim, float theta,
                  int64_t pos0) {
  rope_apply("rope_forward", x, B, T, n_heads, head_dim, theta, pos0, /*inverse=*/false);
}

void rope_backward(Tensor& dx, int64_t B, int64_t T, int64_t n_heads, int64_t head_dim, float theta,
                   int64_t pos0) {
  // The rotation is orthogonal, so its transpose (the backward) is the
  // rotation by -angle, applied in place to the incoming gradient.
  rope_apply("rope_backward", dx, B, T, n_heads, head_dim, theta, pos0, /*inverse=*/true);
}

}  // namespace attnres::kernels
