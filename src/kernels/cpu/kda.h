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

}  // namespace attnres::kernels::cpu
