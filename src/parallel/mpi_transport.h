// The MPI transport: Isend/Irecv on the pipeline communicator (tag 0, so it
// matches per peer in issue order exactly like NCCL), and the data-parallel
// sums as reduce + broadcast on the data communicator. Host memory; CUDA
// tensors are staged through host copies.
#pragma once
#include <memory>
#include <vector>

#include "core/device.h"
#include "parallel/mpi.h"
#include "parallel/transport.h"

namespace attnres::parallel {

// Host buffers for staging, reused from one step to the next. A pinned
// buffer is only ever filled by copies queued on the compute stream and read
// by the host after a synchronisation, and given back once its last copies
// are queued: its next user's copies run after those, in stream order.
class StagingPool {
 public:
  std::unique_ptr<cuda::HostBuffer> take(size_t bytes, bool pinned);
  void give(std::unique_ptr<cuda::HostBuffer> buffer);

 private:
  std::vector<std::unique_ptr<cuda::HostBuffer>> free_;
};

class MpiTransport : public Transport {
 public:
  explicit MpiTransport(const ProcessGrid& grid);
  std::string name() const override { return "mpi"; }
  bool graph_capturable() const override { return false; }  // the host drives its transfers
  std::unique_ptr<PendingSum> start_sum_across_replicas(std::vector<Tensor> tensors,
                                                        Replicas group) override;
  std::unique_ptr<PendingSum> start_reduce_scatter(Tensor flat, Tensor mine, Replicas group) override;
  void all_gather(const Tensor& mine, Tensor& flat, Replicas group) override;
  void all_to_all(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                  const std::vector<int64_t>& recv_rows) override;
  void sum_with_peer(Tensor& t, int peer) override;

 protected:
  Request send_to(const Tensor& buffer, int peer) override;
  Request recv_from(const Tensor& buffer, int peer) override;

 private:
  const ProcessGrid& grid_;
  StagingPool staging_;  // the data-parallel sums' buffers
};

}  // namespace attnres::parallel
