// CUDA Muon (kernels/muon.h: Newton-Schulz and the update, from the GEMM and
// elementwise ops) against the CPU op on the same random inputs: wide, tall
// and square matrices, fp32 weights, and fp32 masters with their bf16 copy.
#include <catch2/catch.hpp>

#include "gpu_testing.h"
#include "kernels/muon.h"
#include "kernels/reduce.h"

using namespace attnres;
using namespace attnres::gpu_testing;
namespace kern = attnres::kernels;

namespace {
Tensor scaled_copy(const Tensor& t, double s) {
  Tensor out = t.clone();
  kern::scale_(out, s);
  return out;
}
}  // namespace

TEST_CASE("cuda muon update matches the CPU", "[gpu][muon]") {
  for (auto [m, n] : {std::pair<int64_t, int64_t>{64, 96}, {96, 64}, {48, 48}, {1, 40}, {200, 8}}) {
    for (bool lowp : {false, true}) {
      INFO(m << " x " << n << (lowp ? ", fp32 master with a bf16 copy" : ", fp32"));
      Tensor w = randn_f32({m, n}, 1, 0.05), g = randn_f32({m, n}, 2), buf = randn_f32({m, n}, 3, 0.5);
      Tensor wd = w.to(Device::CUDA), gd = g.to(Device::CUDA), bd = buf.to(Device::CUDA);
      Tensor low = poisoned({m, n}, DType::BF16);
      const kern::MuonStep st{0.02, 0.95, 0.1, 0.7};
      const Tensor w0 = w.clone();
      kern::muon_update(wd, gd, bd, st, lowp ? &low : nullptr);
      kern::muon_update(w, g, buf, st);
      // Newton-Schulz is five rounds of three GEMMs each: fp32 GEMMs that sum
      // in another order (cuBLASLt's tiles) stay within 1e-5 of the CPU's.
      // With a bf16 copy it iterates in bf16 (fp32 accumulation): the update
      // w - w0 within bf16's rounding of the CPU's fp32 one.
      const Tensor w_gpu = to_host_f32(wd);
      if (!lowp) {
        CHECK(rel_l2(w_gpu, w) < 1e-5);
      } else {
        Tensor du_gpu = w_gpu.clone(), du_cpu = w.clone();
        kern::add_(du_gpu, scaled_copy(w0, -1.0));
        kern::add_(du_cpu, scaled_copy(w0, -1.0));
        CHECK(rel_l2(du_gpu, du_cpu) < 3e-2);
      }
      CHECK(rel_l2(to_host_f32(bd), buf) < 1e-6);  // the momentum stays fp32
      if (lowp) CHECK(same_bits(low.to(Device::CPU), wd.to(Device::CPU).to(DType::BF16)));
    }
  }
}

TEST_CASE("cuda newton-schulz iterating in bf16 tracks the CPU's fp32", "[gpu][muon]") {
  for (auto [m, n] : {std::pair<int64_t, int64_t>{64, 96}, {96, 64}, {48, 48}}) {
    INFO(m << " x " << n);
    const Tensor u = randn_f32({m, n}, 4);
    Tensor x_cpu = Tensor::empty({m, n}, DType::F32), x_gpu = Tensor::empty({m, n}, DType::F32, Device::CUDA);
    kern::newton_schulz5(x_cpu, u);
    kern::newton_schulz5(x_gpu, u.to(Device::CUDA), DType::BF16);
    // bf16 inputs round each step's operands to 8 bits of mantissa; the
    // quintic maps singular values into [0.7, 1.2] either way.
    CHECK(rel_l2(to_host_f32(x_gpu), x_cpu) < 3e-2);
  }
}
