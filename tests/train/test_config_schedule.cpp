// Config parsing/validation and learning-rate schedules.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "config_testing.h"
#include "core/device.h"
#include "core/error.h"
#include "model/params.h"
#include "train/config.h"
#include "train/lr_schedule.h"

using namespace attnres;
using train::Config;
using train::json;

using testing::config_error;

namespace {

json base() { return testing::small_config(3, 2); }

// j as a bf16 run on cuda, read (validate() needs a CUDA build: not called);
// written back and read again, it gives the same config.
Config read_as_cuda_bf16(json j) {
  j["training"]["precision"] = "bf16";
  j["training"]["device"] = "cuda";
  const Config c = Config::from_json(j, "cfg.json");
  CHECK(Config::from_json(c.to_json(), "again").to_json() == c.to_json());
  return c;
}

}  // namespace

TEST_CASE("a config with every key parses", "[train][backend]") {
  // Every key the parser declares, from its own enumeration (the key table
  // that for_each_key in src/train/config.cpp feeds to the parser, the
  // serialiser and config_reference_table): a key added there without a
  // value here fails below, naming it.
  std::vector<std::pair<std::string, std::string>> declared;  // key, JSON type
  {
    std::istringstream rows(train::config_reference_table());
    std::string row;
    while (std::getline(rows, row)) {
      if (row.rfind("| `", 0) != 0) continue;  // the header and its rule
      const size_t end = row.find('`', 3);
      const size_t type_end = row.find(" |", end + 4);
      declared.emplace_back(row.substr(3, end - 3), row.substr(end + 4, type_end - end - 4));
    }
  }
  REQUIRE(declared.size() >= 50);

  // A value for each key, none of them its default (so a key the parser did
  // not read would come back as the default), all valid together, except
  // that block_size and n_blocks exclude each other (checked after).
  const std::map<std::string, json> value = {
      {"model.vocab_size", 97}, {"model.d_model", 32}, {"model.n_layers", 4}, {"model.n_heads", 4},
      {"model.n_kv_heads", 2}, {"model.d_ff", 80}, {"model.norm_eps", 1e-6},
      {"model.rope_theta", 50000.0}, {"model.tie_embeddings", true}, {"model.residual.mode", "block"},
      {"model.residual.block_size", 2}, {"model.residual.n_blocks", 3},
      {"model.residual.query", "input"}, {"model.residual.weights", "scalars"},
      {"model.residual.score", "sigmoid"}, {"model.residual.key_norm", false},
      {"model.residual.heads", 2}, {"model.residual.window", 3},
      {"model.init_from", "init.safetensors"},
      {"model.moe.experts", 8}, {"model.moe.top_k", 2}, {"model.moe.shared_experts", 1},
      {"model.moe.expert_d_ff", 24}, {"model.moe.router", "softmax"}, {"model.moe.routed_scale", 2.5},
      {"model.moe.balance", "aux_loss"}, {"model.moe.bias_rate", 0.01},
      {"model.moe.aux_loss_coef", 0.001}, {"model.moe.dense_layers", 2},
      {"model.moe.capacity_factor", 1.25},
      {"model.kda.heads", 2}, {"model.kda.head_dim", 8}, {"model.kda.conv_size", 3},
      {"model.kda.full_attention_every", 2}, {"model.kda.full_attention_layers", json::array({2, 4})},
      {"model.mla.kv_lora_rank", 12}, {"model.mla.qk_nope_head_dim", 8},
      {"model.mla.qk_rope_head_dim", 4}, {"model.mla.v_head_dim", 6}, {"model.mla.rope", true},
      {"optimizer.type", "muon"}, {"optimizer.momentum", 0.9},
      {"optimizer.lr", 3e-4}, {"optimizer.beta1", 0.8}, {"optimizer.beta2", 0.99},
      {"optimizer.eps", 1e-7}, {"optimizer.weight_decay", 0.05}, {"optimizer.grad_clip", 0.5},
      {"schedule.type", "wsd"}, {"schedule.warmup_steps", 3}, {"schedule.min_lr_ratio", 0.2},
      {"schedule.decay_ratio", 0.3},
      {"training.steps", 8}, {"training.micro_batch_size", 2}, {"training.seq_len", 16},
      {"training.grad_accum", 4}, {"training.seed", 7}, {"training.device", "cuda"},
      {"training.precision", "bf16"}, {"training.logits", "bf16"}, {"training.attention_kernel", "cudnn"},
      {"training.recompute", "mix"}, {"training.cuda_graphs", false},
      {"training.peak_tflops", 500.0},
      {"data.train", "train.bin"}, {"data.val", "val.bin"}, {"data.tokenizer", "tok.json"},
      {"data.shuffle", true},
      {"parallel.pipeline", 2}, {"parallel.virtual_stages", 2}, {"parallel.data", 4}, {"parallel.expert", 2},
      {"parallel.layers_per_chunk", json::array({1, 1, 1, 1})},
      {"parallel.cache_blocks", false}, {"parallel.zero", 1}, {"parallel.transport", "nccl"},
      {"checkpoint.dir", "ckpt"}, {"checkpoint.every", 4}, {"checkpoint.keep_last", 2},
      {"checkpoint.resume", "auto"}, {"checkpoint.sharded", false}, {"checkpoint.async", false}, {"checkpoint.save_initial", true},
      {"eval.every", 2}, {"eval.batches", 5}, {"eval.tasks", "hellaswag:hs.jsonl"},
      {"eval.task_examples", 10}, {"eval.scoring", "llm.c"},
      {"run.dir", "run2"}, {"run.log_every", 3}, {"run.stop_after", 6}, {"run.depth_stats_every", 2},
  };
  // The value's JSON at a dotted key of a config.
  auto at_key = [](const json& root, const std::string& key) -> const json* {
    const json* v = &root;
    std::istringstream parts(key);
    std::string part;
    while (std::getline(parts, part, '.')) {
      if (!v->is_object() || !v->contains(part)) return nullptr;
      v = &(*v)[part];
    }
    return v;
  };
  const json defaults = Config().to_json();  // keys at their default (unset ones left out)
  json j;
  for (const auto& [key, type] : declared) {
    INFO("config key " << key << " (" << type << ")");
    const auto it = value.find(key);
    REQUIRE(it != value.end());  // a new key: give it a value above
    const json& v = it->second;
    CHECK((type == "integer"  ? v.is_number_integer()
           : type == "number" ? v.is_number()
           : type == "bool"   ? v.is_boolean()
           : type == "bool or string" ? v.is_boolean() || v.is_string()
           : type == "list of integers" ? v.is_array()
                              : type == "string" && v.is_string()));
    const json* def = at_key(defaults, key);
    CHECK((def == nullptr || *def != v));  // not the default
    json* node = &j;
    std::istringstream parts(key);
    std::string part;
    while (std::getline(parts, part, '.')) node = &(*node)[part];
    *node = v;
  }
  CHECK(value.size() == declared.size());  // no value for a key that does not exist

  // Each value is read and comes back in the resolved config, and the
  // resolved config round-trips.
  const Config c = Config::from_json(j, "example.json");
  const json resolved = c.to_json();
  for (const auto& [key, type] : declared) {
    INFO("config key " << key);
    const json* got = at_key(resolved, key);
    REQUIRE(got != nullptr);
    CHECK(*got == value.at(key));
  }
  CHECK(Config::from_json(resolved, "resolved").to_json() == resolved);

  // And it validates once one of block_size / n_blocks is left out, where
  // the build has the CUDA backend the device, precision, logits and
  // transport values above need.
  json one = j;
  one["model"]["residual"].erase("n_blocks");
  one["model"]["residual"].erase("weights");  // scalars have no query, score, key norm or heads
  one["model"]["residual"].erase("window");   // a full-mode key (this is block)
  one["model"]["kda"].erase("full_attention_every");  // it and the list exclude each other
  one["optimizer"]["type"] = "adamw";  // Muon with ZeRO-1 is refused (not yet: config.cpp)
  const Config valid = Config::from_json(one, "example.json");
  if (cuda::compiled())
    CHECK_NOTHROW(valid.validate());
  else
    CHECK_THROWS_WITH(valid.validate(), Catch::Contains("no CUDA backend"));
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("exactly one"));
}

