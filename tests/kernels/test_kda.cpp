// The KDA core (kernels/kda.h): the chunkwise forward against the
// token-by-token recurrence written out below in double (no code shared
// with src/), at chunk and sub-chunk boundaries, with T not a multiple of
// the chunk, and under decays whose cumulative log falls far below -88; the
// library's own recurrence (decoding's) against the same, with its state
// carried across calls; the chunkwise backward by central finite
// differences in double, and against the token-by-token backward; Store::Set against Add; bad arguments.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "kernels/kda.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
using kernels::KdaShape;

namespace {

struct Inputs {
  KdaShape s;
  Tensor q, k, v, g, beta;  // F64
};

// Rows of unit L2 norm per head (as the layer gives the core), v of O(1),
// g = -softplus(N(0, 1)), with `strong` channels at -6 (-384 over a chunk of
// 64) and -100,
// beta in (0, 1).
Inputs make_inputs(KdaShape s, uint64_t seed, bool strong = false) {
  const int64_t N = s.B * s.T;
  Inputs in{s, randn({N, s.H * s.K}, seed), randn({N, s.H * s.K}, seed + 1),
            randn({N, s.H * s.V}, seed + 2), randn({N, s.H * s.K}, seed + 3),
            randn({N, s.H}, seed + 4)};
  for (Tensor* t : {&in.q, &in.k}) {
    double* p = t->data<double>();
    for (int64_t r = 0; r < N * s.H; ++r) {
      double ss = 0;
      for (int64_t c = 0; c < s.K; ++c) ss += p[r * s.K + c] * p[r * s.K + c];
      for (int64_t c = 0; c < s.K; ++c) p[r * s.K + c] /= std::sqrt(ss + 1e-6);
    }
  }
  double* g = in.g.data<double>();
  for (int64_t i = 0; i < in.g.numel(); ++i) {
    g[i] = -std::log1p(std::exp(g[i]));                      // -softplus: (-inf, 0)
    // A third of the channels at about -6 a token; one in six at -100 (a
    // single token's exp(-g) past fp32's range).
    if (strong && (i % s.K) % 3 == 0) g[i] = -6.0 + 0.1 * g[i];
    if (strong && (i % s.K) % 6 == 1) g[i] = -100.0 + g[i];
  }
  double* b = in.beta.data<double>();
  for (int64_t i = 0; i < in.beta.numel(); ++i) b[i] = 1 / (1 + std::exp(-b[i]));
  return in;
}

// The recurrence of docs/model.md, literally: S <- Diag(exp g) S;
// S <- S + beta k (v - S^T k)^T; o = scale S^T q.
Tensor reference(const Inputs& in, double scale) {
  const KdaShape& s = in.s;
  Tensor o = Tensor::zeros({s.B * s.T, s.H * s.V}, DType::F64);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      std::vector<double> S(static_cast<size_t>(s.K * s.V), 0.0);
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t row = b * s.T + t;
        auto at4 = [&](const Tensor& x, int64_t w, int64_t c) { return at(x, row * s.H * w + h * w + c); };
        for (int64_t c = 0; c < s.K; ++c)
          for (int64_t e = 0; e < s.V; ++e) S[size_t(c * s.V + e)] *= std::exp(at4(in.g, s.K, c));
        for (int64_t e = 0; e < s.V; ++e) {
          double pred = 0;
          for (int64_t c = 0; c < s.K; ++c) pred += S[size_t(c * s.V + e)] * at4(in.k, s.K, c);
          const double err = at4(in.v, s.V, e) - pred;
          for (int64_t c = 0; c < s.K; ++c)
            S[size_t(c * s.V + e)] += at(in.beta, row * s.H + h) * at4(in.k, s.K, c) * err;
        }
        for (int64_t e = 0; e < s.V; ++e) {
          double y = 0;
          for (int64_t c = 0; c < s.K; ++c) y += S[size_t(c * s.V + e)] * at4(in.q, s.K, c);
          set(o, row * s.H * s.V + h * s.V + e, scale * y);
        }
      }
    }
  return o;
}

Tensor chunkwise(const Inputs& in, double scale, DType dt = DType::F64) {
  Tensor o = Tensor::empty({in.s.B * in.s.T, in.s.H * in.s.V}, dt);
  kernels::kda_forward(o, in.q.to(dt), in.k.to(dt), in.v.to(dt), in.g.to(dt), in.beta.to(dt),
                       in.s, scale);
  return o;
}

