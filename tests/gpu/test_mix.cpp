// CUDA AttnRes depth Mix vs the CPU op run in F64 on the same values:
// mix_source_rstd, forward (out and probs) and backward (every dsource and dw,
// accumulated into random values) in F32 and BF16 for warp-per-row and
// block-per-row shapes, d not a multiple of 8, k from 1 to the 64-source
// capacity (and beyond the shared-memory cache), the realistic size; both
// kernel families (rows and warp, ATTNRES_MIX_KERNELS) for every op; the
// k == 1 identity bit for bit, aliased dsources, repeatability, a query's
// independence from the queries beside it, limits.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/scoped_env.h"
#include "gpu_testing.h"
#include "kernels/mix.h"

using namespace attnres;
namespace gt = attnres::gpu_testing;
namespace kern = attnres::kernels;

namespace {

constexpr float kMixEps = 1e-5f;

// k sources [N, d] of different scales (so the softmax is far from uniform),
// a pseudo-query w [d]; host F32 copies (bf16-rounded for BF16) and device
// copies in `dt`.
struct MixSetup {
  int64_t N, d, kk;
  DType dt;
  std::vector<Tensor> src_h, src_d;
  Tensor w_h, w_d;
};

MixSetup make_setup(int64_t N, int64_t d, int64_t kk, DType dt, uint64_t seed) {
  MixSetup s{N, d, kk, dt, {}, {}, {}, {}};
  for (int64_t j = 0; j < kk; ++j) {
    s.src_h.push_back(gt::randn_f32({N, d}, seed + j, 0.5 + 0.4 * (j % 5)));
    s.src_d.push_back(gt::to_device(s.src_h.back(), dt));
  }
  // |w| ~ 2 / sqrt(d): logits of order 1 (the RMS-normalised keys have unit
  // RMS), so the softmax is neither uniform nor one-hot.
  s.w_h = gt::randn_f32({d}, seed + 1000, 2.0 / std::sqrt(double(std::max<int64_t>(d, 1))));
  s.w_d = gt::to_device(s.w_h, dt);
  return s;
}

std::vector<Tensor> to_f64(const std::vector<Tensor>& ts) {
  std::vector<Tensor> r;
  for (const Tensor& t : ts) r.push_back(t.to(DType::F64));
  return r;
}
std::vector<Tensor> on_device(const std::vector<Tensor>& ts) {
  std::vector<Tensor> r;
  for (const Tensor& t : ts) r.push_back(t.to(Device::CUDA));
  return r;
}

// The CPU's F64 rstds of the (rounded) sources, rounded to F32: both sides of
// the forward / backward comparisons read exactly these.
std::vector<Tensor> rstds_f32(const MixSetup& s) {
  std::vector<Tensor> r;
  for (const Tensor& v : s.src_h) {
    Tensor t = Tensor::empty({s.N}, DType::F64);
    kern::mix_source_rstd(t, v.to(DType::F64), kMixEps);
    r.push_back(t.to(DType::F32));
  }
  return r;
}

// For the element-wise bf16 bounds (gpu_testing.h). Every Mix kernel works
// in fp32 (logits, softmax, sums) and rounds only what it stores to bf16, so
// an element is within 2^-8 |exact| (c_ref = 2) plus fp32 differences, which
// are relative to the terms behind it:
// - a Mix output out[n, c] = sum_j a_nj v_j[n, c]: its terms sum_j a_nj
//   |v_j[n, c]| (from the reference's probabilities, below), c_terms = 1,
//   far above the fp32 errors of the GPU's own probabilities (~1e-5);
// - gradients (the row passes' dot products and RMSNorm statistics cancel in
//   ways the CPU ops do not expose): the largest increment as a tensor-wide
//   stand-in (c_terms = 1 for bf16 stores of fp32 row results; 4 for the fp32
//   dw / dgain, sums over all rows).
// The terms of query q's output: sum_j probs[q, n, j] |src_j[n, c]|.
Tensor mix_terms(const Tensor& probs, const std::vector<Tensor>& src64, int64_t q = 0) {
  const int64_t kk = static_cast<int64_t>(src64.size()), N = src64[0].dim(0), d = src64[0].dim(1);
  Tensor t = Tensor::zeros({N, d}, DType::F64);
  for (int64_t j = 0; j < kk; ++j)
    for (int64_t n = 0; n < N; ++n) {
      const double a = testing::at(probs, (q * N + n) * kk + j);
      for (int64_t c = 0; c < d; ++c)
        t.data<double>()[n * d + c] += a * std::fabs(src64[j].data<double>()[n * d + c]);
    }
  return t;
}

void check_mix(int64_t N, int64_t d, int64_t kk, DType dt, uint64_t seed) {
  INFO("N=" << N << " d=" << d << " k=" << kk << " " << dtype_name(dt));
  const double tol = gt::tol(dt);
  MixSetup s = make_setup(N, d, kk, dt, seed);
  const std::vector<Tensor> src64 = to_f64(s.src_h);
  const Tensor w64 = s.w_h.to(DType::F64);

  // rstd
  std::vector<Tensor> rs32 = rstds_f32(s);
  for (int64_t j = 0; j < kk; ++j) {
    Tensor r = gt::poisoned({N}, DType::F32);
    kern::mix_source_rstd(r, s.src_d[j], kMixEps);
    CHECK(gt::rel_l2(r.to(Device::CPU), rs32[j]) < gt::kTolF32);
  }

  // forward
  const std::vector<Tensor> rs64 = to_f64(rs32), rs_d = on_device(rs32);
  Tensor out_ref = Tensor::empty({N, d}, DType::F64), probs_ref = Tensor::empty({N, kk}, DType::F64);
  kern::mix_forward(out_ref, probs_ref, w64, src64, rs64);
  Tensor out = gt::poisoned({N, d}, dt), probs = gt::poisoned({N, kk}, DType::F32);
  kern::mix_forward(out, probs, s.w_d, s.src_d, rs_d);
  CHECK(gt::rel_l2(gt::to_host_f32(out), out_ref) < tol);
  CHECK(gt::bf16_outliers(dt, gt::to_host_f32(out), out_ref, 2, mix_terms(probs_ref, src64), 1) == "");
  CHECK(gt::rel_l2(probs.to(Device::CPU), probs_ref) < gt::kTolF32);

  // backward: the same probs on both sides (the CPU's, rounded to F32);
  // gradients accumulate into random values.
  Tensor probs32 = probs_ref.to(DType::F32);
  Tensor dout = gt::randn_f32({N, d}, seed + 2000);
  Tensor dout_d = gt::to_device(dout, dt);
  std::vector<Tensor> ds_h, ds_d, ds_ref;
  for (int64_t j = 0; j < kk; ++j) {
    ds_h.push_back(gt::randn_f32({N, d}, seed + 3000 + j, 0.5));  // rounded in place by to_device
    ds_d.push_back(gt::to_device(ds_h.back(), dt));
    ds_ref.push_back(ds_h.back().to(DType::F64));
  }
  Tensor dw0 = gt::randn_f32({d}, seed + 4000);
  Tensor dw_d = dw0.to(Device::CUDA), dw_ref = dw0.to(DType::F64);
  kern::mix_backward(ds_ref, dw_ref, dout.to(DType::F64), w64, src64, rs64, probs32.to(DType::F64));
  kern::mix_backward(ds_d, dw_d, dout_d, s.w_d, s.src_d, rs_d, probs32.to(Device::CUDA));
  for (int64_t j = 0; j < kk; ++j) {
    INFO("dsource " << j);
    CHECK(gt::rel_l2(gt::to_host_f32(ds_d[j]), ds_ref[j]) < tol);
    CHECK(gt::bf16_outliers(dt, gt::to_host_f32(ds_d[j]), ds_ref[j], 2,
                            gt::max_increment(ds_ref[j], ds_h[j]), 1) == "");
  }
  // dw - dw0 is the gradient proper: compare it, not the (random) start.
  Tensor dw_h = dw_d.to(Device::CPU);
  Tensor g = Tensor::empty({d}, DType::F64), g_ref = Tensor::empty({d}, DType::F64);
  for (int64_t c = 0; c < d; ++c) {
    g.data<double>()[c] = double(dw_h.data<float>()[c]) - double(dw0.data<float>()[c]);
    g_ref.data<double>()[c] = dw_ref.data<double>()[c] - double(dw0.data<float>()[c]);
  }
  // (The subtraction exposes dw's fp32 rounding at the start's magnitude.)
  CHECK(gt::rel_l2(g, g_ref) < (dt == DType::BF16 ? tol : 1e-4));
  CHECK(gt::bf16_outliers(dt, g, g_ref, 2, gt::max_abs(g_ref), 4) == "");
}

}  // namespace

