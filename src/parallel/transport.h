// How tensors move between ranks (docs/parallel.md "Transports"): one interface,
// two implementations. MPI point-to-point on host memory (CPU runs; GPU runs
// staged through host when NCCL cannot be used) and NCCL ncclSend/ncclRecv
// on device memory (parallel/nccl_transport.h).
//
// Point-to-point is tag-less, like NCCL: for every ordered pair of ranks,
// receives match sends in the order they were issued. The schedule
// guarantees identical per-peer order on both sides (parallel/schedule.h);
// the MPI transport additionally checks every received size, so an ordering
// mistake is an error, not silently swapped tensors.
//
// Non-blocking: isend/irecv return a Request; the executor issues one
// group of them (this step's sends and the next step's receives), computes,
// and waits on a receive right before the compute that needs it. A sent
// buffer is kept alive by its Request and must not be written until it completes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace attnres::parallel {

class RequestImpl {
 public:
  virtual ~RequestImpl() = default;
  // Block (bounded, see comm_timeout_seconds()) until the operation completed
  // and its data may be used; throws attnres::Error on failure or timeout.
  virtual void wait() = 0;
  // Called instead of wait() when the request is dropped unfinished (error
  // paths): give up on the operation without blocking.
  virtual void abandon() noexcept = 0;
};

// A pending send or receive. Move-only; dropping one unfinished abandons it
// (only error paths do that: the job is about to end).
class Request {
 public:
  Request() = default;
  explicit Request(std::unique_ptr<RequestImpl> impl) : impl_(std::move(impl)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& o) noexcept {
    if (this != &o) {
      if (impl_) impl_->abandon();
      impl_ = std::move(o.impl_);
    }
    return *this;
  }
  ~Request() {
    if (impl_) impl_->abandon();
  }
  bool pending() const { return impl_ != nullptr; }
  void wait() {
    if (!impl_) return;
    impl_->wait();
    impl_.reset();
  }

 private:
  std::unique_ptr<RequestImpl> impl_;
};

// A data-parallel sum in flight; finish() completes it (bounded wait) and
// leaves the summed values in the tensors it was started on.
class PendingSum {
 public:
  virtual ~PendingSum() = default;
  virtual void finish() = 0;
};

// Bytes moved point-to-point, per pipeline peer and direction.
struct Traffic {
  std::vector<int64_t> sent, received;  // index = pipeline rank of the peer
  int64_t total_sent() const;
};

// Which transport a job uses (config key parallel.transport). Auto becomes
// Nccl for CUDA runs when NCCL is built in, else Mpi.
enum class TransportKind { Auto, Mpi, Nccl };

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;

  // Operations between group_start() and group_end() are issued together
  // (one NCCL group); they may be matched in any order across peers.
  virtual void group_start() {}
  virtual void group_end() {}
  // Point-to-point with a pipeline peer (rank in this replica's pipeline).
  // Buffers are whole contiguous tensors; the receive buffer's size is the
  // expected message size.
  virtual Request isend(const Tensor& buffer, int peer) = 0;
  virtual Request irecv(const Tensor& buffer, int peer) = 0;

  // Element-wise sum of each tensor over this stage's data-parallel replicas,
  // in place, with bit-identical results on every replica. The start_ form
  // returns at once so the sum can overlap with the rest of the backward
  // pass (the runtime starts it for a chunk as soon as its last backward is
  // done); every replica must start its sums in the same order.
  virtual std::unique_ptr<PendingSum> start_sum_across_replicas(std::vector<Tensor> tensors) = 0;
  void sum_across_replicas(std::vector<Tensor>& tensors) {
    start_sum_across_replicas(tensors)->finish();
  }
  // t = t + (peer's t), with a pipeline peer that calls this at the same time
  // (tied embeddings: first and last stage). Both sides get identical bits.
  virtual void sum_with_peer(Tensor& t, int peer) = 0;

  const Traffic& traffic() const { return traffic_; }

 protected:
  explicit Transport(int pipeline_size);
  void count_sent(int peer, int64_t bytes) { traffic_.sent.at(static_cast<size_t>(peer)) += bytes; }
  void count_received(int peer, int64_t bytes) {
    traffic_.received.at(static_cast<size_t>(peer)) += bytes;
  }

 private:
  Traffic traffic_;
};

// The transport of a single-process job (P = D = 1): one chunk, no peers,
// nothing to send and no replicas to sum over. Anything else is a bug.
class LocalTransport : public Transport {
 public:
  LocalTransport() : Transport(1) {}
  std::string name() const override { return "none (single process)"; }
  Request isend(const Tensor&, int peer) override;
  Request irecv(const Tensor&, int peer) override;
  std::unique_ptr<PendingSum> start_sum_across_replicas(std::vector<Tensor> tensors) override;
  void sum_with_peer(Tensor&, int peer) override;
};

}  // namespace attnres::parallel
