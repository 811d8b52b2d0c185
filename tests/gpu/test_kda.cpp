// The CUDA KDA core (kernels/cuda/kda.cu) against the CPU's (kernels/kda.h,
// run in double on the same values): the chunkwise forward and backward in
// F32 and BF16, with T not a multiple of the chunk, several sequences and
// heads, K != V, strong decays (a chunk's cumulative log-decay far below -88),
// Store::Set into poisoned gradients and Store::Add onto random ones; the
// token-by-token recurrence with its fp32 state carried across two calls.
#include <catch2/catch.hpp>

#include <cmath>

#include "gpu_testing.h"
#include "kernels/kda.h"

using namespace attnres;
using namespace attnres::gpu_testing;
namespace kern = attnres::kernels;
using kern::KdaShape;

namespace {

// Host F32 inputs as the layer gives the core (q, k of unit norm per head,
// g = -softplus(N(0, 1)), beta in (0, 1)), rounded to `dt`, and the same on
// the device. With `strong`, a third of the channels decay by about -6 a
// token and one in six by -100.
struct Inputs {
  KdaShape s;
  Tensor hq, hk, hv, hg, hb;  // host F32
  Tensor q, k, v, g, beta;    // device, dt
};

Inputs make(KdaShape s, DType dt, uint64_t seed, bool strong) {
  const int64_t N = s.B * s.T;
  Inputs in{s};
  in.hq = randn_f32({N, s.H * s.K}, seed);
  in.hk = randn_f32({N, s.H * s.K}, seed + 1);
  in.hv = randn_f32({N, s.H * s.V}, seed + 2);
  in.hg = randn_f32({N, s.H * s.K}, seed + 3);
  in.hb = randn_f32({N, s.H}, seed + 4);
  for (Tensor* t : {&in.hq, &in.hk}) {
    float* p = t->data<float>();
    for (int64_t r = 0; r < N * s.H; ++r) {
      double ss = 0;
      for (int64_t c = 0; c < s.K; ++c) ss += double(p[r * s.K + c]) * p[r * s.K + c];
      for (int64_t c = 0; c < s.K; ++c) p[r * s.K + c] = float(p[r * s.K + c] / std::sqrt(ss + 1e-6));
    }
  }
  float* g = in.hg.data<float>();
  for (int64_t i = 0; i < in.hg.numel(); ++i) {
    g[i] = float(-std::log1p(std::exp(double(g[i]))));
    if (strong && (i % s.K) % 3 == 0) g[i] = -6.0f + 0.1f * g[i];
    if (strong && (i % s.K) % 6 == 1) g[i] = -100.0f + g[i];
  }
  float* b = in.hb.data<float>();
  for (int64_t i = 0; i < in.hb.numel(); ++i) b[i] = float(1 / (1 + std::exp(-double(b[i]))));
  in.q = to_device(in.hq, dt), in.k = to_device(in.hk, dt), in.v = to_device(in.hv, dt);
  in.g = to_device(in.hg, dt), in.beta = to_device(in.hb, dt);
  return in;
}

Tensor f64(const Tensor& host_f32) { return host_f32.to(DType::F64); }

}  // namespace

