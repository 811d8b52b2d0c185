// Depth statistics (run.depth_stats_every, Model::set_depth_stats): the RMS of
// every sublayer output y_s and the norm of dL/dy_s equal a direct
// computation (the literal reference of docs/model.md with y_s perturbed, finite
// differences in float64), and attaching the sink changes no training number.
#include <cmath>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "data/shard.h"
#include "model/model.h"
#include "model/model_testing.h"
#include "temp_dir.h"
#include "testing.h"
#include "train/config.h"
#include "train/trainer.h"

using namespace attnres;
using attnres::testing::TempDir;
using model::ModelConfig;
using model::ResidualMode;
using nlohmann::json;
using reference::Seq;
using reference::Vec;
using testing::randomize;
using testing::tiny;

namespace {

// reference::sequence_loss with a hook on every sublayer output y_s (after
// f_s, before it joins the residual stream / partial sum), which may record
// or perturb it. The residual bookkeeping is docs/model.md section 2 verbatim.
using OutputHook = std::function<void(size_t s, Seq& y)>;
double loss_with_hook(const ModelConfig& c, const reference::ParamFn& P,
                      const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                      const OutputHook& hook) {
  const size_t T = tokens.size(), d = c.d_model, L2 = c.n_sublayers();
  const Vec E = P("model.embed_tokens.weight");
  Seq e(T), z(T);
  for (size_t t = 0; t < T; ++t) e[t] = Vec(E.begin() + tokens[t] * d, E.begin() + (tokens[t] + 1) * d);
  if (!c.attnres()) {
    Seq x = e;
    for (size_t s = 0; s < L2; ++s) {
      Seq y = reference::sublayer(c, P, s, x);
      hook(s, y);
      for (size_t t = 0; t < T; ++t) x[t] = reference::add(x[t], y[t]);
    }
    z = x;
  } else {
    const size_t S = c.resolved_block_size();
    std::vector<Seq> blocks{e};
    Seq partial;
    for (size_t s = 0; s < L2; ++s) {
      const size_t i = s % S;
      const std::string pre = reference::lp(s / 2, s % 2 == 0 ? "attn_res." : "mlp_res.");
      Seq x(T);
      for (size_t t = 0; t < T; ++t) {
        std::vector<Vec> src;
        for (const auto& b : blocks) src.push_back(b[t]);
        if (i > 0) src.push_back(partial[t]);
        x[t] = reference::depth_mix(c, P, pre, src);
      }
      Seq y = reference::sublayer(c, P, s, x);
      hook(s, y);
      if (i == 0) partial = y;
      else for (size_t t = 0; t < T; ++t) partial[t] = reference::add(partial[t], y[t]);
      if (i == S - 1) {
        blocks.push_back(partial);
        partial.clear();
      }
    }
    for (size_t t = 0; t < T; ++t) {
      std::vector<Vec> src;
      for (const auto& b : blocks) src.push_back(b[t]);
      if (!partial.empty()) src.push_back(partial[t]);
      z[t] = reference::depth_mix(c, P, "model.final_res.", src);
    }
  }
  const Vec g = P("model.norm.weight");
  const Vec W = P(c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  double loss = 0;
  for (size_t t = 0; t < T; ++t) {
    const Vec logits = reference::linear(W, reference::rmsnorm(z[t], &g, c.norm_eps));
    const double m = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (double v : logits) sum += std::exp(v - m);
    loss += m + std::log(sum) - logits[targets[t]];
  }
  return loss;
}

std::vector<int32_t> slice(const Tensor& t, int64_t b, int64_t T) {
  return std::vector<int32_t>(t.data<int32_t>() + b * T, t.data<int32_t>() + (b + 1) * T);
}

std::vector<json> read_jsonl(const std::string& path, bool drop_timing) {
  std::vector<json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    json r = json::parse(line);
    if (drop_timing) {
      r.erase("tokens_per_sec");
      r.erase("elapsed_sec");
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace

TEST_CASE("depth statistics equal a direct computation on a tiny model (float64)", "[depth_stats]") {
  using Case = testing::NamedConfig;
  for (const auto& tc : {Case{"baseline", tiny(ResidualMode::Baseline)}, Case{"full", tiny(ResidualMode::Full)},
                         Case{"block S=3 (final partial)", tiny(ResidualMode::Block, 3)}}) {
    SECTION(tc.name) {
      const ModelConfig& c = tc.cfg;
      const int64_t B = 2, T = 3, d = c.d_model, L2 = c.n_sublayers();
      const double grad_scale = 0.25;
      model::Model m(c, DType::F64);
      randomize(m.params(), 17);
      Tensor tokens = testing::random_tokens(B * T, c.vocab_size, 1);
      Tensor targets = testing::random_tokens(B * T, c.vocab_size, 2);

      // Without the sink, then with it: the same loss and gradients, bit for bit.
      m.params().zero_grads();
      const double loss_off = m.forward_backward(tokens, targets, B, T, grad_scale);
      std::vector<Tensor> grads_off;
      for (const auto& p : m.params().all()) grads_off.push_back(p.grad.clone());
      model::DepthStats stats(L2);
      m.set_depth_stats(&stats);
      m.params().zero_grads();
      const double loss_on = m.forward_backward(tokens, targets, B, T, grad_scale);
      m.set_depth_stats(nullptr);
      CHECK(loss_on == loss_off);
      for (size_t i = 0; i < grads_off.size(); ++i)
        CHECK(testing::max_rel_diff(m.params().all()[i].grad, grads_off[i], 1e-300) == 0.0);

      // Direct: y_s from the reference, dL/dy_s by central differences on y_s.
      const reference::ParamFn P = testing::param_fn(m.params());
      std::vector<double> out_sq(L2, 0.0), grad_sq(L2, 0.0);
      const double h = 1e-5;
      for (int64_t b = 0; b < B; ++b) {
        const auto tk = slice(tokens, b, T), tg = slice(targets, b, T);
        loss_with_hook(c, P, tk, tg, [&](size_t s, Seq& y) {
          for (const auto& row : y)
            for (double v : row) out_sq[s] += v * v;
        });
        for (int64_t s = 0; s < L2; ++s)
          for (int64_t t = 0; t < T; ++t)
            for (int64_t k = 0; k < d; ++k) {
              auto nudge = [&](double delta) {
                return loss_with_hook(c, P, tk, tg, [&](size_t s2, Seq& y) {
                  if (static_cast<int64_t>(s2) == s) y[t][k] += delta;
                });
              };
              const double g = grad_scale * (nudge(h) - nudge(-h)) / (2 * h);
              grad_sq[s] += g * g;
            }
      }
      for (int64_t s = 0; s < L2; ++s) {
        INFO("sublayer " << s);
        CHECK(stats.output_count[s] == B * T * d);
        CHECK(stats.grad_count[s] == B * T * d);
        CHECK(std::sqrt(stats.output_sumsq[s] / stats.output_count[s]) ==
              Approx(std::sqrt(out_sq[s] / (B * T * d))).epsilon(1e-12));
        CHECK(std::sqrt(stats.grad_sumsq[s]) == Approx(std::sqrt(grad_sq[s])).epsilon(1e-6));
        CHECK(stats.grad_sumsq[s] > 0);
      }
    }
  }
}

TEST_CASE("run.depth_stats_every: depth_stats.jsonl, and training numbers unchanged", "[depth_stats]") {
  TempDir d;
  data::write_shard(d / "train.bin", testing::learnable_tokens(1, 8000), 2);
  data::write_shard(d / "val.bin", testing::learnable_tokens(2, 2000), 2);
  json j = json::parse(R"({
    "model": {"vocab_size": 64, "d_model": 16, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1,
              "d_ff": 32, "residual": {"mode": "block", "block_size": 3}},
    "optimizer": {"lr": 1e-2},
    "schedule": {"type": "cosine", "warmup_steps": 2},
    "training": {"steps": 7, "micro_batch_size": 2, "seq_len": 16, "grad_accum": 2, "seed": 5},
    "data": {"shuffle": false},
    "eval": {"every": 4, "batches": 2},
    "run": {"log_every": 100}})");
  j["data"]["train"] = d / "train.bin";
  j["data"]["val"] = d / "val.bin";
  auto config = [&](const std::string& run, int64_t every) {
    json k = j;
    k["run"]["dir"] = d / run;
    k["run"]["depth_stats_every"] = every;
    train::Config c = train::Config::from_json(k, "test");
    c.validate();
    return c;
  };
  REQUIRE(train::train(config("off", 0)) == 0);
  REQUIRE(train::train(config("on", 3)) == 0);
  REQUIRE(train::train(config("every", 1)) == 0);
  CHECK_FALSE(std::filesystem::exists(d / "off/depth_stats.jsonl"));
  const auto off = read_jsonl(d / "off/metrics.jsonl", true);
  CHECK(off.size() == 7 + 2);  // 7 steps, evals at 4 and 7
  CHECK(read_jsonl(d / "on/metrics.jsonl", true) == off);
  CHECK(read_jsonl(d / "every/metrics.jsonl", true) == off);

  // Every 3rd step and the last one; one value per sublayer.
  const auto on = read_jsonl(d / "on/depth_stats.jsonl", false);
  REQUIRE(on.size() == 3);
  CHECK(on[0]["step"] == 3);
  CHECK(on[1]["step"] == 6);
  CHECK(on[2]["step"] == 7);
  CHECK(on[0]["output_rms"].size() == 4);
  CHECK(on[0]["grad_norm"].size() == 4);
  const auto every = read_jsonl(d / "every/depth_stats.jsonl", false);
  REQUIRE(every.size() == 7);
  CHECK(every[2] == on[0]);  // same step, same numbers

  // Step 1's record = the initial model on units 0 and 1 (grad_accum 2),
  // with the gradient of the step's mean loss.
  const train::Config c = config("direct", 0);
  model::Model m(c.model);
  m.params().init(c.training.seed);
  data::TokenLoader loader({d / "train.bin"}, 2, 16, false, c.training.seed);
  model::DepthStats stats(c.model.n_sublayers());
  m.set_depth_stats(&stats);
  for (int64_t u = 0; u < 2; ++u) {
    auto batch = loader.unit(u);
    m.forward_backward(batch.inputs, batch.targets, 2, 16, 1.0 / (2 * 2 * 16));
  }
  for (size_t s = 0; s < 4; ++s) {
    INFO("sublayer " << s);
    CHECK(every[0]["output_rms"][s].get<double>() ==
          Approx(std::sqrt(stats.output_sumsq[s] / stats.output_count[s])).epsilon(1e-14));
    CHECK(every[0]["grad_norm"][s].get<double>() == Approx(std::sqrt(stats.grad_sumsq[s])).epsilon(1e-14));
    CHECK(every[0]["output_rms"][s].get<double>() > 0);
  }

  json bad = j;
  bad["run"]["depth_stats_every"] = -1;
  REQUIRE_THROWS_WITH(train::Config::from_json(bad, "test").validate(),
                      Catch::Contains("run.depth_stats_every") && Catch::Contains(">= 0"));
  CHECK(c.to_json()["run"]["depth_stats_every"] == 0);
}
