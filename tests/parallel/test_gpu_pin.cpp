// Rank-to-GPU pinning (parallel/mpi.h) on the launch set-ups of real
// clusters: each rank takes device (local rank mod the GPUs it sees), and the
// node's ranks decide from the PCI bus ids of the GPUs they took whether they
// share one. Pure functions: no GPU needed.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/scoped_env.h"
#include "parallel/mpi.h"

using attnres::ScopedEnv;
using attnres::parallel::GpuPin;
using attnres::parallel::gpu_index_for;
using attnres::parallel::gpu_sharing;
using attnres::parallel::launcher_local_rank;
using attnres::parallel::pin_gpu_before_mpi;
using attnres::parallel::plan_node_gpus;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "(unset)";
}

// Bus ids of an 8-GPU node, in the driver's order.
const std::vector<std::string> kNode = {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0",
                                        "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0",
                                        "0000:ba:00.0", "0000:db:00.0"};
const std::string& gpu(int i) { return kNode.at(static_cast<size_t>(i)); }
}  // namespace

TEST_CASE("GPU pinning: all GPUs visible, one rank per GPU", "[gpu_pin]") {
  // mpirun -np 8 on an 8-GPU node: every rank sees all eight and takes its own.
  const std::vector<std::vector<std::string>> visible(8, kNode);
  const auto pins = plan_node_gpus(visible);
  REQUIRE(pins.size() == 8);
  for (int r = 0; r < 8; ++r) {
    const GpuPin& p = pins[static_cast<size_t>(r)];
    CHECK(p.local_rank == r);
    CHECK(p.index == r);
    CHECK(p.bus_id == gpu(r));
    CHECK(p.sharing == 1);
    CHECK(p.warning.empty());
  }
  // Fewer ranks than GPUs: the first ones.
  const auto two = plan_node_gpus({kNode, kNode});
  CHECK(two[1].bus_id == gpu(1));
  CHECK(two[1].sharing == 1);
}

TEST_CASE("GPU pinning: one GPU per rank (Slurm --gpus-per-task, Kubernetes)", "[gpu_pin]") {
  // Each rank sees only its own GPU, as its device 0: four different GPUs,
  // not four ranks on one (what counting visible devices alone concluded).
  const std::vector<std::vector<std::string>> visible = {{gpu(4)}, {gpu(5)}, {gpu(6)}, {gpu(7)}};
  const auto pins = plan_node_gpus(visible);
  for (int r = 0; r < 4; ++r) {
    const GpuPin& p = pins[static_cast<size_t>(r)];
    CHECK(p.index == 0);
    CHECK(p.bus_id == gpu(4 + r));
    CHECK(p.sharing == 1);
    CHECK(p.warning.empty());
  }
  // Two GPUs per task (--gpus-per-task=2): rank r takes device r mod 2 of its own pair.
  const auto pairs = plan_node_gpus({{gpu(0), gpu(1)}, {gpu(2), gpu(3)}});
  CHECK(pairs[0].bus_id == gpu(0));
  CHECK(pairs[1].bus_id == gpu(3));
  CHECK(pairs[0].sharing == 1);
  CHECK(pairs[1].sharing == 1);
}

