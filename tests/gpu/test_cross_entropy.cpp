// CUDA fused LM head + cross-entropy vs the CPU op on the same values: loss,
// dh and dw (accumulated into random values), F32 and BF16 (F32 dw), odd
// sizes (V = 97, d = 36, N = 13), several row chunks with V a multiple of 4
// and not, the realistic size (N = 16384, V = 50304, d = 768), optional
// gradients, bad target ids, and bitwise repeatability. Every BF16 case also
// runs with bf16 logits (training.logits) against the same fp32/fp64 CPU
// reference, with logits of order 1 and of order 30.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "gpu_testing.h"
#include "kernels/cross_entropy.h"
#include "kernels/matmul.h"

using namespace attnres;
namespace gt = attnres::gpu_testing;
namespace kern = attnres::kernels;

namespace {

struct CeCase {
  int64_t N, V, d;
  // Standard deviation of the logits: 1 (a softmax neither flat nor one-hot)
  // or ~6, whose largest logits (~30) are what a trained model's look like and
  // lose the most to bf16 rounding (up to 0.0625 in [16, 32)).
  double logit_std = 1.0;
};

// max_v |h_n . w_v| of every row n (host F32 h, w; the logits in fp32 on the
// device, 256 rows at a time).
std::vector<double> row_max_abs_logit(const Tensor& h, const Tensor& w) {
  const int64_t N = h.dim(0), V = w.dim(0), rows = 256;
  const Tensor hd = h.to(Device::CUDA), wd = w.to(Device::CUDA);
  std::vector<double> out(static_cast<size_t>(N));
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t m = std::min(rows, N - r0);
    Tensor z = Tensor::empty({m, V}, DType::F32, Device::CUDA);
    kern::matmul_forward(z, hd.rows(r0, m), wd);
    const Tensor zh = z.to(Device::CPU);
    const float* p = zh.data<float>();
    for (int64_t i = 0; i < m; ++i) {
      double mx = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, std::fabs(double(p[i * V + v])));
      out[static_cast<size_t>(r0 + i)] = mx;
    }
  }
  return out;
}

// For the element-wise bf16 bounds (gpu_testing.h) of dh = dh0 + gs dz W,
// dz = softmax(z) - onehot(target) rounded to bf16 (and, with bf16 logits, z
// rounded to bf16 first). The terms of dh[n, c] are gs sum_v |dz_nv| |w_vc|
// <= gs 2 colmax_c, colmax_c = max_v |w_vc|, since sum_v |dz_nv| = 2 (1 -
// p_nt) <= 2: the dlogits' rounding moves dh[n, c] by at most 2^-8 of that.
// bf16 logits move each logit by at most 2^-8 |z_v| <= 2^-8 zmax_n, so each
// probability by a factor within exp(+-2^-7 zmax_n) (the log-sum-exp moves by
// at most 2^-8 zmax_n too), and dh[n, c] by at most gs colmax_c (exp(2^-7
// zmax_n) - 1): in units of 2^-8, 2^8 (exp(2^-7 zmax_n) - 1) more terms (2
// zmax_n for small zmax_n; ~68 for zmax_n = 30). `zmax` empty: fp32 logits.
Tensor dh_terms(const Tensor& w, double gs, int64_t N, const std::vector<double>& zmax) {
  const int64_t V = w.dim(0), d = w.dim(1);
  std::vector<double> colmax(static_cast<size_t>(d), 0.0);
  for (int64_t v = 0; v < V; ++v)
    for (int64_t c = 0; c < d; ++c)
      colmax[c] = std::max(colmax[c], std::fabs(double(w.data<float>()[v * d + c])));
  Tensor t = Tensor::empty({N, d}, DType::F64);
  for (int64_t n = 0; n < N; ++n) {
    const double logits = zmax.empty() ? 0.0 : std::ldexp(std::expm1(std::ldexp(zmax[n], -7)), 8);
    for (int64_t c = 0; c < d; ++c) t.data<double>()[n * d + c] = gs * colmax[c] * (2 + logits);
  }
  return t;
}

