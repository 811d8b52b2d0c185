// CUDA KDA (see kernels/kda.h): the chunkwise core's forward and backward and
// the token-by-token recurrence (kernels/cuda/kda.cu), and the layer's
// per-token parts (kernels/cuda/kda_parts.cu). Values F32 or BF16 (every sum,
// state and solve in fp32); parameter gradients in fp32 for BF16 values
// (grad_dtype). The dispatcher (kernels/kda.cpp) has checked the arguments.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "kernels/kda.h"
#include "kernels/store.h"

namespace attnres::kernels::cuda {

void kda_forward(Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                 const Tensor& beta, const KdaShape& s, double scale);
void kda_backward(Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta,
                  const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& g, const Tensor& beta, const KdaShape& s, double scale,
                  Store store);
// state: F32 [B, H, K, V] or null (zeros; nothing returned).
void kda_recurrent_forward(Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& g, const Tensor& beta, const KdaShape& s, double scale,
                           Tensor* state);

void kda_conv_forward(Tensor& y, const Tensor& x, const Tensor& w, int64_t B, int64_t T);
void kda_conv_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                       int64_t B, int64_t T, Store dx_store);
void kda_l2norm_forward(Tensor& y, const Tensor& x, int64_t K, double eps);
void kda_l2norm_backward(Tensor& dx, const Tensor& dy, const Tensor& x, int64_t K, double eps,
                         Store dx_store);
void kda_decay_forward(Tensor& g, const Tensor& f, const Tensor& a_log, const Tensor& dt_bias,
                       int64_t K);
void kda_decay_backward(Tensor& df, Tensor& da_log, Tensor& ddt_bias, const Tensor& dg,
                        const Tensor& f, const Tensor& a_log, const Tensor& dt_bias, int64_t K,
                        Store df_store);
void kda_beta_forward(Tensor& beta, const Tensor& b);
void kda_beta_backward(Tensor& db, const Tensor& dbeta, const Tensor& beta, Store db_store);
void kda_out_gate_forward(Tensor& y, const Tensor& o, const Tensor& w, const Tensor& z, int64_t K,
                          double eps);
void kda_out_gate_backward(Tensor& d_o, Tensor& dw, Tensor& dz, const Tensor& dy, const Tensor& o,
                           const Tensor& w, const Tensor& z, int64_t K, double eps, Store store);

}  // namespace attnres::kernels::cuda
