#include "train/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <unordered_map>

#include "core/fileio.h"
#include "core/safetensors.h"
#include "train/checkpoint_io.h"

namespace attnres::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
// A Kimi Linear model (KDA and / or MLA layers) under the names of Kimi
// Linear's config.json (Hugging Face moonshotai/Kimi-Linear-48B-A3B):
// model_type kimi_linear, linear_attn_config with 1-based layer lists, MLA's
// dims, and Kimi's MoE names in place of DeepSeek-V3's. Fields Kimi's file
// lacks (attn_res, topk_method, moe_capacity_factor) stay ours.
void kimi_linear_fields(const model::ModelConfig& m, json& out) {
  out["model_type"] = "kimi_linear";
  json kda_layers = json::array(), full_layers = json::array();
  for (int64_t l = 0; l < m.n_layers; ++l) (m.kda_layer(l) ? kda_layers : full_layers).push_back(l + 1);
  if (m.has_kda())
    out["linear_attn_config"] = {{"kda_layers", kda_layers},
                                 {"full_attn_layers", full_layers},
                                 {"num_heads", m.kda.heads},
                                 {"head_dim", m.kda.head_dim},
                                 {"short_conv_kernel_size", m.kda.conv_size}};
  if (m.has_mla()) {
    out["q_lora_rank"] = nullptr;
    out["kv_lora_rank"] = m.mla.kv_lora_rank;
    out["qk_nope_head_dim"] = m.mla.qk_nope_head_dim;
    out["qk_rope_head_dim"] = m.mla.qk_rope_head_dim;
    out["v_head_dim"] = m.mla.v_head_dim;
    out["mla_use_nope"] = !m.mla.rope;
  }
  if (m.has_moe()) {
    const std::pair<const char*, const char*> renamed[] = {
        {"n_routed_experts", "num_experts"},
        {"num_experts_per_tok", "num_experts_per_token"},
        {"n_shared_experts", "num_shared_experts"},
        {"scoring_func", "moe_router_activation_func"}};
    for (const auto& [deepseek, kimi] : renamed) {
      out[kimi] = out[deepseek];
      out.erase(deepseek);
    }
    out["moe_renormalize"] = true;
    for (const char* k : {"moe_layer_freq", "n_group", "topk_group", "norm_topk_prob"}) out.erase(k);
  }
}
}  // namespace

