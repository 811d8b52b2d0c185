#include "train/checkpoint.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <unordered_map>

#include "core/fileio.h"
#include "core/safetensors.h"
#include "data/bpe.h"
#include "train/checkpoint_io.h"

namespace attnres::train {

namespace fs = std::filesystem;
using nlohmann::json;

json hf_config(const model::ModelConfig& m) {
  json residual = {{"mode", model::residual_mode_name(m.mode)}};
  if (m.attnres()) residual["block_size"] = m.resolved_block_size();
  if (m.n_blocks > 0) residual["n_blocks"] = m.n_blocks;
  // The baseline is a Llama model and says so. Full and Block AttnRes compute
  // another function with Llama's tensors plus the Mix queries: labelled
  // "llama", a Llama loader would load them, drop the queries with a warning
  // and compute something else. "attnres" makes such a loader refuse them.
  const bool llama = !m.attnres();
  return {
      {"architectures", {llama ? "LlamaForCausalLM" : "AttnResForCausalLM"}},
      {"model_type", llama ? "llama" : "attnres"},
      {"vocab_size", m.vocab_size},
      {"hidden_size", m.d_model},
      {"intermediate_size", m.d_ff},
      {"num_hidden_layers", m.n_layers},
      {"num_attention_heads", m.n_heads},
      {"num_key_value_heads", m.n_kv_heads},
      {"head_dim", m.head_dim()},
      {"hidden_act", "silu"},
      {"rms_norm_eps", m.norm_eps},
      {"rope_theta", m.rope_theta},
      {"tie_word_embeddings", m.tie_embeddings},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"initializer_range", 0.02},
      {"torch_dtype", "float32"},
      {"attn_res", residual},
  };
}

namespace {
// Checkpoints are written from host memory; device tensors are copied first.
std::vector<NamedTensor> on_host(std::vector<NamedTensor> tensors) {
  for (auto& t : tensors)
    if (!t.tensor.is_cpu()) t.tensor = t.tensor.to(Device::CPU);
  return tensors;
}
}  // namespace

namespace {

// config.json, state.json and the tokenizer: the files of a checkpoint that
// are not tensors (written by rank 0).
void write_run_files(const CheckpointWriter& w, const Config& cfg, int64_t optimizer_steps,
                     const TrainState& state) {
  write_text_file_atomic(w.path_for("config.json"), hf_config(cfg.model).dump(2) + "\n");
  const int64_t units = state.step * cfg.training.grad_accum * cfg.parallel.data;
  json st = {
      {"format", "attnres-train-state"},
      {"version", 1},
      {"step", state.step},
      {"tokens", state.tokens},
      {"optimizer_steps", optimizer_steps},
      // The loader is stateless: unit u of the run is a pure function of
      // (u, shuffle, seed), so the cursor is just the count of units consumed.
      {"data", {{"units_consumed", units}, {"shuffle", cfg.data.shuffle}, {"seed", cfg.training.seed}}},
      // All randomness is counter-based (core/rng.h): the seed is the whole state.
      {"rng", {{"kind", "counter-splitmix64"}, {"seed", cfg.training.seed}}},
      {"config", cfg.to_json()},
  };
  write_text_file_atomic(w.path_for("state.json"), st.dump(2) + "\n");
  // One file that `generate` reads with nothing else: GPT-2's two files
  // (encoder.json + vocab.bpe) become a Hugging Face tokenizer.json.
  if (!cfg.data.tokenizer.empty() && fs::exists(cfg.data.tokenizer))
    write_text_file_atomic(w.path_for("tokenizer.json"), data::self_contained_tokenizer(cfg.data.tokenizer));
}

// "model.safetensors", or "model-00002-of-00004.safetensors" for shard 1 of 4.
std::string shard_file(const std::string& stem, int shard, int n_shards) {
  if (n_shards == 1) return stem + ".safetensors";
  char b[64];
  std::snprintf(b, sizeof b, "-%05d-of-%05d.safetensors", shard + 1, n_shards);
  return stem + b;
}

std::string index_file(const std::string& stem) { return stem + ".safetensors.index.json"; }

// Test hook (tests/mpi/checkpoint_shards.sh): ATTNRES_TEST_KILL_IN_SAVE =
// "RANK:STEP" makes that rank kill itself in the middle of that step's save,
// after its model shard and before its optimizer shard.
void maybe_die_in_save(int rank, int64_t step) {
  const char* spec = std::getenv("ATTNRES_TEST_KILL_IN_SAVE");
  if (!spec) return;
  int r = -1;
  long long s = -1;
  if (std::sscanf(spec, "%d:%lld", &r, &s) == 2 && r == rank && s == step) std::raise(SIGKILL);
}

}  // namespace

