// Scaling-law sweeps (src/train/sweep.h): the plan (grid, names, steps,
// compute), errors in sweep files, parameter counts, reading metrics, fits
// wired to the right runs, and a 2x2 grid trained in-process: completed runs
// are skipped, interrupted ones resume and end bit-identical to an
// uninterrupted sweep.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "core/fileio.h"
#include "data/shard.h"
#include "model/params.h"
#include "temp_dir.h"
#include "testing.h"
#include "train/sweep.h"

using namespace attnres;
using namespace attnres::train;
using attnres::testing::TempDir;
using Catch::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

void write_corpus(const TempDir& d) {
  data::write_shard(d / "train.bin", testing::learnable_tokens(1, 20000), 2);
  data::write_shard(d / "val.bin", testing::learnable_tokens(2, 3000), 2);
}

// Two sizes, each with its own budget, x baseline / full: 4 runs of 10 and 20 steps.
json tiny_sweep(const TempDir& d, const std::string& out = "out") {
  return json::parse(R"({
    "out_dir": ")" + d.file(out) + R"(",
    "base": {"model": {"vocab_size": 64, "n_heads": 2, "n_kv_heads": 1},
             "optimizer": {"lr": 1e-2},
             "schedule": {"type": "cosine"},
             "training": {"micro_batch_size": 2, "seq_len": 16, "seed": 3},
             "data": {"train": ")" + d.file("train.bin") + R"(", "val": ")" + d.file("val.bin") + R"(",
                      "shuffle": true},
             "checkpoint": {"every": 3, "keep_last": 1},
             "eval": {"batches": 2},
             "run": {"log_every": 100, "depth_stats_every": 5}},
    "sizes": [{"name": "a", "model": {"d_model": 16, "n_layers": 1, "d_ff": 32}, "tokens": [320]},
              {"name": "b", "model": {"d_model": 24, "n_layers": 2, "d_ff": 48}, "tokens": [640]}],
    "modes": [{"mode": "baseline"}, {"mode": "full"}],
    "warmup_fraction": 0.2
  })");
}

// metrics.jsonl's step and evaluation records without the timing fields.
std::vector<json> records(const std::string& path) {
  std::vector<json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    json r = json::parse(line);
    // Checkpoint records: timings and memory, and more of them in a run
    // that was interrupted and resumed.
    if (r.value("event", "") == "checkpoint") continue;
    r.erase("tokens_per_sec");
    r.erase("elapsed_sec");
    out.push_back(r);
  }
  return out;
}

std::vector<RunOutcome> outcomes_of(const SweepPlan& plan) {
  std::vector<RunOutcome> out;
  for (const auto& r : plan.runs) out.push_back(read_outcome(r));
  return out;
}

SweepOptions no_plots() {
  SweepOptions o;
  o.plots = false;
  o.jobs = 1;  // in this process (a test binary cannot start `attnres train`)
  return o;
}

}  // namespace

