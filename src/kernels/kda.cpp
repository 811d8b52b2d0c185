// KDA dispatcher (kernels/kda.h): argument checks, then the CPU kernels
// (kernels/cpu/kda.cpp, kda_parts.cpp) or the CUDA ones (kernels/cuda/kda.cu,
// kda_parts.cu).
#include "kernels/kda.h"

#include "kernels/common.h"
#include "kernels/cpu/kda.h"
#include "kernels/dispatch.h"
#if ATTNRES_HAVE_CUDA
#include "kernels/cuda/kda.h"
#endif

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
  ATTNRES_CUDA_DISPATCH(q, op, cuda::kda_forward(o, q, k, v, g, beta, s, scale));
  dispatch_cpu_float(q, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::kda_forward<T>(o.data<T>(), args<T>(q, k, v, g, beta, s, scale));
  });
}

namespace {
// A backward's inputs and its five gradients (kda_backward's shapes).
void check_backward(const char* op, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                    const Tensor& dg, const Tensor& dbeta, const Tensor& dout, const Tensor& q,
                    const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                    const KdaShape& s) {
  check_inputs(op, q, k, v, g, beta, s);
  const int64_t N = s.B * s.T;
  check_arg(op, "dout", dout, q, {N, s.H * s.V});
  check_arg(op, "dq", dq, q, {N, s.H * s.K});
  check_arg(op, "dk", dk, q, {N, s.H * s.K});
  check_arg(op, "dg", dg, q, {N, s.H * s.K});
  check_arg(op, "dv", dv, q, {N, s.H * s.V});
  check_arg(op, "dbeta", dbeta, q, {N, s.H});
}
}  // namespace

void kda_backward(Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta,
                  const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& g, const Tensor& beta, const KdaShape& s, double scale,
                  Store store) {
  const char* op = "kda_backward";
  check_backward(op, dq, dk, dv, dg, dbeta, dout, q, k, v, g, beta, s);
  ATTNRES_CUDA_DISPATCH(q, op, cuda::kda_backward(dq, dk, dv, dg, dbeta, dout, q, k, v, g, beta, s,
                                                  scale, store));
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
  // The state: fp32 on a GPU (whatever the values' dtype), the values' dtype on the CPU.
  if (state)
    check_arg(op, "state", *state, q.device(), q.is_cuda() ? DType::F32 : q.dtype(),
              {s.B, s.H, s.K, s.V});
  ATTNRES_CUDA_DISPATCH(q, op, cuda::kda_recurrent_forward(o, q, k, v, g, beta, s, scale, state));
  dispatch_cpu_float(q, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::kda_recurrent_forward<T>(o.data<T>(), args<T>(q, k, v, g, beta, s, scale),
                                  state ? state->data<T>() : nullptr);
  });
}

void kda_recurrent_backward(Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta,
                            const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& g, const Tensor& beta, const KdaShape& s, double scale,
                            Store store) {
  const char* op = "kda_recurrent_backward";
  check_backward(op, dq, dk, dv, dg, dbeta, dout, q, k, v, g, beta, s);
  if (q.is_cuda()) fail(op, ": the token-by-token backward is a CPU reference (kda_backward trains)");
  dispatch_cpu_float(q, op, [&](auto tag) {
    using T = decltype(tag);
    cpu::kda_recurrent_backward<T>(dq.data<T>(), dk.data<T>(), dv.data<T>(), dg.data<T>(),
                                   dbeta.data<T>(), dout.data<T>(), args<T>(q, k, v, g, beta, s, scale),
                                   store == Store::Add);
  });
}

// ---- the layer's parts ----

namespace {

// x (named `name`) [N, H K] with heads of K channels (K >= 1 dividing the width).
int64_t heads_of(const char* op, const char* name, const Tensor& x, int64_t K) {
  check_2d(op, name, x);
  if (K < 1 || x.dim(1) % K != 0)
    fail(op, ": heads of ", K, " channels do not divide ", name, "'s width ", x.dim(1));
  return x.dim(1) / K;
}

void check_eps(const char* op, double eps) {
  if (!(eps >= 0)) fail(op, ": eps must be >= 0, got ", eps);
}

// The decay's f [N, H K], a_log [H] and dt_bias [H K]; returns H.
int64_t check_decay(const char* op, const Tensor& f, const Tensor& a_log, const Tensor& dt_bias,
                    int64_t K) {
  const int64_t H = heads_of(op, "f", f, K);
  check_arg(op, "a_log", a_log, f, {H});
  check_arg(op, "dt_bias", dt_bias, f, {H * K});
  return H;
}

// The output gate's o and z [N, H K], w [K], eps >= 0; returns H.
int64_t check_out_gate(const char* op, const Tensor& o, const Tensor& w, const Tensor& z, int64_t K,
                       double eps) {
  const int64_t H = heads_of(op, "o", o, K);
  check_eps(op, eps);
  check_arg(op, "w", w, o, {K});
  check_arg(op, "z", z, o, o.shape());
  return H;
}

// The convolution's x [B T, Ch] and w [Ch, W] (W >= 1); returns W.
int64_t check_conv(const char* op, const Tensor& x, const Tensor& w, int64_t B, int64_t T) {
  check_2d(op, "x", x);
  check_2d(op, "w", w);
  if (B < 1 || T < 1 || x.dim(0) != B * T) fail(op, ": x has ", x.dim(0), " rows for B ", B, " x T ", T);
  check_arg(op, "w", w, x, {x.dim(1), w.dim(1)});
  heads_of(op, "x", x, 1);
  return w.dim(1);
}

}  // namespace

