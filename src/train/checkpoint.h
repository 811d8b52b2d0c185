// Model-level checkpoints on top of checkpoint_io's atomic directories:
//   step_XXXXXXXX/model.safetensors      fp32 weights, docs/model.md section 3 names
//                 optimizer.safetensors  AdamW moments (exp_avg.*, exp_avg_sq.*)
//     or, sharded (a pipeline run: each stage writes its own parameters),
//                 model-0000S-of-0000P.safetensors + model.safetensors.index.json
//                 optimizer-0000S-of-0000P.safetensors + optimizer.safetensors.index.json
//                 (Hugging Face's sharded form: {"metadata": {"total_size": bytes},
//                 "weight_map": {tensor name: file}}); every reader takes both forms
//                 config.json            Hugging Face LlamaConfig fields + residual settings
//                                        (model_type "llama" for the baseline, "attnres" else)
//                 state.json             step, tokens, data cursor, RNG, resolved config
//                 tokenizer.json         data.tokenizer as one file, when configured
//                 manifest.json          sizes + checksums (written last by checkpoint_io)
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "parallel/mpi.h"
#include "train/config.h"
#include "train/optimizer.h"

namespace attnres::train {

struct TrainState {
  int64_t step = 0;    // optimizer steps completed
  int64_t tokens = 0;  // training tokens consumed
};

// Hugging Face LlamaConfig fields plus our residual settings; model_type and
// architectures say "llama" only for the baseline (Full and Block AttnRes are
// "attnres" / AttnResForCausalLM, which no Llama loader accepts); a model
// with KDA or MLA layers is "kimi_linear" with Kimi Linear's fields
// (linear_attn_config, the MLA dims, Kimi's MoE names). Nothing of
// ours reads it back (state.json holds the config), so checkpoints written
// before the label changed read as before.
nlohmann::json hf_config(const model::ModelConfig& m);

// Writing one: train/checkpoint_save.h (every rank writes the tensors it
// owns, rank 0 the index and run files, in the background when
// checkpoint.async).

// "model.safetensors.index.json" for "model": the index of a sharded set.
std::string checkpoint_index_file(const std::string& stem);

// Every tensor of a checkpoint's "model" or "optimizer" file set, from the
// single file or from the shards its index names (an error names the index
// or shard that is wrong). Tensors in file order, shard by shard.
std::vector<NamedTensor> read_checkpoint_tensors(const std::string& dir, const std::string& stem);
// The tensor names of that set and the file holding each (headers only).
std::map<std::string, std::string> checkpoint_weight_map(const std::string& dir,
                                                         const std::string& stem);

// Verify, then load weights, optimizer state and counters from `dir` into a
// rank's tables (its chunks) with their optimizers, and its chunks' model
// state (`state`: the MoE routers' biases): each takes the tensors it holds,
// whatever layout wrote the file. Throws (naming the file) on damage or on a
// model that doesn't match. `verify` = false skips re-hashing the files
// (another rank verified them).
TrainState load_checkpoint(const std::string& dir, const model::ModelConfig& model,
                           const std::vector<model::ParamTable*>& tables,
                           const std::vector<Optimizer*>& opts,
                           const std::vector<model::ParamTable*>& state, bool verify = true);

// Load weights only, from a safetensors file or a checkpoint directory (model.init_from,
// eval, generate). Every tensor of the table must be present with its shape;
// for a model, of its parameters and its state.
void load_weights(const std::string& path, model::ParamTable& params);
void load_weights(const std::string& path, model::Model& model);

// A checkpoint directory (with its state.json) whose layers are of other
// kinds than the model's (KDA, MLA or GQA, layer by layer): an error naming
// the first such layer and the keys that set the pattern. Weights of another
// pattern would otherwise fail on a tensor's name or shape.
void check_layer_pattern(const std::string& dir, const model::ModelConfig& model);

// The resolved training config stored in a checkpoint's state.json.
Config config_from_checkpoint(const std::string& dir);

}  // namespace attnres::train
