// CUDA SwiGLU forward and backward on gate | up rows against the CPU op, F32
// and BF16, widths that are not multiples of the vector width (no packs),
// row slices at unaligned offsets.
#include <catch2/catch.hpp>

#include "gpu_testing.h"
#include "kernels/swiglu.h"

using namespace attnres;
using namespace attnres::gpu_testing;
namespace kern = attnres::kernels;

TEST_CASE("cuda swiglu forward and backward match the CPU", "[gpu][swiglu]") {
  struct Size {
    int64_t N, F;
  };
  for (DType dt : {DType::F32, DType::BF16})
    for (Size s : {Size{0, 8}, Size{1, 1}, Size{3, 5}, Size{17, 96}, Size{33, 131}, Size{64, 1024}})
      for (int layout : {0, 1, 2}) {  // aligned, all misaligned, mixed
        const bool offset = layout == 1;
        INFO(dtype_name(dt) << " N=" << s.N << " F=" << s.F << " layout=" << layout);
        Pair gu = random_pair({s.N, 2 * s.F}, dt, 1, offset, 1.5);

        Tensor h = poisoned_at({s.N, s.F}, dt, layout >= 1);
        kern::swiglu_forward(h, gu.dev);
        Tensor h_cpu = Tensor::empty({s.N, s.F});
        kern::swiglu_forward(h_cpu, gu.host);
        REQUIRE(rel_l2(to_host_f32(h), h_cpu) < tol(dt));
        // Element-wise (gpu_testing.h): h = silu(g) u is a product, its error
        // relative to itself (one bf16 rounding, expf against exp): c_ref = 2.
        REQUIRE(bf16_outliers(dt, to_host_f32(h), h_cpu, 2, 0.0, 0) == "");

        // Backward accumulates into the existing gradients.
        Pair dh = random_pair({s.N, s.F}, dt, 3, offset, 1.5);
        Pair dgu = random_pair({s.N, 2 * s.F}, dt, 4, layout >= 1, 1.5);
        const Tensor dgu_start = dgu.host.clone();
        kern::swiglu_backward(dgu.dev, dh.dev, gu.dev);
        kern::swiglu_backward(dgu.host, dh.host, gu.host);
        REQUIRE(rel_l2(to_host_f32(dgu.dev), dgu.host) < tol(dt));
        // Element-wise: the stored sums dgu0 + increment, rounded once (c_ref
        // = 2); the gate's increment dh u sigmoid(g) (1 + g (1 - sigmoid(g)))
        // cancels near g = -1.28, so the largest increment stands in for its
        // terms, c_terms = 1.
        REQUIRE(bf16_outliers(dt, to_host_f32(dgu.dev), dgu.host, 2,
                              max_increment(dgu.host, dgu_start), 1) == "");

        // fp32 is much tighter than the shared 1e-5: same formulas, expf vs exp.
        if (dt == DType::F32) {
          REQUIRE(rel_l2(to_host_f32(h), h_cpu) < 1e-6);
          REQUIRE(rel_l2(to_host_f32(dgu.dev), dgu.host) < 1e-6);
        }
      }
}
