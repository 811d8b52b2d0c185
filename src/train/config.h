// The run configuration: JSON file + `--section.key=value` overrides, checked
// before any work. Every key is declared once, in config.cpp's key table,
// which parses, serialises and documents it (docs/config.md); unknown keys,
// wrong types and impossible combinations are errors naming the key.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "kernels/attention.h"
#include "model/config.h"
#include "parallel/transport.h"

namespace attnres::train {

using json = nlohmann::json;

enum class ScheduleType { Constant, Cosine, Wsd };
// optimizer.type (docs/model.md section 4): AdamW for every tensor, or Muon for
// the 2-D weights inside the transformer layers and AdamW for the rest.
enum class OptimizerType { AdamW, Muon };
// training.logits: the dtype of the LM head's logits (kernels/cross_entropy.h).
// Auto: bf16 in a bf16 run, fp32 in an fp32 run; F32: fp32 logits in any run
// (the reference a bf16-logit run is compared with); BF16: bf16 logits, only
// in a bf16 run (validate() rejects it otherwise).
enum class Logits { Auto, F32, BF16 };
// training.cuda_graphs (parallel/step_graph.h): each rank's step as one CUDA
// graph. Auto: off until graphs have run on a GPU (docs/cuda.md); On (JSON
// true): on cuda, and with peers over NCCL only (their communication is
// captured too), else an error; Off (JSON false).
enum class CudaGraphs { Auto, On, Off };
// parallel.transport: parallel::TransportKind (Auto: NCCL for CUDA runs when
// built with it, else MPI; Mpi: host memory, GPU tensors staged through the
// host, e.g. several ranks sharing one GPU; Nccl).
using parallel::TransportKind;

struct OptimizerConfig {
  OptimizerType type = OptimizerType::AdamW;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0;
  double momentum = 0.95;  // Muon's
};
struct ScheduleConfig {
  ScheduleType type = ScheduleType::Cosine;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1, decay_ratio = 0.2;
};
struct TrainingConfig {
  int64_t steps = 0, micro_batch_size = 0, seq_len = 0, grad_accum = 1;
  uint64_t seed = 1;
  Device device = Device::CPU;
  DType precision = DType::F32;  // F32, or BF16 (mixed precision) on CUDA
  Logits logits = Logits::Auto;
  // training.attention_kernel (kernels/attention.h): ours (Own), cuDNN's fused
  // attention where it runs (Auto), or cuDNN or an error (Cudnn: cuda only).
  // Own by default until cuDNN's path has run on a GPU (docs/cuda.md).
  kernels::AttentionKernel attention_kernel = kernels::AttentionKernel::Own;
  model::Recompute recompute = model::Recompute::None;
  CudaGraphs cuda_graphs = CudaGraphs::Auto;
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
  // Layers of each of the P*V chunks (chunk c on rank c mod P), summing to
  // model.n_layers; empty: as even as possible (parallel/layout.h). `inspect
  // plan` prints a split balanced by cost for hybrids and heavy heads.
  std::vector<int64_t> layers_per_chunk;
  // EP: expert parallelism of a MoE model (docs/parallel.md "Expert
  // parallelism"): groups of EP replicas split each MoE layer's routed experts.
  int64_t expert = 1;
  bool cache_blocks = true;
  int64_t zero = 0;  // 0 | 1 (ZeRO-1: AdamW state and master weights split over the replicas)
  TransportKind transport = TransportKind::Auto;
};
struct CheckpointConfig {
  std::string dir;               // empty = no checkpoints
  int64_t every = 0;             // 0 = only the final one
  int64_t keep_last = 0;         // 0 = keep all
  std::string resume = "never";  // never | auto | <checkpoint directory>
  bool save_initial = false;
  bool sharded = true;  // each pipeline stage writes its own shard (no gather at rank 0)
  bool async = true;    // write in the background while training goes on (train/checkpoint_save.h)
};
struct EvalConfig {
  int64_t every = 0, batches = 4;
  // Multiple-choice tasks scored at every evaluation (train/multiple_choice.h):
  // "hellaswag:FILE[,...]"; empty = none. task_examples: the first N
  // questions of each (0 = all).
  std::string tasks;
  int64_t task_examples = 0;
  std::string scoring = "lm-eval";  // "lm-eval" or "llm.c" (train/multiple_choice.h)
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
  // Parse a whole config; `source` names it in errors (a file path). Types,
  // allowed values and each key's own range are checked here.
  static Config from_json(const json& j, const std::string& source);
  // Checks that involve several keys (heads | d, the parallel layout, ...).
  void validate() const;
  // Whether the training step runs as a CUDA graph (training.cuda_graphs resolved).
  bool cuda_graphs() const;
};

// The names the config file uses for the enum values ("cosine", "nccl",
// "cuda", "bf16", ...).
const char* transport_name(TransportKind t);
const char* precision_name(DType t);
// Parse a device / precision name as the config file spells it ("cpu",
// "cuda"; "fp32", "bf16"); `where` names the flag or key in the error.
Device parse_device(const std::string& name, const std::string& where);
DType parse_precision(const std::string& name, const std::string& where);
model::Recompute parse_recompute(const std::string& name, const std::string& where);
Logits parse_logits(const std::string& name, const std::string& where);
kernels::AttentionKernel parse_attention_kernel(const std::string& name, const std::string& where);
// The logits' dtype for a model computing in `compute` (training.precision, or
// the fp32 an evaluation on the cpu falls back to): fp32 when fp32 logits are
// asked for or the model computes in fp32, else bf16. (A config asking for bf16
// logits in an fp32 run never gets here: validate() rejects it.)
DType logit_dtype(Logits logits, DType compute);

// The table of every config key (key, default, meaning, check) as the
// Markdown rows of docs/config.md, generated from the same declarations that
// parse and serialise the config (tests/train/test_config_schedule.cpp checks
// that the document carries exactly these rows).
std::string config_reference_table();

// Apply one `--section.key=value` override to j. The value is parsed as JSON
// when it parses (numbers, true/false, quoted strings, objects), else taken as
// a bare string.
void apply_override(json& j, const std::string& arg);

// Read the file, apply overrides in order, parse and validate.
Config load_config(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace attnres::train