TEST_CASE("config errors name the key", "[train]") {
  json j = base();
  j["model"]["colour"] = 1;
  CHECK_THAT(config_error(j), Catch::Contains("model.colour"));
  j = base();
  j["training"]["steps"] = "many";
  CHECK_THAT(config_error(j), Catch::Contains("training.steps"));
  j = base();
  j["model"]["n_heads"] = 5;
  CHECK_THAT(config_error(j), Catch::Contains("model.n_heads"));
  j = base();
  j["model"]["n_kv_heads"] = 3;
  CHECK_THAT(config_error(j), Catch::Contains("model.n_kv_heads"));
  j = base();
  j["model"]["residual"] = {{"mode", "dense"}};
  CHECK_THAT(config_error(j), Catch::Contains("model.residual.mode"));
  j = base();
  j["model"]["residual"] = {{"mode", "block"}, {"block_size", 2}, {"n_blocks", 3}};
  CHECK_THAT(config_error(j), Catch::Contains("exactly one"));
  j = base();
  j["model"]["d_model"] = 36;  // head dim 9: odd
  CHECK_THAT(config_error(j), Catch::Contains("even"));
  j = base();
  j["schedule"] = {{"type", "linear"}};
  CHECK_THAT(config_error(j), Catch::Contains("schedule.type"));
  j = base();
  j["data"].erase("train");
  CHECK_THAT(config_error(j), Catch::Contains("data.train"));
  j = base();
  j["parallel"] = {{"pipeline", 2}, {"virtual_stages", 2}};
  CHECK_THAT(config_error(j), Catch::Contains("exceed model.n_layers"));  // 4 chunks, 3 layers
  j["model"]["n_layers"] = 4;
  j["training"]["grad_accum"] = 3;
  CHECK_THAT(config_error(j), Catch::Contains("training.grad_accum"));
  j = base();  // 3 layers
  j["parallel"] = {{"pipeline", 2}, {"layers_per_chunk", {1, 1, 1}}};
  CHECK_THAT(config_error(j), Catch::Contains("parallel.layers_per_chunk: 3 chunk sizes, but"));
  j["parallel"]["layers_per_chunk"] = {3, 0};
  CHECK_THAT(config_error(j), Catch::Contains("parallel.layers_per_chunk: every chunk needs"));
  j["parallel"]["layers_per_chunk"] = {1, 1};
  CHECK_THAT(config_error(j), Catch::Contains("parallel.layers_per_chunk: the chunk sizes sum to 2"));
  j["parallel"]["layers_per_chunk"] = {1, 2};
  CHECK(config_error(j).empty());
  j = base();
  j["eval"] = {{"every", 2}};
  CHECK_THAT(config_error(j), Catch::Contains("data.val"));
  CHECK(config_error(base()).empty());
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
  s.decay_ratio = 0.22;  // ceil(4.4) = 5 steps, where rounding gives 4: k = 15..19 again
  CHECK(train::learning_rate(s, lr, 14, 20) == Approx(1.0));
  CHECK(train::learning_rate(s, lr, 15, 20) == Approx(1.0 - 0.9 * 0.2));
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
  CHECK_THAT(config_error(j), Catch::Contains("training.device") && Catch::Contains("cpu, cuda"));
  j = base();
  j["schedule"] = {{"type", 3}};
  CHECK_THAT(config_error(j), Catch::Contains("schedule.type") && Catch::Contains("constant, cosine, wsd"));
  j = base();
  j["parallel"] = {{"transport", "nccl"}};  // NCCL moves device memory
  CHECK_THAT(config_error(j), Catch::Contains("needs training.device"));
  const Config c = read_as_cuda_bf16(base());
  CHECK(c.training.precision == DType::BF16);
  CHECK(c.training.device == Device::CUDA);
  CHECK(c.to_json()["training"]["precision"] == "bf16");
}

