#include <catch2/catch.hpp>

#include "core/rng.h"
#include "kernels/cuda/device.h"

TEST_CASE("CUDA toolchain: axpy on the device matches the host", "[gpu]") {
  const int n = 1000;
  std::vector<float> a(n), b(n);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(attnres::random_normal(1, 1, i));
    b[i] = static_cast<float>(attnres::random_normal(1, 2, i));
  }
  auto out = attnres::cuda::axpy_on_device(a, b, 1.5f);
  for (int i = 0; i < n; ++i) REQUIRE(out[i] == Approx(a[i] * 1.5f + b[i]).epsilon(1e-6));
}
