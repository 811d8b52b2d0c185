// fp32 <-> bf16 conversions (core/bf16.h, and Tensor::to, which `attnres export
// hf --dtype bf16` and the bf16 runs' weights go through) on their edge cases,
// each against a bit pattern derived by hand in the comment beside it.
//
// The layouts: fp32 is sign | 8 exponent bits | 23 mantissa bits, bf16 the top
// 16 of them (sign | 8 | 7). fp32 -> bf16 keeps the top half and rounds on the
// low 16 bits L: L < 0x8000 down, L > 0x8000 up (a carry may move into the
// exponent, and from the largest finite value into infinity), L = 0x8000 (an
// exact halfway value) to the even neighbour, the one whose last bit (bit 16 of
// the fp32) is 0 -- IEEE round to nearest, ties to even, as PyTorch's
// c10::BFloat16 and CUDA's __float2bfloat16_rn do. Rounding is on the magnitude,
// so a negative value rounds as its absolute value does.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "core/bf16.h"
#include "core/rng.h"
#include "core/tensor.h"

using namespace attnres;

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
std::string hex(uint32_t u, int digits) {
  char s[16];
  std::snprintf(s, sizeof s, "0x%0*X", digits, u);
  return s;
}

struct Case {
  uint32_t f32;   // the input's bits
  uint16_t bf16;  // what it must become
  const char* why;
};

void check_cases(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    INFO(hex(c.f32, 8) << " (" << from_bits(c.f32) << "): " << c.why);
    CHECK(hex(float_to_bf16(from_bits(c.f32)).bits, 4) == hex(c.bf16, 4));
  }
}

// The bf16 value nearest to a finite x found by arithmetic instead of bit
// manipulation, as an independent oracle: x's bf16 neighbours lo <= |x| < hi =
// lo + ulp, with ulp = 2^(e-8) for |x| in [2^(e-1), 2^e) (8 significant bits),
// never below 2^-133 (bf16's subnormal spacing); the nearer of the two, on a
// tie the one that is an even multiple of ulp; infinity if that is 2^128 or
// more (IEEE overflow). Every step is exact in double.
uint16_t nearest_bf16_by_arithmetic(float x) {
  const double a = std::fabs(static_cast<double>(x));
  int e = 0;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1) (e = 0 for a = 0)
  const double ulp = std::ldexp(1.0, std::max(e - 8, -133));
  const double lo = std::floor(a / ulp) * ulp, hi = lo + ulp;
  double r = a - lo < hi - a ? lo : a - lo > hi - a ? hi : std::fmod(lo / ulp, 2.0) == 0 ? lo : hi;
  const float rf = r >= std::ldexp(1.0, 128) ? std::numeric_limits<float>::infinity()
                                             : static_cast<float>(r);  // exact: r is a bf16 value
  return static_cast<uint16_t>(bits_of(std::copysign(rf, x)) >> 16);
}

bool is_nan_bits(uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x007F) != 0; }

}  // namespace

TEST_CASE("fp32 -> bf16 rounds to nearest, ties to even, on hand-derived bit patterns", "[core][bf16]") {
  check_cases({
      {0x3F800000, 0x3F80, "1.0: L = 0, exact"},
      {0x3F808000, 0x3F80, "1 + 2^-8, halfway between 1.0 (0x3F80, last bit 0) and 1 + 2^-7 (0x3F81): to the even, down"},
      {0x3F818000, 0x3F82, "1 + 3 2^-8, halfway between 0x3F81 (odd) and 0x3F82 (even): up"},
      {0x3F808001, 0x3F81, "one fp32 ulp above the halfway value of 0x3F808000: up"},
      {0x3F807FFF, 0x3F80, "one fp32 ulp below it: down"},
      {0x3F817FFF, 0x3F81, "just below the halfway value above an odd one: down, not to the even"},
      {0x3FFF8000, 0x4000, "2 - 2^-8, halfway between 0x3FFF (1.9921875, odd) and 2.0: up, the carry moves into the exponent"},
      {0xBF808000, 0xBF80, "-(1 + 2^-8): halfway, to the even, toward zero"},
      {0xBF818000, 0xBF82, "-(1 + 3 2^-8): halfway, to the even, away from zero"},
      {0xBF808001, 0xBF81, "-(1 + 2^-8 + 2^-23): past halfway in magnitude: away from zero (toward -inf)"},
      {0xBF807FFF, 0xBF80, "below halfway in magnitude: toward zero"},
      {0x40490FDB, 0x4049, "pi (fp32 0x40490FDB): L = 0x0FDB < 0x8000, down to 3.140625"},
      {0x3DCCCCCD, 0x3DCD, "0.1 (fp32 0x3DCCCCCD): L = 0xCCCD > 0x8000, up"},
      {0xC2F6E979, 0xC2F7, "-123.456 (fp32 0xC2F6E979): L = 0xE979 > 0x8000, up in magnitude to -123.5"},
      {0x00000000, 0x0000, "+0"},
      {0x80000000, 0x8000, "-0 keeps its sign"},
  });
}

