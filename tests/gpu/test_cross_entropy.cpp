// CUDA fused LM head + cross-entropy vs the CPU op on the same values: loss,
// dh and dw (accumulated into random values), F32 and BF16 (F32 dw), odd
// sizes (V = 97, d = 36, N = 13), several row chunks with V a multiple of 4
// and not, the realistic size (N = 16384, V = 50304, d = 768), optional
// gradients, bad target ids, and bitwise repeatability.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "gpu_testing.h"
#include "kernels/cross_entropy.h"

using namespace attnres;
namespace gt = attnres::gpu_testing;
namespace kern = attnres::kernels;

namespace {

struct CeCase {
  int64_t N, V, d;
};

// GPU op in `dt` vs the CPU op in `ref` (F64, or F32 for the largest shapes)
// on the same (bf16-rounded where dt is BF16) values.
void check_ce(const CeCase& c, DType dt, DType ref, uint64_t seed) {
  INFO("N=" << c.N << " V=" << c.V << " d=" << c.d << " " << dtype_name(dt) << " ref "
            << dtype_name(ref));
  const DType gdt = dt == DType::BF16 ? DType::F32 : dt;
  const double gs = 0.37;
  // w ~ N(0, 1/d): logits of order 1, a softmax neither flat nor one-hot.
  Tensor h = gt::randn_f32({c.N, c.d}, seed), w = gt::randn_f32({c.V, c.d}, seed + 1, 1.0 / std::sqrt(double(c.d)));
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

  // Loss only: the same loss bits; each gradient alone: the same gradient bits.
  const double loss_only = kern::lm_head_cross_entropy(hd, wd, tgd, nullptr, nullptr, 0.0);
  CHECK(std::memcmp(&loss_only, &loss, sizeof loss) == 0);
  Tensor dh_only = gt::to_device(dh0, dt), dw_only = gt::to_device(dw0, gdt);
  kern::lm_head_cross_entropy(hd, wd, tgd, &dh_only, nullptr, gs);
  kern::lm_head_cross_entropy(hd, wd, tgd, nullptr, &dw_only, gs);
  CHECK(gt::same_bits(dh_only, dhd));
  CHECK(gt::same_bits(dw_only, dwd));
}

}  // namespace

TEST_CASE("cuda lm_head_cross_entropy matches the CPU on small and odd sizes", "[gpu][cross_entropy]") {
  uint64_t seed = 500;
  for (const CeCase& c : {CeCase{13, 97, 36}, CeCase{1, 5, 3}, CeCase{64, 1000, 128},
                          CeCase{200, 4099, 768}})
    for (DType dt : {DType::F32, DType::BF16}) check_ce(c, dt, DType::F64, seed += 10);
}

TEST_CASE("cuda lm_head_cross_entropy over several row chunks", "[gpu][cross_entropy]") {
  // A 512 MiB fp32 logits chunk holds 512 rows at V = 2^18: N = 1100 gives
  // chunks of 512, 512 and 76 rows. V odd takes the scalar row pass.
  uint64_t seed = 600;
  for (const CeCase& c : {CeCase{1100, 262144, 16}, CeCase{1100, 262139, 20}})
    for (DType dt : {DType::F32, DType::BF16}) check_ce(c, dt, DType::F64, seed += 10);
}

TEST_CASE("cuda lm_head_cross_entropy at the realistic size", "[gpu][cross_entropy]") {
  // N = 16384 tokens, GPT-2 vocabulary, d = 768: 4 chunks, 3 of 5248 rows and
  // one of 640 (1 GiB of fp32 logits per chunk).
  // The CPU reference runs in F32 here (an F64 one would take minutes).
  check_ce(CeCase{16384, 50304, 768}, DType::BF16, DType::F32, 700);
}

TEST_CASE("cuda lm_head_cross_entropy is bitwise repeatable", "[gpu][cross_entropy]") {
  const int64_t N = 3000, V = 50304, d = 64;  // two chunks at V = 50304
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtype_name(dt));
    const DType gdt = dt == DType::BF16 ? DType::F32 : dt;
    Tensor h = gt::randn_f32({N, d}, 800), w = gt::randn_f32({V, d}, 801, 0.125);
    Tensor hd = gt::to_device(h, dt), wd = gt::to_device(w, dt);
    Tensor tgd = testing::random_tokens(N, V, 802).to(Device::CUDA);
    double loss[2];
    Tensor dh[2], dw[2];
    for (int r = 0; r < 2; ++r) {
      dh[r] = Tensor::zeros({N, d}, dt, Device::CUDA);
      dw[r] = Tensor::zeros({V, d}, gdt, Device::CUDA);
      loss[r] = kern::lm_head_cross_entropy(hd, wd, tgd, &dh[r], &dw[r], 1.0 / N);
    }
    CHECK(std::memcmp(&loss[0], &loss[1], sizeof(double)) == 0);
    CHECK(gt::same_bits(dh[0], dh[1]));
    CHECK(gt::same_bits(dw[0], dw[1]));
  }
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
