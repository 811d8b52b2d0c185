// Where the model lives in a pipeline, and what crosses each chunk boundary
// (docs/parallel.md "Layout" and "What crosses a chunk boundary", with its
// byte counts).
//
// P physical stages x V virtual stages = C chunks. Chunk c holds a contiguous
// range of transformer layers and runs on pipeline rank c mod P ("loop"
// placement, as Megatron): rank r holds chunks r, r+P, r+2P, ... Chunk 0 also
// runs the embedding, chunk C-1 the final Mix, norm, LM head and loss.
//
// Everything here is a pure function of the layout and the residual mode, so
// the executor, the byte accounting, the tests and `attnres inspect` all use
// the same numbers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace attnres::parallel {

struct LayerRange {
  int64_t begin = 0, end = 0;  // layers [begin, end)
  int64_t size() const { return end - begin; }
};

class PipelineLayout {
 public:
  // Layers split as evenly as possible: chunk c gets [floor(c*L/C), floor((c+1)*L/C)).
  // `layers_per_chunk` (C positive counts summing to L) overrides the split.
  PipelineLayout(int64_t n_layers, int P, int V, std::vector<int64_t> layers_per_chunk = {});

  int P() const { return P_; }
  int V() const { return V_; }
  int C() const { return P_ * V_; }
  int64_t n_layers() const { return n_layers_; }

  const LayerRange& layers(int chunk) const { return ranges_.at(static_cast<size_t>(chunk)); }
  int rank_of(int chunk) const { return chunk % P_; }
  // Position of a chunk among its rank's chunks (0 .. V-1).
  int local_index(int chunk) const { return chunk / P_; }
  // The chunks of pipeline rank r in increasing order: r, r+P, ..., r+(V-1)P.
  std::vector<int> chunks_of(int rank) const;

 private:
  int64_t n_layers_;
  int P_, V_;
  std::vector<LayerRange> ranges_;
};

// The depth state at a layer boundary, for the AttnRes modes (block size S;
// full = S 1): the completed sources are b_0 (embedding) .. b_{n-1}, and a
// partial sum exists when the boundary falls inside a block. DenseFormer's
// is its sources X_0 (embedding) .. X_l, one a layer: blocks of S = 2 to the
// pipeline (never a partial at a layer boundary).
struct DepthPlan {
  bool attnres = false;  // the state is a list of sources (ModelConfig::depth_sources)
  int64_t S = 0;  // sublayers per block (0 for baseline)

  static DepthPlan of(const model::ModelConfig& cfg) {
    return {cfg.depth_sources(), cfg.attnres() ? cfg.resolved_block_size() : cfg.denseformer() ? 2 : 0};
  }
  // Completed sources after the first `layer` layers: b_0 plus 2*layer / S blocks.
  int64_t sources_after(int64_t layer) const { return attnres ? 1 + (2 * layer) / S : 0; }
  bool partial_after(int64_t layer) const { return attnres && (2 * layer) % S != 0; }
};

// What the message into chunk c (c >= 1) carries, in [N, d] tensors (N = B*T
// tokens of one microbatch): baseline the hidden state; AttnRes the sources
// with global ids [lo, hi) followed by the partial sum when there is one.
// The gradient message from chunk c back to c-1 has exactly the same shape
// (the gradients of those sources and of the partial).
//
// Cached protocol: the receiving rank already holds every source completed by
// the end of its previous chunk c-P, so lo = sources_after(end of c-P) for
// c >= P and 0 before. Naive protocol: lo = 0 always.
struct BoundaryMessage {
  int64_t lo = 0, hi = 0;  // source ids carried (AttnRes)
  bool partial = false;    // the partial sum follows the sources
  bool hidden = false;     // baseline: the residual stream
  int64_t tensors() const { return hidden ? 1 : (hi - lo) + (partial ? 1 : 0); }
};
BoundaryMessage boundary_message(const PipelineLayout& layout, const DepthPlan& plan, int chunk,
                                 bool cache_blocks);

// Communication volume of one microbatch in one direction (forward; the
// backward is identical), in [N, d] tensors, from the actual layout.
struct CommVolume {
  int64_t sources = 0;   // source tensors sent, summed over the C-1 boundaries
  int64_t partials = 0;  // partial sums (or baseline hidden states) sent
  int64_t max_hop = 0;   // largest single message
  int64_t tensors() const { return sources + partials; }
};
CommVolume comm_volume(const PipelineLayout& layout, const DepthPlan& plan, bool cache_blocks);

// Exact pipeline bytes of one optimizer step summed over all ranks:
// forward + backward, M microbatches, D replicas, each tensor N*d elements of
// `elem_bytes` bytes.
int64_t pipeline_bytes_per_step(const PipelineLayout& layout, const DepthPlan& plan,
                                bool cache_blocks, int64_t M, int64_t D, int64_t tokens_per_mb,
                                int64_t d_model, int64_t elem_bytes);

// The paper's closed forms (section 4), in source tensors per microbatch and
// direction, for an even split with N_p sources completed per chunk; they
// leave out b_0 and the partial sums that the exact count includes.
double paper_naive_sources(int P, int V, double N_p);
double paper_cached_sources(int P, int V, double N_p);

}  // namespace attnres::parallel
