#include "parallel/layout.h"

#include <algorithm>

#include "core/error.h"

namespace attnres::parallel {

PipelineLayout::PipelineLayout(int64_t n_layers, int P, int V,
                               std::vector<int64_t> layers_per_chunk)
    : n_layers_(n_layers), P_(P), V_(V) {
  if (P < 1) fail("parallel.pipeline must be >= 1, got ", P);
  if (V < 1) fail("parallel.virtual_stages must be >= 1, got ", V);
  const int64_t C = int64_t(P) * V;
  if (C > n_layers)
    fail("parallel.pipeline * parallel.virtual_stages = ", C,
         " chunks exceed model.n_layers = ", n_layers, " (every chunk needs at least one layer)");
  if (layers_per_chunk.empty()) {
    for (int64_t c = 0; c < C; ++c) ranges_.push_back({c * n_layers / C, (c + 1) * n_layers / C});
    return;
  }
  if (static_cast<int64_t>(layers_per_chunk.size()) != C)
    fail("explicit layer split: ", layers_per_chunk.size(), " chunk sizes for ", C, " chunks");
  int64_t at = 0;
  for (int64_t n : layers_per_chunk) {
    if (n < 1) fail("explicit layer split: every chunk needs at least one layer, got ", n);
    ranges_.push_back({at, at + n});
    at += n;
  }
  if (at != n_layers)
    fail("explicit layer split: chunk sizes sum to ", at, ", model.n_layers is ", n_layers);
}

std::vector<int> PipelineLayout::chunks_of(int rank) const {
  ATTNRES_CHECK(rank >= 0 && rank < P_, "pipeline rank ", rank, " of ", P_);
  std::vector<int> out;
  for (int v = 0; v < V_; ++v) out.push_back(v * P_ + rank);
  return out;
}

BoundaryMessage boundary_message(const PipelineLayout& layout, const DepthPlan& plan, int chunk,
                                 bool cache_blocks) {
  ATTNRES_CHECK(chunk >= 1 && chunk < layout.C(), "no message enters chunk ", chunk);
  BoundaryMessage m;
  if (!plan.attnres) {
    m.hidden = true;
    return m;
  }
  const int64_t start = layout.layers(chunk).begin;
  m.hi = plan.sources_after(start);
  m.partial = plan.partial_after(start);
  const int P = layout.P();
  // The receiver's previous chunk c-P completed (and so holds) every source
  // up to the end of its layers: those need not travel again.
  m.lo = (cache_blocks && chunk >= P) ? plan.sources_after(layout.layers(chunk - P).end) : 0;
  return m;
}

CommVolume comm_volume(const PipelineLayout& layout, const DepthPlan& plan, bool cache_blocks) {
  CommVolume v;
  for (int c = 1; c < layout.C(); ++c) {
    const BoundaryMessage m = boundary_message(layout, plan, c, cache_blocks);
    if (m.hidden)
      v.partials += 1;
    else
      v.sources += m.hi - m.lo, v.partials += m.partial ? 1 : 0;
    v.max_hop = std::max(v.max_hop, m.tensors());
  }
  return v;
}

int64_t pipeline_bytes_per_step(const PipelineLayout& layout, const DepthPlan& plan,
                                bool cache_blocks, int64_t M, int64_t D, int64_t tokens_per_mb,
                                int64_t d_model, int64_t elem_bytes) {
  const CommVolume v = comm_volume(layout, plan, cache_blocks);
  return 2 * M * D * v.tensors() * tokens_per_mb * d_model * elem_bytes;
}

double paper_naive_sources(int P, int V, double N_p) {
  const double C = double(P) * V;
  return C * (C - 1) / 2 * N_p;
}

double paper_cached_sources(int P, int V, double N_p) {
  // P(P-1)/2 N_p for the first round; every later hop carries the sources of
  // the P-1 chunks since the receiver's previous chunk: (V-1) P (P-1) N_p.
  return double(P) * (P - 1) / 2 * N_p + double(V - 1) * P * (P - 1) * N_p;
}

}  // namespace attnres::parallel