TEST_CASE("cuda mix matches the CPU: warp-per-row shapes", "[gpu][mix]") {
  uint64_t seed = 10000;
  struct C { int64_t N, d, kk; };
  for (const C& c : {C{13, 36, 1}, C{13, 36, 3}, C{7, 8, 2}, C{37, 768, 2}, C{64, 1000, 5},
                     C{20, 1020, 7}, C{300, 768, 20}, C{50, 512, 64}, C{9, 3, 4}})
    for (DType dt : {DType::F32, DType::BF16}) check_mix(c.N, c.d, c.kk, dt, seed += 100);
}

TEST_CASE("cuda mix matches the CPU: block-per-row shapes (d > 1024)", "[gpu][mix]") {
  uint64_t seed = 20000;
  struct C { int64_t N, d, kk; };
  for (const C& c : {C{5, 2048, 4}, C{3, 4100, 5}, C{33, 4096, 9}, C{4, 8192, 3}, C{6, 1032, 2}})
    for (DType dt : {DType::F32, DType::BF16}) check_mix(c.N, c.d, c.kk, dt, seed += 100);
}

TEST_CASE("cuda mix matches the CPU at the realistic size", "[gpu][mix]") {
  // N = 16384 tokens, d = 768, k = 9 (more sources than the backward's
  // shared-memory cache holds in either dtype).
  check_mix(16384, 768, 9, DType::BF16, 30000);
  check_mix(16384, 768, 9, DType::F32, 30100);
}

