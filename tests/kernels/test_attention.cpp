// Causal GQA attention: forward vs a full T x T softmax, gradients vs finite
// differences, GQA groupings, multi-block sequences, KV-cache decode,
// accumulation, precision, determinism and errors.
#include <omp.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_qkv.h"
#include "kernels/attention.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
namespace kern = attnres::kernels;

namespace {

// Finite-difference step and gradient floor. The loss sums hundreds of O(1)
// terms, so its rounding noise (~1e-15) divided by the step swamps gradient
// elements far below the typical O(0.1..1) size (late keys that few queries
// see); comparing those against a 1e-3 floor keeps the check tight where it
// matters. h = 1e-4 keeps the O(h^2) truncation error below 1e-7.
constexpr double kH = 1e-4, kFloor = 1e-3;


struct Qkv {
  Tensor q, k, v;
};

Qkv random_qkv(const kern::AttnShape& s, uint64_t seed, DType dt = DType::F64) {
  const int64_t N = s.B * s.T;
  return {randn({N, s.H * s.hd}, seed, dt), randn({N, s.Hkv * s.hd}, seed + 1, dt),
          randn({N, s.Hkv * s.dv()}, seed + 2, dt)};
}

// The obviously-correct version: for each (b, h) build the full T x T score
// matrix, mask the future with -inf, softmax each row, multiply by V (dv
// columns a head).
void naive_attention(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& kk, const Tensor& v,
                     const kern::AttnShape& s) {
  const int64_t T = s.T, hd = s.hd, ldq = s.H * hd, ldk = s.Hkv * hd, dv = s.dv();
  out = Tensor::zeros({s.B * T, s.H * dv}, DType::F64);
  lse = Tensor::zeros({s.B, s.H, T}, DType::F64);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t j = h * s.Hkv / s.H;  // KV head j serves [j*H/Hkv, (j+1)*H/Hkv)
      std::vector<double> S(T * T);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t u = 0; u < T; ++u) {
          double dot = 0;
          for (int64_t c = 0; c < hd; ++c)
            dot += at(q, (b * T + t) * ldq + h * hd + c) * at(kk, (b * T + u) * ldk + j * hd + c);
          S[t * T + u] = u <= t ? dot / std::sqrt(double(hd)) : -INFINITY;
        }
      for (int64_t t = 0; t < T; ++t) {
        double m = -INFINITY, l = 0;
        for (int64_t u = 0; u < T; ++u) m = std::max(m, S[t * T + u]);
        for (int64_t u = 0; u < T; ++u) l += std::exp(S[t * T + u] - m);
        set(lse, (b * s.H + h) * T + t, m + std::log(l));
        for (int64_t c = 0; c < dv; ++c) {
          double o = 0;
          for (int64_t u = 0; u < T; ++u)
            o += std::exp(S[t * T + u] - m) / l * at(v, (b * T + u) * s.Hkv * dv + j * dv + c);
          set(out, (b * T + t) * s.H * dv + h * dv + c, o);
        }
      }
    }
}

struct Fwd {
  Tensor out, lse;
};

Fwd forward(const Qkv& x, const kern::AttnShape& s) {
  Fwd f{Tensor::empty({s.B * s.T, s.H * s.dv()}, x.q.dtype()), Tensor::empty({s.B, s.H, s.T}, x.q.dtype())};
  attention_forward(f.out, f.lse, x.q, x.k, x.v, s);
  return f;
}

struct Grads {
  Tensor dq, dk, dv;
};

Grads zero_grads(const kern::AttnShape& s, DType dt) {
  const int64_t N = s.B * s.T;
  return {Tensor::zeros({N, s.H * s.hd}, dt), Tensor::zeros({N, s.Hkv * s.hd}, dt),
          Tensor::zeros({N, s.Hkv * s.dv()}, dt)};
}

void backward(Grads& g, const Tensor& dout, const Qkv& x, const Fwd& f, const kern::AttnShape& s) {
  attention_backward(g.dq, g.dk, g.dv, dout, x.q, x.k, x.v, f.out, f.lse, s);
}

}  // namespace

TEST_CASE("attention forward matches a full masked softmax", "[kernels]") {
  // Hkv = 1 (multi-query), H/Hkv = 2, Hkv = H (plain multi-head); T = 5 fits in
  // one query block, T = 150 spans three (64-row blocks, ragged last one);
  // values as wide as keys, narrower and wider (MLA's dv != dn + dr).
  for (int64_t T : {int64_t(5), int64_t(150)})
    for (int64_t Hkv : {int64_t(1), int64_t(2), int64_t(4)})
    for (int64_t vd : {int64_t(0), int64_t(3), int64_t(9)}) {
      const kern::AttnShape s{2, T, 4, Hkv, 6, vd};
      Qkv x = random_qkv(s, 1 + Hkv);
      Fwd f = forward(x, s);
      Tensor out, lse;
      naive_attention(out, lse, x.q, x.k, x.v, s);
      INFO("T=" << T << " Hkv=" << Hkv << " vd=" << vd);
      REQUIRE(scaled_diff(f.out, out) < 1e-13);
      REQUIRE(scaled_diff(f.lse, lse) < 1e-13);
    }
}

