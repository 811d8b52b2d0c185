#include "parallel/transport.h"

#include "core/error.h"

namespace attnres::parallel {

int64_t Traffic::total_sent() const {
  int64_t n = 0;
  for (int64_t b : sent) n += b;
  return n;
}

Transport::Transport(int pipeline_size, int stage) : stage_(stage) {
  traffic_.sent.assign(static_cast<size_t>(pipeline_size), 0);
  traffic_.received.assign(static_cast<size_t>(pipeline_size), 0);
}

// A receive from itself: takes the message of the same number when waited on.
class Transport::SelfRecv : public RequestImpl {
 public:
  SelfRecv(Transport& t, int64_t n, Tensor buffer) : t_(t), n_(n), buffer_(std::move(buffer)) {}
  void wait() override {
    auto it = t_.to_self_.find(n_);
    ATTNRES_CHECK(it != t_.to_self_.end(), "message ", n_,
                  " to itself is waited on before it was sent");
    ATTNRES_CHECK(it->second.shape() == buffer_.shape() && it->second.dtype() == buffer_.dtype(),
                  "message ", n_, " to itself: sent ", it->second.describe(), ", expected ",
                  buffer_.describe());
    buffer_.copy_from(it->second);
    t_.to_self_.erase(it);
  }
  void abandon() noexcept override {}
  bool test() override { return false; }

 private:
  Transport& t_;
  int64_t n_;
  Tensor buffer_;
};

Request Transport::isend(const Tensor& buffer, int peer) {
  if (peer != stage_) return send_to(buffer, peer);
  to_self_.emplace(self_sent_++, buffer);
  count_sent(peer, static_cast<int64_t>(buffer.nbytes()));
  return {};
}

Request Transport::irecv(const Tensor& buffer, int peer) {
  if (peer != stage_) return recv_from(buffer, peer);
  count_received(peer, static_cast<int64_t>(buffer.nbytes()));
  return Request(std::make_unique<SelfRecv>(*this, self_posted_++, buffer));
}

namespace {
struct NothingToSum : PendingSum {
  void finish() override {}
};
}  // namespace

Request LocalTransport::send_to(const Tensor&, int peer) {
  ATTNRES_CHECK(false, "a single-process job has no pipeline peer (send to ", peer, ")");
  return {};
}
Request LocalTransport::recv_from(const Tensor&, int peer) {
  ATTNRES_CHECK(false, "a single-process job has no pipeline peer (receive from ", peer, ")");
  return {};
}
std::unique_ptr<PendingSum> LocalTransport::start_sum_across_replicas(std::vector<Tensor>,
                                                                      Replicas) {
  return std::make_unique<NothingToSum>();  // one replica: its gradients are the sum
}
std::unique_ptr<PendingSum> LocalTransport::start_reduce_scatter(Tensor flat, Tensor mine,
                                                                 Replicas) {
  mine.copy_from(flat);  // one replica owns everything
  return std::make_unique<NothingToSum>();
}
void LocalTransport::all_gather(const Tensor& mine, Tensor& flat, Replicas) { flat.copy_from(mine); }
void LocalTransport::all_to_all(const Tensor& send, const std::vector<int64_t>& send_rows,
                                Tensor& recv, const std::vector<int64_t>& recv_rows) {
  // An expert group of one: the rows stay here.
  ATTNRES_CHECK(send_rows.size() == 1 && recv_rows == send_rows, "a single process's all-to-all");
  if (send_rows[0] > 0) recv.rows(0, send_rows[0]).copy_from(send.rows(0, send_rows[0]));
}
void LocalTransport::sum_with_peer(Tensor&, int peer) {
  ATTNRES_CHECK(false, "a single-process job has no pipeline peer (sum with ", peer, ")");
}

}  // namespace attnres::parallel
