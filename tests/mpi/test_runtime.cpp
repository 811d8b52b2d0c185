// The MPI plumbing under the runtime: gathering checkpoint tensors at rank 0,
// bounded waits, and that a failing rank ends the whole job.
#include <catch2/catch.hpp>
#include <cstdlib>

#include "core/error.h"
#include "core/worst.h"
#include "mpi_testing.h"
#include "parallel/mpi_transport.h"
#include "parallel/runtime.h"

using namespace attnres;
using namespace attnres::testing;

TEST_CASE("the grid: rank = replica * P + stage", "[mpi][grid]") {
  if (world().size() != 4) return;
  int64_t bad = 0;
  guarded([&] {
    parallel::ProcessGrid grid(world(), 2, 2);
    const int r = world().rank();
    if (grid.stage() != r % 2 || grid.replica() != r / 2) ++bad;
    if (grid.pipeline().rank() != grid.stage() || grid.pipeline().size() != 2) ++bad;
    if (grid.data().rank() != grid.replica() || grid.data().size() != 2) ++bad;
  });
  CHECK(max_over_ranks(double(bad)) == 0);
  // A layout that doesn't fit the job is an error naming the keys.
  try {
    parallel::ProcessGrid grid(world(), 3, 1);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("parallel.pipeline * parallel.data") &&
                             Catch::Contains("mpirun -np 3"));
  }
}

TEST_CASE("sum_across_replicas gives identical bits on every replica", "[mpi][grid]") {
  if (world().size() % 2 != 0) return;
  double worst = 0;
  guarded([&] {
    parallel::ProcessGrid grid(world(), 1, world().size());
    parallel::MpiTransport tr(grid);
    std::vector<Tensor> ts = {Tensor::empty({5}, DType::F32), Tensor::empty({2, 3}, DType::F64)};
    for (int i = 0; i < 5; ++i)
      ts[0].data<float>()[i] = 0.1f * float(i + 1) * float(grid.replica() + 1);
    for (int i = 0; i < 6; ++i) ts[1].data<double>()[i] = 1.0 / (i + 1 + grid.replica());
    tr.sum_across_replicas(ts);
    // Rank 0's bits, broadcast, compared everywhere.
    std::vector<double> v;
    for (int i = 0; i < 5; ++i) v.push_back(ts[0].data<float>()[i]);
    for (int i = 0; i < 6; ++i) v.push_back(ts[1].data<double>()[i]);
    std::vector<double> root = v;
    world().bcast(root.data(), root.size() * sizeof(double), 0);
    for (size_t i = 0; i < v.size(); ++i) worst = nan_max(worst, std::fabs(v[i] - root[i]));
    // And the value is the sum.
    double want = 0;
    for (int d = 0; d < grid.D(); ++d) want += 0.1 * (d + 1);
    worst = nan_max(worst, std::fabs(v[0] - want) <= 1e-6 ? 0.0 : 1.0);
  });
  CHECK(max_over_ranks(worst) == 0);
}

TEST_CASE("checkpoint tensors gather at rank 0, in rank order", "[mpi][grid]") {
  if (world().size() != 4) return;
  size_t n = 0;
  bool ok = true;
  guarded([&] {
    parallel::ProcessGrid grid(world(), 2, 2);
    model::ModelConfig cfg;
    cfg.vocab_size = 11, cfg.d_model = 8, cfg.n_layers = 2, cfg.n_heads = 2, cfg.n_kv_heads = 1;
    cfg.d_ff = 8;
    parallel::Runtime rt(grid, cfg, DType::F32, Device::CPU, {}, 1, 4);
    std::vector<NamedTensor> mine;
    Tensor t = Tensor::empty({2, 2}, DType::F32);
    for (int i = 0; i < 4; ++i) t.data<float>()[i] = float(world().rank() * 10 + i);
    // Each rank passes what it contributes (the trainer: replica 0's part and
    // its expert group's experts); rank 2 nothing.
    if (world().rank() != 2) mine.push_back({"t" + std::to_string(world().rank()), t});
    const auto all = rt.gather_to_root(mine);
    n = all.size();
    if (world().rank() == 0) {
      ok = n == 3 && all[0].name == "t0" && all[1].name == "t1" && all[2].name == "t3" &&
           all[1].tensor.data<float>()[3] == 13.0f && all[2].tensor.data<float>()[3] == 33.0f &&
           all[1].tensor.shape() == Shape{2, 2};
    } else {
      ok = n == 0;
    }
  });
  CHECK(max_over_ranks(ok ? 0.0 : 1.0) == 0);
}

TEST_CASE("a receive that never completes times out with a message", "[mpi][timeout]") {
  if (world().size() < 2) return;
  std::string message;
  guarded([&] {
    parallel::Comm pair = group_of(2);
    parallel::ProcessGrid grid(pair, 2, 1);
    parallel::MpiTransport tr(grid);
    setenv("ATTNRES_COMM_TIMEOUT_S", "0.5", 1);
    if (grid.stage() == 0) {
      // Stage 1 never sends: the wait must give up.
      parallel::Request r = tr.irecv(Tensor::empty({4}, DType::F32), 1);
      try {
        r.wait();
      } catch (const Error& e) {
        message = e.what();
      }
    }
    unsetenv("ATTNRES_COMM_TIMEOUT_S");
    pair.barrier();
  });
  if (world().rank() % 2 == 0) {
    CHECK_THAT(message, Catch::Contains("timed out") && Catch::Contains("stage 1"));
  }
}

// Not run by default (hidden tag): tests/mpi/failure.sh runs it and checks
// that the job ends with the failing rank's message and a non-zero code.
TEST_CASE("a rank that throws ends the whole job", "[.abort]") {
  guarded([&] {
    if (world().rank() == 1) throw Error("injected failure on purpose");
    // The other ranks wait for rank 1 forever: only the abort ends them.
    world().barrier();
  });
  FAIL("unreachable: the job should have been aborted");
}
