// Config parsing/validation and learning-rate schedules.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "train/config.h"
#include "train/lr_schedule.h"

using namespace attnres;
using train::Config;
using train::json;

namespace {

json base() {
  return json::parse(R"({
    "model": {"vocab_size": 97, "d_model": 32, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2,
              "d_ff": 80, "residual": {"mode": "block", "block_size": 2}},
    "training": {"steps": 8, "micro_batch_size": 2, "seq_len": 16},
    "data": {"train": "train.bin"}})");
}

std::string error_of(const json& j) {
  try {
    Config::from_json(j, "cfg.json").validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a config with every key parses", "[train]") {
  json j = json::parse(R"(
{"model": {"vocab_size": 97, "d_model": 32, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2,
           "d_ff": 80, "norm_eps": 1e-5, "rope_theta": 10000.0, "tie_embeddings": false,
           "residual": {"mode": "block", "block_size": 2}, "init_from": "init.safetensors"},
 "optimizer": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1,
               "grad_clip": 1.0},
 "schedule": {"type": "cosine", "warmup_steps": 3, "min_lr_ratio": 0.1, "decay_ratio": 0.2},
 "training": {"steps": 8, "micro_batch_size": 2, "seq_len": 16, "grad_accum": 1, "seed": 1,
              "device": "cpu", "precision": "fp32"},
 "data": {"train": "train.bin", "val": "val.bin", "shuffle": false},
 "parallel": {"pipeline": 1, "virtual_stages": 1, "data": 1, "cache_blocks": true},
 "checkpoint": {"dir": "ckpt", "every": 4, "keep_last": 2, "resume": "never", "save_initial": false},
 "eval": {"every": 0, "batches": 4},
 "run": {"dir": "run", "log_every": 1}})");
  Config c = Config::from_json(j, "example.json");
  c.validate();
  CHECK(c.model.block_size == 2);
  CHECK(c.model.init_from == "init.safetensors");
  CHECK(c.checkpoint.keep_last == 2);
  // The resolved config round-trips.
  Config again = Config::from_json(c.to_json(), "resolved");
  CHECK(again.to_json() == c.to_json());
}

TEST_CASE("config errors name the key", "[train]") {
  json j = base();
  j["model"]["colour"] = 1;
  CHECK_THAT(error_of(j), Catch::Contains("model.colour"));
  j = base();
  j["training"]["steps"] = "many";
  CHECK_THAT(error_of(j), Catch::Contains("training.steps"));
  j = base();
  j["model"]["n_heads"] = 5;
  CHECK_THAT(error_of(j), Catch::Contains("model.n_heads"));
  j = base();
  j["model"]["n_kv_heads"] = 3;
  CHECK_THAT(error_of(j), Catch::Contains("model.n_kv_heads"));
  j = base();
  j["model"]["residual"] = {{"mode", "dense"}};
  CHECK_THAT(error_of(j), Catch::Contains("model.residual.mode"));
  j = base();
  j["model"]["residual"] = {{"mode", "block"}, {"block_size", 2}, {"n_blocks", 3}};
  CHECK_THAT(error_of(j), Catch::Contains("exactly one"));
  j = base();
  j["model"]["d_model"] = 36;  // head dim 9: odd
  CHECK_THAT(error_of(j), Catch::Contains("even"));
  j = base();
  j["schedule"] = {{"type", "linear"}};
  CHECK_THAT(error_of(j), Catch::Contains("schedule.type"));
  j = base();
  j["data"].erase("train");
  CHECK_THAT(error_of(j), Catch::Contains("data.train"));
  j = base();
  j["parallel"] = {{"pipeline", 2}, {"virtual_stages", 2}};
  CHECK_THAT(error_of(j), Catch::Contains("exceed model.n_layers"));  // 4 chunks, 3 layers
  j["model"]["n_layers"] = 4;
  j["training"]["grad_accum"] = 3;
  CHECK_THAT(error_of(j), Catch::Contains("training.grad_accum"));
  j = base();
  j["eval"] = {{"every", 2}};
  CHECK_THAT(error_of(j), Catch::Contains("data.val"));
  CHECK(error_of(base()).empty());
}

TEST_CASE("overrides set nested keys with JSON or bare-string values", "[train]") {
  json j = base();
  train::apply_override(j, "--optimizer.lr=3e-4");
  train::apply_override(j, "--model.residual.mode=full");
  train::apply_override(j, "--model.residual={\"mode\":\"full\"}");
  train::apply_override(j, "--data.train=shards/*.bin");
  train::apply_override(j, "--model.tie_embeddings=true");
  Config c = Config::from_json(j, "cfg");
  CHECK(c.optimizer.lr == 3e-4);
  CHECK(c.model.mode == model::ResidualMode::Full);
  CHECK(c.data.train == "shards/*.bin");
  CHECK(c.model.tie_embeddings);
  CHECK_THROWS_WITH(train::apply_override(j, "optimizer.lr=1"), Catch::Contains("--section.key"));
  CHECK_THROWS_WITH(train::apply_override(j, "--optimizer.lr.x=1"), Catch::Contains("not a section"));
}

