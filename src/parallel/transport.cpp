#include "parallel/transport.h"

#include "core/error.h"

namespace attnres::parallel {

int64_t Traffic::total_sent() const {
  int64_t n = 0;
  for (int64_t b : sent) n += b;
  return n;
}

Transport::Transport(int pipeline_size) {
  traffic_.sent.assign(static_cast<size_t>(pipeline_size), 0);
  traffic_.received.assign(static_cast<size_t>(pipeline_size), 0);
}

namespace {
struct NothingToSum : PendingSum {
  void finish() override {}
};
}  // namespace

Request LocalTransport::isend(const Tensor&, int peer) {
  ATTNRES_CHECK(false, "a single-process job has no pipeline peer (send to ", peer, ")");
  return {};
}
Request LocalTransport::irecv(const Tensor&, int peer) {
  ATTNRES_CHECK(false, "a single-process job has no pipeline peer (receive from ", peer, ")");
  return {};
}
std::unique_ptr<PendingSum> LocalTransport::start_sum_across_replicas(std::vector<Tensor>) {
  return std::make_unique<NothingToSum>();  // one replica: its gradients are the sum
}
void LocalTransport::sum_with_peer(Tensor&, int peer) {
  ATTNRES_CHECK(false, "a single-process job has no pipeline peer (sum with ", peer, ")");
}

}  // namespace attnres::parallel