void kda_conv_forward(Tensor& y, const Tensor& x, const Tensor& w, int64_t B, int64_t T) {
  const char* op = "kda_conv_forward";
  const int64_t W = check_conv(op, x, w, B, T), Ch = x.dim(1);
  check_arg(op, "y", y, x, x.shape());
  ATTNRES_CUDA_DISPATCH(x, op, cuda::kda_conv_forward(y, x, w, B, T));
  dispatch_cpu_float(x, op, [&](auto tag) {
    using T_ = decltype(tag);
    cpu::kda_conv_forward<T_>(y.data<T_>(), x.data<T_>(), w.data<T_>(), B, T, Ch, W);
  });
}

void kda_conv_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                       int64_t B, int64_t T, Store dx_store) {
  const char* op = "kda_conv_backward";
  const int64_t W = check_conv(op, x, w, B, T), Ch = x.dim(1);
  check_arg(op, "dy", dy, x, x.shape());
  check_arg(op, "dx", dx, x, x.shape());
  check_arg(op, "dw", dw, x.device(), grad_dtype(x.dtype()), {Ch, W});
  ATTNRES_CUDA_DISPATCH(x, op, cuda::kda_conv_backward(dx, dw, dy, x, w, B, T, dx_store));
  dispatch_cpu_float(x, op, [&](auto tag) {
    using T_ = decltype(tag);
    cpu::kda_conv_backward<T_>(dx.data<T_>(), dw.data<T_>(), dy.data<T_>(), x.data<T_>(),
                               w.data<T_>(), B, T, Ch, W, dx_store == Store::Add);
  });
}

void kda_l2norm_forward(Tensor& y, const Tensor& x, int64_t K, double eps) {
  const char* op = "kda_l2norm_forward";
  const int64_t H = heads_of(op, "x", x, K);
  check_eps(op, eps);
  check_arg(op, "y", y, x, x.shape());
  ATTNRES_CUDA_DISPATCH(x, op, cuda::kda_l2norm_forward(y, x, K, eps));
  dispatch_cpu_float(x, op, [&](auto tag) {
    using T_ = decltype(tag);
    cpu::kda_l2norm_forward<T_>(y.data<T_>(), x.data<T_>(), x.dim(0) * H, K, static_cast<T_>(eps));
  });
}

void kda_l2norm_backward(Tensor& dx, const Tensor& dy, const Tensor& x, int64_t K, double eps,
                         Store dx_store) {
  const char* op = "kda_l2norm_backward";
  const int64_t H = heads_of(op, "x", x, K);
  check_eps(op, eps);
  check_arg(op, "dy", dy, x, x.shape());
  check_arg(op, "dx", dx, x, x.shape());
  ATTNRES_CUDA_DISPATCH(x, op, cuda::kda_l2norm_backward(dx, dy, x, K, eps, dx_store));
  dispatch_cpu_float(x, op, [&](auto tag) {
    using T_ = decltype(tag);
    cpu::kda_l2norm_backward<T_>(dx.data<T_>(), dy.data<T_>(), x.data<T_>(), x.dim(0) * H, K,
                                 static_cast<T_>(eps), dx_store == Store::Add);
  });
}

void kda_decay_forward(Tensor& g, const Tensor& f, const Tensor& a_log, const Tensor& dt_bias,
                       int64_t K) {
  const char* op = "kda_decay_forward";
  const int64_t H = check_decay(op, f, a_log, dt_bias, K);
  check_arg(op, "g", g, f, f.shape());
  ATTNRES_CUDA_DISPATCH(f, op, cuda::kda_decay_forward(g, f, a_log, dt_bias, K));
  dispatch_cpu_float(f, op, [&](auto tag) {
    using T_ = decltype(tag);
    cpu::kda_decay_forward<T_>(g.data<T_>(), f.data<T_>(), a_log.data<T_>(), dt_bias.data<T_>(),
                               f.dim(0), H, K);
  });
}

