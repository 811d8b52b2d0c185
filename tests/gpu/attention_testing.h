// What the GPU attention tests share (test_attention.cpp: our kernels;
// test_attention_cudnn.cpp: cuDNN's): one shape's random inputs.
#pragma once
#include <cstdint>

#include "gpu_testing.h"
#include "kernels/attention.h"

namespace attnres::gpu_testing {

// Host F32 tensors (to_device rounds them in place to bf16 for BF16 runs, so
// the CPU reference sees exactly the values the GPU sees) and their device
// copies: q, k, v (q and k scaled by `stddev`: large values give peaked
// softmax rows), the output gradient, and initial gradients to accumulate onto.
struct AttnInputs {
  Tensor q, k, v, dout, dq0, dk0, dv0;
  Tensor qd, kd, vd, dod, dq0d, dk0d, dv0d;
};

inline AttnInputs attn_inputs(const kernels::AttnShape& s, DType dt, uint64_t seed,
                              double stddev = 1.0) {
  const int64_t N = s.B * s.T, q_cols = s.H * s.hd, kv_cols = s.Hkv * s.hd;
  AttnInputs in;
  in.q = randn_f32({N, q_cols}, seed, stddev);
  in.k = randn_f32({N, kv_cols}, seed + 1, stddev);
  in.v = randn_f32({N, kv_cols}, seed + 2);
  in.dout = randn_f32({N, q_cols}, seed + 3);
  in.dq0 = randn_f32({N, q_cols}, seed + 4, 0.5);
  in.dk0 = randn_f32({N, kv_cols}, seed + 5, 0.5);
  in.dv0 = randn_f32({N, kv_cols}, seed + 6, 0.5);
  in.qd = to_device(in.q, dt), in.kd = to_device(in.k, dt), in.vd = to_device(in.v, dt);
  in.dod = to_device(in.dout, dt);
  in.dq0d = to_device(in.dq0, dt), in.dk0d = to_device(in.dk0, dt), in.dv0d = to_device(in.dv0, dt);
  return in;
}

// A host F32 tensor in F64 (for the CPU reference).
inline Tensor to_f64(const Tensor& host_f32) { return host_f32.to(DType::F64); }

}  // namespace attnres::gpu_testing
