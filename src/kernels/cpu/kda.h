// CPU KDA core (kernels/kda.h): the chunkwise forward and backward and the
// token-by-token recurrence, for float and double.
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu {

// One call's tensors (rows of B T tokens; see kernels/kda.h) and shape.
template <typename T>
struct KdaArgs {
  const T *q, *k, *v, *g, *beta;
  int64_t B, T_, H, K, V, chunk;
  T scale;
};

template <typename T>
void kda_forward(T* o, const KdaArgs<T>& a);

// Gradients added into (accumulate) or written over the five outputs.
template <typename T>
void kda_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, const T* dout, const KdaArgs<T>& a,
                  bool accumulate);

// state [B, H, K, V] or nullptr (zeros; nothing kept).
template <typename T>
void kda_recurrent_forward(T* o, const KdaArgs<T>& a, T* state);

// The recurrence's gradients, token by token (from a zero state).
template <typename T>
void kda_recurrent_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, const T* dout,
                            const KdaArgs<T>& a, bool accumulate);

// The layer's parts (kda_parts.cpp; see kernels/kda.h). rows = N H for the
// per-head ops (each head's K channels one row); Ch = the conv's channels.
template <typename T>
void kda_conv_forward(T* y, const T* x, const T* w, int64_t B, int64_t T_, int64_t Ch, int64_t W);
template <typename T>
void kda_conv_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t B, int64_t T_,
                       int64_t Ch, int64_t W, bool accumulate);
template <typename T>
void kda_l2norm_forward(T* y, const T* x, int64_t rows, int64_t K, T eps);
template <typename T>
void kda_l2norm_backward(T* dx, const T* dy, const T* x, int64_t rows, int64_t K, T eps, bool accumulate);
template <typename T>
void kda_decay_forward(T* g, const T* f, const T* a_log, const T* dt_bias, int64_t N, int64_t H, int64_t K);
template <typename T>
void kda_decay_backward(T* df, T* da_log, T* ddt_bias, const T* dg, const T* f, const T* a_log,
                        const T* dt_bias, int64_t N, int64_t H, int64_t K, bool accumulate);
template <typename T>
void kda_beta_forward(T* beta, const T* b, int64_t n);
template <typename T>
void kda_beta_backward(T* db, const T* dbeta, const T* beta, int64_t n, bool accumulate);
template <typename T>
void kda_out_gate_forward(T* y, const T* o, const T* w, const T* z, int64_t rows, int64_t K, T eps);
template <typename T>
void kda_out_gate_backward(T* d_o, T* dw, T* dz, const T* dy, const T* o, const T* w, const T* z,
                           int64_t rows, int64_t K, T eps, bool accumulate);

}  // namespace attnres::kernels::cpu