// |got - want| <= tol (1 + |want|) everywhere, NaN failing.
int64_t mismatches(const Tensor& got, const Tensor& want, double tol) {
  int64_t bad = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = at(got, i), w = at(want, i);
    bad += !(std::fabs(g - w) <= tol * (1 + std::fabs(w)));
  }
  return bad;
}

// Each gradient against central differences of loss() in its input
// (testing.h fd_gradient), |fd - analytic| <= 1e-6 (1 + |fd|); the count off
// per input.
std::vector<int64_t> fd_misses(const std::function<double()>& loss, const std::vector<Tensor*>& xs,
                               const std::vector<const Tensor*>& grads) {
  std::vector<int64_t> misses;
  for (size_t n = 0; n < xs.size(); ++n) misses.push_back(mismatches(*grads[n], fd_gradient(*xs[n], loss), 1e-6));
  return misses;
}
bool no_misses(const std::vector<int64_t>& m) {
  return std::all_of(m.begin(), m.end(), [](int64_t x) { return x == 0; });
}

}  // namespace

TEST_CASE("kda chunkwise forward = the token-by-token recurrence, across chunk boundaries",
          "[kernels][kda]") {
  for (int64_t chunk : {int64_t(16), int64_t(64)})
    for (int64_t T : {int64_t(1), int64_t(15), int64_t(16), int64_t(17), int64_t(63),
                      int64_t(64), int64_t(65), int64_t(130), int64_t(200)}) {
      KdaShape s{2, T, 2, 8, 6, chunk};
      const Inputs in = make_inputs(s, 100 + T);
      const double scale = 1 / std::sqrt(8.0);
      const Tensor want = reference(in, scale);
      INFO("chunk " << chunk << ", T " << T);
      CHECK(mismatches(chunkwise(in, scale), want, 1e-11) == 0);
      CHECK(mismatches(chunkwise(in, scale, DType::F32), want, 2e-5) == 0);
    }
}

TEST_CASE("kda chunkwise forward stays finite and exact under decays far below exp's range",
          "[kernels][kda]") {
  // A third of the channels decay by about -6 a token: their cumulative log
  // over a 64-token chunk reaches -390, where exp(Gamma) alone would be 0 in
  // fp32 and 1 / exp(Gamma) infinite; every exp the kernel takes is of a
  // difference <= 0.
  KdaShape s{1, 150, 2, 16, 8, 64};
  const Inputs in = make_inputs(s, 7, /*strong=*/true);
  double lowest = 0;
  for (int64_t t = 0; t < 64; ++t) lowest += at(in.g, t * s.H * s.K);
  REQUIRE(lowest < -300);
  const Tensor want = reference(in, 0.25);
  CHECK(mismatches(chunkwise(in, 0.25), want, 1e-11) == 0);
  const Tensor f = chunkwise(in, 0.25, DType::F32);
  CHECK(mismatches(f, want, 2e-5) == 0);
}

TEST_CASE("kda recurrent op = the reference, its state carried across calls", "[kernels][kda]") {
  KdaShape s{2, 40, 3, 8, 5, 64};
  const Inputs in = make_inputs(s, 21);
  const Tensor want = reference(in, 0.5);
  Tensor o = Tensor::empty({s.B * s.T, s.H * s.V}, DType::F64);
  kernels::kda_recurrent_forward(o, in.q, in.k, in.v, in.g, in.beta, s, 0.5);
  CHECK(mismatches(o, want, 1e-12) == 0);
  // One sequence token by token, the state handed from call to call (decoding).
  KdaShape one{1, 1, 3, 8, 5, 64};
  Tensor state = Tensor::zeros({1, 3, 8, 5}, DType::F64);
  int64_t bad = 0;
  for (int64_t t = 0; t < s.T; ++t) {
    auto row = [&](const Tensor& x) { return x.rows(t, 1).clone(); };
    Tensor ot = Tensor::empty({1, 3 * 5}, DType::F64);
    kernels::kda_recurrent_forward(ot, row(in.q), row(in.k), row(in.v), row(in.g), row(in.beta),
                                   one, 0.5, &state);
    bad += mismatches(ot, want.rows(t, 1), 1e-12);
  }
  CHECK(bad == 0);
}

