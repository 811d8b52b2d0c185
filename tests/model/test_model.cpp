// Whole-model tests: the model computes the function of docs/model.md (against the
// literal reference in reference.h), its gradients are right (finite
// differences in float64), layers cut into chunks anywhere give the same bits
// as one chunk, and decoding with a KV cache agrees with training.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>

#include "core/rng.h"
#include "model/depth_attention.h"
#include "model/flops.h"
#include "model/model.h"
#include "model/model_testing.h"

using namespace attnres;
using model::ModelConfig;
using model::ResidualMode;
using testing::param_fn;
using testing::randomize;
using testing::tiny;
using testing::with_kda;
using testing::with_mla;
using testing::with_moe;
using testing::with_variant;
using testing::variant;
using Q = model::MixQuery;
using W = model::MixWeights;
using Sc = kernels::MixScore;

namespace {

std::vector<testing::NamedConfig> cases() {
  return {
      {"baseline", tiny(ResidualMode::Baseline)},
      {"full", tiny(ResidualMode::Full)},
      {"block S=2", tiny(ResidualMode::Block, 2)},
      {"block S=3 (uneven: final partial)", tiny(ResidualMode::Block, 3)},
      {"block n_blocks=2 of 6 sublayers", tiny(ResidualMode::Block, 0, 2, false, 3)},
      {"block S=4 = all sublayers", tiny(ResidualMode::Block, 4)},
      {"full, tied embeddings", tiny(ResidualMode::Full, 0, 0, true)},
      {"full, 5 layers (Mix groups of 4: up to 3 recent sources)",
       tiny(ResidualMode::Full, 0, 0, false, 5)},
      {"baseline, tied embeddings", tiny(ResidualMode::Baseline, 0, 0, true)},
      // Mixture of experts: the sublayers' outputs the residual modes see.
      {"block S=2, MoE (sigmoid, aux-free bias, a shared expert, layer 0 dense)",
       with_moe(tiny(ResidualMode::Block, 2, 0, false, 3), 4, 2, 1)},
      {"full, MoE (softmax, aux loss, no shared expert, no dense layer)",
       with_moe(tiny(ResidualMode::Full), 5, 2, 0, 0, kernels::MoeRouter::Softmax,
                model::MoeBalance::AuxLoss)},
      {"baseline, MoE top-1 (sigmoid, aux loss, 2 shared experts)",
       with_moe(tiny(ResidualMode::Baseline, 0, 0, false, 3), 3, 1, 2, 1,
                kernels::MoeRouter::Sigmoid, model::MoeBalance::AuxLoss)},
      // Kimi Linear hybrids (model.kda): KDA layers 1-3 and 5, softmax 4 and 6.
      {"baseline, KDA hybrid (2 heads of 4, softmax every 4)",
       with_kda(tiny(ResidualMode::Baseline, 0, 0, false, 4), 2, 4)},
      {"block S=3, KDA hybrid + MoE", with_kda(with_moe(tiny(ResidualMode::Block, 3, 0, false, 4), 4, 2, 1), 2, 4)},
      {"full, KDA hybrid (softmax every 2, conv 4)", with_kda(tiny(ResidualMode::Full, 0, 0, false, 3), 1, 6, 4, 2)},
      // MLA softmax layers (model.mla): dn + dr != dv, NoPE and RoPE.
      {"block S=2, KDA + MLA hybrid (NoPE: Kimi Linear)",
       with_mla(with_kda(tiny(ResidualMode::Block, 2, 0, false, 4), 2, 4), 6, 4, 2, 3)},
      {"baseline, KDA + MLA hybrid + MoE", with_mla(with_kda(with_moe(tiny(ResidualMode::Baseline, 0, 0, false, 4), 4, 2, 1), 2, 4), 5, 3, 2, 4)},
      {"full, every layer MLA with RoPE on dr (DeepSeek's)",
       with_mla(tiny(ResidualMode::Full), 6, 2, 4, 5, true)},
      // DenseFormer (docs/model.md "DenseFormer").
      {"denseformer", tiny(ResidualMode::DenseFormer)},
      {"denseformer, 4 layers, tied", tiny(ResidualMode::DenseFormer, 0, 0, true, 4)},
      {"denseformer, MoE", with_moe(tiny(ResidualMode::DenseFormer, 0, 0, false, 3), 4, 2, 1)},
      // The residual variants (model.residual; docs/model.md "Residual variants").
      {"full, input query", with_variant(tiny(ResidualMode::Full), variant(Q::Input))},
      {"block S=2, input query (the partial sum, or the latest block)",
       with_variant(tiny(ResidualMode::Block, 2, 0, false, 3), variant(Q::Input))},
      {"full, scalar weights", with_variant(tiny(ResidualMode::Full), variant(Q::Static, W::Scalars))},
      {"block S=3, scalar weights (uneven: final partial)",
       with_variant(tiny(ResidualMode::Block, 3), variant(Q::Static, W::Scalars))},
      {"full, sigmoid", with_variant(tiny(ResidualMode::Full), variant(Q::Static, W::Attention, Sc::Sigmoid))},
      {"block S=2, no key norm",
       with_variant(tiny(ResidualMode::Block, 2), variant(Q::Static, W::Attention, Sc::Softmax, false))},
      {"full, no key norm",
       with_variant(tiny(ResidualMode::Full), variant(Q::Static, W::Attention, Sc::Softmax, false))},
      {"block S=2, 4 heads",
       with_variant(tiny(ResidualMode::Block, 2), variant(Q::Static, W::Attention, Sc::Softmax, true, 4))},
      {"full, window 2 of 6 sublayers",
       with_variant(tiny(ResidualMode::Full, 0, 0, false, 3),
                    variant(Q::Static, W::Attention, Sc::Softmax, true, 1, 2))},
      // (An input query with sigmoid weights grows the sources from sublayer
      // to sublayer and the logits with them: its loss here agreed with the
      // reference to 4e-12, rounding amplified, where each alone holds 1e-12;
      // so did window 3 + input query + 2 heads + MoE, each part alone 1e-12.)
      {"full, window 3, input query, 2 heads",
       with_variant(tiny(ResidualMode::Full, 0, 0, false, 3),
                    variant(Q::Input, W::Attention, Sc::Softmax, true, 2, 3))},
      {"block S=2, input query, MoE",
       with_variant(with_moe(tiny(ResidualMode::Block, 2, 0, false, 3), 4, 2, 1), variant(Q::Input))},
      {"block S=2, sigmoid, 2 heads, no key norm",
       with_variant(tiny(ResidualMode::Block, 2, 0, false, 3),
                    variant(Q::Static, W::Attention, Sc::Sigmoid, false, 2))},
  };
}

// The loss whose gradient forward_backward(..., grad_scale = 1) computes:
// the summed token loss, plus a MoE model's auxiliary losses, each weighted
// by the microbatch's tokens (its share of the mean over microbatches).
double training_loss(model::Model& m, const testing::Microbatch& mb) {
  const model::ModelConfig& c = m.config();
  model::MoeStats stats(c.n_layers, c.moe.experts);
  m.set_moe_stats(&stats);
  double loss = m.forward_loss(mb.tokens, mb.targets, mb.B, mb.T);
  m.set_moe_stats(nullptr);
  for (double a : stats.aux_sum) loss += static_cast<double>(mb.B * mb.T) * a;
  return loss;
}

}  // namespace