// GPU op in `dt` vs the CPU op in `ref` (F64, or F32 for the largest shapes)
// on the same (bf16-rounded where dt is BF16) values; for BF16 also with bf16
// logits against the same reference.
void check_ce(const CeCase& c, DType dt, DType ref, uint64_t seed) {
  INFO("N=" << c.N << " V=" << c.V << " d=" << c.d << " logit std " << c.logit_std << " "
            << dtype_name(dt) << " ref " << dtype_name(ref));
  const DType gdt = dt == DType::BF16 ? DType::F32 : dt;
  const double gs = 0.37;
  // w ~ N(0, logit_std^2 / d): logits ~ N(0, logit_std^2).
  Tensor h = gt::randn_f32({c.N, c.d}, seed),
         w = gt::randn_f32({c.V, c.d}, seed + 1, c.logit_std / std::sqrt(double(c.d)));
  Tensor tg = testing::random_tokens(c.N, c.V, seed + 2);
  Tensor dh0 = gt::randn_f32({c.N, c.d}, seed + 3, 0.3), dw0 = gt::randn_f32({c.V, c.d}, seed + 4, 0.3);
  Tensor hd = gt::to_device(h, dt), wd = gt::to_device(w, dt), tgd = tg.to(Device::CUDA);
  Tensor dhd = gt::to_device(dh0, dt), dwd = gt::to_device(dw0, gdt);

  Tensor hr = h.to(ref), wr = w.to(ref), dh_ref = dh0.to(ref), dw_ref = dw0.to(ref);
  const double loss_ref = kern::lm_head_cross_entropy(hr, wr, tg, &dh_ref, &dw_ref, gs);

  const double loss = kern::lm_head_cross_entropy(hd, wd, tgd, &dhd, &dwd, gs);
  CHECK(std::fabs(loss - loss_ref) / std::fabs(loss_ref) < (dt == DType::BF16 ? 1e-4 : 1e-5));
  CHECK(gt::rel_l2(gt::to_host_f32(dhd), dh_ref) < gt::tol(dt));
  CHECK(gt::rel_l2(gt::to_host_f32(dwd), dw_ref) < gt::tol(dt));
  // Element-wise (gpu_testing.h): dh (bf16, one rounding of the stored sum:
  // c_ref = 2) against the dlogits' terms above with c_terms = 2, twice the
  // worst case. dw is fp32 but sums bf16 dlogits: its increment dw - dw0
  // (dw0 ~ 0.3 would hide it) against the largest increment, c_terms = 4 (a
  // stand-in: the terms gs sum_n |dz_nv| |h_nc| need the softmax, and the
  // dlogits' roundings over n add like a random walk).
  const Tensor dw0_64 = dw0.to(DType::F64);
  const Tensor dw_inc_ref = gt::minus(dw_ref, dw0_64);
  if (dt == DType::BF16) {
    CHECK(gt::bf16_outliers(dt, gt::to_host_f32(dhd), dh_ref, 2, dh_terms(w, gs, c.N, {}), 2) == "");
    CHECK(gt::bf16_outliers(dt, gt::minus(gt::to_host_f32(dwd), dw0_64), dw_inc_ref, 2,
                            gt::max_abs(dw_inc_ref), 4) == "");
  }

  // Loss only: the same loss bits; each gradient alone: the same gradient bits.
  const double loss_only = kern::lm_head_cross_entropy(hd, wd, tgd, nullptr, nullptr, 0.0);
  CHECK(std::memcmp(&loss_only, &loss, sizeof loss) == 0);
  Tensor dh_only = gt::to_device(dh0, dt), dw_only = gt::to_device(dw0, gdt);
  kern::lm_head_cross_entropy(hd, wd, tgd, &dh_only, nullptr, gs);
  kern::lm_head_cross_entropy(hd, wd, tgd, nullptr, &dw_only, gs);
  CHECK(gt::same_bits(dh_only, dhd));
  CHECK(gt::same_bits(dw_only, dwd));
  if (dt != DType::BF16) return;

  // bf16 logits. Loss: a row's loss lse(z) - z_t moves by at most 2 max_v |dz_v|
  // when its logits z move by dz (lse is 1-Lipschitz in the max norm), and
  // rounding to bf16 moves a logit by at most 2^-8 |z_v| (8 significant bits,
  // round to nearest), so the summed loss is within sum_n 2^-7 max_v |z_nv|
  // of the fp32-logit loss, plus the fp32 arithmetic's 1e-4 relative (the
  // BF16 bound above). Worst case, not typical: the roundings' signs vary.
  // dh, dw: dlogits were bf16 already (the BF16 tolerance above); the
  // logits' rounding moves each softmax value by a relative ~2^-8 |z|, small
  // against the one-hot term that dominates the gradients' norms.
  INFO("bf16 logits");
  const std::vector<double> zmax = row_max_abs_logit(h, w);
  double bound = 1e-4 * std::fabs(loss_ref);
  for (const double m : zmax) bound += std::ldexp(m, -7);
  Tensor dh16 = gt::to_device(dh0, dt), dw16 = gt::to_device(dw0, gdt);
  const double loss16 =
      kern::lm_head_cross_entropy(hd, wd, tgd, &dh16, &dw16, gs, kern::Store::Add, DType::BF16);
  CHECK(std::fabs(loss16 - loss_ref) <= bound);
  CHECK(gt::rel_l2(gt::to_host_f32(dh16), dh_ref) < gt::kTolBF16);
  CHECK(gt::rel_l2(gt::to_host_f32(dw16), dw_ref) < gt::kTolBF16);
  // Element-wise: dh with the bf16 logits' extra terms per row (dh_terms);
  // dw's increment with the largest row's factor on the same stand-in as above.
  double zmax_all = 0;
  for (const double m : zmax) zmax_all = std::max(zmax_all, m);
  CHECK(gt::bf16_outliers(dt, gt::to_host_f32(dh16), dh_ref, 2, dh_terms(w, gs, c.N, zmax), 2) == "");
  CHECK(gt::bf16_outliers(dt, gt::minus(gt::to_host_f32(dw16), dw0_64), dw_inc_ref, 2,
                          gt::max_abs(dw_inc_ref),
                          4 + 2 * std::ldexp(std::expm1(std::ldexp(zmax_all, -7)), 8)) == "");
  // Loss only, and each gradient alone: the same bits as all at once.
  const double loss16_only =
      kern::lm_head_cross_entropy(hd, wd, tgd, nullptr, nullptr, 0.0, kern::Store::Add, DType::BF16);
  CHECK(std::memcmp(&loss16_only, &loss16, sizeof loss16) == 0);
  Tensor dh16_only = gt::to_device(dh0, dt), dw16_only = gt::to_device(dw0, gdt);
  kern::lm_head_cross_entropy(hd, wd, tgd, &dh16_only, nullptr, gs, kern::Store::Add, DType::BF16);
  kern::lm_head_cross_entropy(hd, wd, tgd, nullptr, &dw16_only, gs, kern::Store::Add, DType::BF16);
  CHECK(gt::same_bits(dh16_only, dh16));
  CHECK(gt::same_bits(dw16_only, dw16));
}

}  // namespace

