// The NCCL transport (docs/parallel.md "Transports"): ncclSend/ncclRecv on
// device memory, each directed link between two pipeline ranks with its own
// two-rank communicator and stream, ordered against the compute stream with
// events; a "wait" makes the compute stream wait for the operation's event,
// so the host never blocks. Collectives: one communicator per pipeline (the
// tied-embedding exchange) and one per data-parallel group (D replicas of a
// stage), each bootstrapped by broadcasting an ncclUniqueId over the
// matching MPI communicator. Data-parallel sums are ncclAllReduce (identical
// results on every member).
//
// Compiled only with the CUDA backend, NCCL and MPI; elsewhere
// make_nccl_transport() throws a message naming what is missing.
#pragma once
#include <memory>

#include "parallel/mpi.h"
#include "parallel/transport.h"

namespace attnres::parallel {

bool nccl_compiled();
// NCCL's version as "2.28.9", or "" without NCCL.
std::string nccl_version();
std::unique_ptr<Transport> make_nccl_transport(const ProcessGrid& grid);

}  // namespace attnres::parallel