TEST_CASE("training.cuda_graphs: auto, true or false, true on cuda, and with peers never over mpi",
          "[train]") {
  json j = base();
  Config c = Config::from_json(j, "cfg.json");
  CHECK(c.training.cuda_graphs == train::CudaGraphs::Auto);
  CHECK(c.to_json()["training"]["cuda_graphs"] == "auto");
  CHECK_FALSE(c.cuda_graphs());  // auto: off until graphs have run on a GPU
  for (const json& v : {json(true), json("true")}) {
    j["training"]["cuda_graphs"] = v;
    c = Config::from_json(j, "cfg.json");
    CHECK(c.training.cuda_graphs == train::CudaGraphs::On);
    CHECK(c.cuda_graphs());
    CHECK(c.to_json()["training"]["cuda_graphs"] == json(true));
  }
  j["training"]["cuda_graphs"] = false;
  c = Config::from_json(j, "cfg.json");
  CHECK(c.training.cuda_graphs == train::CudaGraphs::Off);
  CHECK_FALSE(c.cuda_graphs());
  CHECK(c.to_json()["training"]["cuda_graphs"] == json(false));
  CHECK(config_error(j).empty());
  j["training"]["cuda_graphs"] = "yes";
  CHECK_THAT(config_error(j), Catch::Contains("training.cuda_graphs") &&
                              Catch::Contains("auto, true, false"));
  j["training"]["cuda_graphs"] = 1;
  CHECK_THAT(config_error(j), Catch::Contains("training.cuda_graphs") &&
                              Catch::Contains("must be one of auto, true, false"));
  j["training"]["cuda_graphs"] = true;  // on the cpu
  CHECK_THAT(config_error(j), Catch::Contains("config key training.cuda_graphs: true needs "
                                              "training.device = \"cuda\""));
  j["training"]["device"] = "cuda";
  j["training"]["precision"] = "bf16";
  // With peers the graph holds their communication: NCCL's (or "auto"'s, which
  // the trainer resolves; it refuses an MPI choice then), never MPI's.
  for (const auto& [key, v] : {std::make_pair("pipeline", 2), std::make_pair("data", 2)}) {
    json k = j;
    k["parallel"][key] = v;
    k["training"]["grad_accum"] = 2;
    for (const char* transport : {"nccl", "auto"}) {
      k["parallel"]["transport"] = transport;
      INFO("parallel." << key << " = " << v << ", transport " << transport);
      CHECK_THAT(config_error(k), !Catch::Contains("cuda_graphs"));  // (a CPU build: no cuda)
    }
    k["parallel"]["transport"] = "mpi";
    INFO("parallel." << key << " = " << v << ", transport mpi");
    CHECK_THAT(config_error(k), Catch::Contains("config key training.cuda_graphs: true with 2 "
                                                "ranks") &&
                                    Catch::Contains("parallel.transport = \"mpi\" cannot"));
  }
  json k = j;
  k["parallel"]["zero"] = 1;  // one replica: its reduce-scatter is a copy, captured too
  CHECK_THAT(config_error(k), !Catch::Contains("cuda_graphs"));
}