TEST_CASE("kda chunkwise backward matches finite differences", "[kernels][kda]") {
  // Two chunks of 16 and a ragged third (T = 37), strong decays on some
  // channels; loss = sum(w . o) for a random w.
  for (bool strong : {false, true}) {
    KdaShape s{2, 37, 2, 5, 4, 16};
    Inputs in = make_inputs(s, strong ? 41 : 31, strong);
    const double scale = 0.7;
    const Tensor w = randn({s.B * s.T, s.H * s.V}, 55);
    auto loss = [&]() {
      const Tensor o = chunkwise(in, scale);
      double l = 0;
      for (int64_t i = 0; i < o.numel(); ++i) l += at(o, i) * at(w, i);
      return l;
    };
    auto zeros_like = [](const Tensor& t) { return Tensor::zeros(t.shape(), DType::F64); };
    Tensor dq = zeros_like(in.q), dk = zeros_like(in.k), dv = zeros_like(in.v),
           dg = zeros_like(in.g), db = zeros_like(in.beta);
    kernels::kda_backward(dq, dk, dv, dg, db, w, in.q, in.k, in.v, in.g, in.beta, s, scale);
    const std::vector<int64_t> misses =
        fd_misses(loss, {&in.q, &in.k, &in.v, &in.g, &in.beta}, {&dq, &dk, &dv, &dg, &db});
    for (size_t n = 0; n < misses.size(); ++n) {
      INFO((strong ? "strong decays, " : "") << "gradient " << n << " (dq, dk, dv, dg, dbeta): "
                                             << misses[n] << " elements off");
      CHECK(misses[n] == 0);
    }
  }
}

TEST_CASE("kda token-by-token backward: finite differences, and = the chunkwise backward",
          "[kernels][kda]") {
  // The benchmark's baseline (kda_recurrent_backward) by central differences
  // of the literal recurrence above (a ragged T over chunks of 16), then
  // against the chunkwise backward at T = 150 over chunks of 64 (two chunk
  // boundaries and a ragged end), with decays far below exp's range: two
  // derivations of the same gradients that share no code.
  auto zeros5 = [](const Inputs& in) {
    std::vector<Tensor> d;
    for (const Tensor* t : {&in.q, &in.k, &in.v, &in.g, &in.beta}) d.push_back(Tensor::zeros(t->shape(), DType::F64));
    return d;
  };
  {
    KdaShape s{2, 37, 2, 5, 4, 16};
    Inputs in = make_inputs(s, 71, /*strong=*/true);
    const Tensor w = randn({s.B * s.T, s.H * s.V}, 72);
    auto loss = [&]() {
      const Tensor o = reference(in, 0.7);
      double l = 0;
      for (int64_t i = 0; i < o.numel(); ++i) l += at(o, i) * at(w, i);
      return l;
    };
    std::vector<Tensor> d = zeros5(in);
    kernels::kda_recurrent_backward(d[0], d[1], d[2], d[3], d[4], w, in.q, in.k, in.v, in.g, in.beta, s, 0.7);
    const std::vector<int64_t> misses =
        fd_misses(loss, {&in.q, &in.k, &in.v, &in.g, &in.beta}, {&d[0], &d[1], &d[2], &d[3], &d[4]});
    for (size_t n = 0; n < misses.size(); ++n) {
      INFO("gradient " << n << " (dq, dk, dv, dg, dbeta): " << misses[n] << " elements off");
      CHECK(misses[n] == 0);
    }
  }
  KdaShape s{1, 150, 2, 8, 6, 64};
  const Inputs in = make_inputs(s, 73, /*strong=*/true);
  const Tensor w = randn({s.B * s.T, s.H * s.V}, 74);
  std::vector<Tensor> rec = zeros5(in), chunk = zeros5(in);
  kernels::kda_recurrent_backward(rec[0], rec[1], rec[2], rec[3], rec[4], w, in.q, in.k, in.v, in.g,
                                  in.beta, s, 0.4);
  kernels::kda_backward(chunk[0], chunk[1], chunk[2], chunk[3], chunk[4], w, in.q, in.k, in.v, in.g,
                        in.beta, s, 0.4);
  for (size_t i = 0; i < rec.size(); ++i) {
    INFO("gradient " << i << " (dq, dk, dv, dg, dbeta)");
    CHECK(mismatches(chunk[i], rec[i], 1e-9) == 0);
  }
}

