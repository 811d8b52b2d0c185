// RoPE (Hugging Face rotate-half): forward vs the explicit formula, backward
// as the transpose (finite differences), round trip, precision, errors.
#include <catch2/catch.hpp>
#include <cmath>

#include "kernels/rope.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
namespace kern = attnres::kernels;

TEST_CASE("rope forward matches the rotate-half formula", "[kernels]") {
  const int64_t B = 2, T = 5, H = 3, hd = 8, pos0 = 3;
  const float theta = 10000.0f;
  Tensor x = randn({B * T, H * hd}, 1);
  Tensor y = x.clone();
  kern::rope_forward(y, B, T, H, hd, theta, pos0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < hd / 2; ++i) {
          // HF: q*cos + rotate_half(q)*sin, rotate_half(q) = cat(-q2, q1).
          const double angle = (pos0 + t) * std::pow(10000.0, -2.0 * i / hd);
          const int64_t base = (b * T + t) * H * hd + h * hd;
          const double x1 = at(x, base + i), x2 = at(x, base + i + hd / 2);
          // A rotation's outputs can cancel to ~0: the margin scales with |x1| + |x2|.
          const double terms = std::fabs(x1) + std::fabs(x2);
          REQUIRE(at(y, base + i) ==
                  approx_terms(x1 * std::cos(angle) - x2 * std::sin(angle), 1e-13, terms));
          REQUIRE(at(y, base + i + hd / 2) ==
                  approx_terms(x2 * std::cos(angle) + x1 * std::sin(angle), 1e-13, terms));
        }
  // Position 0 is the identity.
  Tensor z0 = x.rows(0, 1).clone();
  kern::rope_forward(z0, 1, 1, H, hd, theta, 0);
  REQUIRE(max_rel_diff(z0, x.rows(0, 1)) == 0);
}

TEST_CASE("rope backward is the transpose (finite differences) and inverts forward", "[kernels]") {
  const int64_t B = 2, T = 3, H = 3, hd = 6, pos0 = 7;  // hd/2 = 3: odd half
  const float theta = 500.0f;
  Tensor x = randn({B * T, H * hd}, 2), w = randn({B * T, H * hd}, 3);
  auto loss = [&] {
    Tensor y = x.clone();
    kern::rope_forward(y, B, T, H, hd, theta, pos0);
    return weighted_sum(y, w);
  };
  Tensor dx = w.clone();
  kern::rope_backward(dx, B, T, H, hd, theta, pos0);
  REQUIRE(fd_check(x, dx, loss) < 1e-6);

  Tensor r = x.clone();
  kern::rope_forward(r, B, T, H, hd, theta, pos0);
  kern::rope_backward(r, B, T, H, hd, theta, pos0);
  REQUIRE(scaled_diff(r, x) < 1e-14);
}

TEST_CASE("rope float32 agrees with float64, also at large positions", "[kernels]") {
  const int64_t B = 2, T = 7, H = 2, hd = 12;
  for (int64_t pos0 : {int64_t(0), int64_t(4090)}) {
    Tensor x = randn({B * T, H * hd}, 4);
    Tensor x32 = x.to(DType::F32);
    kern::rope_forward(x, B, T, H, hd, 10000.0f, pos0);
    kern::rope_forward(x32, B, T, H, hd, 10000.0f, pos0);
    REQUIRE(scaled_diff(x32, x) < 1e-6);
    kern::rope_backward(x, B, T, H, hd, 10000.0f, pos0);
    kern::rope_backward(x32, B, T, H, hd, 10000.0f, pos0);
    REQUIRE(scaled_diff(x32, x) < 1e-6);
  }
}

TEST_CASE("rope on the first heads of wider rows rotates them alone", "[kernels]") {
  // The joint q | k | v rows (kernels/attention.h): q's and k's heads are
  // rotated in place, v's left alone, each as if it were a tensor of its own.
  const int64_t B = 2, T = 7, H = 4, Hkv = 2, hd = 8, W = (H + 2 * Hkv) * hd;
  for (DType dt : {DType::F64, DType::F32})
    for (bool inverse : {false, true}) {
      const Tensor x = randn({B * T, W}, 11, dt);
      Tensor joint = x.clone();
      Tensor qk = Tensor::empty({B * T, (H + Hkv) * hd}, dt);
      for (int64_t r = 0; r < B * T; ++r)
        for (int64_t c = 0; c < (H + Hkv) * hd; ++c) set(qk, r * (H + Hkv) * hd + c, at(x, r * W + c));
      if (inverse) {
        kern::rope_backward(joint, B, T, H + Hkv, hd, 10000.0f, 5);
        kern::rope_backward(qk, B, T, H + Hkv, hd, 10000.0f, 5);
      } else {
        kern::rope_forward(joint, B, T, H + Hkv, hd, 10000.0f, 5);
        kern::rope_forward(qk, B, T, H + Hkv, hd, 10000.0f, 5);
      }
      int64_t differing = 0, rotated = 0;
      for (int64_t r = 0; r < B * T; ++r)
        for (int64_t c = 0; c < W; ++c) {
          const bool in_qk = c < (H + Hkv) * hd;
          const double want = in_qk ? at(qk, r * (H + Hkv) * hd + c) : at(x, r * W + c);
          if (!(at(joint, r * W + c) == want)) ++differing;  // NaN counts as differing
          if (in_qk && at(joint, r * W + c) != at(x, r * W + c)) ++rotated;
        }
      INFO(dtype_name(dt) << (inverse ? " backward" : " forward"));
      CHECK(differing == 0);
      CHECK(rotated > B * T * (H + Hkv) * hd / 2);  // positions 5..11 turn nearly every pair
    }
}

TEST_CASE("rope rejects bad shapes and arguments", "[kernels]") {
  Tensor x = randn({6, 12}, 5);
  REQUIRE_THROWS_AS(kern::rope_forward(x, 2, 3, 3, 3, 10000.0f), Error);  // odd head_dim
  REQUIRE_THROWS_WITH(kern::rope_forward(x, 2, 3, 4, 3, 10000.0f),
                      Catch::Contains("rope_forward: head_dim must be even, got 3"));
  REQUIRE_THROWS_WITH(kern::rope_forward(x, 2, 2, 3, 4, 10000.0f),
                      Catch::Contains("x has shape [6, 12], expected [B*T, W] = [4, W]"));
  REQUIRE_THROWS_WITH(kern::rope_backward(x, 2, 3, 4, 4, 10000.0f),
                      Catch::Contains("rope_backward: x has shape [6, 12], expected [B*T, W] = "
                                      "[6, W] with W >= n_heads*head_dim = 16"));
  REQUIRE_THROWS_WITH(kern::rope_forward(x, 2, 3, 3, 4, 0.0f), Catch::Contains("theta must be > 0"));
}