TEST_CASE("cuda mix with one source is the identity, bit for bit", "[gpu][mix]") {
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t d : {int64_t(36), int64_t(768), int64_t(2048)}) {
      INFO(dtype_name(dt) << " d=" << d);
      const int64_t N = 19;
      MixSetup s = make_setup(N, d, 1, dt, 40000 + d);
      std::vector<Tensor> rs{Tensor::empty({N}, DType::F32, Device::CUDA)};
      kern::mix_source_rstd(rs[0], s.src_d[0], kMixEps);
      Tensor out = gt::poisoned({N, d}, dt), probs = gt::poisoned({N, 1}, DType::F32);
      kern::mix_forward(out, probs, s.w_d, s.src_d, rs);
      REQUIRE(gt::same_bits(out, s.src_d[0]));
      Tensor ph = probs.to(Device::CPU);
      for (int64_t n = 0; n < N; ++n) REQUIRE(ph.data<float>()[n] == 1.0f);

      // dsource += dout exactly (one rounding of the sum), dw unchanged.
      Tensor dout = gt::randn_f32({N, d}, 40500 + d), ds0 = gt::randn_f32({N, d}, 40600 + d);
      Tensor dout_d = gt::to_device(dout, dt);
      std::vector<Tensor> ds{gt::to_device(ds0, dt)};
      Tensor dw0 = gt::randn_f32({d}, 40700 + d);
      Tensor dw = dw0.to(Device::CUDA);
      kern::mix_backward(ds, dw, dout_d, s.w_d, s.src_d, rs, probs);
      Tensor expect = Tensor::empty({N, d}, DType::F32);
      for (int64_t i = 0; i < N * d; ++i)
        expect.data<float>()[i] = ds0.data<float>()[i] + dout.data<float>()[i];
      REQUIRE(gt::same_bits(ds[0], dt == DType::BF16 ? expect.to(DType::BF16) : expect));
      REQUIRE(gt::same_bits(dw, dw0));
    }
}

TEST_CASE("cuda mix backward adds every contribution into aliased dsources", "[gpu][mix]") {
  // dsources {A, B, A}: A receives the gradients of sources 0 and 2, as on the CPU.
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t d : {int64_t(36), int64_t(768), int64_t(2048)}) {
      INFO(dtype_name(dt) << " d=" << d);
      const int64_t N = 41, kk = 3;
      MixSetup s = make_setup(N, d, kk, dt, 50000 + d);
      std::vector<Tensor> rs32 = rstds_f32(s);
      Tensor out_ref = Tensor::empty({N, d}, DType::F64), probs_ref = Tensor::empty({N, kk}, DType::F64);
      kern::mix_forward(out_ref, probs_ref, s.w_h.to(DType::F64), to_f64(s.src_h), to_f64(rs32));
      Tensor probs32 = probs_ref.to(DType::F32);
      Tensor dout = gt::randn_f32({N, d}, 50500 + d);
      Tensor dout_d = gt::to_device(dout, dt);
      Tensor a0 = gt::randn_f32({N, d}, 50600 + d, 0.5), b0 = gt::randn_f32({N, d}, 50700 + d, 0.5);
      Tensor a_d = gt::to_device(a0, dt), b_d = gt::to_device(b0, dt);
      Tensor a_ref = a0.to(DType::F64), b_ref = b0.to(DType::F64);
      std::vector<Tensor> ds_d{a_d, b_d, a_d}, ds_ref{a_ref, b_ref, a_ref};
      Tensor dw_d = Tensor::zeros({d}, DType::F32, Device::CUDA);
      Tensor dw_ref = Tensor::zeros({d}, DType::F64);
      kern::mix_backward(ds_ref, dw_ref, dout.to(DType::F64), s.w_h.to(DType::F64), to_f64(s.src_h),
                      to_f64(rs32), probs32.to(DType::F64));
      kern::mix_backward(ds_d, dw_d, dout_d, s.w_d, s.src_d, on_device(rs32), probs32.to(Device::CUDA));
      CHECK(gt::rel_l2(gt::to_host_f32(a_d), a_ref) < gt::tol(dt));
      CHECK(gt::rel_l2(gt::to_host_f32(b_d), b_ref) < gt::tol(dt));
      CHECK(gt::rel_l2(dw_d.to(Device::CPU), dw_ref) < gt::tol(dt));
      // Element-wise, as in check_mix (a0, b0 were rounded in place by to_device).
      CHECK(gt::bf16_outliers(dt, gt::to_host_f32(a_d), a_ref, 2, gt::max_increment(a_ref, a0), 1) == "");
      CHECK(gt::bf16_outliers(dt, gt::to_host_f32(b_d), b_ref, 2, gt::max_increment(b_ref, b0), 1) == "");
      CHECK(gt::bf16_outliers(dt, dw_d.to(Device::CPU), dw_ref, 2, gt::max_abs(dw_ref), 4) == "");
    }
}