TEST_CASE("kda backward: Store::Set writes what adding into zeros gives, float agrees with double",
          "[kernels][kda]") {
  KdaShape s{1, 70, 2, 8, 8, 64};
  const Inputs in = make_inputs(s, 61);
  const Tensor w = randn({s.B * s.T, s.H * s.V}, 62);
  std::vector<Tensor> add, put, f32;
  for (const Tensor* t : {&in.q, &in.k, &in.v, &in.g, &in.beta}) {
    add.push_back(Tensor::zeros(t->shape(), DType::F64));
    Tensor p = Tensor::empty(t->shape(), DType::F64);
    for (int64_t i = 0; i < p.numel(); ++i) set(p, i, NAN);  // never read under Set
    put.push_back(p);
    f32.push_back(Tensor::zeros(t->shape(), DType::F32));
  }
  kernels::kda_backward(add[0], add[1], add[2], add[3], add[4], w, in.q, in.k, in.v, in.g, in.beta,
                        s, 0.3);
  kernels::kda_backward(put[0], put[1], put[2], put[3], put[4], w, in.q, in.k, in.v, in.g, in.beta,
                        s, 0.3, kernels::Store::Set);
  kernels::kda_backward(f32[0], f32[1], f32[2], f32[3], f32[4], w.to(DType::F32),
                        in.q.to(DType::F32), in.k.to(DType::F32), in.v.to(DType::F32),
                        in.g.to(DType::F32), in.beta.to(DType::F32), s, 0.3);
  for (size_t i = 0; i < add.size(); ++i) {
    INFO("gradient " << i);
    CHECK(same_bits(add[i], put[i]));
    CHECK(mismatches(f32[i], add[i], 1e-4) == 0);
  }
}

TEST_CASE("kda refuses bad shapes and chunks", "[kernels][kda]") {
  KdaShape s{1, 8, 2, 4, 4, 64};
  const Inputs in = make_inputs(s, 3);
  Tensor o = Tensor::empty({8, 8}, DType::F64);
  KdaShape odd = s;
  odd.chunk = 24;
  REQUIRE_THROWS_WITH(kernels::kda_forward(o, in.q, in.k, in.v, in.g, in.beta, odd, 1.0),
                      Catch::Contains("chunk must be a multiple of 16"));
  Tensor short_beta = in.beta.rows(0, 7).clone();
  REQUIRE_THROWS_WITH(kernels::kda_forward(o, in.q, in.k, in.v, in.g, short_beta, s, 1.0),
                      Catch::Contains("beta has shape"));
  Tensor o_f32 = Tensor::empty({8, 8}, DType::F32);
  REQUIRE_THROWS_WITH(kernels::kda_forward(o_f32, in.q, in.k, in.v, in.g, in.beta, s, 1.0),
                      Catch::Contains("o is F32"));
}

// ---- the layer's parts ----

TEST_CASE("kda conv: causal within each sequence, SiLU after, gradients by finite differences",
          "[kernels][kda]") {
  const int64_t B = 2, T = 7, Ch = 5, W = 4;
  Tensor x = randn({B * T, Ch}, 71), w = randn({Ch, W}, 72, DType::F64, 0.5);
  Tensor y = Tensor::empty(x.shape(), DType::F64);
  kernels::kda_conv_forward(y, x, w, B, T);
  // Written out: token t of sequence b reads x at t - 3 .. t of that sequence only.
  int64_t bad = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < Ch; ++c) {
        double p = 0;
        for (int64_t j = 0; j < W; ++j) {
          const int64_t src = t - W + 1 + j;
          if (src >= 0) p += at(w, c * W + j) * at(x, (b * T + src) * Ch + c);
        }
        const double want = p / (1 + std::exp(-p));
        bad += !(std::fabs(at(y, (b * T + t) * Ch + c) - want) <= 1e-14 * (1 + std::fabs(want)));
      }
  CHECK(bad == 0);
  const Tensor wy = randn(x.shape(), 73);
  Tensor dx = Tensor::zeros(x.shape(), DType::F64), dw = Tensor::zeros(w.shape(), DType::F64);
  kernels::kda_conv_backward(dx, dw, wy, x, w, B, T);
  auto loss = [&] {
    Tensor yy = Tensor::empty(x.shape(), DType::F64);
    kernels::kda_conv_forward(yy, x, w, B, T);
    return weighted_sum(yy, wy);
  };
  CHECK(no_misses(fd_misses(loss, {&x, &w}, {&dx, &dw})));
}