TEST_CASE("learning-rate schedules follow docs/model.md section 4", "[train]") {
  train::ScheduleConfig s;
  s.warmup_steps = 4;
  s.min_lr_ratio = 0.1;
  const double lr = 1.0;
  s.type = train::ScheduleType::Constant;
  CHECK(train::learning_rate(s, lr, 0, 20) == Approx(0.25));
  CHECK(train::learning_rate(s, lr, 3, 20) == Approx(1.0));
  CHECK(train::learning_rate(s, lr, 19, 20) == Approx(1.0));
  s.type = train::ScheduleType::Cosine;
  CHECK(train::learning_rate(s, lr, 1, 20) == Approx(0.5));
  CHECK(train::learning_rate(s, lr, 4, 20) == Approx(1.0));  // q = 0
  CHECK(train::learning_rate(s, lr, 12, 20) == Approx(0.1 + 0.9 * 0.5));  // q = 1/2
  CHECK(train::learning_rate(s, lr, 19, 20) ==
        Approx(0.1 + 0.9 * (1 + std::cos(M_PI * 15.0 / 16.0)) / 2));
  s.type = train::ScheduleType::Wsd;
  s.decay_ratio = 0.25;  // last ceil(5) steps: k = 15..19
  CHECK(train::learning_rate(s, lr, 14, 20) == Approx(1.0));
  CHECK(train::learning_rate(s, lr, 15, 20) == Approx(1.0 - 0.9 * 0.2));
  CHECK(train::learning_rate(s, lr, 19, 20) == Approx(0.1));
  s.warmup_steps = 0;
  s.type = train::ScheduleType::Cosine;
  CHECK(train::learning_rate(s, lr, 0, 1) == Approx(1.0));  // K - W = 1
}

TEST_CASE("docs/config.md's key table is the one the parser declares", "[train]") {
  const std::string path = std::string(ATTNRES_SOURCE_DIR) + "/docs/config.md";
  std::ifstream in(path);
  REQUIRE(in.good());
  // The table: from its header line to the first line that is not a row.
  std::string line, table;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line.rfind("| key |", 0) == 0) inside = true;
    if (inside && line.rfind("|", 0) != 0) break;
    if (inside) table += line + "\n";
  }
  INFO(path << " differs from the declared keys; regenerate its table with "
               "`build/attnres inspect keys`");
  CHECK(table == train::config_reference_table());
}

TEST_CASE("enum-valued keys take exactly their names", "[train]") {
  json j = base();
  j["training"]["device"] = "CUDA";
  CHECK_THAT(error_of(j), Catch::Contains("training.device") && Catch::Contains("cpu, cuda"));
  j = base();
  j["schedule"] = {{"type", 3}};
  CHECK_THAT(error_of(j), Catch::Contains("schedule.type") && Catch::Contains("constant, cosine, wsd"));
  j = base();
  j["parallel"] = {{"transport", "nccl"}};  // NCCL moves device memory
  CHECK_THAT(error_of(j), Catch::Contains("needs training.device"));
  j = base();
  j["training"]["precision"] = "bf16";
  j["training"]["device"] = "cuda";
  const Config c = Config::from_json(j, "cfg.json");
  CHECK(c.training.precision == DType::BF16);
  CHECK(c.training.device == Device::CUDA);
  CHECK(c.to_json()["training"]["precision"] == "bf16");
  CHECK(Config::from_json(c.to_json(), "again").to_json() == c.to_json());
}

TEST_CASE("training.logits: auto follows the precision; bf16 only in a bf16 run", "[train]") {
  json j = base();
  Config c = Config::from_json(j, "cfg.json");
  CHECK(c.training.logits == train::Logits::Auto);
  CHECK(c.to_json()["training"]["logits"] == "auto");
  CHECK(train::logit_dtype(train::Logits::Auto, DType::F32) == DType::F32);
  CHECK(train::logit_dtype(train::Logits::Auto, DType::BF16) == DType::BF16);
  CHECK(train::logit_dtype(train::Logits::F32, DType::BF16) == DType::F32);
  CHECK(train::logit_dtype(train::Logits::BF16, DType::BF16) == DType::BF16);
  j["training"]["logits"] = "fp32";
  CHECK(error_of(j).empty());
  CHECK(Config::from_json(j, "cfg.json").training.logits == train::Logits::F32);
  j["training"]["logits"] = "bf16";  // on the cpu, in fp32
  CHECK_THAT(error_of(j), Catch::Contains("config key training.logits") &&
                              Catch::Contains("needs training.precision = \"bf16\""));
  j["training"]["logits"] = "BF16";
  CHECK_THAT(error_of(j), Catch::Contains("training.logits") && Catch::Contains("auto, fp32, bf16"));
  j["training"]["logits"] = "bf16";
  j["training"]["precision"] = "bf16";
  j["training"]["device"] = "cuda";
  c = Config::from_json(j, "cfg.json");  // (validate() needs a CUDA build: not called)
  CHECK(c.training.logits == train::Logits::BF16);
  CHECK(Config::from_json(c.to_json(), "again").to_json() == c.to_json());
}
