// bfloat16 on the host: the top 16 bits of an IEEE float. The CUDA kernels use
// __nv_bfloat16, which has the same bits; this type exists so host code can
// name, convert and checkpoint bf16 tensors without CUDA headers.
#pragma once
#include <cstdint>
#include <cstring>

namespace attnres {

struct bf16_t {
  uint16_t bits;
};

// Round to nearest, ties to even (what __float2bfloat16_rn does); NaN stays NaN.
inline bf16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

inline float bf16_to_float(bf16_t b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace attnres