TEST_CASE("attention backward matches finite differences", "[kernels]") {
  for (int64_t Hkv : {int64_t(1), int64_t(2), int64_t(4)})
  for (int64_t vd : {int64_t(0), int64_t(4)}) {
    const kern::AttnShape s{2, 5, 4, Hkv, 6, vd};
    Qkv x = random_qkv(s, 10 + Hkv);
    Tensor wt = randn({s.B * s.T, s.H * s.dv()}, 20 + Hkv);
    auto loss = [&] { return weighted_sum(forward(x, s).out, wt); };
    Grads g = zero_grads(s, DType::F64);
    backward(g, wt, x, forward(x, s), s);
    INFO("Hkv=" << Hkv << " vd=" << vd);
    REQUIRE(fd_check(x.q, g.dq, loss, kH, kFloor) < 1e-6);
    REQUIRE(fd_check(x.k, g.dk, loss, kH, kFloor) < 1e-6);
    REQUIRE(fd_check(x.v, g.dv, loss, kH, kFloor) < 1e-6);
  }
}

TEST_CASE("attention backward matches finite differences across query blocks", "[kernels]") {
  // T = 70: a second, partial query block whose rows see keys of the first;
  // values wider than the keys.
  const kern::AttnShape s{1, 70, 2, 1, 4, 5};
  Qkv x = random_qkv(s, 30);
  Tensor wt = randn({s.B * s.T, s.H * s.dv()}, 31);
  auto loss = [&] { return weighted_sum(forward(x, s).out, wt); };
  Grads g = zero_grads(s, DType::F64);
  backward(g, wt, x, forward(x, s), s);
  REQUIRE(fd_check(x.q, g.dq, loss, kH, kFloor) < 1e-6);
  REQUIRE(fd_check(x.k, g.dk, loss, kH, kFloor) < 1e-6);
  REQUIRE(fd_check(x.v, g.dv, loss, kH, kFloor) < 1e-6);
}

TEST_CASE("attention backward accumulates, and float32 agrees with float64", "[kernels]") {
  for (int64_t Hkv : {int64_t(1), int64_t(2), int64_t(4)}) {
    const kern::AttnShape s{2, 77, 4, Hkv, 8};
    Qkv x = random_qkv(s, 40 + Hkv);
    Tensor dout = randn({s.B * s.T, s.H * s.hd}, 50 + Hkv);
    Fwd f = forward(x, s);
    Grads g = zero_grads(s, DType::F64);
    backward(g, dout, x, f, s);
    Grads once{g.dq.clone(), g.dk.clone(), g.dv.clone()};
    backward(g, dout, x, f, s);
    for (int64_t i = 0; i < g.dq.numel(); ++i) REQUIRE(at(g.dq, i) == approx_terms(2 * at(once.dq, i), 1e-13, 1.0));
    for (int64_t i = 0; i < g.dk.numel(); ++i) REQUIRE(at(g.dk, i) == approx_terms(2 * at(once.dk, i), 1e-13, 1.0));
    for (int64_t i = 0; i < g.dv.numel(); ++i) REQUIRE(at(g.dv, i) == approx_terms(2 * at(once.dv, i), 1e-13, 1.0));

    Qkv x32{x.q.to(DType::F32), x.k.to(DType::F32), x.v.to(DType::F32)};
    Fwd f32 = forward(x32, s);
    INFO("Hkv=" << Hkv);
    REQUIRE(scaled_diff(f32.out, f.out) < 1e-5);
    REQUIRE(scaled_diff(f32.lse, f.lse) < 1e-6);
    Grads g32 = zero_grads(s, DType::F32);
    backward(g32, dout.to(DType::F32), x32, f32, s);
    REQUIRE(scaled_diff(g32.dq, once.dq) < 1e-5);
    REQUIRE(scaled_diff(g32.dk, once.dk) < 1e-5);
    REQUIRE(scaled_diff(g32.dv, once.dv) < 1e-5);
  }
}