void kda_decay_backward(Tensor& df, Tensor& da_log, Tensor& ddt_bias, const Tensor& dg,
                        const Tensor& f, const Tensor& a_log, const Tensor& dt_bias, int64_t K,
                        Store df_store) {
  const char* op = "kda_decay_backward";
  const int64_t H = check_decay(op, f, a_log, dt_bias, K);
  check_arg(op, "dg", dg, f, f.shape());
  check_arg(op, "df", df, f, f.shape());
  check_arg(op, "da_log", da_log, f.device(), grad_dtype(f.dtype()), {H});
  check_arg(op, "ddt_bias", ddt_bias, f.device(), grad_dtype(f.dtype()), {H * K});
  ATTNRES_CUDA_DISPATCH(f, op, cuda::kda_decay_backward(df, da_log, ddt_bias, dg, f, a_log, dt_bias,
                                                        K, df_store));
  dispatch_cpu_float(f, op, [&](auto tag) {
    using T_ = decltype(tag);
    cpu::kda_decay_backward<T_>(df.data<T_>(), da_log.data<T_>(), ddt_bias.data<T_>(),
                                dg.data<T_>(), f.data<T_>(), a_log.data<T_>(), dt_bias.data<T_>(),
                                f.dim(0), H, K, df_store == Store::Add);
  });
}

void kda_beta_forward(Tensor& beta, const Tensor& b) {
  const char* op = "kda_beta_forward";
  heads_of(op, "b", b, 1);
  check_arg(op, "beta", beta, b, b.shape());
  ATTNRES_CUDA_DISPATCH(b, op, cuda::kda_beta_forward(beta, b));
  dispatch_cpu_float(b, op, [&](auto tag) {
    using T_ = decltype(tag);
    cpu::kda_beta_forward<T_>(beta.data<T_>(), b.data<T_>(), b.numel());
  });
}

void kda_beta_backward(Tensor& db, const Tensor& dbeta, const Tensor& beta, Store db_store) {
  const char* op = "kda_beta_backward";
  heads_of(op, "beta", beta, 1);
  check_arg(op, "dbeta", dbeta, beta, beta.shape());
  check_arg(op, "db", db, beta, beta.shape());
  ATTNRES_CUDA_DISPATCH(beta, op, cuda::kda_beta_backward(db, dbeta, beta, db_store));
  dispatch_cpu_float(beta, op, [&](auto tag) {
    using T_ = decltype(tag);
    cpu::kda_beta_backward<T_>(db.data<T_>(), dbeta.data<T_>(), beta.data<T_>(), beta.numel(),
                               db_store == Store::Add);
  });
}

void kda_out_gate_forward(Tensor& y, const Tensor& o, const Tensor& w, const Tensor& z, int64_t K,
                          double eps) {
  const char* op = "kda_out_gate_forward";
  const int64_t H = check_out_gate(op, o, w, z, K, eps);
  check_arg(op, "y", y, o, o.shape());
  ATTNRES_CUDA_DISPATCH(o, op, cuda::kda_out_gate_forward(y, o, w, z, K, eps));
  dispatch_cpu_float(o, op, [&](auto tag) {
    using T_ = decltype(tag);
    cpu::kda_out_gate_forward<T_>(y.data<T_>(), o.data<T_>(), w.data<T_>(), z.data<T_>(),
                                  o.dim(0) * H, K, static_cast<T_>(eps));
  });
}

void kda_out_gate_backward(Tensor& d_o, Tensor& dw, Tensor& dz, const Tensor& dy, const Tensor& o,
                           const Tensor& w, const Tensor& z, int64_t K, double eps, Store store) {
  const char* op = "kda_out_gate_backward";
  const int64_t H = check_out_gate(op, o, w, z, K, eps);
  check_arg(op, "dy", dy, o, o.shape());
  check_arg(op, "d_o", d_o, o, o.shape());
  check_arg(op, "dz", dz, o, o.shape());
  check_arg(op, "dw", dw, o.device(), grad_dtype(o.dtype()), {K});
  ATTNRES_CUDA_DISPATCH(o, op, cuda::kda_out_gate_backward(d_o, dw, dz, dy, o, w, z, K, eps, store));
  dispatch_cpu_float(o, op, [&](auto tag) {
    using T_ = decltype(tag);
    cpu::kda_out_gate_backward<T_>(d_o.data<T_>(), dw.data<T_>(), dz.data<T_>(), dy.data<T_>(),
                                   o.data<T_>(), w.data<T_>(), z.data<T_>(), o.dim(0) * H, K,
                                   static_cast<T_>(eps), store == Store::Add);
  });
}

}  // namespace attnres::kernels
