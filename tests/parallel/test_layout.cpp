// Pipeline layout and the communication accounting: which sources cross each
// chunk boundary with and without the cache, checked against the paper's
// closed forms and against an independent brute-force count.
#include <catch2/catch.hpp>
#include <set>

#include "core/error.h"
#include "parallel/layout.h"

using namespace attnres;
using namespace attnres::parallel;

namespace {

model::ModelConfig block_model(int64_t L, int64_t S) {
  model::ModelConfig m;
  m.vocab_size = 32, m.d_model = 8, m.n_layers = L, m.n_heads = 2, m.n_kv_heads = 1, m.d_ff = 16;
  m.mode = S == 1 ? model::ResidualMode::Full : model::ResidualMode::Block;
  if (S > 1) m.block_size = S;
  return m;
}

// Brute force: simulate which rank holds which source, sublayer by sublayer.
// Returns source tensors sent per microbatch (forward).
int64_t brute_force_sources(const PipelineLayout& lay, int64_t S, bool cache) {
  std::vector<std::set<int64_t>> held(lay.P());
  std::set<int64_t> produced = {0};  // b_0 by the embedding (chunk 0)
  held[0].insert(0);
  int64_t sent = 0;
  int64_t next_id = 1;
  for (int c = 0; c < lay.C(); ++c) {
    const int r = lay.rank_of(c);
    if (c > 0) {
      // The message carries every completed source the receiver lacks (all, if naive).
      for (int64_t id : produced)
        if (!cache || !held[r].count(id)) {
          ++sent;
          held[r].insert(id);
        }
    }
    for (int64_t s = 2 * lay.layers(c).begin; s < 2 * lay.layers(c).end; ++s)
      if (s % S == S - 1) {  // a block completes
        produced.insert(next_id);
        held[r].insert(next_id++);
      }
  }
  return sent;
}

}  // namespace

TEST_CASE("layers are split as evenly as possible, chunks placed in a loop", "[layout]") {
  PipelineLayout lay(24, 4, 4);
  CHECK(lay.C() == 16);
  int64_t total = 0;
  for (int c = 0; c < lay.C(); ++c) {
    CHECK(lay.layers(c).size() >= 1);
    CHECK(lay.layers(c).size() <= 2);
    if (c > 0) CHECK(lay.layers(c).begin == lay.layers(c - 1).end);
    total += lay.layers(c).size();
  }
  CHECK(total == 24);
  CHECK(lay.chunks_of(1) == std::vector<int>{1, 5, 9, 13});
  CHECK(lay.rank_of(13) == 1);
  CHECK(lay.local_index(13) == 3);
  // Explicit split.
  PipelineLayout ex(5, 2, 1, {3, 2});
  CHECK(ex.layers(0).end == 3);
  CHECK(ex.layers(1).begin == 3);
  CHECK_THROWS_AS(PipelineLayout(5, 2, 1, {4, 2}), Error);
  CHECK_THROWS_AS(PipelineLayout(3, 2, 2), Error);  // 4 chunks > 3 layers
}

TEST_CASE("boundary messages: cached sends only what the receiver lacks", "[layout]") {
  // 8 layers, S = 2 (one block per layer), P = 2, V = 2: chunks of 2 layers.
  const DepthPlan plan = DepthPlan::of(block_model(8, 2));
  PipelineLayout lay(8, 2, 2);
  // Into chunk 1: b_0 and the 2 blocks of chunk 0.
  auto m1 = boundary_message(lay, plan, 1, true);
  CHECK(m1.lo == 0);
  CHECK(m1.hi == 3);
  CHECK_FALSE(m1.partial);
  // Into chunk 2 (rank 0, which ran chunk 0 and holds b_0..b_2): only chunk 1's blocks.
  auto m2 = boundary_message(lay, plan, 2, true);
  CHECK(m2.lo == 3);
  CHECK(m2.hi == 5);
  auto n2 = boundary_message(lay, plan, 2, false);
  CHECK(n2.lo == 0);
  CHECK(n2.hi == 5);
  // Baseline: one hidden state per hop.
  model::ModelConfig base = block_model(8, 2);
  base.mode = model::ResidualMode::Baseline;
  base.block_size = 0;
  auto mb = boundary_message(lay, DepthPlan::of(base), 2, true);
  CHECK(mb.hidden);
  CHECK(mb.tensors() == 1);
  // Block straddling a boundary: S = 3 over chunks of 2 layers (4 sublayers).
  const DepthPlan p3 = DepthPlan::of(block_model(8, 3));
  auto m = boundary_message(lay, p3, 1, true);  // 4 sublayers done: b_0, b_1 and a partial
  CHECK(m.hi == 2);
  CHECK(m.partial);
  CHECK(m.tensors() == 3);
}