TEST_CASE("cuda lm_head_cross_entropy matches the CPU on small and odd sizes", "[gpu][cross_entropy]") {
  uint64_t seed = 500;
  // V = 1004 is a multiple of 4, not of 8: fp32 logits take 16-byte packs,
  // bf16 logits the scalar row pass.
  for (const CeCase& c : {CeCase{13, 97, 36}, CeCase{1, 5, 3}, CeCase{64, 1000, 128},
                          CeCase{64, 1004, 128}, CeCase{200, 4099, 768}})
    for (DType dt : {DType::F32, DType::BF16}) check_ce(c, dt, DType::F64, seed += 10);
}

TEST_CASE("cuda lm_head_cross_entropy with bf16 logits of a trained model's size", "[gpu][cross_entropy]") {
  // Logits ~ N(0, 36): the largest near 30, rounded by up to 0.0625 in bf16;
  // V = 50304 (16-byte bf16 packs) and V = 4099 (odd: the scalar row pass).
  uint64_t seed = 550;
  for (const CeCase& c : {CeCase{300, 50304, 768, 6.0}, CeCase{200, 4099, 768, 6.0},
                          CeCase{37, 97, 36, 6.0}})
    check_ce(c, DType::BF16, DType::F64, seed += 10);
}

TEST_CASE("cuda lm_head_cross_entropy over several row chunks", "[gpu][cross_entropy]") {
  // A 1 GiB fp32 logits chunk holds 1024 rows at V = 2^18: N = 1100 gives
  // chunks of 1024 and 76 rows. V odd takes the scalar row pass.
  uint64_t seed = 600;
  for (const CeCase& c : {CeCase{1100, 262144, 16}, CeCase{1100, 262139, 20}})
    for (DType dt : {DType::F32, DType::BF16}) check_ce(c, dt, DType::F64, seed += 10);
}