TEST_CASE("sweep plan: sizes x modes x budgets with names, steps and compute", "[sweep]") {
  TempDir d;
  json j = tiny_sweep(d);
  j["tokens"] = {300, 1e3};  // a global list for sizes without their own
  j["sizes"][0].erase("tokens");
  j["modes"].push_back({{"mode", "block"}, {"n_blocks", 2}});
  const SweepPlan plan = parse_sweep(j, "sweep.json");
  std::vector<std::string> names;
  for (const auto& r : plan.runs) names.push_back(r.name);
  CHECK(names == std::vector<std::string>{"a_baseline_300", "a_baseline_1k", "a_full_300",
                                          "a_full_1k", "a_block_n2_300", "a_block_n2_1k",
                                          "b_baseline_640", "b_full_640", "b_block_n2_640"});
  CHECK(plan.modes == std::vector<std::string>{"baseline", "full", "block_n2"});
  CHECK(plan.baseline_mode == "baseline");
  CHECK(plan.fit_loss == "val");

  const SweepRun& r = plan.runs[1];  // a_baseline_1k: 1000 tokens / 32 per step = 31.25 -> 31 steps
  CHECK(r.size == "a");
  CHECK(r.mode == "baseline");
  CHECK(r.budget == 1000);
  CHECK(r.steps == 31);
  CHECK(r.tokens == 31 * 32);
  CHECK(r.config.training.steps == 31);
  CHECK(r.config.schedule.warmup_steps == 6);  // round(0.2 * 31)
  CHECK(r.config.model.d_model == 16);
  CHECK(r.config.model.n_heads == 2);  // from the base
  CHECK(r.dir == d.file("out") + "/runs/a_baseline_1k");
  CHECK(r.config.run.dir == r.dir);
  CHECK(r.config.checkpoint.dir == r.dir + "/ckpt");
  CHECK(r.config.checkpoint.resume == "auto");
  CHECK(r.config.eval.every == 31);  // the final eval runs before the final checkpoint
  // The scaling-law N and C = 6 N D, counted by hand (and checked with a few
  // lines of Python), not by the code under test: size a is d 16, 1 layer,
  // H 2 of head dim 8 with one KV head, d_ff 32; N leaves out the embedding
  // and the LM head. Per layer: two gains 2 x 16, q 16 x 16 = 256, k and v
  // 8 x 16 = 128 each, o 256, gate, up, down 3 x 32 x 16 = 1536: 2336; the
  // final norm 16: N = 2352. C = 6 x 2352 x 992 tokens = 13,999,104.
  CHECK(r.params == 2352);
  CHECK(r.flops == 13999104.0);

  const SweepRun& blk = plan.runs[8];  // b_block_n2_640: 4 sublayers in 2 blocks
  CHECK(blk.config.model.mode == model::ResidualMode::Block);
  CHECK(blk.config.model.resolved_block_size() == 2);
  // Size b by hand: d 24, 2 layers, head dim 12, d_ff 48. Per layer 2 x 24 +
  // 576 + 2 x 288 + 576 + 3 x 1152 = 5232, x 2 + the final norm 24 = 10488
  // for the baseline; AttnRes adds a query per sublayer and the final one,
  // 5 x 24 = 120: 10608, the same for full and block (the queries count).
  CHECK(plan.runs[6].params == 10488);  // b_baseline_640
  CHECK(plan.runs[7].params == 10608);  // b_full_640
  CHECK(blk.params == 10608);
  CHECK(blk.flops == 40734720.0);  // 6 x 10608 x 640

  // Overrides reach every run's base config.
  const SweepPlan lr = parse_sweep(j, "sweep.json", {"--optimizer.lr=0.5", "--training.seq_len=8"});
  CHECK(lr.runs[0].config.optimizer.lr == 0.5);
  // round(budget / tokens per step) and round(warmup_fraction x steps), each
  // where truncation gives another count: 300 / 16 = 18.75, 0.2 x 19 = 3.8.
  CHECK(lr.runs[0].steps == 19);
  CHECK(lr.runs[0].config.schedule.warmup_steps == 4);
  // Run names carry the budget to three digits, without exponents.
  json big = j;
  big["tokens"] = {999999, 38700000000, 1e6 + 5e4};
  std::vector<std::string> big_names;
  for (const auto& run : parse_sweep(big, "sweep.json").runs) big_names.push_back(run.name);
  CHECK(big_names[0] == "a_baseline_1M");
  CHECK(big_names[1] == "a_baseline_38.7B");
  CHECK(big_names[2] == "a_baseline_1.05M");
  const SweepPlan moved = parse_sweep(j, "sweep.json", {"--out_dir=elsewhere", "--training.seed=2"});
  CHECK(moved.out_dir == "elsewhere");
  CHECK(moved.runs[0].dir == "elsewhere/runs/a_baseline_300");
  CHECK(moved.runs[0].config.training.seed == 2);
  // A mode's own config keys (two optimizers of one residual mode): merged
  // into its runs only.
  json opt = j;
  opt["modes"] = {{{"mode", "baseline"}},
                  {{"mode", "baseline"}, {"name", "baseline_muon"},
                   {"config", {{"optimizer", {{"type", "muon"}, {"momentum", 0.9}}}}}}};
  const SweepPlan two = parse_sweep(opt, "sweep.json");
  auto run_named = [&](const std::string& name) -> const SweepRun& {
    for (const SweepRun& r : two.runs)
      if (r.name == name) return r;
    FAIL("no run " << name);
    return two.runs.front();
  };
  const SweepRun& adamw = run_named("a_baseline_300");
  const SweepRun& muon = run_named("a_baseline_muon_300");
  CHECK(adamw.config.optimizer.type == OptimizerType::AdamW);
  CHECK(muon.config.optimizer.type == OptimizerType::Muon);
  CHECK(muon.config.optimizer.momentum == 0.9);
  CHECK(muon.config.optimizer.lr == adamw.config.optimizer.lr);
  CHECK(muon.config.model.mode == model::ResidualMode::Baseline);
}