TEST_CASE("training.attention_kernel: own, auto, or cudnn on cuda only", "[train]") {
  json j = base();
  const Config c = Config::from_json(j, "cfg.json");
  CHECK(c.training.attention_kernel == kernels::AttentionKernel::Own);
  CHECK(c.to_json()["training"]["attention_kernel"] == "own");
  j["training"]["attention_kernel"] = "auto";
  CHECK(config_error(j).empty());
  CHECK(Config::from_json(j, "cfg.json").training.attention_kernel == kernels::AttentionKernel::Auto);
  j["training"]["attention_kernel"] = "cudnn";  // on the cpu
  CHECK_THAT(config_error(j), Catch::Contains("config key training.attention_kernel") &&
                              Catch::Contains("\"cudnn\" needs training.device = \"cuda\""));
  j["training"]["attention_kernel"] = "flash";
  CHECK_THAT(config_error(j), Catch::Contains("training.attention_kernel") &&
                              Catch::Contains("auto, own, cudnn"));
  j["training"]["attention_kernel"] = "cudnn";
  CHECK(read_as_cuda_bf16(j).training.attention_kernel == kernels::AttentionKernel::Cudnn);
}

TEST_CASE("training.logits: auto follows the precision, and bf16 only in a bf16 run", "[train]") {
  json j = base();
  const Config c = Config::from_json(j, "cfg.json");
  CHECK(c.training.logits == train::Logits::Auto);
  CHECK(c.to_json()["training"]["logits"] == "auto");
  CHECK(train::logit_dtype(train::Logits::Auto, DType::F32) == DType::F32);
  CHECK(train::logit_dtype(train::Logits::Auto, DType::BF16) == DType::BF16);
  CHECK(train::logit_dtype(train::Logits::F32, DType::BF16) == DType::F32);
  CHECK(train::logit_dtype(train::Logits::BF16, DType::BF16) == DType::BF16);
  j["training"]["logits"] = "fp32";
  CHECK(config_error(j).empty());
  CHECK(Config::from_json(j, "cfg.json").training.logits == train::Logits::F32);
  j["training"]["logits"] = "bf16";  // on the cpu, in fp32
  CHECK_THAT(config_error(j), Catch::Contains("config key training.logits") &&
                              Catch::Contains("needs training.precision = \"bf16\""));
  j["training"]["logits"] = "BF16";
  CHECK_THAT(config_error(j), Catch::Contains("training.logits") && Catch::Contains("auto, fp32, bf16"));
  j["training"]["logits"] = "bf16";
  CHECK(read_as_cuda_bf16(j).training.logits == train::Logits::BF16);
}

