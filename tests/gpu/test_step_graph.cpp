// training.cuda_graphs (parallel/step_graph.h): the step captured as a CUDA
// graph and replayed gives the eager step's losses and weights bit for bit,
// in every residual mode and precision, and raises the eager step's error for
// a bad token id. Our attention kernels on both sides (cuDNN's backward need
// not repeat its bits).
#include <catch2/catch.hpp>
#include <cstring>

#include "gpu_testing.h"
#include "model/model_testing.h"
#include "parallel/mpi.h"
#include "train/stepper.h"

using namespace attnres;
using model::ModelConfig;
using model::ResidualMode;

namespace {

constexpr int64_t kB = 2, kT = 64, kA = 3;

// The engine `attnres train` runs on one GPU: a Stepper on a solo grid.
struct Run {
  parallel::Comm solo = parallel::Comm::solo();
  parallel::ProcessGrid grid{solo, 1, 1};
  train::Stepper stepper;

  static train::Config config(const ModelConfig& m, DType dtype) {
    train::Config c;
    c.model = m;
    c.training.micro_batch_size = kB, c.training.seq_len = kT, c.training.grad_accum = kA;
    c.training.device = Device::CUDA, c.training.precision = dtype;
    c.training.attention_kernel = kernels::AttentionKernel::Own;
    return c;
  }
  static parallel::RuntimeOptions options(bool graphs) {
    parallel::RuntimeOptions ro;
    ro.cuda_graphs = graphs;
    return ro;
  }
  Run(const ModelConfig& m, DType dtype, bool graphs)
      : stepper(grid, config(m, dtype), options(graphs)) {
    stepper.init_weights(7);
  }

  // `steps` AdamW steps, each on its own random microbatches (a replay must
  // read the new step's tokens, not the captured ones); the per-step loss
  // sums. Step `bad_at_step` (0-based) has a token id outside the vocabulary;
  // step `eager_step` runs without the graph (as a depth-statistics step).
  std::vector<double> train(int steps, int bad_at_step = -1, int eager_step = -1) {
    std::vector<double> losses;
    const int64_t V = stepper.runtime().model().chunk(0).config().vocab_size;
    for (int k = 0; k < steps; ++k) {
      const auto data = [&](int mb) {
        data::TokenLoader::Batch b;
        b.inputs = testing::random_tokens(kB * kT, V, 100 + 10 * k + mb);
        b.targets = testing::random_tokens(kB * kT, V, 500 + 10 * k + mb);
        if (k == bad_at_step && mb == 1) b.inputs.data<int32_t>()[37] = static_cast<int32_t>(V + 5);
        return b;
      };
      const auto st =
          stepper.forward_backward(kA, data, 1.0 / (kA * kB * kT), /*graph=*/k != eager_step);
      stepper.update(3e-3, stepper.grad_norm());
      losses.push_back(st.loss_sum);
    }
    return losses;
  }
  std::vector<model::Param*> params() { return stepper.runtime().model().params(); }
};

ModelConfig small(ResidualMode mode, int64_t block_size = 0) {
  return testing::resized(testing::tiny(mode, block_size, 0, false, 3), 97, 64, 4, 2, 96);
}

}  // namespace

TEST_CASE("a step replayed as a CUDA graph gives the eager step's bits", "[gpu][graphs]") {
  const std::vector<testing::NamedConfig> cases = {{"baseline", small(ResidualMode::Baseline)},
                                                   {"full", small(ResidualMode::Full)},
                                                   {"block S=4", small(ResidualMode::Block, 4)}};
  for (const auto& tc : cases)
    for (DType dt : {DType::F32, DType::BF16}) {
      INFO(tc.name << ", " << dtype_name(dt));
      Run eager(tc.cfg, dt, false), graphed(tc.cfg, dt, true);
      const auto a = eager.train(5), b = graphed.train(5);
      // Step 1 eager, step 2 captured and launched, steps 3-5 replays.
      CHECK(graphed.stepper.runtime().graph_launches() == 4);
      CHECK(eager.stepper.runtime().graph_launches() == 0);
      REQUIRE(a.size() == b.size());
      for (size_t k = 0; k < a.size(); ++k) {
        INFO("step " << k + 1 << ": " << a[k] << " vs " << b[k]);
        CHECK(std::isfinite(b[k]));
        CHECK(std::memcmp(&a[k], &b[k], sizeof(double)) == 0);
      }
      const auto pa = eager.params(), pb = graphed.params();
      REQUIRE(pa.size() == pb.size());
      for (size_t i = 0; i < pa.size(); ++i) {
        INFO("parameter " << i);
        CHECK(testing::same_bits(pa[i]->weights(), pb[i]->weights()));
        CHECK(testing::same_bits(pa[i]->grad, pb[i]->grad));
      }
    }
}

TEST_CASE("a bad token id in a replayed step raises the eager step's error", "[gpu][graphs]") {
  Run graphed(small(ResidualMode::Block, 2), DType::F32, true);
  graphed.train(2);  // eager, then captured
  REQUIRE(graphed.stepper.runtime().graph_launches() == 1);
  REQUIRE_THROWS_WITH(graphed.train(1, /*bad_at_step=*/0),
                      Catch::Contains("embedding_forward: token id 102 at position 37 is outside "
                                      "the vocabulary [0, 97)"));
}

TEST_CASE("an eager step between replays (depth statistics) keeps the bits", "[gpu][graphs]") {
  const ModelConfig c = small(ResidualMode::Full);
  Run eager(c, DType::F32, false), graphed(c, DType::F32, true);
  const auto a = eager.train(4), b = graphed.train(4, -1, /*eager_step=*/2);
  CHECK(graphed.stepper.runtime().graph_launches() == 2);  // steps 2 and 4
  REQUIRE(a.size() == b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    INFO("step " << k + 1);
    CHECK(std::memcmp(&a[k], &b[k], sizeof(double)) == 0);
  }
  const auto pa = eager.params(), pb = graphed.params();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(testing::same_bits(pa[i]->weights(), pb[i]->weights()));
}
