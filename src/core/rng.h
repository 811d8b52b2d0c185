// Counter-based random numbers: value i of stream s under seed k is a pure
// function hash(k, s, i). No hidden state, so initialisation is independent of
// device, thread count and parallel layout, and a shuffled epoch is fully
// described by (seed, epoch): nothing but those numbers needs checkpointing.
#pragma once
#include <cmath>
#include <cstdint>
#include <string_view>

#include "core/hostdevice.h"

namespace attnres {

// SplitMix64 finaliser: a bijective 64-bit mixer with good avalanche.
ATTNRES_HD uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

ATTNRES_HD uint64_t random_u64(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(mix64(seed) ^ stream) ^ index);
}

// Uniform in (0, 1]: never 0, so log() below is finite. 53 random bits.
ATTNRES_HD double random_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return (static_cast<double>(random_u64(seed, stream, index) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

// Standard normal via Box-Muller on two uniforms drawn at 2i and 2i+1.
ATTNRES_HD double random_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  double u1 = random_uniform(seed, stream, 2 * index);
  double u2 = random_uniform(seed, stream, 2 * index + 1);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// FNV-1a 64-bit, used to turn a parameter name into its RNG stream id.
constexpr uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace attnres
