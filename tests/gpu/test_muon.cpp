// CUDA Muon (kernels/muon.h: Newton-Schulz and the update, from the GEMM and
// elementwise ops) against the CPU op on the same random inputs: wide, tall
// and square matrices, fp32 weights, and fp32 masters with their bf16 copy.
#include <catch2/catch.hpp>

#include "gpu_testing.h"
#include "kernels/muon.h"

using namespace attnres;
using namespace attnres::gpu_testing;
namespace kern = attnres::kernels;

TEST_CASE("cuda muon update matches the CPU", "[gpu][muon]") {
  for (auto [m, n] : {std::pair<int64_t, int64_t>{64, 96}, {96, 64}, {48, 48}, {1, 40}, {200, 8}}) {
    for (bool lowp : {false, true}) {
      INFO(m << " x " << n << (lowp ? ", fp32 master with a bf16 copy" : ", fp32"));
      Tensor w = randn_f32({m, n}, 1, 0.05), g = randn_f32({m, n}, 2), buf = randn_f32({m, n}, 3, 0.5);
      Tensor wd = w.to(Device::CUDA), gd = g.to(Device::CUDA), bd = buf.to(Device::CUDA);
      Tensor low = poisoned({m, n}, DType::BF16);
      const kern::MuonStep st{0.02, 0.95, 0.1, 0.7};
      kern::muon_update(wd, gd, bd, st, lowp ? &low : nullptr);
      kern::muon_update(w, g, buf, st);
      // Newton-Schulz is five rounds of three GEMMs each: fp32 GEMMs that sum
      // in another order (cuBLASLt's tiles) stay within 1e-5 of the CPU's.
      CHECK(rel_l2(to_host_f32(wd), w) < 1e-5);
      CHECK(rel_l2(to_host_f32(bd), buf) < 1e-6);
      if (lowp) CHECK(same_bits(low.to(Device::CPU), wd.to(Device::CPU).to(DType::BF16)));
    }
  }
}