TEST_CASE("cuda mix is bitwise repeatable", "[gpu][mix]") {
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t d : {int64_t(768), int64_t(4096)}) {
      INFO(dtype_name(dt) << " d=" << d);
      const int64_t N = d == 768 ? 16384 : 1500, kk = 9;
      MixSetup s = make_setup(N, d, kk, dt, 60000 + d);
      std::vector<Tensor> rs;
      for (int64_t j = 0; j < kk; ++j) {
        rs.push_back(Tensor::empty({N}, DType::F32, Device::CUDA));
        kern::mix_source_rstd(rs.back(), s.src_d[j], kMixEps);
      }
      Tensor dout_h = gt::randn_f32({N, d}, 60500 + d);
      Tensor dout = gt::to_device(dout_h, dt);
      Tensor out[2], probs[2], dw[2];
      std::vector<Tensor> ds[2];
      for (int r = 0; r < 2; ++r) {
        out[r] = gt::poisoned({N, d}, dt);
        probs[r] = gt::poisoned({N, kk}, DType::F32);
        kern::mix_forward(out[r], probs[r], s.w_d, s.src_d, rs);
        for (int64_t j = 0; j < kk; ++j) ds[r].push_back(Tensor::zeros({N, d}, dt, Device::CUDA));
        dw[r] = Tensor::zeros({d}, DType::F32, Device::CUDA);
        kern::mix_backward(ds[r], dw[r], dout, s.w_d, s.src_d, rs, probs[r]);
      }
      CHECK(gt::same_bits(out[0], out[1]));
      CHECK(gt::same_bits(probs[0], probs[1]));
      CHECK(gt::same_bits(dw[0], dw[1]));
      for (int64_t j = 0; j < kk; ++j) CHECK(gt::same_bits(ds[0][j], ds[1][j]));

      // The merge + norm (m = 2 recent sources: the first two sources; o =
      // the output above), its per-block dw and dgain sums included.
      const int64_t m = 2;
      std::vector<Tensor> rec(s.src_d.begin(), s.src_d.begin() + m);
      Tensor lse = Tensor::zeros({N}, DType::F32, Device::CUDA);
      Tensor gain_h = gt::randn_f32({d}, 60600 + d);
      const Tensor gain = gt::to_device(gain_h, dt);
      Tensor u[2], st[2], d_o[2], dlse[2], dwm[2], dg[2];
      std::vector<Tensor> de[2];
      for (int r = 0; r < 2; ++r) {
        u[r] = gt::poisoned({N, d}, dt);
        st[r] = gt::poisoned({N, 2 * m + 2}, DType::F32);
        kern::mix_merge_norm_forward(u[r], st[r], s.w_d, out[0], lse, rec, gain, kMixEps);
        d_o[r] = gt::poisoned({N, d}, dt);
        dlse[r] = gt::poisoned({N}, DType::F32);
        for (int64_t j = 0; j < m; ++j) de[r].push_back(Tensor::zeros({N, d}, dt, Device::CUDA));
        dwm[r] = Tensor::zeros({d}, DType::F32, Device::CUDA);
        dg[r] = Tensor::zeros({d}, DType::F32, Device::CUDA);
        kern::mix_merge_norm_backward(d_o[r], dlse[r], de[r], dwm[r], dg[r], dout, s.w_d, out[0],
                                      rec, gain, st[r]);
      }
      CHECK(gt::same_bits(u[0], u[1]));
      CHECK(gt::same_bits(st[0], st[1]));
      CHECK(gt::same_bits(d_o[0], d_o[1]));
      CHECK(gt::same_bits(dlse[0], dlse[1]));
      CHECK(gt::same_bits(dwm[0], dwm[1]));
      CHECK(gt::same_bits(dg[0], dg[1]));
      for (int64_t j = 0; j < m; ++j) CHECK(gt::same_bits(de[0][j], de[1][j]));
    }
}

TEST_CASE("cuda mix rejects more sources or wider rows than its kernels take", "[gpu][mix]") {
  {
    const int64_t N = 2, d = 8, kk = 65;
    MixSetup s = make_setup(N, d, kk, DType::F32, 70000);
    std::vector<Tensor> rs;
    for (int64_t j = 0; j < kk; ++j) rs.push_back(Tensor::zeros({N}, DType::F32, Device::CUDA));
    Tensor out = Tensor::empty({N, d}, DType::F32, Device::CUDA);
    Tensor probs = Tensor::empty({N, kk}, DType::F32, Device::CUDA);
    REQUIRE_THROWS_WITH(kern::mix_forward(out, probs, s.w_d, s.src_d, rs),
                        Catch::Contains("mix_forward: 65 sources exceed") &&
                            Catch::Contains("capacity of 64"));
    Tensor dw = Tensor::zeros({d}, DType::F32, Device::CUDA);
    std::vector<Tensor> ds = s.src_d;
    REQUIRE_THROWS_WITH(kern::mix_backward(ds, dw, out, s.w_d, s.src_d, rs, probs),
                        Catch::Contains("mix_backward: 65 sources exceed"));
  }
  {
    const int64_t N = 1, d = 8200;
    MixSetup s = make_setup(N, d, 1, DType::F32, 71000);
    std::vector<Tensor> rs{Tensor::zeros({N}, DType::F32, Device::CUDA)};
    Tensor out = Tensor::empty({N, d}, DType::F32, Device::CUDA);
    Tensor probs = Tensor::empty({N, 1}, DType::F32, Device::CUDA);
    REQUIRE_THROWS_WITH(kern::mix_forward(out, probs, s.w_d, s.src_d, rs),
                        Catch::Contains("d = 8200 exceeds"));
  }
}