TEST_CASE("cuda lm_head_cross_entropy with bf16 logits over several row chunks", "[gpu][cross_entropy]") {
  // A 1 GiB chunk of bf16 logits holds 256 rows at V = 2^21 (and at 2^21 - 3):
  // N = 600 gives chunks of 256, 256 and 88 rows (fp32 logits: 128-row chunks).
  // The CPU reference runs in F32 (F64 would take minutes at this size).
  uint64_t seed = 650;
  for (const CeCase& c : {CeCase{600, 2097152, 8}, CeCase{600, 2097149, 8}})
    check_ce(c, DType::BF16, DType::F32, seed += 10);
}

TEST_CASE("cuda lm_head_cross_entropy at the realistic size", "[gpu][cross_entropy]") {
  // N = 16384 tokens, GPT-2 vocabulary, d = 768: 4 chunks, 3 of 5248 rows and
  // one of 640 (1 GiB of fp32 logits per chunk); with bf16 logits 2 chunks,
  // of 10624 and 5760 rows.
  // The CPU reference runs in F32 here (an F64 one would take minutes).
  check_ce(CeCase{16384, 50304, 768}, DType::BF16, DType::F32, 700);
}

TEST_CASE("cuda lm_head_cross_entropy is bitwise repeatable", "[gpu][cross_entropy]") {
  // Two chunks at V = 50304 with fp32 logits; with bf16 logits N = 12000
  // makes two (10624 + 1376 rows).
  const int64_t V = 50304, d = 64;
  struct Run {
    DType dt, logits;
    int64_t N;
  };
  for (const Run& run : {Run{DType::F32, DType::F32, 3000}, Run{DType::BF16, DType::F32, 3000},
                         Run{DType::BF16, DType::BF16, 12000}}) {
    const DType dt = run.dt;
    const int64_t N = run.N;
    INFO(dtype_name(dt) << ", " << dtype_name(run.logits) << " logits");
    const DType gdt = dt == DType::BF16 ? DType::F32 : dt;
    Tensor h = gt::randn_f32({N, d}, 800), w = gt::randn_f32({V, d}, 801, 0.125);
    Tensor hd = gt::to_device(h, dt), wd = gt::to_device(w, dt);
    Tensor tgd = testing::random_tokens(N, V, 802).to(Device::CUDA);
    double loss[2];
    Tensor dh[2], dw[2];
    for (int r = 0; r < 2; ++r) {
      dh[r] = Tensor::zeros({N, d}, dt, Device::CUDA);
      dw[r] = Tensor::zeros({V, d}, gdt, Device::CUDA);
      loss[r] = kern::lm_head_cross_entropy(hd, wd, tgd, &dh[r], &dw[r], 1.0 / N, kern::Store::Add,
                                            run.logits);
    }
    CHECK(std::memcmp(&loss[0], &loss[1], sizeof(double)) == 0);
    CHECK(gt::same_bits(dh[0], dh[1]));
    CHECK(gt::same_bits(dw[0], dw[1]));
    if (run.logits == DType::BF16) {
      // The bf16 path really ran: rounding the logits moved the loss.
      const double loss32 = kern::lm_head_cross_entropy(hd, wd, tgd, nullptr, nullptr, 0.0);
      CHECK(loss32 != loss[0]);
    }
  }
}

