// MLA's expansion (kernels/mla.h): the layout attention reads (every head's
// key ends in the one shared k_r), RoPE on the dr dims only, the backward as
// the exact transpose of the forward (the op is linear), and bad shapes.
#include <catch2/catch.hpp>
#include <cmath>

#include "kernels/mla.h"
#include "kernels/rope.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
namespace kern = attnres::kernels;

namespace {

struct Inputs {
  Tensor q, kv, kr;
};

Inputs random_inputs(const kern::MlaShape& s, uint64_t seed, DType dt = DType::F64) {
  const int64_t N = s.B * s.T;
  return {randn({N, s.H * s.dqk()}, seed, dt), randn({N, s.H * (s.dn + s.dv)}, seed + 1, dt),
          randn({N, s.dr}, seed + 2, dt)};
}

Tensor expand(const Inputs& x, const kern::MlaShape& s, double theta) {
  Tensor qkv = Tensor::empty({s.B * s.T, kern::qkv_width(s.attn())}, x.q.dtype());
  kern::mla_expand_forward(qkv, x.q, x.kv, x.kr, s, theta);
  return qkv;
}

double dot(const Tensor& a, const Tensor& b) {
  double d = 0;
  for (int64_t i = 0; i < a.numel(); ++i) d += at(a, i) * at(b, i);
  return d;
}

}  // namespace

TEST_CASE("mla expansion: queries as projected, every head's key [k_n,h | k_r], values v_h",
          "[kernels]") {
  const kern::MlaShape s{2, 5, 3, 4, 2, 5};
  const Inputs x = random_inputs(s, 1);
  const Tensor qkv = expand(x, s, 0.0);
  const int64_t W = qkv.dim(1), dqk = s.dqk();
  REQUIRE(W == 2 * s.H * dqk + s.H * s.dv);
  for (int64_t r = 0; r < s.B * s.T; ++r)
    for (int64_t h = 0; h < s.H; ++h) {
      for (int64_t i = 0; i < dqk; ++i)
        REQUIRE(at(qkv, r * W + h * dqk + i) == at(x.q, r * s.H * dqk + h * dqk + i));
      const int64_t kv0 = r * s.H * (s.dn + s.dv) + h * (s.dn + s.dv);
      for (int64_t i = 0; i < s.dn; ++i)
        REQUIRE(at(qkv, r * W + s.H * dqk + h * dqk + i) == at(x.kv, kv0 + i));
      for (int64_t i = 0; i < s.dr; ++i)
        REQUIRE(at(qkv, r * W + s.H * dqk + h * dqk + s.dn + i) == at(x.kr, r * s.dr + i));
      for (int64_t i = 0; i < s.dv; ++i)
        REQUIRE(at(qkv, r * W + 2 * s.H * dqk + h * s.dv + i) == at(x.kv, kv0 + s.dn + i));
    }
}

TEST_CASE("mla expansion: RoPE turns the dr dims of every query and of k_r, nothing else",
          "[kernels]") {
  const kern::MlaShape s{2, 7, 2, 3, 4, 2};
  const double theta = 10000.0;
  const Inputs x = random_inputs(s, 10);
  const Tensor plain = expand(x, s, 0.0), turned = expand(x, s, theta);
  // k_r and each query's tail, rotated by the RoPE kernel as one head of width dr.
  Tensor kr = x.kr.clone();
  kern::rope_forward(kr, s.B, s.T, 1, s.dr, static_cast<float>(theta));
  const int64_t W = plain.dim(1), dqk = s.dqk(), N = s.B * s.T;
  Tensor tails = Tensor::empty({N, s.H * s.dr}, DType::F64);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.dr; ++i)
        set(tails, r * s.H * s.dr + h * s.dr + i, at(x.q, r * s.H * dqk + h * dqk + s.dn + i));
  kern::rope_forward(tails, s.B, s.T, s.H, s.dr, static_cast<float>(theta));
  int64_t changed = 0;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < W; ++c) {
      const bool k_block = c >= s.H * dqk && c < 2 * s.H * dqk;
      const int64_t h = (c % (s.H * dqk)) / dqk, i = c % dqk - s.dn;
      double want = at(plain, r * W + c);
      if (c < 2 * s.H * dqk && i >= 0)
        want = k_block ? at(kr, r * s.dr + i) : at(tails, r * s.H * s.dr + h * s.dr + i);
      REQUIRE(at(turned, r * W + c) == Approx(want).margin(1e-14));
      changed += at(turned, r * W + c) != at(plain, r * W + c);
    }
  REQUIRE(changed > N);  // position 0 is not rotated; the later ones are
}