TEST_CASE("model.residual variants: where each applies, and left out of the config at defaults",
          "[train]") {
  auto with = [](const char* mode, const char* variant) {
    json j = base();  // block S = 2, d = 32
    j["model"]["residual"] = json::parse(variant);
    j["model"]["residual"]["mode"] = mode;
    if (std::string(mode) == "block") j["model"]["residual"]["block_size"] = 2;
    return config_error(j);
  };
  CHECK(with("full", R"({"query": "input", "score": "sigmoid", "heads": 4, "window": 8})").empty());
  CHECK(with("block", R"({"key_norm": false, "heads": 16})").empty());
  CHECK(with("full", R"({"weights": "scalars"})").empty());
  CHECK_THAT(with("baseline", R"({"score": "sigmoid"})"),
             Catch::Contains("variants of the AttnRes depth Mix; mode \"baseline\""));
  CHECK_THAT(with("block", R"({"window": 8})"),
             Catch::Contains("model.residual.window: the depth window is Full AttnRes's"));
  CHECK_THAT(with("full", R"({"heads": 3})"), Catch::Contains("model.residual.heads: 3 heads"));
  CHECK_THAT(with("full", R"({"heads": 0})"), Catch::Contains("model.residual.heads"));
  CHECK_THAT(with("full", R"({"window": -1})"), Catch::Contains("model.residual.window"));
  for (const char* v : {R"({"weights": "scalars", "query": "input"})",
                        R"({"weights": "scalars", "score": "sigmoid"})",
                        R"({"weights": "scalars", "key_norm": false})",
                        R"({"weights": "scalars", "heads": 2})"})
    CHECK_THAT(with("full", v), Catch::Contains("model.residual.weights: \"scalars\""));
  CHECK(with("denseformer", R"({})").empty());
  CHECK_THAT(with("denseformer", R"({"heads": 2})"),
             Catch::Contains("variants of the AttnRes depth Mix; mode \"denseformer\""));
  {
    json j = base();
    j["model"]["residual"] = {{"mode", "denseformer"}, {"block_size", 2}};
    CHECK_THAT(config_error(j), Catch::Contains("block_size / n_blocks only apply"));
  }
  CHECK_THAT(with("full", R"({"score": "tanh"})"),
             Catch::Contains("unknown value \"tanh\" (expected softmax, sigmoid)"));
  // The resolved config: no variant keys at the defaults (an AttnRes config
  // is what it was before them), all of them once one is set.
  json plain = base();
  const json r0 = Config::from_json(plain, "a.json").to_json();
  CHECK(!r0["model"]["residual"].contains("query"));
  CHECK(!r0["model"]["residual"].contains("window"));
  plain["model"]["residual"]["key_norm"] = false;
  const json r1 = Config::from_json(plain, "a.json").to_json();
  CHECK(r1["model"]["residual"]["key_norm"] == false);
  CHECK(r1["model"]["residual"]["query"] == "static");
  CHECK(r1["model"]["residual"]["heads"] == 1);
}