TEST_CASE("attention is stable for large scores", "[kernels]") {
  // Scores of order 1e3: exp without max subtraction would overflow.
  const kern::AttnShape s{1, 9, 2, 1, 6};
  Qkv x = random_qkv(s, 60, DType::F32);
  for (int64_t i = 0; i < x.q.numel(); ++i) set(x.q, i, 40 * at(x.q, i));
  for (int64_t i = 0; i < x.k.numel(); ++i) set(x.k, i, 40 * at(x.k, i));
  Fwd f = forward(x, s);
  Tensor out, lse;
  naive_attention(out, lse, x.q.to(DType::F64), x.k.to(DType::F64), x.v.to(DType::F64), s);
  REQUIRE(scaled_diff(f.out, out) < 1e-4);
  Grads g = zero_grads(s, DType::F32);
  backward(g, randn({s.B * s.T, s.H * s.hd}, 61, DType::F32), x, f, s);
  for (const Tensor* t : {&g.dq, &g.dk, &g.dv})
    for (int64_t i = 0; i < t->numel(); ++i) REQUIRE(std::isfinite(at(*t, i)));
}

TEST_CASE("attention decode with a KV cache reproduces the full forward", "[kernels]") {
  for (DType dt : {DType::F64, DType::F32})
    for (int64_t Hkv : {int64_t(1), int64_t(2), int64_t(4)}) {
      const int64_t B = 2, T = 9, Tmax = 12, H = 4, hd = 6;
      const int64_t vd = Hkv == 2 ? 5 : 0, dv = vd ? vd : hd;  // one case with dv != hd
      const kern::AttnShape s{B, T, H, Hkv, hd, vd};
      Qkv x = random_qkv(s, 70 + Hkv, dt);
      Fwd f = forward(x, s);
      // Fill the cache position by position (stale garbage beyond len must be ignored).
      Tensor kc = randn({B, Tmax, Hkv * hd}, 80, dt), vc = randn({B, Tmax, Hkv * dv}, 81, dt);
      for (int64_t p = 0; p < T; ++p) {
        Tensor q1 = Tensor::empty({B, H * hd}, dt), out1 = Tensor::empty({B, H * dv}, dt);
        Tensor ref = Tensor::empty({B, H * dv}, dt);
        for (int64_t b = 0; b < B; ++b) {
          kc.reshape({B * Tmax, Hkv * hd}).rows(b * Tmax + p, 1).copy_from(x.k.rows(b * T + p, 1));
          vc.reshape({B * Tmax, Hkv * dv}).rows(b * Tmax + p, 1).copy_from(x.v.rows(b * T + p, 1));
          q1.rows(b, 1).copy_from(x.q.rows(b * T + p, 1));
          ref.rows(b, 1).copy_from(f.out.rows(b * T + p, 1));
        }
        kern::attention_decode(out1, q1, kc, vc, p + 1, {B, 1, H, Hkv, hd, vd});
        INFO("dtype=" << dtype_name(dt) << " Hkv=" << Hkv << " pos=" << p);
        REQUIRE(scaled_diff(out1, ref) < (dt == DType::F64 ? 1e-13 : 1e-6));
      }
    }
}

TEST_CASE("attention is deterministic and independent of the thread count", "[kernels]") {
  const kern::AttnShape s{2, 150, 4, 2, 32};
  Qkv x = random_qkv(s, 90, DType::F32);
  Tensor dout = randn({s.B * s.T, s.H * s.hd}, 91, DType::F32);
  const int saved = omp_get_max_threads();
  Fwd f[3];
  Grads g[3];
  for (int r = 0; r < 3; ++r) {  // 2 threads, 2 threads again, 1 thread
    omp_set_num_threads(r == 2 ? 1 : 2);
    f[r] = forward(x, s);
    g[r] = zero_grads(s, DType::F32);
    backward(g[r], dout, x, f[r], s);
  }
  omp_set_num_threads(saved);
  for (int r = 1; r < 3; ++r) {
    INFO("run " << r);
    REQUIRE(same_bits(f[r].out, f[0].out));
    REQUIRE(same_bits(f[r].lse, f[0].lse));
    REQUIRE(same_bits(g[r].dq, g[0].dq));
    REQUIRE(same_bits(g[r].dk, g[0].dk));
    REQUIRE(same_bits(g[r].dv, g[0].dv));
  }
}