TEST_CASE("block sizes and final source counts follow docs/model.md", "[model]") {
  ModelConfig c = tiny(ResidualMode::Block, 3);
  c.n_layers = 27;
  c.block_size = 6;
  c.validate();
  CHECK(c.final_sources() == 10);  // the paper's 48B setting: L = 27, S = 6
  c.block_size = 0;
  c.n_blocks = 8;
  CHECK(c.resolved_block_size() == 7);  // ceil(54 / 8)
  CHECK(tiny(ResidualMode::Full).resolved_block_size() == 1);
  CHECK(tiny(ResidualMode::Full).final_sources() == 5);  // e + 4 sublayer outputs
  // Mix groups: the block, or ceil(sqrt(2L)) sublayers for Full AttnRes
  CHECK(tiny(ResidualMode::Block, 3).mix_group_size() == 3);
  CHECK(tiny(ResidualMode::Full).mix_group_size() == 2);
  CHECK(tiny(ResidualMode::Full, 0, 0, false, 5).mix_group_size() == 4);
  CHECK(tiny(ResidualMode::Full, 0, 0, false, 12).mix_group_size() == 5);
  CHECK(tiny(ResidualMode::Full, 0, 0, false, 24).mix_group_size() == 7);
  CHECK(tiny(ResidualMode::Full, 0, 0, false, 32).mix_group_size() == 8);
  CHECK(tiny(ResidualMode::Full, 0, 0, false, 48).mix_group_size() == 8);  // not ceil(sqrt(96)) = 10
  CHECK(tiny(ResidualMode::Baseline).mix_group_size() == 0);
  CHECK(tiny(ResidualMode::Block, 3).final_sources() == 3);  // e, b_1, partial
}