namespace {

// Phase 1 with Q queries (lse and its gradient included) against the CPU in
// F64 on the same values: outputs, probs, lse; dsources (accumulated into
// random values), dws (as increments).
void check_group(int64_t N, int64_t d, int64_t kk, int64_t Q, DType dt, uint64_t seed) {
  INFO("N=" << N << " d=" << d << " k=" << kk << " Q=" << Q << " " << dtype_name(dt));
  const double tol = gt::tol(dt);
  MixSetup s = make_setup(N, d, kk, dt, seed);
  const std::vector<Tensor> src64 = to_f64(s.src_h);
  const std::vector<Tensor> rs32 = rstds_f32(s), rs64 = to_f64(rs32), rs_d = on_device(rs32);
  std::vector<Tensor> w_h, w_d, w64;
  for (int64_t q = 0; q < Q; ++q) {
    w_h.push_back(gt::randn_f32({d}, seed + 100 + q, 2.0 / std::sqrt(double(d))));
    w_d.push_back(gt::to_device(w_h.back(), dt));
    w64.push_back(w_h.back().to(DType::F64));
  }
  std::vector<Tensor> out_ref, out_d;
  for (int64_t q = 0; q < Q; ++q) {
    out_ref.push_back(Tensor::empty({N, d}, DType::F64));
    out_d.push_back(gt::poisoned({N, d}, dt));
  }
  Tensor probs_ref = Tensor::empty({Q, N, kk}, DType::F64), lse_ref = Tensor::empty({Q, N}, DType::F64);
  Tensor probs = gt::poisoned({Q, N, kk}, DType::F32), lse = gt::poisoned({Q, N}, DType::F32);
  kern::mix_forward(out_ref, probs_ref, &lse_ref, w64, src64, rs64);
  kern::mix_forward(out_d, probs, &lse, w_d, s.src_d, rs_d);
  for (int64_t q = 0; q < Q; ++q) {
    CHECK(gt::rel_l2(gt::to_host_f32(out_d[q]), out_ref[q]) < tol);
    CHECK(gt::bf16_outliers(dt, gt::to_host_f32(out_d[q]), out_ref[q], 2,
                            mix_terms(probs_ref, src64, q), 1) == "");
  }
  CHECK(gt::rel_l2(probs.to(Device::CPU), probs_ref) < gt::kTolF32);
  CHECK(gt::rel_l2(lse.to(Device::CPU), lse_ref) < gt::kTolF32);

  // Backward from the CPU's probs (rounded to F32) on both sides.
  const Tensor probs32 = probs_ref.to(DType::F32);
  std::vector<Tensor> dout_d, dout64, ds_d, ds_ref, dw_d, dw_ref;
  for (int64_t q = 0; q < Q; ++q) {
    Tensor dout = gt::randn_f32({N, d}, seed + 200 + q);
    dout_d.push_back(gt::to_device(dout, dt));
    dout64.push_back(dout.to(DType::F64));
    dw_d.push_back(Tensor::zeros({d}, DType::F32, Device::CUDA));
    dw_ref.push_back(Tensor::zeros({d}, DType::F64));
  }
  std::vector<Tensor> ds0_64;
  for (int64_t j = 0; j < kk; ++j) {
    Tensor ds0 = gt::randn_f32({N, d}, seed + 300 + j, 0.5);
    ds_d.push_back(gt::to_device(ds0, dt));
    ds_ref.push_back(ds0.to(DType::F64));
    ds0_64.push_back(ds_ref.back().clone());
  }
  Tensor dlse = gt::randn_f32({Q, N}, seed + 400);
  const Tensor dlse64 = dlse.to(DType::F64);
  kern::mix_backward(ds_ref, dw_ref, dout64, &dlse64, w64, src64, rs64, probs32.to(DType::F64));
  const Tensor dlse_d = dlse.to(Device::CUDA);
  kern::mix_backward(ds_d, dw_d, dout_d, &dlse_d, w_d, s.src_d, rs_d, probs32.to(Device::CUDA));
  for (int64_t j = 0; j < kk; ++j) {
    INFO("dsource " << j);
    CHECK(gt::rel_l2(gt::to_host_f32(ds_d[j]), ds_ref[j]) < tol);
    CHECK(gt::bf16_outliers(dt, gt::to_host_f32(ds_d[j]), ds_ref[j], 2,
                            gt::max_increment(ds_ref[j], ds0_64[j]), 1) == "");
  }
  for (int64_t q = 0; q < Q; ++q) {
    INFO("dw " << q);
    CHECK(gt::rel_l2(dw_d[q].to(Device::CPU), dw_ref[q]) < tol);
    CHECK(gt::bf16_outliers(dt, dw_d[q].to(Device::CPU), dw_ref[q], 2, gt::max_abs(dw_ref[q]), 4) == "");
  }
}

// The merge with m recent sources fused with RMSNorm, forward and backward,
// against the CPU in F64. The recent sources' gradients start from random
// values (they accumulate).
void check_merge(int64_t N, int64_t d, int64_t m, DType dt, uint64_t seed) {
  INFO("N=" << N << " d=" << d << " m=" << m << " " << dtype_name(dt));
  const double tol = gt::tol(dt);
  const int64_t ns = 2 * m + 2;
  Tensor o = gt::randn_f32({N, d}, seed);
  Tensor w = gt::randn_f32({d}, seed + 2, 2.0 / std::sqrt(double(d)));
  Tensor g = gt::randn_f32({d}, seed + 6, 0.3);
  for (int64_t c = 0; c < d; ++c) g.data<float>()[c] += 1.0f;
  Tensor lse = gt::randn_f32({N}, seed + 3);
  std::vector<Tensor> e, e_d, e64, de0, de_ref, de_d;
  for (int64_t j = 0; j < m; ++j) {
    e.push_back(gt::randn_f32({N, d}, seed + 10 + j, 1.5 + 0.25 * double(j)));
    e_d.push_back(gt::to_device(e[j], dt));
    e64.push_back(e[j].to(DType::F64));
    de0.push_back(gt::randn_f32({N, d}, seed + 40 + j, 0.5));
    de_d.push_back(gt::to_device(de0[j], dt));  // rounds de0[j] in place first
    de_ref.push_back(de0[j].to(DType::F64));
  }
  const Tensor o_d = gt::to_device(o, dt), w_d = gt::to_device(w, dt);
  const Tensor g_d = gt::to_device(g, dt), lse_d = lse.to(Device::CUDA);
  const Tensor o64 = o.to(DType::F64), w64 = w.to(DType::F64), g64 = g.to(DType::F64);
  Tensor u_ref = Tensor::empty({N, d}, DType::F64), st_ref = Tensor::empty({N, ns}, DType::F64);
  kern::mix_merge_norm_forward(u_ref, st_ref, w64, o64, lse.to(DType::F64), e64, g64, kMixEps);
  Tensor u = gt::poisoned({N, d}, dt), st = gt::poisoned({N, ns}, DType::F32);
  kern::mix_merge_norm_forward(u, st, w_d, o_d, lse_d, e_d, g_d, kMixEps);
  CHECK(gt::rel_l2(gt::to_host_f32(u), u_ref) < tol);
  // u = g x rstd(x), x the merged row: relative to the row's terms, for which
  // the tensor-wide max |u| stands in (see mix_terms' comment).
  CHECK(gt::bf16_outliers(dt, gt::to_host_f32(u), u_ref, 2, gt::max_abs(u_ref), 1) == "");
  CHECK(gt::rel_l2(st.to(Device::CPU), st_ref) < gt::kTolF32);

  // Backward from the CPU's stats (rounded to F32) on both sides.
  const Tensor st32 = st_ref.to(DType::F32);
  Tensor du = gt::randn_f32({N, d}, seed + 4);
  const Tensor du_d = gt::to_device(du, dt);  // rounds du in place: both sides read the same values
  Tensor do_ref = Tensor::empty({N, d}, DType::F64), dlse_ref = Tensor::empty({N}, DType::F64);
  Tensor dw_ref = Tensor::zeros({d}, DType::F64), dg_ref = Tensor::zeros({d}, DType::F64);
  kern::mix_merge_norm_backward(do_ref, dlse_ref, de_ref, dw_ref, dg_ref, du.to(DType::F64), w64,
                             o64, e64, g64, st32.to(DType::F64));
  Tensor do_d = gt::poisoned({N, d}, dt), dlse_d = gt::poisoned({N}, DType::F32);
  Tensor dw_d = Tensor::zeros({d}, DType::F32, Device::CUDA);
  Tensor dg_d = Tensor::zeros({d}, DType::F32, Device::CUDA);
  kern::mix_merge_norm_backward(do_d, dlse_d, de_d, dw_d, dg_d, du_d, w_d, o_d, e_d,
                             g_d, st32.to(Device::CUDA));
  CHECK(gt::rel_l2(gt::to_host_f32(do_d), do_ref) < tol);
  CHECK(gt::rel_l2(dlse_d.to(Device::CPU), dlse_ref) < tol);
  CHECK(gt::bf16_outliers(dt, gt::to_host_f32(do_d), do_ref, 2, gt::max_abs(do_ref), 1) == "");
  CHECK(gt::bf16_outliers(dt, dlse_d.to(Device::CPU), dlse_ref, 2, gt::max_abs(dlse_ref), 1) == "");
  for (int64_t j = 0; j < m; ++j) {
    INFO("recent source " << j);
    CHECK(gt::rel_l2(gt::to_host_f32(de_d[j]), de_ref[j]) < tol);
    CHECK(gt::bf16_outliers(dt, gt::to_host_f32(de_d[j]), de_ref[j], 2,
                            gt::max_increment(de_ref[j], de0[j]), 1) == "");
  }
  CHECK(gt::rel_l2(dw_d.to(Device::CPU), dw_ref) < tol);
  CHECK(gt::rel_l2(dg_d.to(Device::CPU), dg_ref) < tol);
  CHECK(gt::bf16_outliers(dt, dw_d.to(Device::CPU), dw_ref, 2, gt::max_abs(dw_ref), 4) == "");
  CHECK(gt::bf16_outliers(dt, dg_d.to(Device::CPU), dg_ref, 2, gt::max_abs(dg_ref), 4) == "");
}

}  // namespace