TEST_CASE("sweep files: mistakes are errors naming the key and the reason", "[sweep]") {
  TempDir d;
  auto err = [&](const std::function<void(json&)>& edit, const std::vector<std::string>& overrides = {}) {
    json j = tiny_sweep(d);
    edit(j);
    try {
      parse_sweep(j, "sw.json", overrides);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(err([](json& j) { j["colour"] = 1; }), Contains("sw.json") && Contains("unknown key 'colour'"));
  CHECK_THAT(err([](json& j) { j.erase("out_dir"); }), Contains("'out_dir' is missing"));
  CHECK_THAT(err([](json& j) { j["base"]["training"]["steps"] = 5; }),
             Contains("'base' sets config key 'training.steps'") && Contains("the sweep sets"));
  CHECK_THAT(err([](json&) {}, {"--checkpoint.dir=x"}), Contains("config key 'checkpoint.dir'"));
  CHECK_THAT(err([](json& j) { j["sizes"][0]["model"]["residual"] = {{"mode", "full"}}; }),
             Contains("sizes[0].model.residual") && Contains("come from 'modes'"));
  CHECK_THAT(err([](json& j) { j["sizes"][1]["config"] = {{"run", {{"dir", "x"}}}}; }),
             Contains("'sizes[1].config' sets config key 'run.dir'"));
  CHECK_THAT(err([](json& j) { j["modes"][0]["config"] = {{"model", {{"residual", {{"mode", "full"}}}}}}; }),
             Contains("'modes[0].config' sets model.residual"));
  CHECK_THAT(err([](json& j) { j["modes"][0]["config"] = {{"training", {{"steps", 3}}}}; }),
             Contains("'modes[0].config' sets config key 'training.steps'"));
  CHECK_THAT(err([](json& j) { j["modes"][0]["config"] = 3; }), Contains("'modes[0].config' must be an object"));
  CHECK_THAT(err([](json& j) { j["sizes"][0].erase("name"); }), Contains("'sizes[0].name' is missing"));
  CHECK_THAT(err([](json& j) { j["sizes"][1]["name"] = "a"; }), Contains("two sizes are named \"a\""));
  CHECK_THAT(err([](json& j) { j["sizes"][0]["name"] = "a b"; }), Contains("not a usable name"));
  CHECK_THAT(err([](json& j) { j["sizes"][0]["tokens"] = {0}; }),
             Contains("sizes[0].tokens") && Contains("positive whole token counts"));
  CHECK_THAT(err([](json& j) { j["sizes"][0]["tokens"] = json::array(); }), Contains("non-empty array"));
  CHECK_THAT(err([](json& j) { j["sizes"][0].erase("tokens"); }), Contains("'sizes[0]' has no token budgets"));
  CHECK_THAT(err([](json& j) { j["sizes"][0]["tokens"] = {10}; }),
             Contains("run a_baseline_10") && Contains("less than half a step (32 tokens per step"));
  CHECK_THAT(err([](json& j) { j["sizes"][0]["tokens"] = {320001, 320002}; }),
             Contains("two runs would be named \"a_baseline_320k\""));
  CHECK_THAT(err([](json& j) { j["modes"][1] = {{"mode", "block"}}; }),
             Contains("modes[1]") && Contains("exactly one of block_size or n_blocks"));
  CHECK_THAT(err([](json& j) { j["modes"][1] = {{"mode", "full"}, {"n_blocks", 2}}; }),
             Contains("block mode only"));
  CHECK_THAT(err([](json& j) { j["modes"][1] = {{"mode", "dense"}}; }), Contains("'modes[1].mode': unknown residual mode \"dense\""));
  CHECK_THAT(err([](json& j) { j["modes"][1] = {{"mode", "baseline"}}; }),
             Contains("two modes are named \"baseline\""));
  CHECK_THAT(err([](json& j) { j["modes"] = json::array(); }), Contains("'modes' must be a non-empty array"));
  CHECK_THAT(err([](json& j) { j["fit"] = {{"baseline", "nope"}}; }),
             Contains("'fit.baseline' = \"nope\" is not one of the modes"));
  CHECK_THAT(err([](json& j) { j["fit"] = {{"loss", "test"}}; }), Contains("'fit.loss' = \"test\""));
  CHECK_THAT(err([](json& j) { j["base"]["data"].erase("val"); }),
             Contains("(run a_baseline_320)") && Contains("no data.val"));
  CHECK_THAT(err([](json& j) { j["warmup_fraction"] = 1.5; }), Contains("'warmup_fraction' must be"));
  // The trainer's own checks, with the run named.
  CHECK_THAT(err([](json& j) { j["base"]["optimizer"]["lr_typo"] = 1; }),
             Contains("(run a_baseline_320)") && Contains("unknown config key 'optimizer.lr_typo'"));
  CHECK_THAT(err([](json& j) { j["sizes"][1]["model"]["n_heads"] = 5; }),
             Contains("(run b_baseline_640)") && Contains("n_heads"));
  CHECK_THAT(err([](json& j) { j["seeds"] = {1, 2}; }),
             Contains("'base' sets config key 'training.seed'") && Contains("'seeds'"));
  CHECK_THAT(err([](json& j) {
               j["base"]["training"].erase("seed");
               j["seeds"] = {1, 2};
               j["sizes"][0]["config"] = {{"training", {{"seed", 7}}}};
             }),
             Contains("size 'a' sets config key 'training.seed'"));
  CHECK_THAT(err([](json& j) { j["base"]["training"].erase("seed"); j["seeds"] = {1, 1}; }),
             Contains("'seeds' lists 1 twice"));
  CHECK_THAT(err([](json& j) { j["base"]["training"].erase("seed"); j["seeds"] = json::array(); }),
             Contains("'seeds' must be a non-empty array"));
  CHECK_THAT(err([](json& j) { j["base"]["training"].erase("seed"); j["seeds"] = {-1}; }),
             Contains("'seeds' must hold non-negative integers"));
  // And a file that is not there / not JSON.
  REQUIRE_THROWS_WITH(load_sweep(d / "missing.json"), Contains("missing.json") && Contains("cannot open"));
  write_text_file_atomic(d / "bad.json", "{\"out_dir\": ");
  REQUIRE_THROWS_WITH(load_sweep(d / "bad.json"), Contains("bad.json: not valid JSON"));
}

TEST_CASE("non-embedding parameter counts match the model's parameter table", "[sweep]") {
  for (const auto mode : {model::ResidualMode::Baseline, model::ResidualMode::Full, model::ResidualMode::Block}) {
    for (bool tie : {false, true}) {
      model::ModelConfig c;
      c.vocab_size = 50;
      c.d_model = 24;
      c.n_layers = 3;
      c.n_heads = 4;
      c.n_kv_heads = 2;
      c.d_ff = 40;
      c.tie_embeddings = tie;
      c.mode = mode;
      if (mode == model::ResidualMode::Block) c.n_blocks = 2;
      c.validate();
      const model::ParamTable t = model::make_params(c, DType::F32);
      int64_t embedding = 0;
      for (const auto& p : t.all())
        if (p.name == "model.embed_tokens.weight" || p.name == "lm_head.weight") embedding += p.value.numel();
      INFO(model::residual_mode_name(mode) << (tie ? ", tied" : ""));
      CHECK(model::non_embedding_params(c) == t.numel() - embedding);
      CHECK(model::total_params(c) == t.numel());
    }
  }
}

TEST_CASE("run outcomes from metrics.jsonl: resumed duplicates, segments, torn last line", "[sweep]") {
  TempDir d;
  // Invocation 1 ran steps 1-5 (checkpoint at 4, then killed); invocation 2
  // resumed at 4 and logged 5 again, then 6 with the final val loss.
  write_text_file_atomic(d / "m.jsonl",
                         "{\"step\":1,\"loss\":4.0,\"elapsed_sec\":1.0}\n"
                         "{\"step\":2,\"loss\":3.5,\"elapsed_sec\":2.0}\n"
                         "{\"step\":3,\"loss\":3.0,\"elapsed_sec\":3.0}\n"
                         "{\"step\":4,\"loss\":2.75,\"elapsed_sec\":4.0}\n"
                         "{\"step\":5,\"loss\":2.5,\"elapsed_sec\":5.0}\n"
                         "{\"step\":5,\"loss\":2.5,\"elapsed_sec\":0.5}\n"
                         "{\"step\":6,\"loss\":2.0,\"elapsed_sec\":1.5}\n"
                         "{\"step\":6,\"val_loss\":2.25}\n"
                         "{\"step\":6,\"lo");  // torn by a crash
  RunOutcome o = outcome_from_metrics(d / "m.jsonl", 6);
  CHECK(o.status == "done");
  CHECK(o.step == 6);
  CHECK(o.train_loss == 2.0);
  CHECK(o.train_loss_avg == 2.0);  // the last 10% of 6 steps = 1 step
  CHECK(o.val_loss == 2.25);
  CHECK(o.wall_sec == Approx(6.5));  // 5.0 + 1.5
  o = outcome_from_metrics(d / "m.jsonl", 10);
  CHECK(o.status == "partial");
  CHECK(std::isnan(o.train_loss));
  CHECK(std::isnan(o.val_loss));
  o = outcome_from_metrics(d / "m.jsonl", 5);  // averages over the last steps it asks for
  CHECK(o.train_loss == 2.5);
  CHECK(outcome_from_metrics(d / "none.jsonl", 6).status == "new");
  write_text_file_atomic(d / "bad.jsonl", "{\"step\":1,\"loss\":4.0}\nnot json\n{\"step\":2}\n");
  REQUIRE_THROWS_WITH(outcome_from_metrics(d / "bad.jsonl", 2), Contains("bad.jsonl:2: not a JSON record"));
}

TEST_CASE("fits and multipliers use the completed runs of each mode", "[sweep]") {
  // Four sizes x baseline / full / block with losses on known lines
  // (C in PFLOP/s-days): baseline 3.0 C^-0.1, full 2.9 C^-0.1, block 2.95 C^-0.11.
  TempDir d;
  json j = tiny_sweep(d);
  j["sizes"] = json::array();
  for (int i = 0; i < 4; ++i)
    j["sizes"].push_back({{"name", "s" + std::to_string(i)},
                          {"model", {{"d_model", 16 + 8 * i}, {"n_layers", 1 + i}, {"d_ff", 32}}},
                          {"tokens", {640 * (i + 1)}}});
  j["modes"].push_back({{"mode", "block"}, {"block_size", 2}, {"name", "blk"}});
  const SweepPlan plan = parse_sweep(j, "sweep.json");
  REQUIRE(plan.runs.size() == 12);
  std::vector<RunOutcome> out(plan.runs.size());
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    const double C = plan.runs[i].flops / kFlopsPerPflopsDay;
    const std::string& m = plan.runs[i].mode;
    out[i].status = "done";
    out[i].val_loss = m == "baseline" ? 3.0 * std::pow(C, -0.1)
                      : m == "full"   ? 2.9 * std::pow(C, -0.1)
                                      : 2.95 * std::pow(C, -0.11);
    out[i].train_loss = out[i].val_loss + 0.1;
  }
  out[11].status = "partial";  // an unfinished run is left out of the fit
  out[11].val_loss = 100;
  const json fits = fit_sweep(plan, out);
  CHECK(fits["modes"]["baseline"]["A"].get<double>() == Approx(3.0).epsilon(1e-9));
  CHECK(fits["modes"]["baseline"]["alpha"].get<double>() == Approx(0.1).epsilon(1e-9));
  CHECK(fits["modes"]["full"]["A"].get<double>() == Approx(2.9).epsilon(1e-9));
  CHECK(fits["modes"]["blk"]["alpha"].get<double>() == Approx(0.11).epsilon(1e-9));
  CHECK(fits["modes"]["blk"]["n"] == 3);
  CHECK(fits["modes"]["full"]["r2"].get<double>() == Approx(1.0));
  // Full: equal slopes, so every budget has multiplier (3.0 / 2.9)^(1 / 0.1).
  const double want = std::pow(3.0 / 2.9, 10.0);
  int n_full = 0;
  for (const auto& r : fits["multipliers"]) {
    if (r["mode"] != "full") continue;
    ++n_full;
    CHECK(r["multiplier_measured"].get<double>() == Approx(want).epsilon(1e-9));
    CHECK(r["multiplier_fit"].get<double>() == Approx(want).epsilon(1e-9));
    CHECK(r["baseline_loss"].get<double>() > r["loss"].get<double>());
  }
  CHECK(n_full == 4);
  CHECK(fits["summary"]["full"]["geomean_multiplier_measured"].get<double>() == Approx(want).epsilon(1e-9));
  CHECK(fits["summary"]["blk"]["points"] == 3);
  // One seed per point: no interval, and the report says why.
  CHECK(fits["summary"]["full"]["ci95"].is_null());
  CHECK_THAT(fits["summary"]["full"]["verdict"].get<std::string>(), Contains("one seed per point"));
  const std::string table = fits_table(fits);
  // The fitted exponents to 5 decimals, and full's multiplier (3 / 2.9)^10 =
  // 1.40357 (Python), which the table shows to 3 significant digits ("%g":
  // 1.40 -> "1.4"), in full's summary line.
  CHECK_THAT(table, Contains("baseline") && Contains("0.10000") && Contains("0.11000") &&
                        Contains("full: 1.4x (geometric mean over 4 points)"));

  // The same sweep fitted on train loss.
  json jt = j;
  jt["fit"] = {{"loss", "train"}};
  const json tf = fit_sweep(parse_sweep(jt, "sweep.json"), out);
  CHECK(tf["loss"] == "train_loss");
  CHECK(tf["modes"]["baseline"]["points"][0]["loss"].get<double>() == Approx(out[0].train_loss));

  // Too few completed runs: that mode reports why, the others still fit.
  for (size_t i = 0; i < out.size(); ++i)
    if (plan.runs[i].mode == "full" && plan.runs[i].size != "s0") out[i].status = "partial";
  const json few = fit_sweep(plan, out);
  CHECK_THAT(few["modes"]["full"]["error"].get<std::string>(), Contains("at least 2 points, got 1"));
  CHECK(few["modes"]["baseline"].contains("A"));
  CHECK(few["multipliers"].size() == 1 + 3);  // full s0 (measured only) + blk
  CHECK_FALSE(few["multipliers"][0].contains("multiplier_fit"));
}

TEST_CASE("seeds: every point once per seed, fits and multipliers on the seeds' mean", "[sweep]") {
  TempDir d;
  json j = tiny_sweep(d);
  j["base"]["training"].erase("seed");
  j["seeds"] = {4, 7, 9};
  j["sizes"].push_back({{"name", "c"}, {"model", {{"d_model", 32}, {"n_layers", 2}, {"d_ff", 64}}},
                        {"tokens", {1280}}});
  const SweepPlan plan = parse_sweep(j, "sweep.json");
  REQUIRE(plan.runs.size() == 3 * 2 * 3);
  CHECK(plan.seeds == std::vector<int64_t>{4, 7, 9});
  CHECK(plan.runs[0].name == "a_baseline_320_s4");
  CHECK(plan.runs[2].name == "a_baseline_320_s9");
  CHECK(plan.runs[2].point == "a_baseline_320");
  CHECK(plan.runs[2].seed == 9);
  CHECK(plan.runs[2].config.training.seed == 9);
  CHECK(plan.runs[2].dir == d.file("out") + "/runs/a_baseline_320_s9");

  // Each seed's loss is the line's value times (1 - e, 1, 1 + e): the means
  // lie on the lines (baseline 3.0 C^-0.1, full 2.9 C^-0.1), one seed of one
  // point did not finish and is left out of its mean.
  std::vector<RunOutcome> out(plan.runs.size());
  const double e = 0.004, spread[] = {1 - e, 1.0, 1 + e};
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    const double C = plan.runs[i].flops / kFlopsPerPflopsDay;
    out[i].status = "done";
    out[i].val_loss = (plan.runs[i].mode == "baseline" ? 3.0 : 2.9) * std::pow(C, -0.1) * spread[i % 3];
  }
  out[5].status = "partial";  // a_full_320_s9
  const json fits = fit_sweep(plan, out);
  CHECK(fits["seeds"] == json({4, 7, 9}));
  const json& p0 = fits["modes"]["baseline"]["points"][0];
  CHECK(p0["point"] == "a_baseline_320");
  CHECK(p0["seeds"] == 3);
  CHECK(p0["runs"] == json({"a_baseline_320_s4", "a_baseline_320_s7", "a_baseline_320_s9"}));
  CHECK(p0["loss_se"].get<double>() == Approx(e * p0["loss"].get<double>() / std::sqrt(3.0)).epsilon(1e-9));
  CHECK(fits["modes"]["full"]["points"][0]["seeds"] == 2);
  CHECK(fits["modes"]["baseline"]["alpha"].get<double>() == Approx(0.1).epsilon(1e-6));
  REQUIRE(fits["multipliers"].size() == 3);  // one row per point of full
  const double want = std::pow(3.0 / 2.9, 10.0);
  CHECK(fits["multipliers"][1]["multiplier_measured"].get<double>() == Approx(want).epsilon(1e-6));
  const json& s = fits["summary"]["full"];
  REQUIRE(s["ci95"].is_array());
  CHECK(s["ci95"][0].get<double>() < s["geomean_multiplier_measured"].get<double>());
  CHECK(s["ci95"][1].get<double>() > s["geomean_multiplier_measured"].get<double>());
  // 1.4x with 0.4% seed noise: clearly ahead.
  CHECK(s["distinguished_from_1"] == true);
  CHECK_THAT(s["verdict"].get<std::string>(), Contains("ahead of baseline at 95%"));
  // The geometric mean, by hand (Python): b and c on the line, (3 / 2.9)^10 =
  // 1.40357 each; a_full_320's mean lost its (1 + e) seed, so its loss is
  // (1 - e/2) times the line's and its multiplier (3 / (2.9 (1 - e/2)))^10 =
  // 1.43195; (1.43195 x 1.40357^2)^(1/3) = 1.41296, shown as "1.41".
  CHECK_THAT(fits_table(fits), Contains("full: 1.41x (geometric mean over 3 points)") &&
                                   Contains("95% interval") && Contains("ahead of baseline at 95%"));
  const std::string csv = results_csv(plan, out);
  CHECK_THAT(csv, Contains("\na_full_320_s9,a_full_320,a,full,9,full,"));
}