TEST_CASE("model loss equals the literal reference of docs/model.md", "[model]") {
  for (const auto& tc : cases()) {
    SECTION(tc.name) {
      model::Model m = testing::random_model(tc.cfg, DType::F64, 42);
      const testing::Microbatch mb = testing::random_microbatch(2, 5, tc.cfg.vocab_size, 1);
      double ours = m.forward_loss(mb.tokens, mb.targets, mb.B, mb.T);
      double ref = 0;
      const int32_t *tokens = mb.tokens.data<int32_t>(), *targets = mb.targets.data<int32_t>();
      for (int64_t b = 0; b < mb.B; ++b) {
        std::vector<int32_t> tk(tokens + b * mb.T, tokens + (b + 1) * mb.T);
        std::vector<int32_t> tg(targets + b * mb.T, targets + (b + 1) * mb.T);
        ref += reference::sequence_loss(tc.cfg, param_fn(m), tk, tg);
      }
      CHECK(ours == Approx(ref).epsilon(1e-12));
      // forward_backward reports the same loss as forward_loss.
      CHECK(m.forward_backward(mb.tokens, mb.targets, mb.B, mb.T, 1.0) ==
            Approx(ref).epsilon(1e-12));
    }
  }
}

TEST_CASE("whole-model gradients match finite differences (float64)", "[model]") {
  for (const auto& tc : cases()) {
    SECTION(tc.name) {
      model::Model m = testing::random_model(tc.cfg, DType::F64, 7);
      const testing::Microbatch mb = testing::random_microbatch(2, 3, tc.cfg.vocab_size, 3);
      m.params().zero_grads();
      m.forward_backward(mb.tokens, mb.targets, mb.B, mb.T, 1.0);
      auto loss = [&]() { return training_loss(m, mb); };
      for (auto& p : m.params().all()) {
        INFO(p.name);
        // h = 3e-5 balances truncation (~h^2) against round-off (~1e-16/h) for
        // these O(1) weights; both stay near 1e-9 of the gradient's scale. The
        // scale, not each element: a MoE expert that a token or two reached
        // has gradients near 0, whose differences are mostly rounding. A KDA
        // hybrid's loss curves more (exp(A_log), the decays, the norms of
        // random q and k): its truncation at 3e-5 reached 5e-5 of the scale,
        // falling as h^2 (5e-6 at 1e-5), so it takes h = 3e-6.
        // The residual variants' Mix (a query per head of d / H channels, keys
        // without a norm, sigmoid weights) curves more too: up to 5e-6 at
        // 3e-5, so 1e-5.
        const double h = tc.cfg.has_kda() ? 3e-6 : tc.cfg.one_pass_mix() ? 1e-5 : 3e-5;
        CHECK(testing::scaled_diff(p.grad, testing::fd_gradient(p.value, loss, h)) < 1e-6);
      }
    }
  }
}

namespace {
// Forward + backward of one microbatch with the layers cut at `cuts` (chunk
// boundaries, as the pipeline runtime does, here in one process); returns the
// loss and leaves the parameter gradients in m.
double chunked_forward_backward(model::Model& m, const Tensor& tokens, const Tensor& targets,
                                int64_t B, int64_t T, const std::vector<int64_t>& cuts) {
  std::vector<int64_t> b{0};
  b.insert(b.end(), cuts.begin(), cuts.end());
  b.push_back(m.config().n_layers);
  std::vector<model::Activations> acts(b.size() - 1);
  model::DepthState st;
  m.embed_forward(tokens, B, T, st, acts[0]);
  for (size_t c = 0; c + 1 < b.size(); ++c) {
    acts[c].B = B, acts[c].T = T;
    acts[c].loss_scale = 1.0;  // as head_forward_backward's grad_scale below
    m.layers_forward(b[c], b[c + 1], st, acts[c]);
  }
  model::DepthGrad g;
  const double loss = m.head_forward_backward(st, targets, acts.back(), g, 1.0);
  st = model::DepthState{};
  for (size_t c = acts.size(); c-- > 0;) m.layers_backward(b[c], b[c + 1], acts[c], g);
  m.embed_backward(acts[0], g);
  return loss;
}
}  // namespace