TEST_CASE("model.kda: bad hybrid settings name the key and the reason", "[train]") {
  auto with = [](const char* kda) {
    json j = base();  // 3 layers
    j["model"]["kda"] = json::parse(kda);
    return config_error(j);
  };
  CHECK(with(R"({"heads": 2, "head_dim": 8})").empty());  // a valid hybrid
  CHECK(with(R"({"heads": 2, "head_dim": 8, "full_attention_layers": [1, 3]})").empty());
  CHECK_THAT(with(R"({"heads": 2})"), Catch::Contains("model.kda.head_dim"));
  CHECK_THAT(with(R"({"heads": 2, "head_dim": 0})"), Catch::Contains("model.kda.head_dim"));
  CHECK_THAT(with(R"({"heads": 0, "head_dim": 8})"), Catch::Contains("needs heads"));
  CHECK_THAT(with(R"({"heads": -1, "head_dim": 8})"), Catch::Contains("model.kda.heads"));
  CHECK_THAT(with(R"({"heads": 2, "head_dim": 8, "conv_size": 0})"), Catch::Contains("model.kda.conv_size"));
  CHECK_THAT(with(R"({"heads": 2, "head_dim": 8, "full_attention_layers": [4]})"),
             Catch::Contains("layer 4 is outside 1..3"));
  CHECK_THAT(with(R"({"heads": 2, "head_dim": 8, "full_attention_layers": [0]})"),
             Catch::Contains("layer 0 is outside 1..3"));
  CHECK_THAT(with(R"({"heads": 2, "head_dim": 8, "full_attention_layers": [2, 2]})"),
             Catch::Contains("layer 2 is listed twice"));
  CHECK_THAT(with(R"({"heads": 2, "head_dim": 8, "full_attention_layers": [3], "full_attention_every": 2})"),
             Catch::Contains("exclude each other"));
  CHECK_THAT(with(R"({"heads": 2, "head_dim": 8, "full_attention_layers": 3})"),
             Catch::Contains("'model.kda.full_attention_layers' must be a list of integers"));
  CHECK_THAT(with(R"({"heads": 2, "head_dim": 8, "colour": 1})"), Catch::Contains("model.kda.colour"));
}

TEST_CASE("model.mla: bad latent-attention settings name the key and the reason", "[train]") {
  auto with = [](const char* mla, const char* kda = nullptr) {
    json j = base();  // 3 layers
    j["model"]["mla"] = json::parse(mla);
    if (kda) j["model"]["kda"] = json::parse(kda);
    return config_error(j);
  };
  const char* ok = R"({"kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 6})";
  CHECK(with(ok).empty());                                  // every layer MLA
  CHECK(with(ok, R"({"heads": 2, "head_dim": 8})").empty());  // the hybrid's softmax layers
  CHECK(with(R"({"kv_lora_rank": 8, "qk_nope_head_dim": 0, "qk_rope_head_dim": 2, "v_head_dim": 2, "rope": true})")
            .empty());  // a key of k_r alone, rotated
  // Under MLA the heads need not divide d_model (GQA's head_dim is unused).
  {
    json j = base();
    j["model"]["n_heads"] = 3, j["model"]["n_kv_heads"] = 3;
    j["model"]["mla"] = json::parse(ok);
    CHECK(config_error(j).empty());
  }
  CHECK_THAT(with(R"({"kv_lora_rank": 8, "qk_nope_head_dim": 4})"), Catch::Contains("model.mla.v_head_dim"));
  CHECK_THAT(with(R"({"kv_lora_rank": 8, "qk_nope_head_dim": 4, "v_head_dim": 0})"),
             Catch::Contains("model.mla.v_head_dim"));
  CHECK_THAT(with(R"({"kv_lora_rank": 8, "v_head_dim": 4})"), Catch::Contains("qk_nope_head_dim + qk_rope_head_dim"));
  CHECK_THAT(with(R"({"kv_lora_rank": 8, "qk_nope_head_dim": -1, "qk_rope_head_dim": 2, "v_head_dim": 4})"),
             Catch::Contains("model.mla.qk_nope_head_dim"));
  CHECK_THAT(with(R"({"kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 3, "v_head_dim": 4, "rope": true})"),
             Catch::Contains("model.mla.qk_rope_head_dim") && Catch::Contains("even"));
  CHECK_THAT(with(R"({"kv_lora_rank": 8, "qk_nope_head_dim": 4, "v_head_dim": 4, "rope": true})"),
             Catch::Contains("model.mla.qk_rope_head_dim"));
  CHECK_THAT(with(R"({"qk_nope_head_dim": 4, "v_head_dim": 4})"), Catch::Contains("needs kv_lora_rank"));
  CHECK_THAT(with(R"({"kv_lora_rank": -2, "qk_nope_head_dim": 4, "v_head_dim": 4})"),
             Catch::Contains("model.mla.kv_lora_rank"));
  CHECK_THAT(with(R"({"kv_lora_rank": 8, "qk_nope_head_dim": 4, "v_head_dim": 4, "q_lora_rank": 16})"),
             Catch::Contains("model.mla.q_lora_rank"));
}

