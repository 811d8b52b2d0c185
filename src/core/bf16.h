// bfloat16 on the host: the top 16 bits of an IEEE float. The CUDA kernels use
// __nv_bfloat16, which has the same bits; this type exists so host code can
// name, convert and checkpoint bf16 tensors without CUDA headers.
#pragma once
#include <cstdint>

namespace attnres {

struct bf16_t {
  uint16_t bits;
};

// Round to nearest, ties to even (what __float2bfloat16_rn does); NaN stays NaN.
// Defined in bf16.cpp, not here: host code converts whole tensors (Tensor::to,
// checkpoints), where a call per element costs nothing that matters, and a
// change to the rounding then rebuilds one file, not every file that sees a
// Tensor (the planted faults of scripts/mutants.txt rebuild per fault).
bf16_t float_to_bf16(float f);
float bf16_to_float(bf16_t b);

}  // namespace attnres