TEST_CASE("communication volume equals the brute-force count and the paper's formula", "[layout]") {
  for (int P : {2, 3, 4})
    for (int V : {1, 2, 4})
      for (int64_t S : {1, 2, 3, 6}) {
        const int64_t L = 24;
        if (int64_t(P) * V > L) continue;
        PipelineLayout lay(L, P, V);
        const DepthPlan plan = DepthPlan::of(block_model(L, S));
        INFO("P=" << P << " V=" << V << " S=" << S);
        for (bool cache : {false, true}) {
          const CommVolume v = comm_volume(lay, plan, cache);
          CHECK(v.sources == brute_force_sources(lay, S, cache));
        }
        const CommVolume naive = comm_volume(lay, plan, false),
                         cached = comm_volume(lay, plan, true);
        if (V > 1) CHECK(cached.sources < naive.sources);
        if (V == 1) CHECK(cached.sources == naive.sources);
        // Even split with whole blocks per chunk: the paper's closed forms plus
        // b_0 (on C-1 hops naive, on the first P-1 hops cached).
        const int64_t sub_per_chunk = 2 * L / (P * V);
        if (L % (P * V) == 0 && sub_per_chunk % S == 0) {
          const double Np = double(sub_per_chunk) / S;
          CHECK(naive.sources == Approx(paper_naive_sources(P, V, Np) + (P * V - 1)));
          CHECK(cached.sources == Approx(paper_cached_sources(P, V, Np) + (P - 1)));
          CHECK(naive.partials == 0);
        }
      }
}

TEST_CASE("bytes per step: the table of docs/parallel.md (P=4, Block N=8, 24 layers)", "[layout]") {
  model::ModelConfig m = block_model(24, 0);
  m.block_size = 0;
  m.n_blocks = 8;  // S = 6
  const DepthPlan plan = DepthPlan::of(m);
  REQUIRE(plan.S == 6);
  struct Row {
    int V;
    int64_t naive, cached;
  };
  // Source + partial tensors per microbatch and direction, computed by hand:
  // V=1: 4 chunks of 12 sublayers (2 blocks each), no partials:
  //      naive 3+5+7 = 15, cached the same.
  // V=2: 8 chunks of 6 sublayers (1 block each): naive sum_{c=1..7}(1+c) = 35,
  //      cached 2+3+4 + 4*3 = 21.
  for (const Row& row : {Row{1, 15, 15}, Row{2, 35, 21}}) {
    PipelineLayout lay(24, 4, row.V);
    CHECK(comm_volume(lay, plan, false).tensors() == row.naive);
    CHECK(comm_volume(lay, plan, true).tensors() == row.cached);
  }
  // V=4: 16 chunks of 1 or 2 layers; blocks of 6 sublayers straddle the
  // boundaries, so half the hops carry a partial sum (the sources agree with
  // the brute-force count of the test above).
  PipelineLayout lay4(24, 4, 4);
  const CommVolume naive4 = comm_volume(lay4, plan, false), cached4 = comm_volume(lay4, plan, true);
  CHECK(naive4.sources == 71);
  CHECK(naive4.partials == 8);
  CHECK(cached4.sources == 23);
  CHECK(cached4.partials == 8);
  CHECK(naive4.max_hop == 9);
  CHECK(cached4.max_hop == 3);
  // Bytes: 2 directions x M x D x tensors x N x d x 4 bytes.
  PipelineLayout lay2(24, 4, 2);
  CHECK(pipeline_bytes_per_step(lay2, plan, true, 8, 2, 1024, 768, 4) ==
        2LL * 8 * 2 * 21 * 1024 * 768 * 4);
}
