// CUDA RoPE (forward and inverse) against the CPU op, on rows of the rotated
// heads alone and on wider rows (the joint q | k | v). Angles are computed in
// double on both sides and rounded once, so the fp32 results agree to ~1e-7
// even at large positions, where an fp32 angle would be off by ~1e-4.
#include <catch2/catch.hpp>
#include <cmath>

#include "core/worst.h"
#include "gpu_testing.h"
#include "kernels/rope.h"

using namespace attnres;
using namespace attnres::gpu_testing;
namespace kern = attnres::kernels;

namespace {

// A NaN anywhere makes it NaN (nan_max, core/worst.h); INFINITY when the sizes differ.
double max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return INFINITY;
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = nan_max(worst, std::fabs(testing::at(a, i) - testing::at(b, i)));
  return worst;
}

// `extra` columns per row beyond the rotated heads (the joint q | k | v rows:
// v's columns are left alone), a multiple of the vector width or not.
struct Case {
  int64_t B, T, n_heads, head_dim, pos0, extra = 0;
};

}  // namespace

TEST_CASE("cuda rope forward and backward match the CPU", "[gpu][rope]") {
  const float theta = 10000.f;
  const Case cases[] = {
      {1, 1, 1, 2, 0},     {2, 37, 3, 8, 0},    {2, 37, 3, 6, 5},  // half = 3: scalar path
      {1, 300, 2, 64, 0},  {3, 50, 4, 16, 2000}, {1, 64, 2, 128, 3000},
      {2, 0, 2, 8, 0},     {1, 4, 0, 8, 0},     {2, 5, 2, 0, 0},
      {2, 37, 3, 64, 9, 64}, {2, 37, 3, 16, 1, 3}, {1, 40, 6, 32, 7, 64}};
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& c : cases)
      for (bool inverse : {false, true})
        for (bool offset : {false, true}) {
          INFO(dtype_name(dt) << " B=" << c.B << " T=" << c.T << " heads=" << c.n_heads
                              << " hd=" << c.head_dim << " pos0=" << c.pos0
                              << " extra=" << c.extra << " inverse=" << inverse
                              << " offset=" << offset);
          const int64_t rows = c.B * c.T, width = c.n_heads * c.head_dim + c.extra;
          const int64_t n = rows * width;
          Tensor h = randn_f32({n + 1}, 7 + n);
          Tensor d = to_device(h, dt).rows(offset ? 1 : 0, n).reshape({rows, width});
          Tensor ref = h.rows(offset ? 1 : 0, n).clone().reshape({rows, width});
          if (inverse) {
            kern::rope_backward(d, c.B, c.T, c.n_heads, c.head_dim, theta, c.pos0);
            kern::rope_backward(ref, c.B, c.T, c.n_heads, c.head_dim, theta, c.pos0);
          } else {
            kern::rope_forward(d, c.B, c.T, c.n_heads, c.head_dim, theta, c.pos0);
            kern::rope_forward(ref, c.B, c.T, c.n_heads, c.head_dim, theta, c.pos0);
          }
          Tensor got = to_host_f32(d);
          REQUIRE(rel_l2(got, ref) < tol(dt));
          if (dt == DType::F32) {
            // Same angles, same fp32 operations: within a few 1e-7 of the CPU.
            REQUIRE(rel_l2(got, ref) < 1e-6);
            REQUIRE(max_abs_diff(got, ref) < 2e-6);
          }
        }
}

TEST_CASE("cuda rope backward undoes forward", "[gpu][rope]") {
  const int64_t B = 2, T = 129, H = 4, hd = 32;
  Tensor h = randn_f32({B * T, H * hd}, 3);
  Tensor d = h.to(Device::CUDA);
  kern::rope_forward(d, B, T, H, hd, 500000.f, 1000);
  kern::rope_backward(d, B, T, H, hd, 500000.f, 1000);
  REQUIRE(max_abs_diff(d.to(Device::CPU), h) < 1e-5);
}
