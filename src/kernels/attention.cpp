// Attention dispatcher: shape/dtype checks and dtype dispatch.
#include "kernels/attention.h"

#include "kernels/common.h"
#include "kernels/dispatch.h"
#include "kernels/cpu/attention.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_cudnn.h"
#endif

namespace attnres::kernels {

namespace {

// Head counts must be positive and H a multiple of Hkv (each KV head serves
// H/Hkv query heads); B and T may be 0 (nothing to do).
void check_heads(const char* op, const AttnShape& s, bool need_t) {
  if (s.B < 0 || (need_t && s.T < 0) || s.H < 1 || s.Hkv < 1 || s.hd < 1 || s.vd < 0)
    fail(op, ": bad shape B=", s.B, " T=", s.T, " H=", s.H, " Hkv=", s.Hkv, " hd=", s.hd,
         " vd=", s.vd);
  if (s.H % s.Hkv != 0)
    fail(op, ": H=", s.H, " is not a multiple of Hkv=", s.Hkv);
}

// The tensors of a training-shaped call: the joint q/k/v, the output and its
// log-sum-exp, every one on qkv's device and of qkv's dtype (lse: statistics).
void check_qkv_out(const char* op, const AttnShape& s, const Tensor& qkv, const Tensor& out,
                   const Tensor& lse) {
  check_heads(op, s, true);
  if (!qkv.defined()) fail(op, ": qkv is undefined");
  const int64_t N = s.B * s.T;
  check_arg(op, "qkv", qkv, qkv, {N, qkv_width(s)});
  check_arg(op, "out", out, qkv, {N, s.H * s.dv()});
  check_arg(op, "lse", lse, qkv.device(), stat_dtype(qkv.dtype()), {s.B, s.H, s.T});
}

}  // namespace

bool attention_uses_cudnn(AttentionKernel kernel, const AttnShape& s, DType dt, Device dev,
                          std::string* why) {
  std::string reason;
  if (kernel == AttentionKernel::Own) {
    reason = "training.attention_kernel = \"own\"";
  } else if (dev != Device::CUDA) {
    reason = "cuDNN runs on cuda only";
  } else {
#if ATTNRES_HAVE_CUDA
    reason = cuda::cudnn::sdpa_unsupported(s, dt);  // cached per shape
#else
    reason = "this build has no CUDA backend";
#endif
  }
  if (reason.empty()) return true;
  if (kernel == AttentionKernel::Cudnn)
    fail("attention: training.attention_kernel is \"cudnn\", but cuDNN's fused attention cannot "
         "run B=", s.B, " T=", s.T, " H=", s.H, " Hkv=", s.Hkv, " hd=", s.hd, " in ",
         dtype_name(dt), ": ", reason, " (use \"auto\" or \"own\")");
  if (why) *why = reason;
  return false;
}

void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttnShape& s,
                       AttentionKernel kernel) {
  const char* op = "attention_forward";
  check_qkv_out(op, s, qkv, out, lse);
#if ATTNRES_HAVE_CUDA
  if (qkv.is_cuda() && attention_uses_cudnn(kernel, s, qkv.dtype(), Device::CUDA))
    return cuda::cudnn::sdpa_forward(out, lse, qkv, s);
#else
  (void)kernel;  // the CPU runs its own
#endif
  ATTNRES_CUDA_DISPATCH(qkv, op, cuda::attention_forward(out, lse, qkv, s));
  dispatch_cpu_float(qkv, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::attention_forward<T>(out.data<T>(), lse.data<T>(), qkv.data<T>(), s.B, s.T, s.H, s.Hkv,
                              s.hd, s.dv());
  });
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const AttnShape& s, Store store,
                        AttentionKernel kernel) {
  const char* op = "attention_backward";
  check_qkv_out(op, s, qkv, out, lse);
  const int64_t N = s.B * s.T;
  check_arg(op, "dout", dout, qkv, {N, s.H * s.dv()});
  check_arg(op, "dqkv", dqkv, qkv, {N, qkv_width(s)});
#if ATTNRES_HAVE_CUDA
  if (qkv.is_cuda() && attention_uses_cudnn(kernel, s, qkv.dtype(), Device::CUDA))
    return cuda::cudnn::sdpa_backward(dqkv, dout, qkv, out, lse, s, store);
#else
  (void)kernel;
#endif
  ATTNRES_CUDA_DISPATCH(qkv, op, cuda::attention_backward(dqkv, dout, qkv, out, lse, s, store));
  dispatch_cpu_float(qkv, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::attention_backward<T>(dqkv.data<T>(), dout.data<T>(), qkv.data<T>(), out.data<T>(),
                               lse.data<T>(), s.B, s.T, s.H, s.Hkv, s.hd, s.dv(),
                               store == Store::Add);
  });
}

void attention_decode(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      int64_t len, const AttnShape& s) {
  const char* op = "attention_decode";
  check_heads(op, s, false);  // s.T is ignored here
  if (!q.defined()) fail(op, ": q is undefined");
  if (!k_cache.defined() || k_cache.ndim() != 3)
    fail(op, ": k_cache must be 3-D [B, Tmax, Hkv*hd], got ",
         k_cache.defined() ? shape_str(k_cache.shape()) : std::string("undefined"));
  const int64_t Tmax = k_cache.dim(1);
  check_arg(op, "q", q, q, {s.B, s.H * s.hd});
  check_arg(op, "k_cache", k_cache, q, {s.B, Tmax, s.Hkv * s.hd});
  check_arg(op, "v_cache", v_cache, q, {s.B, Tmax, s.Hkv * s.dv()});
  check_arg(op, "out", out, q, {s.B, s.H * s.dv()});
  if (len < 1 || len > Tmax)
    fail(op, ": len=", len, " is outside the cache [1, ", Tmax, "]");
  ATTNRES_CUDA_DISPATCH(q, op, cuda::attention_decode(out, q, k_cache, v_cache, len, s));
  dispatch_cpu_float(q, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::attention_decode<T>(out.data<T>(), q.data<T>(), k_cache.data<T>(), v_cache.data<T>(),
                             s.B, Tmax, len, s.H, s.Hkv, s.hd, s.dv());
  });
}

}  // namespace attnres::kernels