TEST_CASE("fp32 -> bf16 at the largest finite value and past it: infinity", "[core][bf16]") {
  // bf16's largest finite value is 0x7F7F = (2 - 2^-7) 2^127 = 3.3895e38; the
  // next step up would be 2^128, which is infinity's place (0x7F80).
  check_cases({
      {0x7F7F0000, 0x7F7F, "the largest finite bf16, exactly"},
      {0x7F7F7FFF, 0x7F7F, "just below halfway to 2^128: down, still finite"},
      {0x7F7F8000, 0x7F80, "(2 - 2^-8) 2^127, halfway between 0x7F7F (odd) and 2^128: to the even, 2^128, which overflows to +inf"},
      {0x7F7FFFFF, 0x7F80, "FLT_MAX = (2 - 2^-23) 2^127: past halfway, +inf"},
      {0xFF7F7FFF, 0xFF7F, "-(just below halfway): the most negative finite bf16"},
      {0xFF7F8000, 0xFF80, "-(halfway): -inf"},
      {0xFF7FFFFF, 0xFF80, "-FLT_MAX: -inf"},
      {0x7F800000, 0x7F80, "+inf stays +inf"},
      {0xFF800000, 0xFF80, "-inf stays -inf"},
  });
}

TEST_CASE("fp32 -> bf16 on subnormals: rounded, not flushed to zero", "[core][bf16]") {
  // bf16 has fp32's exponent range, so an fp32 subnormal (exponent bits 0,
  // value mantissa x 2^-149) rounds like any other value: bf16's subnormal step
  // is 2^-133 (0x0001), its smallest normal 2^-126 (0x0080).
  check_cases({
      {0x00000001, 0x0000, "2^-149, the smallest fp32 subnormal: far below half of 2^-133, to +0"},
      {0x00008000, 0x0000, "2^-134, halfway between 0 and 2^-133 (0x0001): to the even, +0"},
      {0x00008001, 0x0001, "2^-134 + 2^-149: past halfway, the smallest bf16 subnormal"},
      {0x00010000, 0x0001, "2^-133, exactly the smallest bf16 subnormal"},
      {0x00018000, 0x0002, "1.5 x 2^-133, halfway between 0x0001 (odd) and 0x0002: up"},
      {0x007F8000, 0x0080, "halfway between the largest bf16 subnormal 0x007F (odd) and 2^-126: up into the normals"},
      {0x007FFFFF, 0x0080, "the largest fp32 subnormal: up to the smallest normal, 2^-126"},
      {0x80008000, 0x8000, "-2^-134: halfway, to -0 (the sign stays)"},
      {0x80008001, 0x8001, "-(2^-134 + 2^-149): -2^-133"},
      {0x80018000, 0x8002, "-1.5 x 2^-133: halfway, to the even, -2 x 2^-133"},
  });
}

