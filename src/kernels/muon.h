// Muon (docs/model.md section 4): momentum, then the update orthogonalised by
// five Newton-Schulz steps, for one weight matrix at a time. Built from the
// dispatched GEMM and elementwise ops, so it runs where the tensors are (the
// CPU's BLAS, or cuBLASLt on CUDA); tests/train/test_muon.cpp holds the
// float64 transcription it is checked against.
#pragma once
#include "core/tensor.h"

namespace attnres::kernels {

// The quintic's coefficients (Keller Jordan's Muon, Moonlight).
constexpr double kMuonA = 3.4445, kMuonB = -4.7750, kMuonC = 2.0315;
constexpr int kMuonSteps = 5;

struct MuonStep {
  double lr, momentum, weight_decay;
  double grad_scale = 1.0;  // gradient clipping, as AdamWStep's
};

// x [m, n] = NS5(u / (||u||_F + 1e-7)): X = u / (||u|| + 1e-7), transposed when
// m > n; five times A = X X^T, X = a X + (b A + c A A) X; transposed back.
// (The transposes are not made: for m > n the same steps are written with
// A = X^T X and X = a X + X (b A + c A A).) u and x: same shape, dtype, device.
// `iterate`: the dtype the five steps' GEMMs and sums run in (default u's);
// BF16 on CUDA: bf16 inputs and outputs, fp32 accumulation inside cuBLASLt,
// as Muon's reference runs it (the normalisation stays in u's dtype, and x
// gets the result converted back).
void newton_schulz5(Tensor& x, const Tensor& u, DType iterate);
inline void newton_schulz5(Tensor& x, const Tensor& u) { newton_schulz5(x, u, u.dtype()); }

// One matrix's Muon update, w [m, n] (the fp32 master in a bf16 run), g its
// gradient, buf its momentum (w's dtype):
//   g' = grad_scale g; buf = mu buf + g'; u = g' + mu buf (Nesterov);
//   w = w (1 - lr wd) - lr 0.2 sqrt(max(m, n)) NS5(u)
// (0.2 sqrt(max(m, n)): Moonlight's scale, an update of AdamW's RMS). With
// w_lowp, the bf16 weights the model computes with are refreshed from w; on
// CUDA a bf16 run's Newton-Schulz iterates in bf16 (newton_schulz5's
// `iterate`), the rest stays fp32.
void muon_update(Tensor& w, const Tensor& g, Tensor& buf, const MuonStep& step,
                 Tensor* w_lowp = nullptr);

}  // namespace attnres::kernels