TEST_CASE("ablation: one point per mode, t-intervals, paired differences, the paper beside",
          "[sweep]") {
  TempDir d;
  json j = tiny_sweep(d);
  j["base"]["training"].erase("seed");
  j["seeds"] = {1, 2, 3};
  j["sizes"] = json::parse(R"([{"name": "a", "model": {"d_model": 16, "n_layers": 2, "d_ff": 32},
                               "tokens": [320]}])");
  j["modes"] = json::parse(R"([{"mode": "baseline", "paper": 1.766},
                               {"name": "full", "mode": "full", "paper": 1.737},
                               {"name": "full_sigmoid", "mode": "full", "score": "sigmoid", "paper": 1.741},
                               {"name": "swa", "mode": "full", "window": 2}])");
  j["ablation"] = {{"reference", "full"}};
  const SweepPlan plan = parse_sweep(j, "sweep.json");
  REQUIRE(plan.runs.size() == 4 * 3);
  CHECK(plan.runs[6].config.model.variant.score == kernels::MixScore::Sigmoid);
  CHECK(plan.runs[9].config.model.variant.window == 2);
  CHECK(plan.paper.at("full_sigmoid") == 1.741);
  // Per seed: full 2.0 + (0, 0.01, 0.02); baseline 0.1 above full, seed by
  // seed, plus (0, 0.001, -0.001); full_sigmoid full's plus 0.0005 - its
  // seed's noise, swa one seed only.
  const double noise[] = {0.0, 0.01, 0.02};
  std::vector<RunOutcome> out(plan.runs.size());
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    const auto& r = plan.runs[i];
    const double full = 2.0 + noise[i % 3];
    out[i].status = "done";
    out[i].val_loss = r.mode == "baseline" ? full + 0.1 + (i % 3 == 1 ? 0.001 : i % 3 == 2 ? -0.001 : 0)
                      : r.mode == "full_sigmoid" ? full + 0.0005 - 0.01 * (i % 3 == 1)
                                                 : full;
  }
  out[10].status = out[11].status = "partial";  // swa: seed 1 alone
  const json a = ablation_sweep(plan, out);
  REQUIRE(a["rows"].size() == 4);
  const json& base = a["rows"][0];
  CHECK(base["seeds"] == 3);
  CHECK(base["loss"].get<double>() == Approx(2.11).epsilon(1e-12));
  // mean +- t(0.975, 2) s / sqrt(3), s = 0.01 (values 2.1, 2.111, 2.119: by hand 0.009539)
  const double s = std::sqrt((0.01 * 0.01 + 0.001 * 0.001 + 0.009 * 0.009) / 2);
  CHECK(base["ci95"][1].get<double>() - 2.11 == Approx(4.302652729911275 * s / std::sqrt(3.0)).epsilon(1e-9));
  const json& vs = base["vs_reference"];  // 0.1, 0.101, 0.099: behind full
  CHECK(vs["pairs"] == 3);
  CHECK(vs["diff"].get<double>() == Approx(0.1).epsilon(1e-12));
  CHECK_THAT(vs["verdict"].get<std::string>(), Contains("behind full at 95%"));
  CHECK(vs["paper_diff"].get<double>() == Approx(0.029).epsilon(1e-9));
  CHECK(!a["rows"][1].contains("vs_reference"));  // full itself
  CHECK_THAT(a["rows"][1]["vs_baseline"]["verdict"].get<std::string>(), Contains("ahead of baseline"));
  // full_sigmoid: 0.0005, -0.0095, 0.0005 against full: not distinguishable.
  CHECK_THAT(a["rows"][2]["vs_reference"]["verdict"].get<std::string>(),
             Contains("not distinguishable from full"));
  const json& swa = a["rows"][3];
  CHECK(swa["seeds"] == 1);
  CHECK(swa["ci95"].is_null());
  CHECK(swa["paper"].is_null());
  CHECK_THAT(swa["vs_reference"]["verdict"].get<std::string>(), Contains("no interval"));
  const std::string table = ablation_table(a);
  CHECK_THAT(table, Contains("full_sigmoid") && Contains("behind") && Contains("n.d.") &&
                        Contains("1.766") && Contains("+0.0290"));

  // Errors: a reference that is no mode; more than one point per mode; a bad paper value.
  json bad = j;
  bad["ablation"]["reference"] = "nope";
  CHECK_THROWS_WITH(parse_sweep(bad, "s.json"), Contains("'ablation.reference' = \"nope\""));
  bad = j;
  bad["sizes"][0]["tokens"] = {320, 640};
  CHECK_THROWS_WITH(parse_sweep(bad, "s.json"), Contains("2 points per mode"));
  bad = j;
  bad["modes"][0]["paper"] = "low";
  CHECK_THROWS_WITH(parse_sweep(bad, "s.json"), Contains("'modes[0].paper' must be a number"));
  bad = j;
  bad["modes"][3]["window"] = 2;
  bad["modes"][3]["mode"] = "block";
  bad["modes"][3]["block_size"] = 2;
  CHECK_THROWS_WITH(parse_sweep(bad, "s.json"), Contains("model.residual.window"));
}