TEST_CASE("chunked layers give the single chunk's loss and gradients bit for bit", "[model]") {
  // Mix groups cut by chunk boundaries (Full: groups of ceil(sqrt(2L)); Block:
  // blocks that straddle chunks, an uneven last block), in float32.
  using C = testing::NamedConfig;
  for (const C& c : {C{"full L=8 (groups of 4)", tiny(ResidualMode::Full, 0, 0, false, 8)},
                     C{"full L=12 (groups of 5)", tiny(ResidualMode::Full, 0, 0, false, 12)},
                     C{"block S=5 L=7", tiny(ResidualMode::Block, 5, 0, false, 7)},
                     C{"baseline L=5", tiny(ResidualMode::Baseline, 0, 0, false, 5)},
                     C{"block S=3 L=5, MoE", with_moe(tiny(ResidualMode::Block, 3, 0, false, 5), 4, 2, 1)},
                     C{"denseformer L=5", tiny(ResidualMode::DenseFormer, 0, 0, false, 5)},
                     // The residual variants' one-pass Mix (no groups to cut)
                     C{"full L=5, window 3, input query, 2 heads",
                       with_variant(tiny(ResidualMode::Full, 0, 0, false, 5),
                                    variant(Q::Input, W::Attention, Sc::Softmax, true, 2, 3))},
                     C{"block S=3 L=5, scalar weights",
                       with_variant(tiny(ResidualMode::Block, 3, 0, false, 5), variant(Q::Static, W::Scalars))},
                     C{"block S=3 L=4, input query, sigmoid, no key norm",
                       with_variant(tiny(ResidualMode::Block, 3, 0, false, 4),
                                    variant(Q::Input, W::Attention, Sc::Sigmoid, false))}}) {
    SECTION(c.name) {
      const int64_t B = 2, T = 4, L = c.cfg.n_layers;
      const Tensor tokens = testing::random_tokens(B * T, c.cfg.vocab_size, 1);
      const Tensor targets = testing::random_tokens(B * T, c.cfg.vocab_size, 2);
      model::Model one(c.cfg, DType::F32), cut(c.cfg, DType::F32);
      randomize(one.params(), 5);
      randomize(cut.params(), 5);
      one.params().zero_grads();
      const double loss = one.forward_backward(tokens, targets, B, T, 1.0);
      std::vector<std::vector<int64_t>> splits, every(1);
      for (int64_t l = 1; l < L; ++l) {
        splits.push_back({l});
        every[0].push_back(l);
      }
      splits.push_back(every[0]);
      for (const auto& split : splits) {
        INFO("cut at " << split.size() << " boundaries, the first after layer " << split[0]);
        cut.params().zero_grads();
        CHECK(chunked_forward_backward(cut, tokens, targets, B, T, split) == loss);
        for (size_t i = 0; i < one.params().all().size(); ++i) {
          INFO(one.params().all()[i].name);
          CHECK(testing::same_bits(cut.params().all()[i].grad, one.params().all()[i].grad));
        }
      }
    }
  }
}

TEST_CASE("recomputation (mix, layer) gives training.recompute = none's bits", "[model][recompute]") {
  // Whole model and cut into chunks (a Mix group's leader in an earlier
  // chunk than the sublayer recomputed), every residual mode, float32: the
  // backward redoes the forward's kernels on the same inputs.
  using C = testing::NamedConfig;
  std::vector<C> all = cases();
  all.push_back({"full L=8 (groups of 4)", tiny(ResidualMode::Full, 0, 0, false, 8)});
  all.push_back({"block S=5 L=7", tiny(ResidualMode::Block, 5, 0, false, 7)});
  for (const C& c : all) {
    SECTION(c.name) {
      const int64_t B = 2, T = 4, L = c.cfg.n_layers;
      const Tensor tokens = testing::random_tokens(B * T, c.cfg.vocab_size, 3);
      const Tensor targets = testing::random_tokens(B * T, c.cfg.vocab_size, 4);
      model::Model ref(c.cfg, DType::F32);
      randomize(ref.params(), 9);
      ref.params().zero_grads();
      const double loss = ref.forward_backward(tokens, targets, B, T, 1.0);
      for (model::Recompute r : {model::Recompute::Mix, model::Recompute::Layer}) {
        for (bool chunked : {false, true}) {
          INFO("recompute = " << model::recompute_name(r) << (chunked ? ", chunked" : ""));
          model::Model m(c.cfg, DType::F32);
          randomize(m.params(), 9);
          m.set_recompute(r);
          m.params().zero_grads();
          const double got = chunked ? chunked_forward_backward(m, tokens, targets, B, T, {L / 2})
                                     : m.forward_backward(tokens, targets, B, T, 1.0);
          CHECK(got == loss);
          for (size_t i = 0; i < ref.params().all().size(); ++i) {
            INFO(ref.params().all()[i].name);
            CHECK(testing::same_bits(m.params().all()[i].grad, ref.params().all()[i].grad));
          }
        }
      }
    }
  }
}

TEST_CASE("recomputation keeps fewer activation bytes: none > mix > layer", "[model][recompute]") {
  // Measured with the tensor allocator's high-water mark over one forward +
  // backward, above what was live before it (the parameters and gradients).
  for (auto mode : {ResidualMode::Baseline, ResidualMode::Block}) {
    ModelConfig cfg = testing::resized(
        tiny(mode, mode == ResidualMode::Block ? 4 : 0, 0, false, 4), 64, 32, 4, 2, 96);
    INFO(model::residual_mode_name(mode));
    const int64_t B = 2, T = 16;
    const Tensor tokens = testing::random_tokens(B * T, cfg.vocab_size, 3);
    const Tensor targets = testing::random_tokens(B * T, cfg.vocab_size, 4);
    std::vector<size_t> peak;
    for (model::Recompute r : {model::Recompute::None, model::Recompute::Mix, model::Recompute::Layer}) {
      model::Model m(cfg, DType::F32);
      randomize(m.params(), 9);
      m.set_recompute(r);
      m.params().zero_grads();
      const size_t before = tensor_memory(Device::CPU).in_use;
      reset_tensor_peak(Device::CPU);
      m.forward_backward(tokens, targets, B, T, 1.0);
      peak.push_back(tensor_memory(Device::CPU).peak - before);
      CHECK(tensor_memory(Device::CPU).in_use == before);  // nothing left behind
    }
    CHECK(peak[1] < peak[0]);
    CHECK(peak[2] < peak[1]);
  }
}

