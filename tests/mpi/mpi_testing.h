// Helpers for the tests that run under mpirun (label mpi). Every rank runs
// every test case in the same order; checks are made collective (values
// reduced over all ranks first) so that all ranks pass or fail together and
// rank 0's report says what happened. Only rank 0 writes to stdout.
#pragma once
#include <cmath>
#include <exception>
#include <functional>
#include <string>

#include "parallel/mpi.h"

namespace attnres::testing {

// The world communicator of the test binary (MPI is initialised by main_mpi.cpp).
inline const parallel::Comm& world() {
  static const parallel::Comm w = parallel::Comm::world();
  return w;
}

// Run a test body that talks to other ranks. An exception on one rank would
// leave the others blocked in a collective, so it ends the job (with the
// rank's message) instead of unwinding into Catch2.
inline void guarded(const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    parallel::MpiSession::abort(1, std::string("test failed with an exception: ") + e.what());
  }
}

// Largest value over all ranks (for differences). A NaN on any rank makes
// the result infinite: MPI_MAX may drop a NaN, depending on rank order.
inline double max_over_ranks(double v) {
  if (std::isnan(v)) v = INFINITY;
  world().allreduce_max(&v, 1);
  return v;
}

// Groups of `k` consecutive world ranks (color = rank / k); empty when the
// world size is not a multiple of k.
inline parallel::Comm group_of(int k) {
  return world().split(world().rank() / k, world().rank() % k);
}

}  // namespace attnres::testing
