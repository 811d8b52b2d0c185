// The run configuration: JSON file + `--section.key=value` overrides, checked
// before any work. Every key of ARCHITECTURE.md exists here; unknown keys,
// wrong types and impossible combinations are errors naming the key.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace attnres::train {

using json = nlohmann::json;

struct OptimizerConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0;
};
struct ScheduleConfig {
  std::string type = "cosine";   // constant | cosine | wsd
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1, decay_ratio = 0.2;
};
struct TrainingConfig {
  int64_t steps = 0, micro_batch_size = 0, seq_len = 0, grad_accum = 1;
  uint64_t seed = 1;
  std::string device = "cpu", precision = "fp32";
  // Peak FLOP/s of the device for the MFU figure, in TFLOP/s; 0 = look it up
  // from the GPU's name (H100/H200: 989 bf16 dense, 67 fp32).
  double peak_tflops = 0;
};
struct DataConfig {
  std::string train, val, tokenizer;
  bool shuffle = false;
};
struct ParallelConfig {
  int64_t pipeline = 1, virtual_stages = 1, data = 1;
  bool cache_blocks = true;
  // Point-to-point transport: "auto" (NCCL for CUDA runs when built with it,
  // else MPI), "mpi" (host memory; GPU tensors staged through the host, e.g.
  // several ranks sharing one GPU) or "nccl".
  std::string transport = "auto";
};
struct CheckpointConfig {
  std::string dir;               // empty = no checkpoints
  int64_t every = 0;             // 0 = only the final one
  int64_t keep_last = 0;         // 0 = keep all
  std::string resume = "never";  // never | auto | <checkpoint directory>
  bool save_initial = false;
};
struct EvalConfig {
  int64_t every = 0, batches = 4;
};
struct RunConfig {
  std::string dir = "run";
  int64_t log_every = 1;
  // Stop (after a checkpoint) once this many steps ran in this invocation;
  // 0 = run to training.steps. For time-sliced jobs and resume tests.
  int64_t stop_after = 0;
  // Every this many steps (and at the last step) write per-sublayer output
  // RMS and gradient norms to <run.dir>/depth_stats.jsonl; 0 = off.
  int64_t depth_stats_every = 0;
};

struct Config {
  model::ModelConfig model;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  TrainingConfig training;
  DataConfig data;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  RunConfig run;

  json to_json() const;  // the resolved config (every key, defaults filled in)
  // Parse a whole config; `source` names it in errors (a file path).
  static Config from_json(const json& j, const std::string& source);
  // Cross-key checks (heads | d, schedule type, parallel layout, ...).
  void validate() const;
};

// Apply one `--section.key=value` override to j. The value is parsed as JSON
// when it parses (numbers, true/false, quoted strings, objects), else taken as
// a bare string.
void apply_override(json& j, const std::string& arg);

// Read the file, apply overrides in order, parse and validate.
Config load_config(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace attnres::train
