// LM head + cross-entropy dispatcher: argument checks, target validation and
// dtype dispatch.
#include "kernels/cross_entropy.h"

#include <cmath>
#include <string>

#include "kernels/common.h"
#include "kernels/dispatch.h"
#include "kernels/cpu/cross_entropy.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/cross_entropy.h"
#endif

namespace attnres::kernels {

double lm_head_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets, Tensor* dh,
                             Tensor* dw, double grad_scale, Store dh_store, DType logits) {
  const char* op = "lm_head_cross_entropy";
  check_2d(op, "h", h);
  check_2d(op, "w", w);
  const int64_t N = h.dim(0), d = h.dim(1), V = w.dim(0);
  check_arg(op, "w", w, h, {V, d});
  if (dh) check_arg(op, "dh", *dh, h, {N, d});
  if (dw) check_arg(op, "dw", *dw, h.device(), grad_dtype(h.dtype()), {V, d});
  if (!std::isfinite(grad_scale)) fail(op, ": grad_scale must be finite, got ", grad_scale);
  if (logits != DType::F32 && logits != DType::BF16)
    fail(op, ": logits must be F32 or BF16, got ", dtype_name(logits));
  // bf16 logits come out of a bf16 GEMM (the GEMMs write F32 or their input dtype).
  if (logits == DType::BF16 && !(h.is_cuda() && h.dtype() == DType::BF16))
    fail(op, ": bf16 logits need BF16 h and w on cuda, got ", dtype_name(h.dtype()), " on ",
         device_name(h.device()));

  // Targets index the logit row; an id outside [0, V) would read out of
  // bounds, so name the first offender (a data / vocab_size mismatch).
  if (!targets.defined()) fail(op, ": targets is undefined");
  if (targets.dtype() != DType::I32)
    fail(op, ": targets must be I32, got ", dtype_name(targets.dtype()));
  if (targets.device() != h.device())
    fail(op, ": targets are on ", device_name(targets.device()), ", h on ", device_name(h.device()));
  if (targets.shape() != Shape{N})
    fail(op, ": targets has shape ", shape_str(targets.shape()), ", expected ", shape_str({N}));
  // (The CUDA kernel checks the ids on the device and reports the same way.)
  ATTNRES_CUDA_DISPATCH(h, op, cuda::lm_head_cross_entropy(h, w, targets, dh, dw, grad_scale, dh_store,
                                                           logits));
  const int32_t* ids = targets.data<int32_t>();
  for (int64_t i = 0; i < N; ++i)
    if (ids[i] < 0 || ids[i] >= V)
      fail(op, ": target id ", ids[i], " at position ", i, " is outside the vocabulary [0, ", V,
           ")");

  double loss = 0;
  dispatch_cpu_float(h, op, [&](auto tag) {
    using T = decltype(tag);
    loss = cpu::lm_head_cross_entropy<T>(h.data<T>(), w.data<T>(), ids, dh ? dh->data<T>() : nullptr,
                                         dw ? dw->data<T>() : nullptr, N, V, d, grad_scale,
                                         dh_store == Store::Add);
  });
  return loss;
}

}  // namespace attnres::kernels
