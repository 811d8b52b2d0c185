// Catch2 runner for the mpirun tests: one MPI session for the whole binary,
// test output from rank 0 only, and the exit code agreed by all ranks.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "core/log.h"
#include "kernels/cpu/blas_cores.h"
#include "mpi_testing.h"

int main(int argc, char** argv) {
  attnres::kernels::cpu::select_blas_kernels(argv);  // before MPI: may re-run this program
  attnres::parallel::MpiSession session;
  attnres::init_logging(session.world_rank());
  if (session.world_rank() != 0 && !std::freopen("/dev/null", "w", stdout)) return 1;
  const int rc = Catch::Session().run(argc, argv);
  int64_t worst = rc;
  attnres::testing::world().allreduce_max(&worst, 1);
  return static_cast<int>(worst);
}
