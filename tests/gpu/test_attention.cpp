// CUDA causal GQA attention vs the CPU op (F64 reference on the same inputs):
// forward (out, lse), backward (dq, dk, dv accumulated onto random values),
// both paths (generic fp32 kernels: F32 and BF16 head dims without a
// tensor-core kernel; tensor-core kernels: BF16 with hd 32/64/128), ragged
// sequence lengths, every GQA grouping in use, T = 1, determinism, decode.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_qkv.h"
#include "attention_testing.h"
#include "gpu_testing.h"
#include "kernels/attention.h"

using namespace attnres;
namespace kern = attnres::kernels;
namespace gt = attnres::gpu_testing;

namespace {

using gt::host_f64;
using gt::to_f64;

// One GPU forward + backward from fixed inputs; gradients start from the
// given initial values (device copies), outputs start poisoned.
gt::AttnRun run_gpu(const kern::AttnShape& s, DType dt, const Tensor& q, const Tensor& kk,
                    const Tensor& v, const Tensor& dout, const Tensor& dq0, const Tensor& dk0,
                    const Tensor& dv0) {
  const int64_t N = s.B * s.T;
  gt::AttnRun r;
  r.out = gt::poisoned({N, s.H * s.hd}, dt);
  r.lse = gt::poisoned({s.B, s.H, s.T}, DType::F32);
  testing::attention_forward(r.out, r.lse, q, kk, v, s);
  r.dq = dq0.clone();
  r.dk = dk0.clone();
  r.dv = dv0.clone();
  testing::attention_backward(r.dq, r.dk, r.dv, dout, q, kk, v, r.out, r.lse, s);
  return r;
}

// Checks one shape in one dtype. `stddev` scales q and k (large values give
// peaked softmax rows).
void check_attention(const kern::AttnShape& s, DType dt, uint64_t seed, double stddev = 1.0) {
  const gt::AttnInputs in = gt::attn_inputs(s, dt, seed, stddev);
  const Tensor &qd = in.qd, &kd = in.kd, &vd = in.vd, &dod = in.dod, &dq0d = in.dq0d,
               &dk0d = in.dk0d, &dv0d = in.dv0d;

  const gt::AttnRun g = run_gpu(s, dt, qd, kd, vd, dod, dq0d, dk0d, dv0d);

  // Forward reference.
  const gt::AttnInputs64 x = gt::inputs_f64(in);
  const gt::AttnForwardRef fwd = gt::attn_forward_reference(s, x);
  const Tensor &out_ref = fwd.out, &lse_ref = fwd.lse;

  INFO("B=" << s.B << " T=" << s.T << " H=" << s.H << " Hkv=" << s.Hkv << " hd=" << s.hd
            << " dtype=" << dtype_name(dt) << " stddev=" << stddev);
  const double tol = gt::tol(dt);
  CHECK(gt::rel_l2(host_f64(g.out), out_ref) < tol);
  // Element-wise (gpu_testing.h): out_i = sum_j P_ij v_j, whose terms are
  // sum_j P_ij |v_j| (fwd.out_terms). The tensor-core kernels round P to bf16
  // for the PV product (2^-8 of those terms) and normalise by the fp32 row
  // sum (another 2^-8 at most), then round out once: c_ref = 2, c_terms = 4,
  // twice the worst case.
  CHECK(gt::bf16_outliers(dt, host_f64(g.out), out_ref, 2, fwd.out_terms, 4) == "");
  // lse is F32 either way and computed from exactly the reference's inputs.
  CHECK(gt::rel_l2(host_f64(g.lse), lse_ref) < (dt == DType::BF16 ? 1e-4 : gt::kTolF32));

  // Backward reference, from the GPU's saved out and lse (so the check
  // isolates the backward kernels) and the same initial gradients.
  Tensor dq_ref = x.dq0.clone(), dk_ref = x.dk0.clone(), dv_ref = x.dv0.clone();
  testing::attention_backward(dq_ref, dk_ref, dv_ref, x.dout, x.q, x.k, x.v, host_f64(g.out),
                              host_f64(g.lse), s);
  CHECK(gt::rel_l2(host_f64(g.dq), dq_ref) < tol);
  CHECK(gt::rel_l2(host_f64(g.dk), dk_ref) < tol);
  CHECK(gt::rel_l2(host_f64(g.dv), dv_ref) < tol);
  // Element-wise (gpu_testing.h). dv_j = dv0_j + sum_i P_ij dO_i: P is
  // rounded to bf16 for the tensor cores, so its terms |dv0_j| + sum_i P_ij
  // |dO_i| (the same backward fed |dv0| and |dO|; its dq, dk are not used)
  // carry up to 2^-8 each, and the stored sum one more rounding: c_ref = 2,
  // c_terms = 4. dq and dk are sums over dS = P (dP - D), also rounded to
  // bf16 for the tensor cores, whose terms the CPU op does not expose: the
  // tensor-wide stand-in is the largest increment |dq - dq0| (resp. dk),
  // c_terms = 4 (the dS roundings of different keys add like a random walk,
  // ~2^-8 of an element's typical size; see gpu_testing.h).
  if (dt == DType::BF16) {
    const Tensor dv_terms =
        gt::attn_dv_terms(s, testing::abs_of(x.dv0), x, host_f64(g.out), host_f64(g.lse));
    CHECK(gt::bf16_outliers(dt, host_f64(g.dv), dv_ref, 2, dv_terms, 4) == "");
    CHECK(gt::bf16_outliers(dt, host_f64(g.dq), dq_ref, 2, gt::max_increment(dq_ref, x.dq0), 4) ==
          "");
    CHECK(gt::bf16_outliers(dt, host_f64(g.dk), dk_ref, 2, gt::max_increment(dk_ref, x.dk0), 4) ==
          "");
  }
  // F32: the increments alone (the gradients proper), so that an error cannot
  // hide behind the O(0.5) initial values. Errors are measured against the
  // larger of the increment and a third of the initial values, which covers
  // gradients that vanish (T = 1: dq = dk = 0 exactly, where the GPU's
  // fp32 dP - D leaves ~1e-7). In BF16 the stored sums carry a rounding of
  // the initial values' size, so only the sums are compared.
  if (dt == DType::F32) {
    auto inc_err = [](const Tensor& gpu, const Tensor& ref, const Tensor& init) {
      double num = 0, den = 0, den0 = 0;
      for (int64_t i = 0; i < ref.numel(); ++i) {
        const double a = gpu.data<double>()[i] - init.data<double>()[i];
        const double b = ref.data<double>()[i] - init.data<double>()[i];
        num += (a - b) * (a - b);
        den += b * b;
        den0 += init.data<double>()[i] * init.data<double>()[i];
      }
      return std::sqrt(num / std::max(den, 0.1 * den0));
    };
    CHECK(inc_err(host_f64(g.dq), dq_ref, x.dq0) < tol);
    CHECK(inc_err(host_f64(g.dk), dk_ref, x.dk0) < tol);
    CHECK(inc_err(host_f64(g.dv), dv_ref, x.dv0) < tol);
  }

  // Determinism: a second run gives the same bits.
  const gt::AttnRun g2 = run_gpu(s, dt, qd, kd, vd, dod, dq0d, dk0d, dv0d);
  CHECK(gt::same_bits(g2.out, g.out));
  CHECK(gt::same_bits(g2.lse, g.lse));
  CHECK(gt::same_bits(g2.dq, g.dq));
  CHECK(gt::same_bits(g2.dk, g.dk));
  CHECK(gt::same_bits(g2.dv, g.dv));
}

// (B, T, H, Hkv, hd)
const std::vector<kern::AttnShape> kShapes = {
    {2, 13, 4, 2, 16},    // generic path in BF16 too; T below one tile
    {1, 64, 2, 1, 32},    // exactly one 64-row tile
    {2, 200, 6, 2, 64},   // group 3, ragged last tile
    {1, 1024, 4, 4, 64},  // long sequence, plain multi-head
    {2, 257, 4, 1, 128},  // multi-query, hd 128, T = 2 * 128 + 1
    {1, 9, 2, 1, 4},      // tiny head dim
    {3, 1, 4, 2, 8},      // T = 1
    {2, 1, 4, 2, 64},     // T = 1 on the tensor-core path
    {1, 150, 12, 1, 64},  // group 12
    {2, 100, 6, 1, 32},   // group 6
    {1, 130, 4, 2, 64},   // one row past a 128-row tile
    {2, 45, 3, 3, 6},     // odd head count and head dim
    {1, 70, 2, 2, 256},   // largest head dim
    {1, 33, 2, 1, 128},   // hd 128, one row past a 32-row tile
};

}  // namespace