std::string save_checkpoint(const Config& cfg, const parallel::Comm& world, int shard,
                            int n_shards, const std::vector<NamedTensor>& weights,
                            const std::vector<NamedTensor>& optimizer_state,
                            int64_t optimizer_steps, const TrainState& state) {
  const bool root = world.rank() == 0;
  std::unique_ptr<CheckpointWriter> w;
  std::string temp;
  if (root) {
    w = std::make_unique<CheckpointWriter>(cfg.checkpoint.dir, state.step);
    temp = w->temp_dir();
  }
  world.bcast(temp, 0);

  // This rank's shards, with what it wrote: per file its size and checksum,
  // per tensor its file and bytes.
  json mine = {{"files", json::object()}, {"model", json::object()}, {"optimizer", json::object()}};
  if (shard >= 0) {
    for (const char* stem : {"model", "optimizer"}) {
      const bool model = std::string(stem) == "model";
      const std::string name = shard_file(stem, shard, n_shards);
      const std::string path = (fs::path(temp) / name).string();
      const auto host = on_host(model ? weights : optimizer_state);
      write_safetensors(path, host, {{"format", "pt"}});
      fsync_path(path);
      uint64_t size = 0;
      const uint64_t hash = xxh64_file(path, &size);
      mine["files"][name] = {{"size", size}, {"xxh64", hex64(hash)}};
      for (const auto& t : host) mine[stem][t.name] = {{"file", name}, {"bytes", t.tensor.nbytes()}};
      if (model) maybe_die_in_save(world.rank(), state.step);
    }
  }
  const auto all = world.gather(mine.dump(), 0);

  std::string dir;
  if (root) {
    std::map<std::string, CheckpointWriter::FileSum> expected;
    json maps = {{"model", json::object()}, {"optimizer", json::object()}};
    int64_t total[2] = {0, 0};
    for (const std::string& blob : all) {
      const json r = json::parse(blob);
      for (const auto& [name, f] : r["files"].items())
        expected[name] = {f["size"].get<uint64_t>(),
                          std::stoull(f["xxh64"].get<std::string>(), nullptr, 16)};
      for (int k = 0; k < 2; ++k) {
        const char* stem = k == 0 ? "model" : "optimizer";
        for (const auto& [t, info] : r[stem].items()) {
          ATTNRES_CHECK(!maps[stem].contains(t), "tensor ", t, " saved by two ranks");
          maps[stem][t] = info["file"];
          total[k] += info["bytes"].get<int64_t>();
        }
      }
    }
    if (n_shards > 1)
      for (int k = 0; k < 2; ++k) {
        const char* stem = k == 0 ? "model" : "optimizer";
        const json index = {{"metadata", {{"total_size", total[k]}}}, {"weight_map", maps[stem]}};
        write_text_file_atomic(w->path_for(index_file(stem)), index.dump(2) + "\n");
      }
    write_run_files(*w, cfg, optimizer_steps, state);
    dir = w->commit(expected);
  }
  world.bcast(dir, 0);
  return dir;
}

std::map<std::string, std::string> checkpoint_weight_map(const std::string& dir,
                                                         const std::string& stem) {
  std::map<std::string, std::string> out;
  const fs::path single = fs::path(dir) / (stem + ".safetensors");
  if (fs::exists(single)) {
    for (const auto& [name, meta] : read_safetensors_header(single.string()))
      out[name] = single.filename().string();
    return out;
  }
  const std::string index = (fs::path(dir) / index_file(stem)).string();
  if (!fs::exists(index))
    fail(dir, ": has neither ", single.filename().string(), " nor ", index_file(stem));
  json j;
  try {
    j = json::parse(read_text_file(index));
  } catch (const json::exception& e) {
    fail(index, ": not valid JSON: ", e.what());
  }
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    fail(index, ": has no \"weight_map\" object");
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
      fail(index, ": tensor '", name, "' maps to ", file.dump(), ", not a file in the directory");
    out[name] = file.get<std::string>();
  }
  return out;
}

