// GPU test runner: exits 77 (CTest "skipped") with a visible message when no
// CUDA device is present, so CPU-only machines report the GPU tests as skipped
// rather than passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "core/device.h"
#include "kernels/cpu/blas_cores.h"

int main(int argc, char** argv) {
  attnres::kernels::cpu::select_blas_kernels(argv);
  int n = attnres::cuda::device_count();
  if (n == 0) {
    std::printf("SKIPPED: no CUDA device found; GPU tests were NOT run.\n");
    return 77;
  }
  std::printf("GPU tests on %s\n", attnres::cuda::device_description().c_str());
  return Catch::Session().run(argc, argv);
}