TEST_CASE("a started run whose config the sweep file now changes is reported", "[sweep]") {
  TempDir d;
  const SweepPlan plan = parse_sweep(tiny_sweep(d), "sweep.json");
  for (const auto& r : plan.runs) CHECK(changed_config(r).empty());  // not started
  fs::create_directories(plan.runs[1].dir);
  write_text_file_atomic(plan.runs[1].dir + "/config.json", plan.runs[1].config.to_json().dump());
  CHECK(changed_config(plan.runs[1]).empty());
  const SweepPlan changed = parse_sweep(tiny_sweep(d), "sweep.json", {"--optimizer.lr=0.02"});
  CHECK_THAT(changed_config(changed.runs[1]),
             Contains("run a_full_320: its config changed") &&
                 Contains("config key 'optimizer.lr': 0.01 -> 0.02") && Contains("Delete"));
  CHECK(changed_config(changed.runs[0]).empty());  // not started: free to change
  // Bookkeeping keys may change.
  const SweepPlan paced = parse_sweep(tiny_sweep(d), "sweep.json", {"--run.stop_after=3"});
  CHECK(changed_config(paced.runs[1]).empty());
}

TEST_CASE("a 2x2 sweep trains, skips completed runs and resumes interrupted ones exactly",
          "[sweep][slow]") {
  TempDir d;
  write_corpus(d);
  const SweepPlan plan = parse_sweep(tiny_sweep(d, "straight"), "sweep.json");
  REQUIRE(plan.runs.size() == 4);
  REQUIRE(run_sweep(plan, no_plots()) == 0);

  const auto done = outcomes_of(plan);
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    INFO(plan.runs[i].name);
    CHECK(done[i].status == "done");
    CHECK(std::isfinite(done[i].val_loss));
    CHECK(std::isfinite(done[i].train_loss));
    CHECK(done[i].val_loss < std::log(64.0));  // learnt something
    CHECK(fs::exists(plan.runs[i].dir + "/result.json"));
    CHECK(fs::exists(plan.runs[i].dir + "/config.json"));
    CHECK(fs::exists(plan.runs[i].dir + "/depth_stats.jsonl"));
    CHECK(records(plan.runs[i].dir + "/metrics.jsonl").size() ==
          static_cast<size_t>(plan.runs[i].steps + 1));  // steps + the final eval
  }
  // results.csv: a header and one row per run, with the numbers of the outcomes.
  std::ifstream csv(plan.out_dir + "/results.csv");
  std::string header, line;
  std::getline(csv, header);
  CHECK(header.rfind("run,point,size,mode,seed,residual,block_size,n_blocks,", 0) == 0);
  std::vector<std::string> rows;
  while (std::getline(csv, line)) rows.push_back(line);
  REQUIRE(rows.size() == 4);
  CHECK(rows[1].rfind("a_full_320,a_full_320,a,full,3,full,1,2,16,1,2,1,32,", 0) == 0);
  CHECK_THAT(rows[1], Contains(",320,10,") && Contains(",done"));
  const json fits = json::parse(read_text_file(plan.out_dir + "/fits.json"));
  CHECK(fits["modes"]["baseline"]["n"] == 2);
  CHECK(fits["modes"]["full"]["n"] == 2);
  CHECK(fits["multipliers"].size() == 2);

  SECTION("a second invocation skips every completed run") {
    std::map<std::string, std::string> before;
    for (const auto& r : plan.runs) before[r.name] = read_text_file(r.dir + "/metrics.jsonl");
    REQUIRE(run_sweep(plan, no_plots()) == 0);
    for (const auto& r : plan.runs) CHECK(read_text_file(r.dir + "/metrics.jsonl") == before[r.name]);
  }

  SECTION("interrupted runs resume from their checkpoints and end bit-identical") {
    // run.stop_after ends every run of the first invocation at step 4 with a
    // checkpoint, as an interruption would; the next invocation resumes them.
    const SweepPlan cut = parse_sweep(tiny_sweep(d, "cut"), "sweep.json", {"--run.stop_after=4"});
    REQUIRE(run_sweep(cut, no_plots()) == 0);
    for (const auto& o : outcomes_of(cut)) {
      CHECK(o.status == "partial");
      CHECK(o.step == 4);
    }
    CHECK(!fs::exists(cut.runs[0].dir + "/result.json"));
    const SweepPlan resumed = parse_sweep(tiny_sweep(d, "cut"), "sweep.json");
    REQUIRE(run_sweep(resumed, no_plots()) == 0);
    const auto res = outcomes_of(resumed);
    for (size_t i = 0; i < plan.runs.size(); ++i) {
      INFO(plan.runs[i].name);
      CHECK(res[i].status == "done");
      CHECK(res[i].val_loss == done[i].val_loss);
      CHECK(res[i].train_loss == done[i].train_loss);
      CHECK(records(resumed.runs[i].dir + "/metrics.jsonl") == records(plan.runs[i].dir + "/metrics.jsonl"));
    }
  }

  SECTION("a changed config is refused, naming the run and the key") {
    const SweepPlan changed = parse_sweep(tiny_sweep(d, "straight"), "sweep.json", {"--optimizer.lr=0.02"});
    REQUIRE_THROWS_WITH(run_sweep(changed, no_plots()),
                        Contains("run a_baseline_320") && Contains("config key 'optimizer.lr': 0.01 -> 0.02") &&
                            Contains("Delete"));
    // Bookkeeping keys may change.
    const SweepPlan logs = parse_sweep(tiny_sweep(d, "straight"), "sweep.json", {"--run.log_every=1"});
    CHECK(run_sweep(logs, no_plots()) == 0);
  }
}
