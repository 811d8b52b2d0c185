// CUDA AdamW against the CPU op, step after step on the same state: p, m and v
// agree bit for bit (the CPU loop is compiled without FMA contraction, see
// src/CMakeLists.txt, and the kernel does the CPU's operations in the CPU's
// precisions), and the bf16 copy of p is p rounded to nearest even.
#include <catch2/catch.hpp>
#include <cstdint>

#include "adamw_testing.h"
#include "gpu_testing.h"
#include "kernels/adamw.h"
#include "kernels/reduce.h"

using namespace attnres;
using namespace attnres::gpu_testing;
namespace kern = attnres::kernels;

TEST_CASE("cuda adamw matches the CPU bit for bit over several steps", "[gpu][adamw]") {
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(5), int64_t(4096), int64_t(100003)})
    for (bool offset : {false, true})
      for (bool decay : {true, false})
        for (bool lowp : {false, true}) {
          INFO("n=" << n << " offset=" << offset << " decay=" << decay << " lowp=" << lowp);
          const int64_t b = offset ? 1 : 0;
          // State on the CPU and, at an offset when asked, on the GPU.
          Tensor p = randn_f32({n + 1}, 1 + n).rows(b, n).clone();
          Tensor m = Tensor::zeros({n}), v = Tensor::zeros({n});
          Tensor dp = Tensor::empty({n + 1}, DType::F32, Device::CUDA).rows(b, n);
          Tensor dm = Tensor::empty({n + 1}, DType::F32, Device::CUDA).rows(b, n);
          Tensor dv = Tensor::empty({n + 1}, DType::F32, Device::CUDA).rows(b, n);
          dp.copy_from(p.to(Device::CUDA));
          dm.zero_();
          dv.zero_();
          Tensor dlow = poisoned({n + 1}, DType::BF16).rows(b, n);

          kern::AdamWStep step{3e-3, 0.9, 0.95, 1e-8, 0.1, 0};
          for (int t = 1; t <= 6; ++t) {
            step.t = t;
            step.lr = 3e-3 * (1.0 - 0.1 * t);  // a schedule: the scalars change each step
            Tensor g = randn_f32({n + 1}, 100 * t + n, t == 3 ? 1e-6 : 1.0).rows(b, n).clone();
            Tensor dg = Tensor::empty({n + 1}, DType::F32, Device::CUDA).rows(1 - b, n);
            dg.copy_from(g.to(Device::CUDA));  // g at the other alignment

            kern::adamw_update(p, g, m, v, step, decay);
            kern::adamw_update(dp, dg, dm, dv, step, decay, lowp ? &dlow : nullptr);
            INFO("step " << t);
            REQUIRE(same_bits(dm, m));
            REQUIRE(same_bits(dv, v));
            REQUIRE(same_bits(dp, p));
          }
          if (lowp) {
            // The bf16 copy is the GPU's own fp32 p, rounded to nearest even.
            REQUIRE(same_bits(dlow, dp.to(Device::CPU).to(DType::BF16)));
          }
        }
}

TEST_CASE("cuda adamw is bitwise repeatable", "[gpu][adamw]") {
  const int64_t n = 77777;
  Tensor p0 = randn_f32({n}, 5), g = randn_f32({n}, 6);
  kern::AdamWStep step{1e-3, 0.9, 0.999, 1e-8, 0.01, 4};
  Tensor out[2];
  for (auto& o : out) {
    Tensor p = p0.to(Device::CUDA), dg = g.to(Device::CUDA);
    Tensor m = randn_f32({n}, 7, 0.1).to(Device::CUDA);
    Tensor v = randn_f32({n}, 8, 0.1).to(Device::CUDA);
    // v must be >= 0: square it on the host first.
    Tensor vh = v.to(Device::CPU);
    for (int64_t i = 0; i < n; ++i) vh.data<float>()[i] *= vh.data<float>()[i];
    v.copy_from(vh);
    kern::adamw_update(p, dg, m, v, step, true);
    o = p.to(Device::CPU);
  }
  REQUIRE(same_bits(out[0], out[1]));
}

TEST_CASE("cuda adamw's grad_scale equals scaling the gradient first, bit for bit", "[gpu][adamw]") {
  const int64_t n = 4099;  // vector body and a scalar tail
  const Tensor p0 = randn_f32({n}, 15), g0 = randn_f32({n}, 16), m0 = randn_f32({n}, 17, 0.1);
  Tensor vh = randn_f32({n}, 18, 0.1);
  for (int64_t i = 0; i < n; ++i) vh.data<float>()[i] *= vh.data<float>()[i];
  kern::AdamWStep s{1e-3, 0.9, 0.95, 1e-8, 0.1, 3};
  s.grad_scale = 0.3711;
  testing::check_grad_scale_folds(p0.to(Device::CUDA), g0.to(Device::CUDA), m0.to(Device::CUDA),
                                  vh.to(Device::CUDA), s);
}

TEST_CASE("cuda adamw_update_each equals one update per parameter, bit for bit", "[gpu][adamw]") {
  // 40 parameters (two launch batches), mixed sizes, empty and misaligned
  // ones, with and without decay and a bf16 copy.
  const int64_t sizes[] = {768, 1, 0, 50304 * 3, 4099, 2048 * 768 + 3};
  kern::AdamWStep s{1e-3, 0.9, 0.95, 1e-8, 0.1, 5};
  s.grad_scale = 0.5;
  struct Param {
    Tensor p, g, m, v, lowp;
    bool decay, has_lowp;
  };
  auto make = [&](int i) {
    const int64_t n = sizes[i % 6];
    const int64_t off = i % 4 == 3 ? 1 : 0;  // every fourth one starts misaligned
    Param q;
    q.p = randn_f32({n + 1}, 100 + i).to(Device::CUDA).rows(off, n);
    q.g = randn_f32({n + 1}, 200 + i).to(Device::CUDA).rows(off, n);
    q.m = randn_f32({n + 1}, 300 + i, 0.1).to(Device::CUDA).rows(off, n);
    Tensor vh = randn_f32({n + 1}, 400 + i, 0.1);
    for (int64_t j = 0; j <= n; ++j) vh.data<float>()[j] *= vh.data<float>()[j];
    q.v = vh.to(Device::CUDA).rows(off, n);
    q.lowp = Tensor::empty({n}, DType::BF16, Device::CUDA);
    q.decay = i % 2 == 0;
    q.has_lowp = i % 3 != 0;
    return q;
  };
  std::vector<Param> a, b;
  for (int i = 0; i < 40; ++i) {
    a.push_back(make(i));
    b.push_back(make(i));
  }
  std::vector<kern::AdamWTensors> batch;
  for (Param& q : a)
    batch.push_back({&q.p, &q.g, &q.m, &q.v, q.decay, q.has_lowp ? &q.lowp : nullptr});
  kern::adamw_update_each(batch, s);
  for (Param& q : b) kern::adamw_update(q.p, q.g, q.m, q.v, s, q.decay, q.has_lowp ? &q.lowp : nullptr);
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(same_bits(a[i].p, b[i].p));
    REQUIRE(same_bits(a[i].m, b[i].m));
    REQUIRE(same_bits(a[i].v, b[i].v));
    if (a[i].has_lowp) REQUIRE(same_bits(a[i].lowp, b[i].lowp));
  }
}