TEST_CASE("attention rejects bad shapes and arguments", "[kernels]") {
  const kern::AttnShape s{2, 5, 4, 2, 6};
  Qkv x = random_qkv(s, 100);
  Fwd f = forward(x, s);
  const Tensor qkv = join_cols({x.q, x.k, x.v});  // [10, 48]: 4 q heads, 2 k, 2 v of 6
  Tensor bad_qkv = randn({s.B * s.T, kern::qkv_width(s) - s.hd}, 101);  // one head short
  REQUIRE_THROWS_AS(kern::attention_forward(f.out, f.lse, bad_qkv, s), Error);
  REQUIRE_THROWS_WITH(kern::attention_forward(f.out, f.lse, bad_qkv, s),
                      Catch::Contains("attention_forward: qkv has shape [10, 42], expected [10, 48]"));
  REQUIRE_THROWS_WITH(kern::attention_forward(f.out, f.lse, qkv, {2, 5, 4, 3, 6}),
                      Catch::Contains("H=4 is not a multiple of Hkv=3"));
  REQUIRE_THROWS_WITH(kern::attention_forward(f.out, f.lse, qkv, {2, 5, 4, 2, 0}),
                      Catch::Contains("attention_forward: bad shape"));
  Tensor bad_lse = Tensor::empty({s.B, s.T, s.H}, DType::F64);
  REQUIRE_THROWS_WITH(kern::attention_forward(f.out, bad_lse, qkv, s),
                      Catch::Contains("lse has shape [2, 5, 4], expected [2, 4, 5]"));
  Tensor out32 = f.out.to(DType::F32);
  REQUIRE_THROWS_WITH(kern::attention_forward(out32, f.lse, qkv, s),
                      Catch::Contains("out is F32, expected F64"));

  Tensor dqkv = Tensor::zeros(qkv.shape(), DType::F64);
  Tensor bad_dqkv = Tensor::zeros({s.B * s.T, s.H * s.hd}, DType::F64);
  REQUIRE_THROWS_WITH(kern::attention_backward(bad_dqkv, f.out, qkv, f.out, f.lse, s),
                      Catch::Contains("attention_backward: dqkv has shape [10, 24], expected [10, 48]"));
  REQUIRE_THROWS_WITH(kern::attention_backward(dqkv, x.k, qkv, f.out, f.lse, s),
                      Catch::Contains("attention_backward: dout has shape"));

  Tensor kc = randn({2, 8, 12}, 102), vc = randn({2, 8, 12}, 103);
  Tensor q1 = randn({2, 24}, 104), out1 = Tensor::empty({2, 24}, DType::F64);
  REQUIRE_NOTHROW(kern::attention_decode(out1, q1, kc, vc, 8, {2, 1, 4, 2, 6}));
  REQUIRE_THROWS_WITH(kern::attention_decode(out1, q1, kc, vc, 9, {2, 1, 4, 2, 6}),
                      Catch::Contains("attention_decode: len=9 is outside the cache [1, 8]"));
  REQUIRE_THROWS_WITH(kern::attention_decode(out1, q1, kc, vc, 0, {2, 1, 4, 2, 6}),
                      Catch::Contains("len=0"));
  Tensor kc2 = randn({16, 12}, 105);
  REQUIRE_THROWS_WITH(kern::attention_decode(out1, q1, kc2, vc, 3, {2, 1, 4, 2, 6}),
                      Catch::Contains("k_cache must be 3-D"));
  Tensor vc_bad = randn({2, 7, 12}, 106);
  REQUIRE_THROWS_WITH(kern::attention_decode(out1, q1, kc, vc_bad, 3, {2, 1, 4, 2, 6}),
                      Catch::Contains("v_cache has shape [2, 7, 12], expected [2, 8, 12]"));
}

TEST_CASE("attention on the CPU runs its own kernels whatever training.attention_kernel says",
          "[kernels]") {
  const kern::AttnShape s{2, 5, 4, 2, 8};
  std::string why;
  CHECK_FALSE(kern::attention_uses_cudnn(kern::AttentionKernel::Auto, s, DType::F32, Device::CPU, &why));
  CHECK(why == "cuDNN runs on cuda only");
  CHECK_FALSE(kern::attention_uses_cudnn(kern::AttentionKernel::Own, s, DType::BF16, Device::CUDA, &why));
  CHECK(why == "training.attention_kernel = \"own\"");
  CHECK_THROWS_WITH(
      kern::attention_uses_cudnn(kern::AttentionKernel::Cudnn, s, DType::F32, Device::CPU),
      Catch::Contains("training.attention_kernel is \"cudnn\"") &&
          Catch::Contains("B=2 T=5 H=4 Hkv=2 hd=8") && Catch::Contains("cuda only"));
  // Auto and Own give the CPU kernels' bits (one code path).
  const Tensor q = randn({10, 32}, 1), k = randn({10, 16}, 2), v = randn({10, 16}, 3);
  Tensor out[2], lse[2];
  const kern::AttentionKernel kinds[2] = {kern::AttentionKernel::Auto, kern::AttentionKernel::Own};
  for (int r = 0; r < 2; ++r) {
    out[r] = Tensor::empty({10, 32}, DType::F64);
    lse[r] = Tensor::empty({2, 4, 5}, DType::F64);
    attention_forward(out[r], lse[r], q, k, v, s, kinds[r]);
  }
  CHECK(same_bits(out[0], out[1]));
  CHECK(same_bits(lse[0], lse[1]));
}
