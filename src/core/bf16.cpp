#include "core/bf16.h"

#include <cstring>

namespace attnres {

bf16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  // NaN: keep the sign and top payload bits, set the quiet bit (truncating
  // could turn a signalling NaN with low payload bits into infinity).
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40)};
  // Adding 0x7fff plus the kept part's lowest bit rounds to nearest and a tie
  // to the even neighbour; a carry into the exponent is the correct rounding up.
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

float bf16_to_float(bf16_t b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace attnres
