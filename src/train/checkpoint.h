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
// "attnres" / AttnResForCausalLM, which no Llama loader accepts). Nothing of
// ours reads it back (state.json holds the config), so checkpoints written
// before the label changed read as before.
nlohmann::json hf_config(const model::ModelConfig& m);

// Write a complete checkpoint for `state.step`, collective over `world`; no
// tensor crosses ranks. Rank `shard` of `n_shards` writers (-1: this rank
// writes no tensors) writes the weights (docs/model.md names) and AdamW
// moments (AdamW::state_tensors names) of the parameters it owns into the
// step's temporary directory (which must be on a file system every rank
// sees), so a checkpoint does not depend on the layout that wrote it. Rank 0
// writes the index files and the run's files, checks every shard against the
// size and checksum its writer recorded, and publishes the directory by
// rename. With one writer (e.g. world = Comm::solo(), shard 0 of 1, holding
// everything) the files are model.safetensors / optimizer.safetensors.
// Returns the directory on every rank.
std::string save_checkpoint(const Config& cfg, const parallel::Comm& world, int shard,
                            int n_shards, const std::vector<NamedTensor>& weights,
                            const std::vector<NamedTensor>& optimizer_state,
                            int64_t optimizer_steps, const TrainState& state);

// Every tensor of a checkpoint's "model" or "optimizer" file set, from the
// single file or from the shards its index names (an error names the index
// or shard that is wrong). Tensors in file order, shard by shard.
std::vector<NamedTensor> read_checkpoint_tensors(const std::string& dir, const std::string& stem);
// The tensor names of that set and the file holding each (headers only).
std::map<std::string, std::string> checkpoint_weight_map(const std::string& dir,
                                                         const std::string& stem);

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