TEST_CASE("cuda mix with Q queries (phase 1) matches the CPU", "[gpu][mix]") {
  uint64_t seed = 70000;
  struct C { int64_t N, d, kk, Q; };
  // warp and block rows; Q = 17 spans two launches of at most 16 queries;
  // Full AttnRes's late Mix groups (many sources, G queries: only part of the
  // sources fit the backward's shared-memory cache).
  for (const C& c : {C{300, 768, 4, 3}, C{37, 36, 2, 17}, C{5, 2048, 3, 2}, C{16384, 768, 8, 3},
                     C{4096, 768, 43, 7}, C{5, 2048, 30, 6}})
    for (DType dt : {DType::F32, DType::BF16}) check_group(c.N, c.d, c.kk, c.Q, dt, seed += 1000);
}

TEST_CASE("cuda mix: both kernel families (rows, warp) match the CPU", "[gpu][mix]") {
  // bf16 rows with d % 4 == 0 and d <= 4096 take the rows kernels
  // (kernels/mix_rows.h: a block per row) by default, the warp kernels with
  // ATTNRES_MIX_KERNELS=warp; fp32 and the other shapes always the warp
  // kernels. Phase 1 forward and backward: Q = 1 (the final Mix) and many,
  // Q = 11 spans two rows launches (of at most 8 queries), k = 1 and
  // k = 43, 64 as Full AttnRes's late groups, d = 36 and 1000 (d % 8 != 0),
  // 4096 (1024 threads). The merge: m = 1 (Block) to 8 (the rows kernels'
  // most) and 9 (the warp kernel under either setting).
  struct C { int64_t N, d, kk, Q; };
  for (const char* kernel : {"rows", "warp"}) {
    ScopedEnv env("ATTNRES_MIX_KERNELS", kernel);
    INFO("ATTNRES_MIX_KERNELS=" << kernel);
    uint64_t seed = 75000;
    for (const C& c : {C{300, 768, 4, 3}, C{37, 64, 2, 11}, C{5, 2048, 3, 2}, C{999, 1024, 8, 6},
                       C{4096, 768, 43, 7}, C{40, 1024, 64, 8}, C{17, 1000, 5, 1},
                       C{33, 36, 1, 2}, C{9, 4096, 9, 1}, C{3000, 768, 21, 4}, C{71, 772, 6, 5}})
      check_group(c.N, c.d, c.kk, c.Q, DType::BF16, seed += 1000);
    for (int64_t m : {int64_t(1), int64_t(2), int64_t(5), int64_t(8), int64_t(9)})
      check_merge(3000, 768, m, DType::BF16, seed += 100);
    check_merge(257, 36, 1, DType::BF16, seed += 100);
    check_merge(257, 1000, 3, DType::BF16, seed += 100);
    check_merge(65, 4096, 2, DType::BF16, seed += 100);
  }
  // Any other value is an error that names the variable.
  ScopedEnv env("ATTNRES_MIX_KERNELS", "fast");
  REQUIRE_THROWS_WITH(check_group(8, 64, 2, 2, DType::BF16, 76000),
                      Catch::Contains("ATTNRES_MIX_KERNELS = 'fast': expected rows or warp"));
}