TEST_CASE("cuda lm_head_cross_entropy refuses bf16 logits of fp32 inputs", "[gpu][cross_entropy]") {
  Tensor hd = gt::randn_f32({13, 36}, 970).to(Device::CUDA);
  Tensor wd = gt::randn_f32({97, 36}, 971).to(Device::CUDA);
  Tensor tgd = testing::random_tokens(13, 97, 972).to(Device::CUDA);
  REQUIRE_THROWS_WITH(
      kern::lm_head_cross_entropy(hd, wd, tgd, nullptr, nullptr, 0.0, kern::Store::Add, DType::BF16),
      Catch::Contains("bf16 logits need BF16 h and w on cuda, got F32 on cuda"));
}

TEST_CASE("cuda lm_head_cross_entropy names the first target outside the vocabulary", "[gpu][cross_entropy]") {
  const int64_t N = 13, V = 97, d = 36;
  Tensor hd = gt::randn_f32({N, d}, 900).to(Device::CUDA);
  Tensor wd = gt::randn_f32({V, d}, 901).to(Device::CUDA);
  Tensor tg = testing::random_tokens(N, V, 902);
  tg.data<int32_t>()[9] = -3;
  tg.data<int32_t>()[5] = 97;
  Tensor tgd = tg.to(Device::CUDA);
  Tensor dh = Tensor::zeros({N, d}, DType::F32, Device::CUDA);
  Tensor dw = Tensor::zeros({V, d}, DType::F32, Device::CUDA);
  REQUIRE_THROWS_WITH(kern::lm_head_cross_entropy(hd, wd, tgd, &dh, &dw, 1.0),
                      Catch::Contains("lm_head_cross_entropy: target id 97 at position 5 is "
                                      "outside the vocabulary [0, 97)"));
  REQUIRE_THROWS_AS(kern::lm_head_cross_entropy(hd, wd, tgd, nullptr, nullptr, 0.0), Error);
  tg.data<int32_t>()[5] = 0;
  REQUIRE_THROWS_WITH(kern::lm_head_cross_entropy(hd, wd, tg.to(Device::CUDA), nullptr, nullptr, 0.0),
                      Catch::Contains("target id -3 at position 9"));
  // The same check with bf16 logits (the row kernel's other instantiation).
  Tensor h = gt::randn_f32({N, d}, 900), w = gt::randn_f32({V, d}, 901);
  Tensor h16 = gt::to_device(h, DType::BF16), w16 = gt::to_device(w, DType::BF16);
  REQUIRE_THROWS_WITH(kern::lm_head_cross_entropy(h16, w16, tg.to(Device::CUDA), nullptr, nullptr, 0.0,
                                                  kern::Store::Add, DType::BF16),
                      Catch::Contains("target id -3 at position 9"));
  // The device is still usable after the error.
  tg.data<int32_t>()[9] = 1;
  const double loss = kern::lm_head_cross_entropy(hd, wd, tg.to(Device::CUDA), nullptr, nullptr, 0.0);
  REQUIRE(std::isfinite(loss));
}

TEST_CASE("cuda lm_head_cross_entropy of no rows is 0", "[gpu][cross_entropy]") {
  Tensor hd = Tensor::empty({0, 8}, DType::F32, Device::CUDA);
  Tensor wd = gt::randn_f32({11, 8}, 950).to(Device::CUDA);
  Tensor tgd = Tensor::empty({0}, DType::I32, Device::CUDA);
  Tensor dh = Tensor::empty({0, 8}, DType::F32, Device::CUDA);
  Tensor dw = Tensor::zeros({11, 8}, DType::F32, Device::CUDA);
  REQUIRE(kern::lm_head_cross_entropy(hd, wd, tgd, &dh, &dw, 1.0) == 0.0);
}
