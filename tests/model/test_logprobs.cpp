// Per-token log-probabilities (model/logprobs.cpp): each selected position's
// log p(target) is the literal reference's, in any order and with repeats,
// and over every position they sum to minus the training loss.
#include <catch2/catch.hpp>

#include "model/model.h"
#include "model/model_testing.h"

using namespace attnres;
using model::ResidualMode;
using testing::tiny;

namespace {

// The reference's summed loss of sequence b's first n positions.
double prefix_loss(const model::ModelConfig& c, const model::ParamTable& params, const Tensor& tokens,
                   const Tensor& targets, int64_t T, int64_t b, int64_t n) {
  if (n == 0) return 0;
  const int32_t* tk = tokens.data<int32_t>() + b * T;
  const int32_t* tg = targets.data<int32_t>() + b * T;
  return reference::sequence_loss(c, testing::param_fn(params), std::vector<int32_t>(tk, tk + n),
                                  std::vector<int32_t>(tg, tg + n));
}

}  // namespace

TEST_CASE("log-probabilities of selected positions are the reference's", "[model]") {
  const std::vector<testing::NamedConfig> cases = {
      {"baseline, tied", tiny(ResidualMode::Baseline, 0, 0, true)},
      {"full (GQA: 2 query heads, 1 KV head)", tiny(ResidualMode::Full)},
      {"block S=3 of 6 sublayers (uneven)", tiny(ResidualMode::Block, 3, 0, false, 3)},
  };
  for (const auto& tc : cases) {
    SECTION(tc.name) {
      model::Model m(tc.cfg, DType::F64);
      testing::randomize(m.params(), 17);
      const int64_t B = 2, T = 5;
      const Tensor tokens = testing::random_tokens(B * T, tc.cfg.vocab_size, 3);
      const Tensor targets = testing::random_tokens(B * T, tc.cfg.vocab_size, 4);
      // Out of order, with a repeat: each answer is its own position's.
      const std::vector<int64_t> rows = {7, 0, 4, 9, 4, 3, 5};
      std::vector<int32_t> tg;
      for (int64_t r : rows) tg.push_back(targets.data<int32_t>()[r]);
      const auto lp = m.forward_logprobs(tokens, B, T, rows, tg);
      REQUIRE(lp.size() == rows.size());
      for (size_t i = 0; i < rows.size(); ++i) {
        const int64_t b = rows[i] / T, t = rows[i] % T;
        // Causal: position t's loss is the prefix t+1's minus the prefix t's.
        const double want = -(prefix_loss(tc.cfg, m.params(), tokens, targets, T, b, t + 1) -
                              prefix_loss(tc.cfg, m.params(), tokens, targets, T, b, t));
        CHECK(lp[i] == Approx(want).margin(1e-11));
        CHECK(lp[i] < 0);
      }
      // Every position: minus the summed training loss.
      std::vector<int64_t> all(static_cast<size_t>(B * T));
      std::vector<int32_t> all_tg(targets.data<int32_t>(), targets.data<int32_t>() + B * T);
      for (int64_t i = 0; i < B * T; ++i) all[static_cast<size_t>(i)] = i;
      double sum = 0;
      for (double x : m.forward_logprobs(tokens, B, T, all, all_tg)) sum += x;
      CHECK(-sum == Approx(m.forward_loss(tokens, targets, B, T)).epsilon(1e-12));
    }
  }
}

TEST_CASE("log-probabilities refuse a target outside the vocabulary", "[model]") {
  const auto cfg = tiny(ResidualMode::Block, 2);
  model::Model m(cfg, DType::F32);
  testing::randomize(m.params(), 5);
  const Tensor tokens = testing::random_tokens(4, cfg.vocab_size, 1);
  CHECK(m.forward_logprobs(tokens, 1, 4, {}, {}).empty());
  CHECK_THROWS_WITH(m.forward_logprobs(tokens, 1, 4, {1}, {static_cast<int32_t>(cfg.vocab_size)}),
                    Catch::Contains("outside the model's vocabulary"));
}
