// CPU embedding lookup and its deterministic backward. Token ids are assumed
// valid here; the dispatcher (kernels/embedding.cpp) checks them first.
#pragma once
#include <cstdint>

namespace attnres::kernels::cpu {

// out[i, :] = weight[tokens[i], :]        out [N, d], weight [V, d]
template <typename T>
void embedding_forward(T* out, const T* weight, const int32_t* tokens, int64_t N, int64_t d);

// dweight[tokens[i], :] += dout[i, :], summed for each vocabulary row in
// increasing position order whatever the thread count.
template <typename T>
void embedding_backward(T* dweight, const T* dout, const int32_t* tokens, int64_t N, int64_t V,
                        int64_t d);

}  // namespace attnres::kernels::cpu