TEST_CASE("mla expansion backward is the forward's transpose (NoPE and RoPE)", "[kernels]") {
  for (double theta : {0.0, 500.0}) {
    const kern::MlaShape s{2, 6, 3, 2, 4, 3};
    const Inputs x = random_inputs(s, 20);
    const Tensor y = expand(x, s, theta);
    const Tensor dy = randn(y.shape(), 23);
    Inputs g{Tensor::empty(x.q.shape(), DType::F64), Tensor::empty(x.kv.shape(), DType::F64),
             Tensor::empty(x.kr.shape(), DType::F64)};
    kern::mla_expand_backward(g.q, g.kv, g.kr, dy, s, theta);
    // <dy, F x> = <F^T dy, x>, each side a sum of O(1) terms.
    const double lhs = dot(dy, y), rhs = dot(g.q, x.q) + dot(g.kv, x.kv) + dot(g.kr, x.kr);
    INFO("theta=" << theta);
    REQUIRE(std::abs(lhs - rhs) < 1e-11 * static_cast<double>(y.numel()));
    // k_r's gradient sums the heads' (without RoPE: exactly their sum).
    if (theta == 0.0) {
      const int64_t W = dy.dim(1), dqk = s.dqk();
      for (int64_t r = 0; r < s.B * s.T; ++r)
        for (int64_t i = 0; i < s.dr; ++i) {
          double sum = 0;
          for (int64_t h = 0; h < s.H; ++h) sum += at(dy, r * W + s.H * dqk + h * dqk + s.dn + i);
          REQUIRE(at(g.kr, r * s.dr + i) == Approx(sum).margin(1e-14));
        }
    }
  }
}

TEST_CASE("mla expansion refuses misfit tensors and shapes, naming them", "[kernels]") {
  const kern::MlaShape s{1, 3, 2, 2, 2, 3};
  Inputs x = random_inputs(s, 30);
  Tensor qkv = Tensor::empty({3, kern::qkv_width(s.attn())}, DType::F64);
  Tensor bad = Tensor::empty({3, 5}, DType::F64);
  REQUIRE_THROWS_WITH(kern::mla_expand_forward(qkv, bad, x.kv, x.kr, s, 0.0), Catch::Contains("q"));
  REQUIRE_THROWS_WITH(kern::mla_expand_forward(qkv, x.q, bad, x.kr, s, 0.0), Catch::Contains("kv"));
  REQUIRE_THROWS_WITH(kern::mla_expand_forward(qkv, x.q, x.kv, bad, s, 0.0), Catch::Contains("kr"));
  REQUIRE_THROWS_WITH(kern::mla_expand_forward(bad, x.q, x.kv, x.kr, s, 0.0), Catch::Contains("qkv"));
  const kern::MlaShape odd{1, 3, 2, 2, 3, 3};
  Inputs y = random_inputs(odd, 31);
  Tensor qkv2 = Tensor::empty({3, kern::qkv_width(odd.attn())}, DType::F64);
  REQUIRE_THROWS_WITH(kern::mla_expand_forward(qkv2, y.q, y.kv, y.kr, odd, 100.0),
                      Catch::Contains("even dr"));
  REQUIRE_NOTHROW(kern::mla_expand_forward(qkv2, y.q, y.kv, y.kr, odd, 0.0));  // NoPE: any dr
}