TEST_CASE("fp32 -> bf16 keeps a NaN a quiet NaN with its sign", "[core][bf16]") {
  // The rounding add would turn some NaNs into other things: a NaN whose
  // payload is only in the low 16 bits into infinity (0x7F800001 -> 0x7F80),
  // 0x7FFFFFFF into -0 (the carry runs through the sign: 0x80007FFF -> 0x8000).
  // The rule here: the top 16 bits with the quiet bit (bf16 bit 6, 0x0040)
  // set, which keeps the sign and the top of the payload -- what x86's
  // VCVTNEPS2BF16 does. PyTorch keeps no sign: its scalar c10::BFloat16 gives
  // 0x7FC0 for every NaN, its vectorised CPU conversion (Debian's torch 1.13,
  // tensor.to(torch.bfloat16)) 0xFFFF, and CUDA's host __float2bfloat16_rn
  // 0x7FFF; all agree on what matters: a NaN stays a quiet NaN. (Checked once,
  // outside the suite, on the halfway patterns of the sweep below: VCVTNEPS2BF16
  // gives these bits for every NaN and differs only on fp32 subnormals, which
  // it flushes to zero; torch gives them for every non-NaN value.)
  const std::vector<Case> nans = {
      {0x7FC00000, 0x7FC0, "the default quiet NaN"},
      {0xFFC00000, 0xFFC0, "-NaN (x86's default NaN): the sign stays"},
      {0x7F800001, 0x7FC0, "signalling NaN, payload 1 (below bf16's bits): quieted, not +inf"},
      {0xFF800001, 0xFFC0, "negative signalling NaN, payload 1: quieted, not -inf"},
      {0x7FFFFFFF, 0x7FFF, "all payload bits: the top ones kept, not -0"},
      {0xFFFFFFFF, 0xFFFF, "negative, all payload bits"},
      {0x7FA00000, 0x7FE0, "signalling NaN with payload bit 0x0020 in bf16's bits: kept, quiet bit added"},
      {0x7F810000, 0x7FC1, "signalling NaN with payload 0x0001 in bf16's bits: kept, quiet bit added"},
  };
  check_cases(nans);
  for (const Case& c : nans) {
    const uint16_t b = float_to_bf16(from_bits(c.f32)).bits;
    INFO(hex(c.f32, 8) << " -> " << hex(b, 4));
    CHECK(is_nan_bits(b));
    CHECK((b & 0x0040) != 0);                 // quiet
    CHECK((b >> 15) == (c.f32 >> 31));        // sign kept
    CHECK(std::isnan(bf16_to_float(bf16_t{b})));
  }
}

TEST_CASE("fp32 -> bf16 agrees with nearest-by-arithmetic at every halfway point", "[core][bf16]") {
  // Every top half (all signs, exponents and bf16 mantissas) with the low
  // halves that decide rounding: 0, just above 0, just below, exactly and just
  // past halfway, the largest; plus 2^20 random fp32 patterns. NaNs and
  // infinities are the cases above.
  int64_t checked = 0, wrong = 0;
  auto check = [&](uint32_t u) {
    const float x = from_bits(u);
    if (!std::isfinite(x)) return;
    ++checked;
    const uint16_t got = float_to_bf16(x).bits, want = nearest_bf16_by_arithmetic(x);
    if (got != want && ++wrong <= 10) FAIL_CHECK(hex(u, 8) << " -> " << hex(got, 4) << ", nearest " << hex(want, 4));
  };
  for (uint32_t top = 0; top < 0x10000; ++top)
    for (uint32_t low : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) check(top << 16 | low);
  for (uint64_t i = 0; i < (uint64_t{1} << 20); ++i) check(static_cast<uint32_t>(random_u64(43, 6, i)));
  INFO(checked << " finite values checked");
  CHECK(wrong == 0);
  CHECK(checked > 390000);
}

