// Catch2 runner shared by the CPU test binaries. Like the attnres binary, it
// first lets the BLAS kernels fit the CPU (kernels/cpu/blas_cores.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "kernels/cpu/blas_cores.h"

int main(int argc, char** argv) {
  attnres::kernels::cpu::select_blas_kernels(argv);
  return Catch::Session().run(argc, argv);
}
