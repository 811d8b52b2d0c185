#include "parallel/transport.h"

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

}  // namespace attnres::parallel