TEST_CASE("kda l2 norm, decay, beta and output gate: values and finite differences",
          "[kernels][kda]") {
  const int64_t N = 6, H = 3, K = 4;
  const double eps = 1e-6;
  Tensor x = randn({N, H * K}, 81);
  {  // L2 norm per head: unit rows, gradient
    Tensor y = Tensor::empty(x.shape(), DType::F64);
    kernels::kda_l2norm_forward(y, x, K, eps);
    for (int64_t r = 0; r < N * H; ++r) {
      double ss = 0, xs = 0;
      for (int64_t c = 0; c < K; ++c) ss += at(y, r * K + c) * at(y, r * K + c), xs += at(x, r * K + c) * at(x, r * K + c);
      CHECK(ss == Approx(xs / (xs + eps)).epsilon(1e-12));
    }
    const Tensor wy = randn(x.shape(), 82);
    Tensor dx = Tensor::zeros(x.shape(), DType::F64);
    kernels::kda_l2norm_backward(dx, wy, x, K, eps);
    auto loss = [&] {
      Tensor yy = Tensor::empty(x.shape(), DType::F64);
      kernels::kda_l2norm_forward(yy, x, K, eps);
      return weighted_sum(yy, wy);
    };
    CHECK(no_misses(fd_misses(loss, {&x}, {&dx})));
  }
  {  // decay: g = -exp(a_log) softplus(f + dt_bias) < 0
    Tensor f = randn({N, H * K}, 83, DType::F64, 3.0), a = randn({H}, 84), dt = randn({H * K}, 85);
    Tensor g = Tensor::empty(f.shape(), DType::F64);
    kernels::kda_decay_forward(g, f, a, dt, K);
    for (int64_t i = 0; i < g.numel(); ++i) {
      const double u = at(f, i) + at(dt, i % (H * K));
      CHECK(at(g, i) == Approx(-std::exp(at(a, (i % (H * K)) / K)) * std::log1p(std::exp(u))).epsilon(1e-13));
      CHECK(at(g, i) < 0);
    }
    const Tensor wg = randn(f.shape(), 86);
    Tensor df = Tensor::zeros(f.shape(), DType::F64), da = Tensor::zeros(a.shape(), DType::F64),
           ddt = Tensor::zeros(dt.shape(), DType::F64);
    kernels::kda_decay_backward(df, da, ddt, wg, f, a, dt, K);
    auto loss = [&] {
      Tensor gg = Tensor::empty(f.shape(), DType::F64);
      kernels::kda_decay_forward(gg, f, a, dt, K);
      return weighted_sum(gg, wg);
    };
    CHECK(no_misses(fd_misses(loss, {&f, &a, &dt}, {&df, &da, &ddt})));
  }
  {  // beta = sigmoid(b)
    Tensor b = randn({N, H}, 87), beta = Tensor::empty({N, H}, DType::F64);
    kernels::kda_beta_forward(beta, b);
    CHECK(at(beta, 4) == Approx(1 / (1 + std::exp(-at(b, 4)))).epsilon(1e-15));
    const Tensor wb = randn(b.shape(), 88);
    Tensor db = Tensor::zeros(b.shape(), DType::F64);
    kernels::kda_beta_backward(db, wb, beta);
    auto loss = [&] {
      Tensor bb = Tensor::empty(b.shape(), DType::F64);
      kernels::kda_beta_forward(bb, b);
      return weighted_sum(bb, wb);
    };
    CHECK(no_misses(fd_misses(loss, {&b}, {&db})));
  }
  {  // output gate: RMSNorm_K(o) . w . sigmoid(z), per head
    Tensor o = randn({N, H * K}, 89), w = randn({K}, 90), z = randn({N, H * K}, 91);
    const double e = 1e-5;
    Tensor y = Tensor::empty(o.shape(), DType::F64);
    kernels::kda_out_gate_forward(y, o, w, z, K, e);
    const int64_t r = 7, c = 2;  // row 7 = token 2, head 1
    double ss = 0;
    for (int64_t j = 0; j < K; ++j) ss += at(o, r * K + j) * at(o, r * K + j);
    CHECK(at(y, r * K + c) == Approx(at(o, r * K + c) / std::sqrt(ss / K + e) * at(w, c) /
                                     (1 + std::exp(-at(z, r * K + c)))).epsilon(1e-13));
    const Tensor wy = randn(o.shape(), 92);
    Tensor d_o = Tensor::zeros(o.shape(), DType::F64), dw = Tensor::zeros(w.shape(), DType::F64),
           dz = Tensor::zeros(z.shape(), DType::F64);
    kernels::kda_out_gate_backward(d_o, dw, dz, wy, o, w, z, K, e);
    auto loss = [&] {
      Tensor yy = Tensor::empty(o.shape(), DType::F64);
      kernels::kda_out_gate_forward(yy, o, w, z, K, e);
      return weighted_sum(yy, wy);
    };
    CHECK(no_misses(fd_misses(loss, {&o, &w, &z}, {&d_o, &dw, &dz})));
  }
}
