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
// Non-blocking: isend/irecv return a Request; the executor issues the sends
// of a compute and the receives posted after it, computes, and waits on a
// receive right before the compute that needs it. A sent buffer is kept alive
// by its Request and must not be written until it completes; the executor
// drops completed sends between computes (Request::done), so send buffers do
// not pile up over a step.
//
// A message to the rank itself (P = 1 with several chunks) never reaches the
// implementation: the base class hands the tensor over and the receive copies
// it when waited on (sends and receives to self match in issue order too).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/mpi.h"

namespace attnres::parallel {

class RequestImpl {
 public:
  virtual ~RequestImpl() = default;
  // Block (bounded, see comm_timeout_seconds()) until the operation completed
  // and its data may be used; throws attnres::Error on failure or timeout.
  virtual void wait() = 0;
  // Without blocking: whether a send has completed (its buffer may then be
  // released). Receives answer false: only wait() checks what arrived.
  virtual bool test() = 0;
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
  // A send that has completed is finished here (the buffer it kept alive is
  // released); true when nothing is left pending.
  bool done() {
    if (impl_ && !impl_->test()) return false;
    impl_.reset();
    return true;
  }
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
  // Whether everything it does in a training step is queued on CUDA streams,
  // ordered by events, with no wait on the host, so that a rank's whole step,
  // communication included, can be captured into one CUDA graph
  // (parallel/step_graph.h): NCCL, and a single process's messages to itself.
  // Not MPI, whose transfers the host drives.
  virtual bool graph_capturable() const = 0;

  // Point-to-point with a pipeline peer (rank in this replica's pipeline).
  // Buffers are whole contiguous tensors; the receive buffer's size is the
  // expected message size.
  Request isend(const Tensor& buffer, int peer);
  Request irecv(const Tensor& buffer, int peer);

  // Element-wise sum of each tensor over this stage's data-parallel replicas,
  // in place, with bit-identical results on every replica. The start_ form
  // returns at once so the sum can overlap with the rest of the backward
  // pass (the runtime starts it for a chunk as soon as its last backward is
  // done); every replica must start its sums in the same order.
  virtual std::unique_ptr<PendingSum> start_sum_across_replicas(
      std::vector<Tensor> tensors, Replicas group = Replicas::All) = 0;
  void sum_across_replicas(std::vector<Tensor>& tensors) {
    start_sum_across_replicas(tensors)->finish();
  }
  // ZeRO-1 (parallel.zero = 1): `flat` [D * n] summed over this stage's
  // replicas, of which replica d receives elements [d * n, (d + 1) * n) in
  // `mine` [n]. Started like start_sum_across_replicas (at once, finished
  // later, in the same order on every replica); F32 tensors on the
  // transport's device side.
  // (With Replicas::SameExperts: over the G = D / EP replicas of the group,
  // `flat` [G * n], member g receiving [g * n, (g + 1) * n).)
  virtual std::unique_ptr<PendingSum> start_reduce_scatter(Tensor flat, Tensor mine,
                                                           Replicas group = Replicas::All) = 0;
  // `flat` [D * n] = every replica's `mine` [n], in replica order (blocking;
  // F32 or BF16); of the group's G replicas with Replicas::SameExperts.
  virtual void all_gather(const Tensor& mine, Tensor& flat, Replicas group = Replicas::All) = 0;
  // Expert parallelism: rows of `send` [*, c] to the EP members of this
  // stage's expert group (ProcessGrid::experts), send_rows[q] consecutive rows
  // to member q in member order, and recv_rows[p] rows from member p into
  // `recv` [*, c], in member order. Blocking for the host (the MPI transport)
  // or for the compute stream (NCCL); every member calls it at the same point
  // of the same schedule.
  virtual void all_to_all(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                          const std::vector<int64_t>& recv_rows) = 0;
  // t = t + (peer's t), with a pipeline peer that calls this at the same time
  // (tied embeddings: first and last stage). Both sides get identical bits.
  virtual void sum_with_peer(Tensor& t, int peer) = 0;

  const Traffic& traffic() const { return traffic_; }

 protected:
  Transport(int pipeline_size, int stage);
  // A peer other than this rank.
  virtual Request send_to(const Tensor& buffer, int peer) = 0;
  virtual Request recv_from(const Tensor& buffer, int peer) = 0;
  void count_sent(int peer, int64_t bytes) { traffic_.sent.at(static_cast<size_t>(peer)) += bytes; }
  void count_received(int peer, int64_t bytes) {
    traffic_.received.at(static_cast<size_t>(peer)) += bytes;
  }

 private:
  class SelfRecv;
  Traffic traffic_;
  int stage_;
  // Messages to itself: send number -> tensor, until its receive takes it.
  std::map<int64_t, Tensor> to_self_;
  int64_t self_sent_ = 0, self_posted_ = 0;
};

// The transport of a single-process job (P = D = 1): no peers (messages
// between its own chunks go through the base class) and no replicas to sum
// over. Anything else is a bug.
class LocalTransport : public Transport {
 public:
  LocalTransport() : Transport(1, 0) {}
  std::string name() const override { return "none (single process)"; }
  bool graph_capturable() const override { return true; }
  std::unique_ptr<PendingSum> start_sum_across_replicas(std::vector<Tensor> tensors,
                                                        Replicas group) override;
  std::unique_ptr<PendingSum> start_reduce_scatter(Tensor flat, Tensor mine, Replicas group) override;
  void all_gather(const Tensor& mine, Tensor& flat, Replicas group) override;
  void all_to_all(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                  const std::vector<int64_t>& recv_rows) override;
  void sum_with_peer(Tensor&, int peer) override;

 protected:
  Request send_to(const Tensor&, int peer) override;
  Request recv_from(const Tensor&, int peer) override;
};

}  // namespace attnres::parallel
