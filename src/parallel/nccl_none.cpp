// Stand-in for parallel/cuda/nccl_transport.cu in builds without CUDA + NCCL + MPI.
#include "core/build_config.h"
#include "core/error.h"
#include "parallel/nccl_transport.h"

#if !(ATTNRES_HAVE_CUDA && ATTNRES_HAVE_NCCL && ATTNRES_HAVE_MPI)
namespace attnres::parallel {

bool nccl_compiled() { return false; }
std::string nccl_version() { return ""; }
std::unique_ptr<Transport> make_nccl_transport(const ProcessGrid&) {
  fail(
      "config key parallel.transport: this build has no NCCL transport (it needs the CUDA "
      "backend, NCCL and MPI when configured); use parallel.transport = \"mpi\"");
}

}  // namespace attnres::parallel
#endif
