// Predicting a run (train/plan.h): the layouts searched, the compute model
// against flops.h, what caching saves, and the CPU path end to end (chunk
// times measured through the executor, then simulated).
#include <catch2/catch.hpp>

#include <functional>

#include "model/flops.h"
#include "train/config.h"
#include "train/plan.h"

using namespace attnres;
using namespace attnres::train;

namespace {

Config gpu_config(model::ResidualMode mode) {
  Config c;
  c.model.vocab_size = 50304, c.model.d_model = 1024, c.model.n_layers = 24;
  c.model.n_heads = 16, c.model.n_kv_heads = 16, c.model.d_ff = 2816;
  c.model.mode = mode;
  if (mode == model::ResidualMode::Block) c.model.n_blocks = 8;
  c.training.micro_batch_size = 8, c.training.seq_len = 2048, c.training.grad_accum = 32;
  return c;
}

}  // namespace

TEST_CASE("candidate layouts cover every way to use the GPUs for the global batch", "[plan]") {
  const Config c = gpu_config(model::ResidualMode::Block);
  const auto layouts = candidate_layouts(c, 8);
  int naive = 0;
  for (const auto& L : layouts) {
    INFO(describe(L));
    CHECK(L.P * L.D == 8);
    CHECK(L.M * L.D == 32);
    CHECK(L.P * L.V <= 24);
    if (L.V > 1) CHECK(L.M % L.P == 0);
    if (!L.cache) {
      CHECK(L.P > 1);
      ++naive;
    }
  }
  // P = 1, and P in {2, 4, 8} x V in {1, 2, 4} but P8 V4 (32 chunks > 24
  // layers), naive and cached.
  CHECK(layouts.size() == 1 + 8 * 2);
  CHECK(naive == 8);
  // Baseline: no naive rows.
  for (const auto& L : candidate_layouts(gpu_config(model::ResidualMode::Baseline), 8))
    CHECK(L.cache);
}

TEST_CASE("one GPU: the step is its FLOPs at the profile's efficiency, plus the update",
          "[plan]") {
  const Config c = gpu_config(model::ResidualMode::Baseline);
  const HardwareProfile h100 = hardware_profile("h100");
  const Prediction p = predict(c, {1, 1, 1, 32, true, 1, {}}, h100);
  const double flops = model::training_flops_per_token(c.model, 2048) * 32 * 8 * 2048;
  CHECK(p.sim.makespan == Approx(flops / (h100.peak_flops * h100.efficiency)).epsilon(0.01));
  CHECK(p.step_time > p.sim.makespan);  // + AdamW
  CHECK(p.mfu <= h100.efficiency);
  CHECK(p.mfu > 0.95 * h100.efficiency);
  CHECK(p.exposed_comm == Approx(0).margin(1e-12));
  CHECK(p.sim.bubble == Approx(0).margin(1e-12));
}

TEST_CASE("pipelines: cached blocks never lose to naive ones, and AttnRes costs over baseline",
          "[plan]") {
  const Config block = gpu_config(model::ResidualMode::Block);
  const Config base = gpu_config(model::ResidualMode::Baseline);
  const HardwareProfile h100 = hardware_profile("h100");
  for (int V : {1, 2, 4}) {
    INFO("V=" << V);
    const Prediction naive = predict(block, {4, V, 2, 16, false, 1, {}}, h100);
    const Prediction cached = predict(block, {4, V, 2, 16, true, 1, {}}, h100);
    const Prediction b = predict(base, {4, V, 2, 16, true, 1, {}}, h100);
    CHECK(cached.step_time <= naive.step_time * (1 + 1e-12));
    CHECK(cached.exposed_comm <= naive.exposed_comm + 1e-12);
    CHECK(cached.step_time > b.step_time);
    CHECK(cached.sim.bubble > 0);
  }
  CHECK_THROWS_WITH(hardware_profile("tpu"), Catch::Contains("cpu or h100"));
}

TEST_CASE("cpu profile: chunk times measured through the executor, then simulated", "[plan]") {
  Config c;
  c.model.vocab_size = 64, c.model.d_model = 32, c.model.n_layers = 4, c.model.n_heads = 2;
  c.model.n_kv_heads = 1, c.model.d_ff = 48, c.model.mode = model::ResidualMode::Block;
  c.model.block_size = 3;
  c.training.micro_batch_size = 2, c.training.seq_len = 16, c.training.grad_accum = 4;
  const ChunkTimes t = measure_chunk_times(c, 4, 1, 1);
  REQUIRE(t.fwd.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(t.fwd[i] > 0);
    CHECK(t.bwd[i] > 0);
    CHECK(t.update[i] > 0);
  }
  const HardwareProfile cpu = hardware_profile("cpu");
  const Prediction p = predict(c, {2, 2, 1, 4, true, 1, {}}, cpu, &t);
  CHECK_FALSE(p.sim.deadlock);
  double work = 0;
  for (size_t i = 0; i < 4; ++i) work += 4 * (t.fwd[i] + t.bwd[i]);
  // Two ranks can at best split the work evenly (cores permitting).
  CHECK(p.sim.makespan >= work / std::min(2.0, cpu.cores) * (1 - 1e-9));
  CHECK_THROWS_WITH(predict(c, {4, 2, 1, 4, true, 1, {}}, cpu, &t), Catch::Contains("8 chunks"));
}

TEST_CASE("balanced stages: a heavy head and costlier layers get fewer layers per chunk", "[plan]") {
  // A hybrid with a large vocabulary: the last chunk's head costs several
  // layers, and the 1-based softmax layers 4, 8, ... cost more than KDA ones.
  Config c = gpu_config(model::ResidualMode::Block);
  c.model.vocab_size = 262144, c.model.n_layers = 12;
  c.model.kda.heads = 8, c.model.kda.head_dim = 128;
  c.training.grad_accum = 9;
  const HardwareProfile h100 = hardware_profile("h100");
  for (const int V : {1, 2}) {
    const PlanLayout even{3, V, 1, 9, true, 1, {}};
    const auto split = balanced_split(c, even, h100);
    INFO("V " << V);
    REQUIRE(split.size() == size_t(3 * V));
    int64_t sum = 0;
    for (int64_t n : split) {
      CHECK(n >= 1);
      sum += n;
    }
    CHECK(sum == 12);
    CHECK(split.back() < 12 / (3 * V));  // the head's chunk holds fewer layers
    PlanLayout bal = even;
    bal.split = split;
    const double t_even = predict(c, even, h100).step_time, t_bal = predict(c, bal, h100).step_time;
    CHECK(t_bal < 0.97 * t_even);
    // Against every split of the 12 layers into 3 V chunks: the balanced one
    // is within 3% of the fastest the simulator finds.
    double fastest = 1e30;
    const int C = 3 * V;
    std::vector<int64_t> s(size_t(C), 1);
    std::function<void(int, int64_t)> each = [&](int c_, int64_t left) {
      if (c_ == C - 1) {
        s[size_t(c_)] = left;
        PlanLayout l = even;
        l.split = s;
        fastest = std::min(fastest, predict(c, l, h100).step_time);
        return;
      }
      for (int64_t n = 1; n <= left - (C - 1 - c_); ++n) s[size_t(c_)] = n, each(c_ + 1, left - n);
    };
    each(0, 12);
    CHECK(t_bal <= 1.03 * fastest);
    CHECK(fastest < t_even);
  }
}
