// CUDA RMSNorm forward and backward against the CPU op, F32 and BF16, with and
// without a gain, widths that are not multiples of the vector width, tensors
// at misaligned offsets, a width whose dgain partial row does not fit in
// shared memory; dgain is reduced in a fixed order, so it repeats bit for bit.
#include <catch2/catch.hpp>

#include "gpu_testing.h"
#include "kernels/rmsnorm.h"

using namespace attnres;
using namespace attnres::gpu_testing;
namespace kern = attnres::kernels;

namespace {

struct Size {
  int64_t N, d;
};
// 13000 floats of dgain partials are over 48 KiB: the global-memory path.
const Size kSizes[] = {{0, 16}, {1, 1}, {3, 7}, {33, 64}, {70, 768}, {5, 4100}, {40, 13000}};

}  // namespace

TEST_CASE("cuda rmsnorm forward matches the CPU", "[gpu][rmsnorm]") {
  const float eps = 1e-5f;
  for (DType dt : {DType::F32, DType::BF16})
    for (Size s : kSizes)
      for (bool with_gain : {true, false})
        for (bool offset : {false, true}) {
          INFO(dtype_name(dt) << " N=" << s.N << " d=" << s.d << " gain=" << with_gain
                              << " offset=" << offset);
          Pair x = random_pair({s.N, s.d}, dt, 1, offset, 2.0);
          Pair g = random_pair({s.d}, dt, 2, offset);
          Tensor y = poisoned_at({s.N, s.d}, dt, offset);
          Tensor rstd = poisoned_at({s.N}, DType::F32, offset);
          kern::rmsnorm_forward(y, rstd, x.dev, with_gain ? &g.dev : nullptr, eps);

          Tensor y_cpu = Tensor::empty({s.N, s.d}), rstd_cpu = Tensor::empty({s.N});
          kern::rmsnorm_forward(y_cpu, rstd_cpu, x.host, with_gain ? &g.host : nullptr, eps);
          REQUIRE(rel_l2(to_host_f32(y), y_cpu) < tol(dt));
          // Element-wise (gpu_testing.h): y = x rstd g is a product, its error
          // relative to itself: one bf16 rounding (2^-8 |y|) and rstd's fp32
          // summation order (the 1e-5 below), so c_ref = 2 and no terms.
          REQUIRE(bf16_outliers(dt, to_host_f32(y), y_cpu, 2, 0.0, 0) == "");
          // rstd is fp32 from the same (rounded) inputs: only the summation order differs.
          REQUIRE(rel_l2(to_host_f32(rstd), rstd_cpu) < 1e-5);
          if (dt == DType::F32) REQUIRE(rel_l2(to_host_f32(y), y_cpu) < 1e-6);
        }
}

TEST_CASE("cuda rmsnorm backward matches the CPU and repeats bit for bit", "[gpu][rmsnorm]") {
  const float eps = 1e-5f;
  for (DType dt : {DType::F32, DType::BF16})
    for (Size s : kSizes)
      for (int gain_mode : {0, 1, 2})  // gain and dgain; gain, no dgain; no gain
        for (bool offset : {false, true}) {
          INFO(dtype_name(dt) << " N=" << s.N << " d=" << s.d << " gain_mode=" << gain_mode
                              << " offset=" << offset);
          const bool with_gain = gain_mode != 2, with_dgain = gain_mode == 0;
          Pair x = random_pair({s.N, s.d}, dt, 11, offset, 2.0);
          Pair g = random_pair({s.d}, dt, 12, offset);
          Pair dy = random_pair({s.N, s.d}, dt, 13, offset);
          // rstd from the forward pass (fp32), the same on both sides.
          Tensor rstd_cpu = Tensor::empty({s.N});
          {
            Tensor y_cpu = Tensor::empty({s.N, s.d});
            kern::rmsnorm_forward(y_cpu, rstd_cpu, x.host, with_gain ? &g.host : nullptr, eps);
          }
          Tensor rstd = Tensor::empty({s.N + 1}, DType::F32, Device::CUDA).rows(offset ? 1 : 0, s.N);
          rstd.copy_from(rstd_cpu.to(Device::CUDA));

          // Gradients accumulate: start both from the same random values.
          Pair dx0 = random_pair({s.N, s.d}, dt, 14, offset);
          Pair dg0 = random_pair({s.d}, DType::F32, 15, offset);  // dgain is fp32 for bf16 too

          const Tensor dx_start = dx0.host.clone();
          Tensor dx_cpu = dx0.host.clone(), dg_cpu = dg0.host.clone();
          kern::rmsnorm_backward(dx_cpu, with_dgain ? &dg_cpu : nullptr, dy.host, x.host, rstd_cpu,
                              with_gain ? &g.host : nullptr);

          Tensor dx_gpu[2], dg_gpu[2];
          for (int rep = 0; rep < 2; ++rep) {
            dx_gpu[rep] = dx0.dev;  // the first run works in place at the (offset) slice
            dg_gpu[rep] = dg0.dev;
            if (rep == 1) {
              dx_gpu[1] = poisoned_at({s.N, s.d}, dt, offset);
              dg_gpu[1] = poisoned_at({s.d}, DType::F32, offset);
              dx_gpu[1].copy_from(dx0.host.to(dt).to(Device::CUDA));
              dg_gpu[1].copy_from(dg0.host.to(Device::CUDA));
            }
            kern::rmsnorm_backward(dx_gpu[rep], with_dgain ? &dg_gpu[rep] : nullptr, dy.dev, x.dev,
                                rstd, with_gain ? &g.dev : nullptr);
            if (rep == 0) {
              dx_gpu[0] = dx_gpu[0].to(Device::CPU).to(Device::CUDA);  // snapshot
              dg_gpu[0] = dg_gpu[0].to(Device::CPU).to(Device::CUDA);
            }
          }
          REQUIRE(rel_l2(to_host_f32(dx_gpu[0]), dx_cpu) < tol(dt));
          // Element-wise: dx = dx0 + rstd (g dy - x rstd^2 mean(g dy x)) in fp32,
          // stored once in bf16 (c_ref = 2); the bracket cancels, so the largest
          // increment stands in for its terms (gpu_testing.h), c_terms = 1.
          REQUIRE(bf16_outliers(dt, to_host_f32(dx_gpu[0]), dx_cpu, 2,
                                max_increment(dx_cpu, dx_start), 1) == "");
          if (dt == DType::F32) REQUIRE(rel_l2(to_host_f32(dx_gpu[0]), dx_cpu) < 1e-5);
          // dgain: fp32 products summed in a fixed order, against the CPU's
          // fp32 products summed in double. Untouched without a dgain.
          REQUIRE(rel_l2(to_host_f32(dg_gpu[0]), dg_cpu) < 1e-5);
          if (!with_dgain) REQUIRE(same_bits(dg_gpu[0], dg0.host));
          REQUIRE(same_bits(dx_gpu[0], dx_gpu[1]));
          REQUIRE(same_bits(dg_gpu[0], dg_gpu[1]));
        }
}