TEST_CASE("cuda attention matches the CPU in F32", "[gpu][attention]") {
  uint64_t seed = 1000;
  for (const auto& s : kShapes) check_attention(s, DType::F32, seed += 10);
}

TEST_CASE("cuda attention matches the CPU in BF16", "[gpu][attention]") {
  uint64_t seed = 2000;
  for (const auto& s : kShapes) check_attention(s, DType::BF16, seed += 10);
}

TEST_CASE("cuda attention is accurate for peaked softmax rows", "[gpu][attention]") {
  // q, k ~ N(0, 9): scaled scores of order 10, rows dominated by few keys.
  for (DType dt : {DType::F32, DType::BF16}) {
    check_attention({2, 200, 4, 2, 64}, dt, 3000, 3.0);
    check_attention({1, 77, 4, 1, 16}, dt, 3100, 3.0);
  }
}

TEST_CASE("cuda attention decode matches the CPU", "[gpu][attention]") {
  struct Case {
    int64_t B, Tmax, H, Hkv, hd;
  };
  uint64_t seed = 4000;
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& c : {Case{2, 12, 4, 2, 6}, Case{3, 300, 8, 2, 64}, Case{1, 50, 4, 4, 128},
                          Case{2, 70, 12, 1, 256}, Case{1, 5, 2, 1, 4}})
      for (int64_t len : {int64_t(1), c.Tmax / 2 + 1, c.Tmax}) {
        seed += 10;
        const kern::AttnShape s{c.B, 1, c.H, c.Hkv, c.hd};
        Tensor q = gt::randn_f32({c.B, c.H * c.hd}, seed);
        Tensor kc = gt::randn_f32({c.B, c.Tmax, c.Hkv * c.hd}, seed + 1);
        Tensor vc = gt::randn_f32({c.B, c.Tmax, c.Hkv * c.hd}, seed + 2);
        const Tensor qd = gt::to_device(q, dt), kcd = gt::to_device(kc, dt),
                     vcd = gt::to_device(vc, dt);
        Tensor out = gt::poisoned({c.B, c.H * c.hd}, dt);
        kern::attention_decode(out, qd, kcd, vcd, len, s);
        Tensor ref = Tensor::empty({c.B, c.H * c.hd}, DType::F64);
        kern::attention_decode(ref, to_f64(q), to_f64(kc), to_f64(vc), len, s);
        INFO("B=" << c.B << " Tmax=" << c.Tmax << " H=" << c.H << " Hkv=" << c.Hkv
                  << " hd=" << c.hd << " len=" << len << " dtype=" << dtype_name(dt));
        CHECK(gt::rel_l2(host_f64(out), ref) < gt::tol(dt));
        // Element-wise, as the forward: the terms are the attention over |v|.
        Tensor terms = Tensor::empty({c.B, c.H * c.hd}, DType::F64);
        kern::attention_decode(terms, to_f64(q), to_f64(kc), testing::abs_of(to_f64(vc)), len, s);
        CHECK(gt::bf16_outliers(dt, host_f64(out), ref, 2, terms, 4) == "");
        Tensor out2 = gt::poisoned({c.B, c.H * c.hd}, dt);
        kern::attention_decode(out2, qd, kcd, vcd, len, s);
        CHECK(gt::same_bits(out2, out));
      }
}