namespace {
// Runs body(dt) under both kernel families (ATTNRES_MIX_KERNELS = rows, warp)
// in both dtypes.
template <typename Body>
void for_each_family_and_dtype(Body&& body) {
  for (const char* kernel : {"rows", "warp"})
    for (DType dt : {DType::BF16, DType::F32}) {
      ScopedEnv env("ATTNRES_MIX_KERNELS", kernel);
      INFO("ATTNRES_MIX_KERNELS=" << kernel << " " << dtype_name(dt));
      body(dt);
    }
}

// A Mix group on the device: make_setup's kk sources [N, d] (seed), their
// rstds (rstds_f32), and the phase 1 forward of Q random queries w_q (seed +
// 100 + q; |w| ~ 2 / sqrt(d), as make_setup's): outputs, probs and lse.
struct MixGroup {
  MixSetup s;
  std::vector<Tensor> rs_d;
  std::vector<Tensor> ws, outs;
  Tensor probs, lse;
};
MixGroup group_forward(int64_t N, int64_t d, int64_t kk, int64_t Q, DType dt, uint64_t seed) {
  MixGroup g{make_setup(N, d, kk, dt, seed), {}, {}, {}, {}, {}};
  g.rs_d = on_device(rstds_f32(g.s));
  for (int64_t q = 0; q < Q; ++q) {
    Tensor w = gt::randn_f32({d}, seed + 100 + q, 2.0 / std::sqrt(double(d)));
    g.ws.push_back(gt::to_device(w, dt));
    g.outs.push_back(gt::poisoned({N, d}, dt));
  }
  g.probs = gt::poisoned({Q, N, kk}, DType::F32);
  g.lse = gt::poisoned({Q, N}, DType::F32);
  kern::mix_forward(g.outs, g.probs, &g.lse, g.ws, g.s.src_d, g.rs_d);
  return g;
}
}  // namespace

TEST_CASE("cuda mix backward with Store::Set writes what zeroing then adding gives", "[gpu][mix]") {
  // The head's final Mix writes its sources' and partial's gradients
  // (kernels/store.h): over poisoned (NaN) buffers, never read under Set, the
  // same bits as Add into zeros, in both kernel families; Q = 11 spans two
  // rows launches (the first writes, the second adds).
  for_each_family_and_dtype([](DType dt) {
    const int64_t N = 301, d = 768, kk = 9, Q = 11;
    const MixGroup g = group_forward(N, d, kk, Q, dt, 78000);
    std::vector<Tensor> douts;
    for (int64_t q = 0; q < Q; ++q) {
      Tensor dy = gt::randn_f32({N, d}, 78200 + q);
      douts.push_back(gt::to_device(dy, dt));
    }
    const Tensor dlse = gt::randn_f32({Q, N}, 78300).to(Device::CUDA);
    std::vector<Tensor> ds[2], dws[2];
    for (int r = 0; r < 2; ++r) {
      for (int64_t j = 0; j < kk; ++j)
        ds[r].push_back(r == 0 ? Tensor::zeros({N, d}, dt, Device::CUDA) : gt::poisoned({N, d}, dt));
      for (int64_t q = 0; q < Q; ++q) dws[r].push_back(Tensor::zeros({d}, DType::F32, Device::CUDA));
      kern::mix_backward(ds[r], dws[r], douts, &dlse, g.ws, g.s.src_d, g.rs_d, g.probs,
                         r == 0 ? kern::Store::Add : kern::Store::Set);
    }
    for (int64_t j = 0; j < kk; ++j) CHECK(gt::same_bits(ds[0][j], ds[1][j]));
    for (int64_t q = 0; q < Q; ++q) CHECK(gt::same_bits(dws[0][q], dws[1][q]));

    // The merge's recent source (Block AttnRes's partial sum at the head).
    std::vector<Tensor> rec{g.s.src_d[0]};
    Tensor gain_h = gt::randn_f32({d}, 78400);
    const Tensor gain = gt::to_device(gain_h, dt), lse0 = g.lse.rows(0, 1).reshape({N});
    Tensor st = gt::poisoned({N, 4}, DType::F32), u = gt::poisoned({N, d}, dt);
    kern::mix_merge_norm_forward(u, st, g.ws[0], g.outs[0], lse0, rec, gain, kMixEps);
    std::vector<Tensor> de[2];
    Tensor d_o[2], dl[2], dwm[2], dg[2];
    for (int r = 0; r < 2; ++r) {
      de[r].push_back(r == 0 ? Tensor::zeros({N, d}, dt, Device::CUDA) : gt::poisoned({N, d}, dt));
      d_o[r] = gt::poisoned({N, d}, dt);
      dl[r] = gt::poisoned({N}, DType::F32);
      dwm[r] = Tensor::zeros({d}, DType::F32, Device::CUDA);
      dg[r] = Tensor::zeros({d}, DType::F32, Device::CUDA);
      kern::mix_merge_norm_backward(d_o[r], dl[r], de[r], dwm[r], dg[r], douts[0], g.ws[0],
                                    g.outs[0], rec, gain, st,
                                    r == 0 ? kern::Store::Add : kern::Store::Set);
    }
    CHECK(gt::same_bits(de[0][0], de[1][0]));
    CHECK(gt::same_bits(dwm[0], dwm[1]));
  });
}

