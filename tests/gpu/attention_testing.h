// What the GPU attention tests share (test_attention.cpp: our kernels;
// test_attention_cudnn.cpp: cuDNN's): one shape's random inputs, what a run
// leaves, and the F64 CPU references with the terms that bound their rounding.
#pragma once
#include <cstdint>

#include "attention_qkv.h"
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

// The host inputs in F64, for the CPU reference (the values the device copies
// hold: for BF16 runs, attn_inputs rounded them). Read-only: clone before
// accumulating onto dq0, dk0, dv0.
struct AttnInputs64 {
  Tensor q, k, v, dout, dq0, dk0, dv0;
};
inline AttnInputs64 inputs_f64(const AttnInputs& in) {
  return {to_f64(in.q),    to_f64(in.k),   to_f64(in.v),  to_f64(in.dout),
          to_f64(in.dq0), to_f64(in.dk0), to_f64(in.dv0)};
}

// What one forward + backward on the device leaves: out, lse and the gradients.
struct AttnRun {
  Tensor out, lse, dq, dk, dv;
};

// The CPU op in F64 on x's q, k, v: out and lse, and out's terms for its
// element-wise bound (gpu_testing.h): out_i = sum_j P_ij v_j has the terms
// sum_j P_ij |v_j|, the same attention over |v|.
struct AttnForwardRef {
  Tensor out, lse, out_terms;
};
inline AttnForwardRef attn_forward_reference(const kernels::AttnShape& s, const AttnInputs64& x) {
  const int64_t N = s.B * s.T;
  AttnForwardRef r;
  r.out = Tensor::empty({N, s.H * s.hd}, DType::F64);
  r.lse = Tensor::empty({s.B, s.H, s.T}, DType::F64);
  testing::attention_forward(r.out, r.lse, x.q, x.k, x.v, s);
  r.out_terms = Tensor::empty({N, s.H * s.hd}, DType::F64);
  Tensor lse_unused = Tensor::empty({s.B, s.H, s.T}, DType::F64);
  testing::attention_forward(r.out_terms, lse_unused, x.q, x.k, testing::abs_of(x.v), s);
  return r;
}

// dv's terms for its element-wise bound: dv_j = dv0_j + sum_i P_ij dO_i has
// the terms |dv0_j| + sum_i P_ij |dO_i|, the CPU backward (F64) fed |dO| onto
// dv0_terms (|dv0|, or zeros where nothing is accumulated onto); its dq and
// dk are not used. P from x's q, k, v and a run's out and lse (F64).
inline Tensor attn_dv_terms(const kernels::AttnShape& s, Tensor dv0_terms, const AttnInputs64& x,
                            const Tensor& out64, const Tensor& lse64) {
  const int64_t N = s.B * s.T;
  Tensor dq_unused = Tensor::zeros({N, s.H * s.hd}, DType::F64);
  Tensor dk_unused = Tensor::zeros({N, s.Hkv * s.hd}, DType::F64);
  testing::attention_backward(dq_unused, dk_unused, dv0_terms, testing::abs_of(x.dout), x.q, x.k,
                              x.v, out64, lse64, s);
  return dv0_terms;
}

}  // namespace attnres::gpu_testing