TEST_CASE("depth attention weights: one row per Mix over its sources, each summing to one",
          "[model]") {
  struct Want {
    ModelConfig cfg;
    std::vector<size_t> sizes;  // sources per sublayer, then the final Mix
  };
  // Block S = 3 over 4 sublayers: [e] | [e, p] | [e, p] | [e, b_1] | final [e, b_1, p].
  // Full: sublayer s reads e and the s earlier outputs; the final Mix all 5
  // (with 5 layers, Mix groups of 4: phase-1 weights, then the recent ones).
  // The residual variants' rows: a window of 2 reads e and the 2 most recent
  // outputs; scalar weights and 4 heads (averaged) sum to one as well.
  for (const Want& w : {Want{tiny(ResidualMode::Block, 3), {1, 2, 2, 2, 3}},
                        Want{tiny(ResidualMode::Full), {1, 2, 3, 4, 5}},
                        Want{tiny(ResidualMode::Full, 0, 0, false, 5),
                             {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}},
                        Want{with_variant(tiny(ResidualMode::Full, 0, 0, false, 3),
                                          variant(Q::Static, W::Attention, Sc::Softmax, true, 1, 2)),
                             {1, 2, 3, 3, 3, 3, 3}},
                        Want{with_variant(tiny(ResidualMode::Block, 3), variant(Q::Static, W::Scalars)),
                             {1, 2, 2, 2, 3}},
                        Want{with_variant(tiny(ResidualMode::Block, 3),
                                          variant(Q::Input, W::Attention, Sc::Softmax, true, 4)),
                             {1, 2, 2, 2, 3}}}) {
    model::Model m(w.cfg, DType::F64);
    randomize(m.params(), 7);
    const int64_t B = 2, T = 6;
    const auto rows = model::depth_attention(m, testing::random_tokens(B * T, w.cfg.vocab_size, 3), B, T);
    REQUIRE(rows.size() == w.sizes.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      INFO("row " << r);
      REQUIRE(rows[r].size() == w.sizes[r]);
      double sum = 0;
      for (double a : rows[r]) {
        CHECK(a > 0);
        sum += a;
      }
      CHECK(sum == Approx(1.0).epsilon(1e-12));
    }
  }
}

TEST_CASE("depth attention of DenseFormer: its learnt weights, a row per average", "[model]") {
  // L = 3: the averages before layers 1 and 2 (over X_0..X_1, X_0..X_2) and
  // the head's (X_0..X_3); each row is the parameter itself, whatever the tokens.
  const ModelConfig c = tiny(ResidualMode::DenseFormer, 0, 0, false, 3);
  model::Model m(c, DType::F64);
  randomize(m.params(), 7);
  const auto rows = model::depth_attention(m, testing::random_tokens(12, c.vocab_size, 3), 2, 6);
  const char* names[] = {"model.layers.1.attn_res.dwa", "model.layers.2.attn_res.dwa",
                         "model.final_res.dwa"};
  REQUIRE(rows.size() == 3);
  for (size_t r = 0; r < 3; ++r) {
    INFO(names[r]);
    const Tensor& w = m.params().get(names[r]).value;
    REQUIRE(rows[r].size() == static_cast<size_t>(w.numel()));
    REQUIRE(rows[r].size() == r + 2);
    for (size_t j = 0; j < rows[r].size(); ++j) CHECK(rows[r][j] == testing::at(w, static_cast<int64_t>(j)));
  }
  // Initialised, every average is X_l itself: a_{l,l} = 1, the rest 0.
  model::Model fresh(c, DType::F64);
  fresh.params().init(5);
  for (const char* n : names) {
    const Tensor& w = fresh.params().get(n).value;
    for (int64_t j = 0; j < w.numel(); ++j) CHECK(testing::at(w, j) == (j == w.numel() - 1 ? 1.0 : 0.0));
  }
}

TEST_CASE("DenseFormer at its initial weights is the PreNorm baseline, bit for bit", "[model]") {
  // a_{l,l} = 1 and 0 elsewhere: every average is X_l exactly (0 x X_j adds
  // zeros), so the same other weights give the baseline's loss and gradients.
  ModelConfig dc = tiny(ResidualMode::DenseFormer, 0, 0, false, 3), bc = tiny(ResidualMode::Baseline, 0, 0, false, 3);
  model::Model dense(dc, DType::F32), base(bc, DType::F32);
  dense.params().init(3);
  randomize(base.params(), 11);
  for (auto& p : base.params().all()) dense.params().get(p.name).value.copy_from(p.value);
  const testing::Microbatch mb = testing::random_microbatch(2, 5, dc.vocab_size, 1);
  dense.params().zero_grads();
  base.params().zero_grads();
  CHECK(dense.forward_backward(mb.tokens, mb.targets, mb.B, mb.T, 1.0) ==
        base.forward_backward(mb.tokens, mb.targets, mb.B, mb.T, 1.0));
  for (auto& p : base.params().all()) {
    INFO(p.name);
    CHECK(testing::same_bits(dense.params().get(p.name).grad, p.grad));
  }
}

