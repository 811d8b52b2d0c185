// KDA core dispatcher (kernels/kda.h): argument checks and dtype dispatch.
// CPU only so far; a CUDA tensor is refused with that said.
#include "kernels/kda.h"

#include "kernels/common.h"
#include "kernels/cpu/kda.h"
#include "kernels/dispatch.h"

namespace attnres::kernels {

namespace {

void check_shape(const char* op, const KdaShape& s) {
  if (s.B < 1 || s.T < 1 || s.H < 1 || s.K < 1 || s.V < 1)
    fail(op, ": B, T, H, K and V must be >= 1, got ", s.B, ", ", s.T, ", ", s.H, ", ", s.K, ", ", s.V);
  if (s.chunk < 16 || s.chunk % 16 != 0)
    fail(op, ": the chunk must be a multiple of 16, got ", s.chunk);
}

// q, k, g [N, H K], v [N, H V], beta [N, H], all of q's dtype and device.
void check_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& g, const Tensor& beta, const KdaShape& s) {
  check_shape(op, s);
  const int64_t N = s.B * s.T;
  check_arg(op, "q", q, q.device(), q.dtype(), {N, s.H * s.K});
  check_arg(op, "k", k, q, {N, s.H * s.K});
  check_arg(op, "g", g, q, {N, s.H * s.K});
  check_arg(op, "v", v, q, {N, s.H * s.V});
  check_arg(op, "beta", beta, q, {N, s.H});
  if (q.is_cuda()) fail(op, ": no CUDA kernel yet (the KDA core runs on the cpu)");
}

template <typename T>
cpu::KdaArgs<T> args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                     const Tensor& beta, const KdaShape& s, double scale) {
  return {q.data<T>(), k.data<T>(), v.data<T>(), g.data<T>(), beta.data<T>(),
          s.B, s.T, s.H, s.K, s.V, s.chunk, static_cast<T>(scale)};
}

}  // namespace

void kda_forward(Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                 const Tensor& beta, const KdaShape& s, double scale) {
  const char* op = "kda_forward";
  check_inputs(op, q, k, v, g, beta, s);
  check_arg(op, "o", o, q, {s.B * s.T, s.H * s.V});
  dispatch_cpu_float(q, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::kda_forward<T>(o.data<T>(), args<T>(q, k, v, g, beta, s, scale));
  });
}

void kda_backward(Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta,
                  const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& g, const Tensor& beta, const KdaShape& s, double scale,
                  Store store) {
  const char* op = "kda_backward";
  check_inputs(op, q, k, v, g, beta, s);
  const int64_t N = s.B * s.T;
  check_arg(op, "dout", dout, q, {N, s.H * s.V});
  check_arg(op, "dq", dq, q, {N, s.H * s.K});
  check_arg(op, "dk", dk, q, {N, s.H * s.K});
  check_arg(op, "dg", dg, q, {N, s.H * s.K});
  check_arg(op, "dv", dv, q, {N, s.H * s.V});
  check_arg(op, "dbeta", dbeta, q, {N, s.H});
  dispatch_cpu_float(q, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::kda_backward<T>(dq.data<T>(), dk.data<T>(), dv.data<T>(), dg.data<T>(), dbeta.data<T>(),
                         dout.data<T>(), args<T>(q, k, v, g, beta, s, scale),
                         store == Store::Add);
  });
}

void kda_recurrent_forward(Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& g, const Tensor& beta, const KdaShape& s, double scale,
                           Tensor* state) {
  const char* op = "kda_recurrent_forward";
  check_inputs(op, q, k, v, g, beta, s);
  check_arg(op, "o", o, q, {s.B * s.T, s.H * s.V});
  if (state) check_arg(op, "state", *state, q, {s.B, s.H, s.K, s.V});
  dispatch_cpu_float(q, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::kda_recurrent_forward<T>(o.data<T>(), args<T>(q, k, v, g, beta, s, scale),
                                  state ? state->data<T>() : nullptr);
  });
}

}  // namespace attnres::kernels
