// MLA expansion dispatcher (kernels/mla.h): argument checks, then the CPU
// kernels (kernels/cpu/mla.cpp) or the CUDA ones (kernels/cuda/mla.cu).
#include "kernels/mla.h"

#include "kernels/common.h"
#include "kernels/cpu/mla.h"
#include "kernels/dispatch.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/mla.h"
#endif

namespace attnres::kernels {

namespace {

void check_all(const char* op, const Tensor& qkv, const Tensor& q, const Tensor& kv,
               const Tensor& kr, const MlaShape& s, double rope_theta) {
  if (s.B < 0 || s.T < 0 || s.H < 1 || s.dn < 0 || s.dr < 0 || s.dqk() < 1 || s.dv < 1)
    fail(op, ": bad shape B=", s.B, " T=", s.T, " H=", s.H, " dn=", s.dn, " dr=", s.dr,
         " dv=", s.dv);
  if (rope_theta > 0 && s.dr % 2 != 0) fail(op, ": RoPE needs an even dr, got ", s.dr);
  const int64_t N = s.B * s.T;
  check_arg(op, "qkv", qkv, qkv.device(), qkv.dtype(), {N, qkv_width(s.attn())});
  check_arg(op, "q", q, qkv, {N, s.H * s.dqk()});
  check_arg(op, "kv", kv, qkv, {N, s.H * (s.dn + s.dv)});
  check_arg(op, "kr", kr, qkv, {N, s.dr});
}

cpu::MlaArgs args(const MlaShape& s, double rope_theta, int64_t pos0) {
  return {s.B, s.T, s.H, s.dn, s.dr, s.dv, rope_theta, pos0};
}

}  // namespace

void mla_expand_forward(Tensor& qkv, const Tensor& q, const Tensor& kv, const Tensor& kr,
                        const MlaShape& s, double rope_theta, int64_t pos0) {
  const char* op = "mla_expand_forward";
  check_all(op, qkv, q, kv, kr, s, rope_theta);
  ATTNRES_CUDA_DISPATCH(qkv, op, cuda::mla_expand_forward(qkv, q, kv, kr, s, rope_theta, pos0));
  dispatch_cpu_float(qkv, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::mla_expand_forward<T>(qkv.data<T>(), q.data<T>(), kv.data<T>(), kr.data<T>(),
                               args(s, rope_theta, pos0));
  });
}

void mla_expand_backward(Tensor& dq, Tensor& dkv, Tensor& dkr, const Tensor& dqkv,
                         const MlaShape& s, double rope_theta, int64_t pos0) {
  const char* op = "mla_expand_backward";
  check_all(op, dqkv, dq, dkv, dkr, s, rope_theta);
  ATTNRES_CUDA_DISPATCH(dqkv, op, cuda::mla_expand_backward(dq, dkv, dkr, dqkv, s, rope_theta, pos0));
  dispatch_cpu_float(dqkv, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::mla_expand_backward<T>(dq.data<T>(), dkv.data<T>(), dkr.data<T>(), dqkv.data<T>(),
                                args(s, rope_theta, pos0));
  });
}

}  // namespace attnres::kernels