TEST_CASE("float32 model agrees with float64", "[model]") {
  ModelConfig c = tiny(ResidualMode::Block, 3);
  model::Model m64(c, DType::F64), m32(c, DType::F32);
  randomize(m64.params(), 5);
  for (size_t i = 0; i < m64.params().all().size(); ++i)
    m32.params().all()[i].value.copy_from(m64.params().all()[i].value.to(DType::F32));
  Tensor tokens = testing::random_tokens(8, c.vocab_size, 1), targets = testing::random_tokens(8, c.vocab_size, 2);
  double l64 = m64.forward_backward(tokens, targets, 2, 4, 1.0);
  double l32 = m32.forward_backward(tokens, targets, 2, 4, 1.0);
  CHECK(l32 == Approx(l64).epsilon(1e-5));
  for (size_t i = 0; i < m64.params().all().size(); ++i) {
    INFO(m64.params().all()[i].name);
    // Gradients are sums that may cancel: judged against each tensor's scale.
    CHECK(testing::scaled_diff(m32.params().all()[i].grad, m64.params().all()[i].grad) < 2e-5);
  }
}

TEST_CASE("KV-cache decoding reproduces the training forward", "[model]") {
  for (const auto& tc : cases()) {
    SECTION(tc.name) {
      model::Model m = testing::random_model(tc.cfg, DType::F64, 9);
      // A hybrid's KDA layers decode by the token-by-token recurrence from
      // their cached state and convolution windows, where the training
      // forward runs the chunkwise form: 70 tokens cross a chunk boundary
      // (64) and fill the windows many times over.
      const int64_t T = tc.cfg.has_kda() ? 70 : 6;
      const testing::Microbatch mb = testing::random_microbatch(1, T, tc.cfg.vocab_size, 5);
      auto cache = m.new_decode_cache(T);
      double loss = 0;
      for (int64_t t = 0; t < T; ++t) {
        auto logits = m.decode_step(mb.tokens.data<int32_t>()[t], cache);
        double mx = *std::max_element(logits.begin(), logits.end()), z = 0;
        for (float v : logits) z += std::exp(v - mx);
        loss += mx + std::log(z) - logits[mb.targets.data<int32_t>()[t]];
      }
      // decode_step returns float logits, hence the float tolerance.
      CHECK(loss == Approx(m.forward_loss(mb.tokens, mb.targets, 1, T)).epsilon(1e-5));
    }
  }
}

TEST_CASE("initialisation follows docs/model.md section 3 and depends only on the seed", "[model]") {
  ModelConfig c = tiny(ResidualMode::Block, 2);
  model::Model a(c), b(c);
  a.params().init(3);
  b.params().init(3);
  for (size_t i = 0; i < a.params().all().size(); ++i)
    CHECK(testing::max_rel_diff(a.params().all()[i].value, b.params().all()[i].value) == 0);
  CHECK(testing::at(a.params().get("model.layers.0.attn_res.query").value, 0) == 0.0);
  CHECK(testing::at(a.params().get("model.norm.weight").value, 3) == 1.0);
  // Standard deviations: 0.02, and 0.02/sqrt(2L) for output projections (on a bigger model).
  ModelConfig big = c;
  big.d_model = 64;
  big.d_ff = 256;
  big.n_heads = 4;
  big.n_kv_heads = 2;
  model::Model m(big);
  m.params().init(1);
  auto stddev = [](const Tensor& t) {
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += testing::at(t, i) * testing::at(t, i);
    return std::sqrt(s / t.numel());
  };
  CHECK(stddev(m.params().get("model.layers.1.mlp.up_proj.weight").value) == Approx(0.02).epsilon(0.03));
  CHECK(stddev(m.params().get("model.layers.1.mlp.down_proj.weight").value) ==
        Approx(0.02 / std::sqrt(4.0)).epsilon(0.03));
  // A table restricted to some layers gets identical values for them.
  model::Model part(big, DType::F32, {1, 2, false, false});
  part.params().init(1);
  CHECK(testing::max_rel_diff(part.params().get("model.layers.1.mlp.up_proj.weight").value,
                              m.params().get("model.layers.1.mlp.up_proj.weight").value) == 0);
}

