// Model-level checkpoints on top of checkpoint_io's atomic directories:
//   step_XXXXXXXX/model.safetensors      fp32 weights, docs/model.md section 3 names
//                 optimizer.safetensors  AdamW moments (exp_avg.*, exp_avg_sq.*)
//                 config.json            Hugging Face LlamaConfig + residual settings
//                 state.json             step, tokens, data cursor, RNG, resolved config
//                 tokenizer.json         data.tokenizer as one file, when configured
//                 manifest.json          sizes + checksums (written last by checkpoint_io)
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "train/config.h"
#include "train/optimizer.h"

namespace attnres::train {

struct TrainState {
  int64_t step = 0;    // optimizer steps completed
  int64_t tokens = 0;  // training tokens consumed
};

// Hugging Face LlamaConfig fields plus our residual settings.
nlohmann::json hf_config(const model::ModelConfig& m);

// Write a complete checkpoint for `state.step`; returns its directory. The
// trainer gathers every rank's weights (docs/model.md names, in param_shapes
// order) and optimizer moments (AdamW::state_tensors names and order) at rank
// 0, so a checkpoint does not depend on the layout that wrote it.
std::string save_checkpoint(const Config& cfg, const std::vector<NamedTensor>& weights,
                            const std::vector<NamedTensor>& optimizer_state,
                            int64_t optimizer_steps, const TrainState& state);

// Verify, then load weights, optimizer state and counters from `dir` into a
// rank's tables (its chunks) with their optimizers: each takes the tensors it
// holds, whatever layout wrote the file. Throws (naming the file) on damage or
// on a model that doesn't match. `verify` = false skips re-hashing the files
// (another rank verified them).
TrainState load_checkpoint(const std::string& dir, const model::ModelConfig& model,
                           const std::vector<model::ParamTable*>& tables,
                           const std::vector<AdamW*>& opts, bool verify = true);

// Load weights only, from a safetensors file or a checkpoint directory (model.init_from,
// eval, generate). Every parameter of the table must be present with its shape.
void load_weights(const std::string& path, model::ParamTable& params);

// The resolved training config stored in a checkpoint's state.json.
Config config_from_checkpoint(const std::string& dir);

}  // namespace attnres::train