TEST_CASE("cuda mix: a query's results do not depend on the queries beside it", "[gpu][mix]") {
  // kernels/mix.h: the Q queries of one call give each query, bit for bit,
  // what it gives alone (so a Mix group split over calls repeats itself).
  for_each_family_and_dtype([](DType dt) {
    const int64_t N = 513, d = 768, kk = 7, Q = 5;
    const MixGroup g = group_forward(N, d, kk, Q, dt, 77000);
    const Tensor ph = g.probs.to(Device::CPU), lh = g.lse.to(Device::CPU);
    for (int64_t q = 0; q < Q; ++q) {
      INFO("query " << q);
      std::vector<Tensor> one_w{g.ws[q]}, one_out{gt::poisoned({N, d}, dt)};
      Tensor p1 = gt::poisoned({1, N, kk}, DType::F32), l1 = gt::poisoned({1, N}, DType::F32);
      kern::mix_forward(one_out, p1, &l1, one_w, g.s.src_d, g.rs_d);
      CHECK(gt::same_bits(one_out[0], g.outs[q]));
      const Tensor p1h = p1.to(Device::CPU), l1h = l1.to(Device::CPU);
      CHECK(std::memcmp(p1h.raw(), ph.data<float>() + q * N * kk, sizeof(float) * N * kk) == 0);
      CHECK(std::memcmp(l1h.raw(), lh.data<float>() + q * N, sizeof(float) * N) == 0);
    }
    // The backward: each query's dw, summed from per-block partials whose
    // chunking is fixed by N alone (mix_common.cuh partial_grid), is the same
    // bits with the others beside it (their shared memory, so the kernel's
    // occupancy, differs) as alone. N = 513 > 512 blocks: a block sums 2 rows.
    std::vector<Tensor> douts, ds_all, dw_all;
    for (int64_t q = 0; q < Q; ++q) {
      Tensor dy = gt::randn_f32({N, d}, 77500 + q);
      douts.push_back(gt::to_device(dy, dt));
      dw_all.push_back(Tensor::zeros({d}, DType::F32, Device::CUDA));
    }
    for (int64_t j = 0; j < kk; ++j) ds_all.push_back(Tensor::zeros({N, d}, dt, Device::CUDA));
    kern::mix_backward(ds_all, dw_all, douts, &g.lse, g.ws, g.s.src_d, g.rs_d, g.probs);
    for (int64_t q = 0; q < Q; ++q) {
      INFO("query " << q << "'s dw alone");
      std::vector<Tensor> ds1, dw1{Tensor::zeros({d}, DType::F32, Device::CUDA)};
      for (int64_t j = 0; j < kk; ++j) ds1.push_back(Tensor::zeros({N, d}, dt, Device::CUDA));
      const Tensor p1 = g.probs.rows(q, 1), l1 = g.lse.rows(q, 1);
      kern::mix_backward(ds1, dw1, Span<const Tensor>(&douts[q], 1), &l1,
                         Span<const Tensor>(&g.ws[q], 1), g.s.src_d, g.rs_d, p1);
      CHECK(gt::same_bits(dw1[0], dw_all[q]));
    }
  });
}

TEST_CASE("cuda mix merge + rmsnorm (phase 2) matches the CPU", "[gpu][mix]") {
  uint64_t seed = 80000;
  // warp rows, block rows, d not a multiple of 8; one recent source (Block
  // AttnRes's partial) and several (a Full AttnRes group). N = 20000 spans
  // more rows than the backward's grid, so groups take several rows each.
  for (int64_t d : {int64_t(36), int64_t(768), int64_t(4100)})
    for (int64_t m : {int64_t(1), int64_t(5)})
      for (DType dt : {DType::F32, DType::BF16}) check_merge(257, d, m, dt, seed += 100);
  check_merge(20000, 768, 1, DType::BF16, seed += 100);
  check_merge(20000, 768, 6, DType::BF16, seed += 100);
}