TEST_CASE("cuda kda chunkwise forward and backward match the CPU", "[gpu][kda]") {
  struct Case {
    KdaShape s;
    bool strong;
  };
  const Case cases[] = {
      {{1, 16, 1, 8, 8, 64}, false},
      {{2, 100, 3, 16, 12, 64}, false},   // T not a multiple of 64, K != V
      {{1, 130, 2, 32, 32, 64}, true},    // strong decays across three chunks
      {{2, 64, 2, 128, 128, 64}, false},  // Kimi's head width, one whole chunk
  };
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& c : cases) {
      const KdaShape& s = c.s;
      INFO(dtype_name(dt) << " B=" << s.B << " T=" << s.T << " H=" << s.H << " K=" << s.K
                          << " V=" << s.V << (c.strong ? " strong decays" : ""));
      Inputs in = make(s, dt, 11 + s.T, c.strong);
      const double scale = 1 / std::sqrt(double(s.K));
      const int64_t N = s.B * s.T;
      // F32: fp32 sums against double; with strong decays the exponent of
      // every pair carries the chunk's cumulative sum's rounding (about
      // 1e-7 |Gamma|, |Gamma| up to 6.5e3 here), hence 1e-4.
      const double tol_f = dt == DType::BF16 ? tol(dt) : c.strong ? 1e-4 : 2e-5;

      Tensor o = poisoned({N, s.H * s.V}, dt);
      kern::kda_forward(o, in.q, in.k, in.v, in.g, in.beta, s, scale);
      Tensor o_ref = Tensor::empty({N, s.H * s.V}, DType::F64);
      kern::kda_forward(o_ref, f64(in.hq), f64(in.hk), f64(in.hv), f64(in.hg), f64(in.hb), s, scale);
      REQUIRE(rel_l2(to_host_f32(o), o_ref) < tol_f);

      // Backward, written (Set) into poisoned tensors and added (Add) onto random ones.
      Pair dout = random_pair({N, s.H * s.V}, dt, 5, false);
      const Shape qs{N, s.H * s.K}, vs{N, s.H * s.V}, bs{N, s.H};
      auto ref_grads = [&](std::vector<Tensor>& r) {
        kern::kda_backward(r[0], r[1], r[2], r[3], r[4], f64(dout.host), f64(in.hq), f64(in.hk),
                           f64(in.hv), f64(in.hg), f64(in.hb), s, scale, kern::Store::Add);
      };
      {
        Tensor dq = poisoned(qs, dt), dk = poisoned(qs, dt), dv = poisoned(vs, dt),
               dg = poisoned(qs, dt), db = poisoned(bs, dt);
        kern::kda_backward(dq, dk, dv, dg, db, dout.dev, in.q, in.k, in.v, in.g, in.beta, s, scale,
                           kern::Store::Set);
        std::vector<Tensor> r{Tensor::zeros(qs, DType::F64), Tensor::zeros(qs, DType::F64),
                              Tensor::zeros(vs, DType::F64), Tensor::zeros(qs, DType::F64),
                              Tensor::zeros(bs, DType::F64)};
        ref_grads(r);
        const char* names[] = {"dq", "dk", "dv", "dg", "dbeta"};
        const Tensor* got[] = {&dq, &dk, &dv, &dg, &db};
        for (int i = 0; i < 5; ++i) {
          INFO(names[i] << " (Set)");
          CHECK(rel_l2(to_host_f32(*got[i]), r[size_t(i)]) < tol_f);
        }
      }
      {
        Pair dq = random_pair(qs, dt, 21, false), dk = random_pair(qs, dt, 22, false),
             dv = random_pair(vs, dt, 23, false), dg = random_pair(qs, dt, 24, false),
             db = random_pair(bs, dt, 25, false);
        kern::kda_backward(dq.dev, dk.dev, dv.dev, dg.dev, db.dev, dout.dev, in.q, in.k, in.v,
                           in.g, in.beta, s, scale, kern::Store::Add);
        std::vector<Tensor> r{f64(dq.host), f64(dk.host), f64(dv.host), f64(dg.host), f64(db.host)};
        ref_grads(r);
        const char* names[] = {"dq", "dk", "dv", "dg", "dbeta"};
        const Pair* got[] = {&dq, &dk, &dv, &dg, &db};
        for (int i = 0; i < 5; ++i) {
          INFO(names[i] << " (Add)");
          CHECK(rel_l2(to_host_f32(got[i]->dev), r[size_t(i)]) < tol(dt) * 2);
        }
      }
    }
}

TEST_CASE("cuda kda recurrence carries its fp32 state across calls as the CPU's", "[gpu][kda]") {
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtype_name(dt));
    const KdaShape s{2, 9, 2, 16, 8, 64};
    Inputs a = make(s, dt, 41, false), b = make(s, dt, 51, false);
    const double scale = 0.25;
    const int64_t N = s.B * s.T;
    Tensor state = Tensor::zeros({s.B, s.H, s.K, s.V}, DType::F32, Device::CUDA);
    Tensor state_ref = Tensor::zeros({s.B, s.H, s.K, s.V}, DType::F64);
    for (Inputs* in : {&a, &b}) {  // the second call continues from the first's state
      Tensor o = poisoned({N, s.H * s.V}, dt);
      kern::kda_recurrent_forward(o, in->q, in->k, in->v, in->g, in->beta, s, scale, &state);
      Tensor o_ref = Tensor::empty({N, s.H * s.V}, DType::F64);
      kern::kda_recurrent_forward(o_ref, f64(in->hq), f64(in->hk), f64(in->hv), f64(in->hg),
                                  f64(in->hb), s, scale, &state_ref);
      REQUIRE(rel_l2(to_host_f32(o), o_ref) < tol(dt));
      REQUIRE(rel_l2(to_host_f32(state), state_ref) < (dt == DType::BF16 ? tol(dt) : 1e-5));
    }
    // The chunkwise forward from a zero state equals the recurrence's first call.
    Tensor o_chunk = poisoned({N, s.H * s.V}, dt), o_rec = poisoned({N, s.H * s.V}, dt);
    kern::kda_forward(o_chunk, a.q, a.k, a.v, a.g, a.beta, s, scale);
    kern::kda_recurrent_forward(o_rec, a.q, a.k, a.v, a.g, a.beta, s, scale, nullptr);
    REQUIRE(rel_l2(to_host_f32(o_chunk), to_host_f32(o_rec)) < tol(dt));
  }
}
