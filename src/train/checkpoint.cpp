#include "train/checkpoint.h"

#include <filesystem>
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
  return {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
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

std::string save_checkpoint(const Config& cfg, const std::vector<NamedTensor>& weights,
                            const std::vector<NamedTensor>& optimizer_state,
                            int64_t optimizer_steps, const TrainState& state) {
  CheckpointWriter w(cfg.checkpoint.dir, state.step);
  write_safetensors(w.path_for("model.safetensors"), on_host(weights), {{"format", "pt"}});
  write_safetensors(w.path_for("optimizer.safetensors"), on_host(optimizer_state),
                    {{"format", "pt"}});
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
  return w.commit();
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
  std::string file = path;
  if (fs::is_directory(path)) {
    verify_checkpoint(path);
    file = (fs::path(path) / "model.safetensors").string();
  }
  assign_weights(read_safetensors(file), file, params);
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
  const std::string weights_file = (fs::path(dir) / "model.safetensors").string();
  const std::string opt_file = (fs::path(dir) / "optimizer.safetensors").string();
  const auto weights = read_safetensors(weights_file);
  const auto moments = read_safetensors(opt_file);
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