TEST_CASE("initialisation gives the same bits on any number of threads: the formula's", "[model]") {
  // Tensors above the threshold where the host's threads split the elements
  // (65536): the embedding and the MLP matrices here.
  ModelConfig c = tiny(ResidualMode::Block, 2);
  c.vocab_size = 700, c.d_model = 128, c.d_ff = 544, c.n_heads = 4, c.n_kv_heads = 2;
  const int threads = omp_get_max_threads();
  model::Model one(c), many(c);
  omp_set_num_threads(1);
  one.params().init(7);
  omp_set_num_threads(3);  // an uneven split on any machine
  many.params().init(7);
  omp_set_num_threads(threads);
  int64_t big = 0;
  for (size_t i = 0; i < one.params().all().size(); ++i) {
    const model::Param& p = one.params().all()[i];
    INFO(p.name);
    CHECK(testing::same_bits(p.value, many.params().all()[i].value));
    big += p.value.numel() >= 65536;
    if (p.init_std == 0) continue;
    // Element k is init_std * normal(seed, fnv1a(name), k), as docs/model.md says.
    const int64_t n = p.value.numel();
    for (int64_t k : {int64_t{0}, n / 3, n - 1}) {
      const float want = static_cast<float>(p.init_std * random_normal(7, fnv1a64(p.name), k));
      CHECK(p.value.data<float>()[k] == want);
    }
  }
  CHECK(big >= 3);  // the threaded path ran
}