TEST_CASE("bf16 -> fp32 is exact: the 16 bits move to the top", "[core][bf16]") {
  struct Back {
    uint16_t bf16;
    float want;
    const char* why;
  };
  const Back cases[] = {
      {0x3F80, 1.0f, "1.0"},
      {0xC000, -2.0f, "-2.0"},
      {0x4049, 3.140625f, "3.140625 = 0x4049 x 2^16 as fp32"},
      {0x7F7F, std::ldexp(255.0f, 120), "the largest finite bf16, (2^8 - 1) 2^120"},
      {0x0080, std::ldexp(1.0f, -126), "the smallest normal, 2^-126"},
      {0x0001, std::ldexp(1.0f, -133), "the smallest subnormal, 2^-133 (an fp32 subnormal)"},
      {0x8001, -std::ldexp(1.0f, -133), "its negative"},
      {0x7F80, std::numeric_limits<float>::infinity(), "+inf"},
      {0xFF80, -std::numeric_limits<float>::infinity(), "-inf"},
  };
  for (const Back& c : cases) {
    INFO(hex(c.bf16, 4) << ": " << c.why);
    CHECK(bf16_to_float(bf16_t{c.bf16}) == c.want);
    CHECK(hex(bits_of(bf16_to_float(bf16_t{c.bf16})), 8) == hex(uint32_t{c.bf16} << 16, 8));
  }
  CHECK(hex(bits_of(bf16_to_float(bf16_t{0x8000})), 8) == "0x80000000");  // -0
  CHECK(hex(bits_of(bf16_to_float(bf16_t{0xFFC1})), 8) == "0xFFC10000");  // a NaN's sign and payload
  // Every non-NaN bf16 value is an fp32 value that converts back to itself.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    if (is_nan_bits(static_cast<uint16_t>(b))) continue;
    const uint16_t back = float_to_bf16(bf16_to_float(bf16_t{static_cast<uint16_t>(b)})).bits;
    if (back != b) FAIL_CHECK(hex(b, 4) << " came back as " << hex(back, 4));
  }
}

TEST_CASE("Tensor::to converts fp32 and fp64 to bf16 and back with the same rounding", "[core][bf16]") {
  // Tensor::to(BF16) from F32 is its own loop (the weights of a bf16 run and
  // `export hf --dtype bf16`), from F64 the generic one (via fp32: exact for
  // values that are floats); bf16 -> F32 / F64 widens exactly.
  const std::vector<Case> cases = {
      {0x3F808000, 0x3F80, "halfway: to the even, down"},
      {0x3F818000, 0x3F82, "halfway: to the even, up"},
      {0xBF808001, 0xBF81, "negative, past halfway"},
      {0x7F7F8000, 0x7F80, "halfway past the largest finite: +inf"},
      {0xFF7F7FFF, 0xFF7F, "the most negative finite"},
      {0x00018000, 0x0002, "subnormal halfway: up to the even"},
      {0x80008000, 0x8000, "negative subnormal halfway: -0"},
      {0x7FC00000, 0x7FC0, "quiet NaN"},
      {0xFFC00000, 0xFFC0, "-NaN"},
      {0xFF800000, 0xFF80, "-inf"},
  };
  const int64_t n = static_cast<int64_t>(cases.size());
  std::vector<float> f32;
  std::vector<double> f64;
  for (const Case& c : cases) {
    f32.push_back(from_bits(c.f32));
    f64.push_back(static_cast<double>(from_bits(c.f32)));
  }
  const Tensor a = Tensor::from_vector<float>(f32, {n}).to(DType::BF16);
  const Tensor b = Tensor::from_vector<double>(f64, {n}).to(DType::BF16);
  REQUIRE(a.dtype() == DType::BF16);
  REQUIRE(b.dtype() == DType::BF16);
  const Tensor wide32 = a.to(DType::F32), wide64 = a.to(DType::F64);
  for (int64_t i = 0; i < n; ++i) {
    const Case& c = cases[static_cast<size_t>(i)];
    INFO(hex(c.f32, 8) << ": " << c.why);
    CHECK(hex(a.data<bf16_t>()[i].bits, 4) == hex(c.bf16, 4));
    CHECK(hex(b.data<bf16_t>()[i].bits, 4) == hex(c.bf16, 4));
    CHECK(hex(bits_of(wide32.data<float>()[i]), 8) == hex(uint32_t{c.bf16} << 16, 8));
    const double w = wide64.data<double>()[i], want = static_cast<double>(from_bits(uint32_t{c.bf16} << 16));
    CHECK((w == want || (std::isnan(w) && std::isnan(want) && std::signbit(w) == std::signbit(want))));
  }
}