TEST_CASE("model.kda: which layers keep softmax attention", "[train]") {
  model::ModelConfig c;
  c.n_layers = 9;
  c.kda.heads = 2, c.kda.head_dim = 4;
  std::string kinds;
  for (int64_t l = 0; l < 9; ++l) kinds += c.kda_layer(l) ? 'K' : 'A';
  CHECK(kinds == "KKKAKKKAA");  // 1-based 4 and 8, and the last
  c.kda.full_attention_every = 3;
  kinds.clear();
  for (int64_t l = 0; l < 9; ++l) kinds += c.kda_layer(l) ? 'K' : 'A';
  CHECK(kinds == "KKAKKAKKA");
  c.kda.full_attention_every = 0;
  c.kda.full_attention_layers = {1, 5};
  kinds.clear();
  for (int64_t l = 0; l < 9; ++l) kinds += c.kda_layer(l) ? 'K' : 'A';
  CHECK(kinds == "AKKKAKKKK");  // exactly the list (the last layer included only when listed)
  c.kda.heads = 0;
  CHECK_FALSE(c.kda_layer(0));
}

TEST_CASE("configs/kimi_linear_48b.json has Kimi Linear 48B's parameter counts", "[train]") {
  // Counted by hand from the released shapes (docs/model.md, "MLA layer";
  // d 2304, V 163840 untied):
  //  a KDA layer 39,514,272 (q, k, v 3 x 4096 x 2304; convolutions 3 x 4096
  //  x 4; A_log 32, dt_bias 4096; f_a, g_a 2 x 128 x 2304; f_b, g_b 2 x 4096
  //  x 128; b 32 x 2304; o_norm 128; o 2304 x 4096), x 20 = 790,285,440;
  //  an MLA layer 29,114,880 (q 32 x 192 x 2304, kv_a 576 x 2304, its norm
  //  512, kv_b 32 x 256 x 512, o 2304 x 4096), x 7 = 203,804,160;
  //  a MoE layer's router 256 x 2304, shared expert 3 x 1024 x 2304 and
  //  256 experts 3 x 1024 x 2304 each: 1,819,607,040, x 26 =
  //  47,309,783,040, of which the routed experts 47,110,422,528;
  //  layer 0's dense MLP 3 x 9216 x 2304 = 63,700,992; the 54 sublayer
  //  norms and the 55 AttnRes queries (with the final norm) 110 x 2304 =
  //  253,440; embedding and head 2 x 377,487,360 = 754,974,720.
  // Total 49,122,801,792; activated: the routed experts' 8 / 256
  // (1,472,200,704) in place of all of them.
  std::ifstream in(std::string(ATTNRES_SOURCE_DIR) + "/configs/kimi_linear_48b.json");
  REQUIRE(in.good());
  const Config c = Config::from_json(json::parse(in), "kimi_linear_48b.json");
  const int64_t total = 49122801792, emb = 754974720;
  const int64_t activated = total - emb - 47110422528 + 1472200704;
  CHECK(model::total_params(c.model) == total);
  CHECK(model::non_embedding_params(c.model) == total - emb);
  CHECK(model::activated_non_embedding_params(c.model) == activated);
  // Against the figures of our count of the released config (49.12B, 2.73B
  // activated, 3.48B with the embeddings and head): within 1%.
  CHECK(std::abs(total / 49.12e9 - 1) < 0.01);
  CHECK(std::abs(activated / 2.73e9 - 1) < 0.01);
  CHECK(std::abs((activated + emb) / 3.48e9 - 1) < 0.01);
  // Its layers: 20 KDA, MLA in 4, 8, ..., 24 and 27 (1-based).
  std::string kinds;
  for (int64_t l = 0; l < 27; ++l) kinds += c.model.kda_layer(l) ? 'K' : c.model.mla_layer(l) ? 'M' : '?';
  CHECK(kinds == "KKKMKKKMKKKMKKKMKKKMKKKMKKM");
}