TEST_CASE("cuda attention decode agrees with the forward's last row", "[gpu][attention]") {
  // The cache holds the sequence's own k/v: decode at position T-1 must give
  // the forward output of row T-1 (both computed on the GPU).
  for (DType dt : {DType::F32, DType::BF16}) {
    const kern::AttnShape s{2, 40, 4, 2, 64};
    const int64_t N = s.B * s.T;
    Tensor q = gt::randn_f32({N, s.H * s.hd}, 5000);
    Tensor kk = gt::randn_f32({N, s.Hkv * s.hd}, 5001);
    Tensor v = gt::randn_f32({N, s.Hkv * s.hd}, 5002);
    const Tensor qd = gt::to_device(q, dt), kd = gt::to_device(kk, dt), vd = gt::to_device(v, dt);
    Tensor out = gt::poisoned({N, s.H * s.hd}, dt), lse = gt::poisoned({s.B, s.H, s.T}, DType::F32);
    testing::attention_forward(out, lse, qd, kd, vd, s);
    Tensor q_last = Tensor::empty({s.B, s.H * s.hd}, dt, Device::CUDA);
    Tensor ref = Tensor::empty({s.B, s.H * s.hd}, dt, Device::CUDA);
    for (int64_t b = 0; b < s.B; ++b) {
      q_last.rows(b, 1).copy_from(qd.rows(b * s.T + s.T - 1, 1));
      ref.rows(b, 1).copy_from(out.rows(b * s.T + s.T - 1, 1));
    }
    Tensor dec = gt::poisoned({s.B, s.H * s.hd}, dt);
    kern::attention_decode(dec, q_last, kd.reshape({s.B, s.T, s.Hkv * s.hd}),
                        vd.reshape({s.B, s.T, s.Hkv * s.hd}), s.T, s);
    INFO("dtype=" << dtype_name(dt));
    CHECK(gt::rel_l2(host_f64(dec), host_f64(ref)) < gt::tol(dt));
    // Element-wise: each of the two is within the forward's bound of the exact
    // row (2^-8 (2 |out| + 4 sum_j P_j |v_j|)), so they are within twice it of
    // each other; the terms from the CPU's decode of the same rows over |v|.
    Tensor q_last_h = Tensor::empty({s.B, s.H * s.hd}, DType::F64);
    for (int64_t b = 0; b < s.B; ++b)
      q_last_h.rows(b, 1).copy_from(to_f64(q).rows(b * s.T + s.T - 1, 1));
    Tensor terms = Tensor::empty({s.B, s.H * s.hd}, DType::F64);
    kern::attention_decode(terms, q_last_h, to_f64(kk).reshape({s.B, s.T, s.Hkv * s.hd}),
                           testing::abs_of(to_f64(v)).reshape({s.B, s.T, s.Hkv * s.hd}), s.T, s);
    CHECK(gt::bf16_outliers(dt, host_f64(dec), host_f64(ref), 4, terms, 8) == "");
  }
}