json hf_config(const model::ModelConfig& m) {
  json residual = {{"mode", model::residual_mode_name(m.mode)}};
  if (m.attnres()) residual["block_size"] = m.resolved_block_size();
  if (m.n_blocks > 0) residual["n_blocks"] = m.n_blocks;
  if (m.one_pass_mix()) {  // the residual variant, under the config keys' names
    const model::ResidualVariant& v = m.variant;
    residual["query"] = model::mix_query_name(v.query);
    residual["weights"] = model::mix_weights_name(v.weights);
    residual["score"] = model::mix_score_name(v.score);
    residual["key_norm"] = v.key_norm;
    residual["heads"] = v.heads;
    residual["window"] = v.window;
  }
  // The baseline is a Llama model and says so. Full and Block AttnRes compute
  // another function with Llama's tensors plus the Mix queries: labelled
  // "llama", a Llama loader would load them, drop the queries with a warning
  // and compute something else. "attnres" makes such a loader refuse them.
  // (A Kimi Linear hybrid is not one either, even in the baseline mode.)
  const bool llama = m.mode == model::ResidualMode::Baseline && !m.has_moe() && !m.has_kda() &&
                     !m.has_mla();
  json out = {
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
  if (m.has_moe()) {
    // DeepSeek-V3's field names (its config.json); one group (no
    // group-limited routing); norm_topk_prob: the weights are renormalised
    // over the chosen experts. topk_method "noaux_tc" is DeepSeek-V3's name
    // for the choice by s + e_score_correction_bias (balance aux_free).
    const model::MoeConfig& moe = m.moe;
    out["n_routed_experts"] = moe.experts;
    out["num_experts_per_tok"] = moe.top_k;
    out["n_shared_experts"] = moe.shared_experts;
    out["moe_intermediate_size"] = moe.expert_d_ff;
    out["first_k_dense_replace"] = moe.dense_layers;
    out["moe_layer_freq"] = 1;
    out["n_group"] = 1;
    out["topk_group"] = 1;
    out["scoring_func"] = moe.router == kernels::MoeRouter::Sigmoid ? "sigmoid" : "softmax";
    out["routed_scaling_factor"] = moe.routed_scale;
    out["norm_topk_prob"] = true;
    out["topk_method"] = moe.balance == model::MoeBalance::AuxFree ? "noaux_tc" : "greedy";
    if (moe.balance == model::MoeBalance::AuxLoss) out["aux_loss_alpha"] = moe.aux_loss_coef;
    // attnres's own: 0 = dropless; otherwise an expert takes at most
    // ceil(c N K / E) of a forward call's N tokens (docs/model.md).
    out["moe_capacity_factor"] = moe.capacity_factor;
  }
  if (m.has_kda() || m.has_mla()) kimi_linear_fields(m, out);
  return out;
}

std::string checkpoint_index_file(const std::string& stem) {
  return stem + ".safetensors.index.json";
}

namespace {
// A file set's index (stem.safetensors.index.json), parsed and checked; a
// null value when the set is the single file stem.safetensors.
json read_index(const std::string& dir, const std::string& stem) {
  const fs::path single = fs::path(dir) / (stem + ".safetensors");
  if (fs::exists(single)) return nullptr;
  const std::string index = (fs::path(dir) / checkpoint_index_file(stem)).string();
  if (!fs::exists(index))
    fail(dir, ": has neither ", single.filename().string(), " nor ", checkpoint_index_file(stem));
  json j;
  try {
    j = json::parse(read_text_file(index));
  } catch (const json::exception& e) {
    fail(index, ": not valid JSON: ", e.what());
  }
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    fail(index, ": has no \"weight_map\" object");
  for (const auto& [name, file] : j["weight_map"].items())
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
      fail(index, ": tensor '", name, "' maps to ", file.dump(), ", not a file in the directory");
  if (j.contains("slices") && !j["slices"].is_object())
    fail(index, ": \"slices\" is not an object");
  return j;
}

// The tensors stored in parts (ZeRO-1 slices, the index's "slices": whole
// name -> {"shape", "parts": [{"name", "offset", "length"}]}) put together:
// each part replaced by its whole tensor, which the parts must cover exactly
// once, in the first part's place.
void join_slices(const json& slices, const std::string& index, std::vector<NamedTensor>& tensors) {
  std::unordered_map<std::string, size_t> at;
  for (size_t i = 0; i < tensors.size(); ++i) at[tensors[i].name] = i;
  std::vector<bool> is_part(tensors.size(), false);
  std::vector<std::pair<size_t, NamedTensor>> wholes;  // (first part's place, whole)
  for (const auto& [name, info] : slices.items()) {
    Shape shape;
    try {
      shape = info.at("shape").get<Shape>();
    } catch (const json::exception&) {
      fail(index, ": slices of '", name, "' have no valid \"shape\"");
    }
    Tensor whole;
    std::vector<std::pair<int64_t, int64_t>> covered;  // (offset, length)
    size_t first = tensors.size();
    for (const auto& part : info.value("parts", json::array())) {
      const std::string stored = part.value("name", "");
      const int64_t offset = part.value("offset", int64_t{-1}), length = part.value("length", int64_t{-1});
      auto it = at.find(stored);
      if (it == at.end()) fail(index, ": slice '", stored, "' of '", name, "' is in no shard");
      const Tensor& t = tensors[it->second].tensor;
      if (!whole.defined()) whole = Tensor::zeros(shape, t.dtype());  // the parts' dtype
      if (t.dtype() != whole.dtype())
        fail(index, ": the slices of '", name, "' have dtypes ", dtype_name(whole.dtype()), " and ",
             dtype_name(t.dtype()));
      if (offset < 0 || length != t.numel() || offset + length > whole.numel())
        fail(index, ": slice '", stored, "' (offset ", offset, ", ", t.numel(), " elements) does not fit '",
             name, "' of shape ", shape_str(shape));
      whole.reshape({whole.numel()}).rows(offset, length).copy_from(t.reshape({length}));
      covered.emplace_back(offset, length);
      is_part[it->second] = true;
      first = std::min(first, it->second);
    }
    if (!whole.defined()) fail(index, ": '", name, "' has no slices");
    std::sort(covered.begin(), covered.end());
    int64_t next = 0;
    for (const auto& [o, n] : covered) {
      if (o != next) fail(index, ": the slices of '", name, "' ", o < next ? "overlap" : "leave a gap", " at element ", std::min(o, next));
      next = o + n;
    }
    if (next != whole.numel())
      fail(index, ": the slices of '", name, "' cover ", next, " of its ", whole.numel(), " elements");
    wholes.emplace_back(first, NamedTensor{name, std::move(whole)});
  }
  std::vector<NamedTensor> out;
  std::sort(wholes.begin(), wholes.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t w = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (; w < wholes.size() && wholes[w].first == i; ++w) out.push_back(std::move(wholes[w].second));
    if (!is_part[i]) out.push_back(std::move(tensors[i]));
  }
  tensors = std::move(out);
}
}  // namespace

namespace {
// The stored tensor names of a file set and the file holding each, from its
// index `j` (read_index) or the single file's header.
std::map<std::string, std::string> weight_map(const std::string& dir, const std::string& stem,
                                              const json& j) {
  std::map<std::string, std::string> out;
  if (j.is_null()) {
    const fs::path single = fs::path(dir) / (stem + ".safetensors");
    for (const auto& [name, meta] : read_safetensors_header(single.string()))
      out[name] = single.filename().string();
    return out;
  }
  for (const auto& [name, file] : j["weight_map"].items()) out[name] = file.get<std::string>();
  return out;
}
}  // namespace

std::map<std::string, std::string> checkpoint_weight_map(const std::string& dir,
                                                         const std::string& stem) {
  return weight_map(dir, stem, read_index(dir, stem));
}

std::vector<NamedTensor> read_checkpoint_tensors(const std::string& dir, const std::string& stem) {
  const json index = read_index(dir, stem);
  const auto map = weight_map(dir, stem, index);
  std::set<std::string> files;
  for (const auto& [name, file] : map) files.insert(file);
  std::vector<NamedTensor> out;
  for (const std::string& file : files) {
    const std::string path = (fs::path(dir) / file).string();
    auto tensors = read_safetensors(path);
    for (auto& t : tensors) {
      auto it = map.find(t.name);
      if (it == map.end() || it->second != file)
        fail(path, ": holds tensor '", t.name, "' that ", checkpoint_index_file(stem),
             " does not map to this file");
      out.push_back(std::move(t));
    }
  }
  if (out.size() != map.size())
    fail(dir, ": ", checkpoint_index_file(stem), " names ", map.size(), " tensors, the shards hold ",
         out.size());
  if (!index.is_null() && index.contains("slices"))
    join_slices(index["slices"], (fs::path(dir) / checkpoint_index_file(stem)).string(), out);
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

void load_weights(const std::string& path, model::Model& model) {
  const bool dir = fs::is_directory(path);
  if (dir) verify_checkpoint(path);
  const auto tensors = dir ? read_checkpoint_tensors(path, "model") : read_safetensors(path);
  for (model::ParamTable* t : model.tables()) assign_weights(tensors, path, *t);
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

namespace {
// The keys where two resolved configs' sections differ, each as "; key: the
// checkpoint has A, the config B" (a section only one side has: whole).
std::string model_differences(const std::string& prefix, const json& have, const json& want) {
  std::string out;
  std::set<std::string> keys;
  for (auto it = have.begin(); it != have.end(); ++it) keys.insert(it.key());
  for (auto it = want.begin(); it != want.end(); ++it) keys.insert(it.key());
  for (const std::string& k : keys) {
    const json* a = have.contains(k) ? &have[k] : nullptr;
    const json* b = want.contains(k) ? &want[k] : nullptr;
    if (a && b && *a == *b) continue;
    if (a && b && a->is_object() && b->is_object()) {
      out += model_differences(prefix + "." + k, *a, *b);
      continue;
    }
    out += "; " + prefix + "." + k + ": the checkpoint has " + (a ? a->dump() : "none") +
           ", the config " + (b ? b->dump() : "none");
  }
  return out;
}
}  // namespace

TrainState load_checkpoint(const std::string& dir, const model::ModelConfig& model,
                           const std::vector<model::ParamTable*>& tables,
                           const std::vector<Optimizer*>& opts,
                           const std::vector<model::ParamTable*>& state, bool verify) {
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
    fail(dir, ": checkpoint holds a different model than the config asks for",
         model_differences("model", have, want));
  const std::string weights_file = dir + " (model)", opt_file = dir + " (optimizer)";
  const auto weights = read_checkpoint_tensors(dir, "model");
  const auto moments = read_checkpoint_tensors(dir, "optimizer");
  for (size_t i = 0; i < tables.size(); ++i) {
    assign_weights(weights, weights_file, *tables[i]);
    opts[i]->load_state_tensors(moments, opt_file);
    opts[i]->set_steps_taken(st.at("optimizer_steps").get<int64_t>());
  }
  for (model::ParamTable* t : state) assign_weights(weights, weights_file, *t);
  TrainState s;
  s.step = st.at("step").get<int64_t>();
  s.tokens = st.at("tokens").get<int64_t>();
  return s;
}

void check_layer_pattern(const std::string& dir, const model::ModelConfig& m) {
  if (!fs::is_directory(dir) || !fs::exists(fs::path(dir) / "state.json")) return;
  const model::ModelConfig saved = config_from_checkpoint(dir).model;
  auto kind = [](const model::ModelConfig& c, int64_t l) {
    return c.kda_layer(l) ? "a KDA layer" : c.mla_layer(l) ? "an MLA layer" : "a GQA layer";
  };
  for (int64_t l = 0; l < std::min(m.n_layers, saved.n_layers); ++l)
    if (std::string(kind(saved, l)) != kind(m, l))
      fail("config key ", saved.kda_layer(l) != m.kda_layer(l) ? "model.kda" : "model.mla", ": ", dir, " holds another layer pattern: its layer ", l + 1,
           " (1-based) is ", kind(saved, l), ", this config's ", kind(m, l),
           " (model.kda.full_attention_every / full_attention_layers, model.mla)");
}

Config config_from_checkpoint(const std::string& dir) {
  const std::string state_path = (fs::path(dir) / "state.json").string();
  const json st = read_state(state_path);
  if (!st.contains("config")) fail(state_path, ": has no resolved config");
  return Config::from_json(st["config"], state_path);
}

}  // namespace attnres::train