TEST_CASE("GPU pinning: several ranks per GPU share it, with a warning", "[gpu_pin]") {
  // 4 ranks, one GPU visible to all (a 1-GPU machine, or the tests' layouts).
  const auto one = plan_node_gpus(std::vector<std::vector<std::string>>(4, {gpu(0)}));
  for (const GpuPin& p : one) {
    CHECK(p.index == 0);
    CHECK(p.sharing == 4);
    CHECK(p.warning.find("4 processes of this job on this node share 1 GPU ") != std::string::npos);
    CHECK(p.warning.find("NCCL refuses") != std::string::npos);
  }
  // 3 ranks on 2 GPUs: ranks 0 and 2 on the first, rank 1 alone on the
  // second; every rank has the node's warning, with the same text.
  const auto three = plan_node_gpus(std::vector<std::vector<std::string>>(3, {gpu(1), gpu(0)}));
  CHECK(three[0].bus_id == gpu(1));
  CHECK(three[1].bus_id == gpu(0));
  CHECK(three[2].bus_id == gpu(1));
  CHECK(three[0].sharing == 2);
  CHECK(three[1].sharing == 1);
  CHECK(three[2].sharing == 2);
  CHECK(!three[1].warning.empty());
  CHECK(three[0].warning == three[1].warning);
  CHECK(three[1].warning.find("share 2 GPUs (up to 2 per GPU") != std::string::npos);
  // Two ranks shown the same GPU under different device numbers (each its
  // own CUDA_VISIBLE_DEVICES): the bus id finds them out.
  const auto hidden = plan_node_gpus({{gpu(3)}, {gpu(2), gpu(3)}});
  CHECK(hidden[0].index == 0);
  CHECK(hidden[1].index == 1);
  CHECK(hidden[0].sharing == 2);
  CHECK(hidden[1].sharing == 2);
}

TEST_CASE("GPU pinning: the index rule and the sharing count alone", "[gpu_pin]") {
  CHECK(gpu_index_for(0, 8) == 0);
  CHECK(gpu_index_for(9, 8) == 1);
  CHECK(gpu_index_for(3, 1) == 0);
  CHECK(gpu_index_for(2, 0) == -1);  // no GPU visible
  const GpuPin p = gpu_sharing(2, {gpu(0), gpu(1), gpu(0), "(none)"});
  CHECK(p.local_rank == 2);
  CHECK(p.bus_id == gpu(0));
  CHECK(p.sharing == 2);
  CHECK(!p.warning.empty());
  CHECK_THROWS(gpu_sharing(4, {gpu(0)}));  // not a rank of the node
}

TEST_CASE("GPU pinning: the launcher's local rank, before MPI_Init", "[gpu_pin]") {
  ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_RANK"), slurm("SLURM_LOCALID"),
      hydra("MPI_LOCALRANKID"), mv2("MV2_COMM_WORLD_LOCAL_RANK");
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID",
                        "MV2_COMM_WORLD_LOCAL_RANK"})
    unsetenv(v);
  CHECK(launcher_local_rank() == -1);
  setenv("SLURM_LOCALID", "3", 1);
  CHECK(launcher_local_rank() == 3);
  setenv("MPI_LOCALRANKID", "5", 1);
  CHECK(launcher_local_rank() == 3);  // srun's own variable first
  unsetenv("SLURM_LOCALID");
  CHECK(launcher_local_rank() == 5);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);  // Open MPI's mpirun inside a Slurm job
  setenv("SLURM_LOCALID", "0", 1);
  CHECK(launcher_local_rank() == 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x1", 1);  // not a number: the next one
  CHECK(launcher_local_rank() == 0);
}

TEST_CASE("GPU pinning: eager kernel loading where NCCL may run", "[gpu_pin]") {
  ScopedEnv loading("CUDA_MODULE_LOADING"), ompi("OMPI_COMM_WORLD_LOCAL_RANK"),
      slurm("SLURM_LOCALID"), hydra("MPI_LOCALRANKID"), mv2("MV2_COMM_WORLD_LOCAL_RANK");
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID",
                        "MV2_COMM_WORLD_LOCAL_RANK"})
    unsetenv(v);
  unsetenv("CUDA_MODULE_LOADING");
  // The MPI transport: lazy loading, CUDA's default, stays. No launcher
  // variable: nothing is chosen before MPI_Init.
  CHECK(pin_gpu_before_mpi(/*nccl=*/false) == -1);
  CHECK(env("CUDA_MODULE_LOADING") == "(unset)");
  // NCCL possible: every kernel loaded up front (set before CUDA starts).
  CHECK(pin_gpu_before_mpi(/*nccl=*/true) == -1);
  CHECK(env("CUDA_MODULE_LOADING") == "EAGER");
  // A user's own setting wins.
  setenv("CUDA_MODULE_LOADING", "LAZY", 1);
  pin_gpu_before_mpi(/*nccl=*/true);
  CHECK(env("CUDA_MODULE_LOADING") == "LAZY");
}