std::vector<NamedTensor> read_checkpoint_tensors(const std::string& dir, const std::string& stem) {
  const auto map = checkpoint_weight_map(dir, stem);
  std::set<std::string> files;
  for (const auto& [name, file] : map) files.insert(file);
  std::vector<NamedTensor> out;
  for (const std::string& file : files) {
    const std::string path = (fs::path(dir) / file).string();
    auto tensors = read_safetensors(path);
    for (auto& t : tensors) {
      auto it = map.find(t.name);
      if (it == map.end() || it->second != file)
        fail(path, ": holds tensor '", t.name, "' that ", index_file(stem),
             " does not map to this file");
      out.push_back(std::move(t));
    }
  }
  if (out.size() != map.size())
    fail(dir, ": ", index_file(stem), " names ", map.size(), " tensors, the shards hold ",
         out.size());
  return out;
}

namespace {
// Copy every parameter of `params` from `tensors` (read from `file`).
void assign_weights(const std::vector<NamedTensor>& tensors, const std::string& file,
                    model::ParamTable& params) {
  std::unordered_map<std::string, const Tensor*> by_name;
  for (const auto& t : tensors) by_name[t.name] = &t.tensor;
  for (auto& p : params.all()) {
    auto it = by_name.find(p.name);
    if (it == by_name.end()) fail(file, ": has no tensor '", p.name, "' that the model needs");
    const Tensor& src = *it->second;
    if (src.shape() != p.value.shape())
      fail(file, ": tensor '", p.name, "' has shape ", shape_str(src.shape()), ", the model needs ",
           shape_str(p.value.shape()));
    Tensor& dst = p.weights();
    dst.copy_from(src.dtype() == dst.dtype() ? src : src.to(dst.dtype()));
    p.sync_value();
  }
}
}  // namespace

void load_weights(const std::string& path, model::ParamTable& params) {
  if (fs::is_directory(path)) {
    verify_checkpoint(path);
    assign_weights(read_checkpoint_tensors(path, "model"), path, params);
    return;
  }
  assign_weights(read_safetensors(path), path, params);
}

namespace {
// A checkpoint's state.json, parsed; an error naming the file otherwise.
json read_state(const std::string& state_path) {
  try {
    return json::parse(read_text_file(state_path));
  } catch (const json::exception& e) {
    fail(state_path, ": not valid JSON: ", e.what());
  }
}
}  // namespace

TrainState load_checkpoint(const std::string& dir, const model::ModelConfig& model,
                           const std::vector<model::ParamTable*>& tables,
                           const std::vector<AdamW*>& opts, bool verify) {
  ATTNRES_CHECK(tables.size() == opts.size(), "load_checkpoint: ", tables.size(), " tables, ",
                opts.size(), " optimizers");
  if (verify) verify_checkpoint(dir);
  const std::string state_path = (fs::path(dir) / "state.json").string();
  const json st = read_state(state_path);
  // The model must be the one this run describes.
  Config saved = Config::from_json(st.at("config"), state_path);
  auto model_json = [](model::ModelConfig m) {
    m.init_from.clear();  // where the weights first came from doesn't matter now
    Config c;
    c.model = m;
    return c.to_json()["model"];
  };
  const json want = model_json(model), have = model_json(saved.model);
  if (want != have)
    fail(dir, ": checkpoint holds a different model (", have.dump(), ") than the config asks for (",
         want.dump(), ")");
  const std::string weights_file = dir + " (model)", opt_file = dir + " (optimizer)";
  const auto weights = read_checkpoint_tensors(dir, "model");
  const auto moments = read_checkpoint_tensors(dir, "optimizer");
  for (size_t i = 0; i < tables.size(); ++i) {
    assign_weights(weights, weights_file, *tables[i]);
    opts[i]->load_state_tensors(moments, opt_file);
    opts[i]->set_steps_taken(st.at("optimizer_steps").get<int64_t>());
  }
  TrainState s;
  s.step = st.at("step").get<int64_t>();
  s.tokens = st.at("tokens").get<int64_t>();
  return s;
}

Config config_from_checkpoint(const std::string& dir) {
  const std::string state_path = (fs::path(dir) / "state.json").string();
  const json st = read_state(state_path);
  if (!st.contains("config")) fail(state_path, ": has no resolved config");
  return Config::from_json(st["config"], state_path);
}

}  // namespace attnres::train