TEST_CASE("each layer's q/k/v and gate/up projections are one matrix each, as named parameters",
          "[model]") {
  const ModelConfig c = tiny(ResidualMode::Block, 2);  // GQA: k and v have fewer rows than q
  REQUIRE(c.n_kv_heads < c.n_heads);
  const int64_t hd = c.head_dim();
  // Joined: one allocation each for values and gradients, in declaration order.
  model::ParamTable joined = model::make_params(c, DType::F64);
  // The same declarations, each parameter on its own.
  model::ParamTable apart;
  for (const auto& s : model::param_shapes(c, {}))
    apart.add(s.name, s.shape, DType::F64, Device::CPU, s.init_std, s.init_value);
  joined.init(11);
  apart.init(11);
  REQUIRE(joined.all().size() == apart.all().size());
  for (size_t i = 0; i < joined.all().size(); ++i) {
    INFO(joined.all()[i].name);
    CHECK(joined.all()[i].name == apart.all()[i].name);
    CHECK(testing::same_bits(joined.all()[i].value, apart.all()[i].value));  // init per name
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    const model::Param& q = joined.get(pre + "self_attn.q_proj.weight");
    const model::Param& k = joined.get(pre + "self_attn.k_proj.weight");
    const model::Param& v = joined.get(pre + "self_attn.v_proj.weight");
    const Tensor qkv = Tensor::joined_rows({q.value, k.value, v.value});
    REQUIRE(qkv.defined());
    CHECK(qkv.shape() == Shape{(c.n_heads + 2 * c.n_kv_heads) * hd, c.d_model});
    CHECK(qkv.rows(c.n_heads * hd, 1).raw() == k.value.raw());
    CHECK(qkv.rows((c.n_heads + c.n_kv_heads) * hd, 1).raw() == v.value.raw());
    CHECK(Tensor::joined_rows({q.grad, k.grad, v.grad}).defined());
    const model::Param& g = joined.get(pre + "mlp.gate_proj.weight");
    const model::Param& u = joined.get(pre + "mlp.up_proj.weight");
    const Tensor w = Tensor::joined_rows({g.value, u.value});
    REQUIRE(w.defined());
    CHECK(w.shape() == Shape{2 * c.d_ff, c.d_model});
    CHECK(w.rows(c.d_ff, 1).raw() == u.value.raw());
    CHECK(Tensor::joined_rows({g.grad, u.grad}).defined());
    // Not joined: another order, a gap, or separate allocations.
    CHECK_FALSE(Tensor::joined_rows({u.value, g.value}).defined());
    CHECK_FALSE(Tensor::joined_rows({q.value, v.value}).defined());
    const model::Param& ga = apart.get(pre + "mlp.gate_proj.weight");
    const model::Param& ua = apart.get(pre + "mlp.up_proj.weight");
    CHECK_FALSE(Tensor::joined_rows({ga.value, ua.value}).defined());
  }
  // Joining keeps the contents; mismatched rows are refused by name.
  const Tensor before = apart.get("model.layers.0.self_attn.v_proj.weight").value.clone();
  apart.join_rows({"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                   "model.layers.0.self_attn.v_proj.weight"});
  CHECK(testing::same_bits(apart.get("model.layers.0.self_attn.v_proj.weight").value, before));
  CHECK(Tensor::joined_rows({apart.get("model.layers.0.self_attn.q_proj.weight").value,
                             apart.get("model.layers.0.self_attn.k_proj.weight").value,
                             apart.get("model.layers.0.self_attn.v_proj.weight").value})
            .defined());
  REQUIRE_THROWS_WITH(
      apart.join_rows({"model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.down_proj.weight"}),
      Catch::Contains("cannot join the values of model.layers.1.mlp.gate_proj.weight"));
}

TEST_CASE("MoE with a capacity factor drops the slots the reference drops", "[model][moe]") {
  // One sequence is the microbatch (the reference's capacity is per
  // sequence); capacity 1.0 x 8 tokens x 2 / 4 experts = 4 slots per expert,
  // and a large router bias towards expert 0 makes it overflow.
  for (ResidualMode mode : {ResidualMode::Baseline, ResidualMode::Block}) {
    ModelConfig c = with_moe(tiny(mode, mode == ResidualMode::Block ? 2 : 0, 0, false, 2), 4, 2, 1);
    c.moe.capacity_factor = 1.0;
    model::Model m = testing::random_model(c, DType::F64, 13);
    testing::set(m.state().get("model.layers.1.mlp.gate.e_score_correction_bias").value, 0, 5.0);
    const testing::Microbatch mb = testing::random_microbatch(1, 8, c.vocab_size, 3);
    model::MoeStats stats(c.n_layers, c.moe.experts);
    m.set_moe_stats(&stats);
    const double ours = m.forward_loss(mb.tokens, mb.targets, mb.B, mb.T);
    m.set_moe_stats(nullptr);
    // All 8 tokens chose expert 0 (4 dropped), and the second choices may
    // overflow another expert too.
    CHECK(stats.load[1 * 4 + 0] == 8);
    double over = 0;
    for (int64_t e = 0; e < 4; ++e) over += std::max(0.0, stats.load[1 * 4 + e] - 4);
    CHECK(stats.dropped[1] == over);
    CHECK(over >= 4);
    std::vector<int32_t> tk(mb.tokens.data<int32_t>(), mb.tokens.data<int32_t>() + 8);
    std::vector<int32_t> tg(mb.targets.data<int32_t>(), mb.targets.data<int32_t>() + 8);
    CHECK(ours == Approx(reference::sequence_loss(c, param_fn(m), tk, tg)).epsilon(1e-12));
  }
}

TEST_CASE("aux-free balancing moves each router bias towards the mean load by bias_rate",
          "[model][moe]") {
  // Layer 0 dense; layers 1 and 2 MoE with 4 experts (mean load 4 in both):
  // an expert above the mean goes down, one below goes up, one at it stays.
  const ModelConfig c = with_moe(tiny(ResidualMode::Baseline, 0, 0, false, 3), 4, 2, 0);
  model::Model m(c, DType::F32);
  model::MoeStats step(c.n_layers, 4);
  const std::vector<double> load = {0, 0, 0, 0, 5, 3, 4, 4, 8, 0, 0, 8};
  step.load = load;
  std::vector<double> lo(3, 99), hi(3, 99);
  m.update_router_bias(step, 0.01, lo, hi);
  m.update_router_bias(step, 0.01, lo, hi);  // twice: the steps add up
  auto bias = [&](int64_t l) {
    const Tensor& b = m.state().get("model.layers." + std::to_string(l) + ".mlp.gate.e_score_correction_bias").value;
    return std::vector<float>(b.data<float>(), b.data<float>() + 4);
  };
  CHECK(bias(1) == std::vector<float>{-0.02f, 0.02f, 0.0f, 0.0f});
  CHECK(bias(2) == std::vector<float>{-0.02f, 0.02f, 0.02f, -0.02f});
  CHECK(lo == std::vector<double>{99, -0.02f, -0.02f});
  CHECK(hi == std::vector<double>{99, 0.02f, 0.02f});
  CHECK_FALSE(m.state().contains("model.layers.0.mlp.gate.e_score_correction_bias"));
  // Only aux_free has a bias (model state, not a parameter).
  ModelConfig loss = c;
  loss.moe.balance = model::MoeBalance::AuxLoss;
  CHECK(model::Model(loss, DType::F32).state().all().empty());
  CHECK_FALSE(m.params().contains("model.layers.1.mlp.gate.e_score_correction_bias"));
}

TEST_CASE("the routers, and only they, are kept at full precision (fp32 values in a bf16 run)",
          "[model][moe]") {
  // ParamShape::full_precision: make_params gives them the statistics' dtype,
  // so their GEMM reads fp32 weights whether or not ZeRO-1 sliced the other
  // parameters' masters (the bf16 tables themselves need CUDA).
  const ModelConfig c = with_moe(tiny(ResidualMode::Block, 2, 0, false, 2), 4, 2, 1);
  int64_t routers = 0, want = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) want += c.moe_layer(l);
  REQUIRE(want > 0);
  for (const auto& s : model::param_shapes(c)) {
    const bool router = s.slot == model::Slot::Router;
    INFO(s.name);
    CHECK(s.full_precision == router);
    routers += router;
  }
  CHECK(routers == want);
}
