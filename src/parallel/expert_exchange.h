// Expert parallelism's exchange (model::ExpertExchange) over a rank's expert
// group (ProcessGrid::experts): the per-expert row counts as a host
// all-to-all on MPI, the token rows through the transport (MPI_Alltoallv on
// host memory, grouped ncclSend/ncclRecv on the device).
#pragma once
#include "model/model.h"
#include "parallel/mpi.h"
#include "parallel/transport.h"

namespace attnres::parallel {

class GroupExpertExchange : public model::ExpertExchange {
 public:
  GroupExpertExchange(const ProcessGrid& grid, Transport& transport)
      : grid_(grid), transport_(transport) {}
  int members() const override { return grid_.EP(); }
  std::vector<int64_t> counts(const std::vector<int64_t>& mine) override {
    return grid_.experts().alltoall(mine);
  }
  void rows(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
            const std::vector<int64_t>& recv_rows) override {
    transport_.all_to_all(send, send_rows, recv, recv_rows);
  }

 private:
  const ProcessGrid& grid_;
  Transport& transport_;
};

}  // namespace attnres::parallel
