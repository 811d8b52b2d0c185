#include "train/trainer.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <memory>
#include <numeric>
#include <optional>
#include <unordered_map>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/process_memory.h"
#include "data/bpe.h"
#include "data/loader.h"
#include "data/shard.h"
#include "kernels/cpu/blas.h"
#include "model/flops.h"
#include "model/params.h"
#include "parallel/mpi.h"
#include "parallel/nccl_transport.h"
#include "parallel/runtime.h"
#include "train/checkpoint.h"
#include "train/checkpoint_io.h"
#include "train/checkpoint_save.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/moe_balance.h"
#include "train/multiple_choice.h"
#include "train/optimizer.h"
#include "train/stepper.h"

namespace attnres::train {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// The one piece of process-global state: a signal handler can only talk to
// the program through a sig_atomic_t. The loop polls it between steps.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

// Installs SIGINT/SIGTERM handlers for its lifetime, restoring the old ones.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    old_int_ = std::signal(SIGINT, on_stop_signal);
    old_term_ = std::signal(SIGTERM, on_stop_signal);
  }
  ~StopSignals() {
    std::signal(SIGINT, old_int_);
    std::signal(SIGTERM, old_term_);
  }
  int pending() const { return g_stop_signal; }

 private:
  void (*old_int_)(int);
  void (*old_term_)(int);
};

// Where to resume from (docs/model.md section 6): "" = start fresh. Refuses a fresh
// run into a directory that already holds checkpoints.
std::string choose_resume_dir(const CheckpointConfig& ck) {
  if (ck.resume == "auto") {
    if (auto latest = find_latest_checkpoint(ck.dir)) return *latest;
    spdlog::info("checkpoint.resume = auto: no checkpoint in '{}', starting fresh", ck.dir);
    return "";
  }
  if (ck.resume != "never") return ck.resume;
  if (!ck.dir.empty() && !list_checkpoints(ck.dir).empty())
    fail("config key checkpoint.resume is \"never\" but checkpoint.dir '", ck.dir,
         "' already holds checkpoints; set checkpoint.resume=auto to continue that run or choose "
         "another checkpoint.dir (nothing was overwritten)");
  return "";
}

// training.device / training.precision as the model sees them, and the peak
// FLOP/s of one device for the MFU figure (0 = unknown / cpu).
struct DeviceChoice {
  bool on_gpu;
  Device device;
  DType dtype;
  double peak_flops;
};
DeviceChoice device_choice(const TrainingConfig& tc) {
  DeviceChoice c;
  c.on_gpu = tc.device == Device::CUDA;
  c.device = tc.device;
  c.dtype = tc.precision;
  c.peak_flops = tc.peak_tflops * 1e12;
  if (c.on_gpu && c.peak_flops == 0 && cuda::device_count() > 0)
    c.peak_flops = cuda::peak_dense_flops(c.dtype == DType::BF16);
  return c;
}

// The CPU's threads and BLAS, for the start-up log of a CPU run.
void log_cpu_setup(const std::string& threads) {
  spdlog::info("cpu: {}; BLAS: {}", threads, kernels::cpu::blas_description());
  for (const std::string& w : kernels::cpu::blas_warnings()) spdlog::warn("{}", w);
}

// The run's token streams (docs/model.md section 5), validated before any compute.
data::TokenLoader open_train_data(const Config& cfg) {
  const auto& tc = cfg.training;
  return data::TokenLoader(data::resolve_data_spec(cfg.data.train, "data.train"),
                           tc.micro_batch_size, tc.seq_len, cfg.data.shuffle, tc.seed);
}
std::unique_ptr<data::TokenLoader> open_val_data(const Config& cfg) {
  if (cfg.data.val.empty()) return nullptr;
  const auto& tc = cfg.training;
  return std::make_unique<data::TokenLoader>(data::resolve_data_spec(cfg.data.val, "data.val"),
                                             tc.micro_batch_size, tc.seq_len, false, tc.seed);
}

// data.tokenizer, read before any compute: checkpoints carry it as one file
// (for `generate`), so a file that can't be read must stop the run now, not
// at its first checkpoint; and its ids must fit the model's vocabulary.
void check_tokenizer(const Config& cfg, bool root) {
  const std::string& path = cfg.data.tokenizer;
  if (path.empty()) return;
  if (!fs::exists(path)) {
    if (root) spdlog::warn("data.tokenizer '{}' does not exist: checkpoints will carry no tokenizer", path);
    return;
  }
  const data::BpeTokenizer tok = data::BpeTokenizer::load(path);
  if (tok.vocab_size() > cfg.model.vocab_size)
    fail("config key data.tokenizer: '", path, "' has ", tok.vocab_size(), " tokens, more than model.vocab_size = ",
         cfg.model.vocab_size);
}

// One line of depth_stats.jsonl: per-sublayer RMS of the outputs y_s and L2
// norm of dL/dy_s over the step's whole batch (docs/files.md).
json depth_stats_record(int64_t step, const model::DepthStats& s) {
  std::vector<double> rms, grad;
  for (size_t i = 0; i < s.output_sumsq.size(); ++i) {
    rms.push_back(s.output_count[i] > 0 ? std::sqrt(s.output_sumsq[i] / s.output_count[i]) : 0.0);
    grad.push_back(std::sqrt(s.grad_sumsq[i]));
  }
  return {{"step", step}, {"output_rms", rms}, {"grad_norm", grad}};
}

std::string depth_stats_path(const Config& cfg) {
  return (fs::path(cfg.run.dir) / "depth_stats.jsonl").string();
}

// A checkpoint tensor's place in the single-process order of its file,
// whatever the layout: parameter i of param_shapes, and in the optimizer
// file its first moment at i and its second at n + i.
std::unordered_map<std::string, size_t> checkpoint_order(const model::ModelConfig& m) {
  std::unordered_map<std::string, size_t> order;
  const auto shapes = model::param_shapes(m);
  for (size_t i = 0; i < shapes.size(); ++i) {
    order[shapes[i].name] = i;
    order[Optimizer::first_moment_name(shapes[i].name)] = i;
    order[Optimizer::second_moment_name(shapes[i].name)] = shapes.size() + i;
    order[Optimizer::momentum_name(shapes[i].name)] = i;  // a Muon matrix's, instead of both
  }
  return order;
}

// ---------------------------------------------------------------------------
// The engine: one rank's share of a P x D job (docs/parallel.md), and the
// optimizer-step loop (docs/model.md sections 4-6). A single process is the
// P = D = 1 job on a communicator of its own (parallel::Comm::solo()), so
// every layout has one setup, one loop and one way to save and resume. Rank 0
// (stage 0 of replica 0) prints progress and writes metrics.jsonl and the
// checkpoints. Every decision that ends or branches the loop (non-finite
// values, signals, stop_after) is taken from globally reduced values, so all
// ranks take it together.
// ---------------------------------------------------------------------------
class Engine {
 public:
  // `gpu`: this rank's GPU in a CUDA run (parallel::pin_gpu; index -1 in a
  // single process, which uses device 0).
  Engine(const Config& cfg, const parallel::Comm& world, const parallel::GpuPin& gpu);
  int run();

 private:
  // The constructor's steps, in order. Those marked collective run on every
  // rank together.
  void choose_device();  // training.device: refused without a GPU; the device log line
  parallel::RuntimeOptions runtime_options();  // parallel.*, and choose_transport
  TransportKind choose_transport();  // parallel.transport, the same on every rank (collective)
  void init_weights();               // seeded, or from model.init_from
  void log_model(const parallel::RuntimeOptions& ro);  // parameters and layout (collective)
  void resume();        // from checkpoint.resume's checkpoint, if any (collective)
  void open_metrics();  // metrics.jsonl and depth_stats.jsonl (rank 0)
  void prefault_staging();  // checkpoint.async: the staging buffers, made in the background

  // What this rank writes of a save: its part of the weights ("model") and
  // of the optimizer state, as the live tensors (collective when
  // checkpoint.sharded = false: ZeRO-1's slices are gathered).
  struct SaveParts {
    SavePart weights, moments;
  };
  SaveParts save_parts();

  // `graph`: as a CUDA graph when training.cuda_graphs is on (not on depth-statistics steps).
  parallel::StepStats step(int64_t k, double grad_scale, bool graph);
  void checkpoint();  // collective: begins a save (checkpoint.async: written in the background)
  void finish_saves(bool wait);  // collective: a save in flight advanced (or finished: wait)
  void saved(const SaveRecord& r);  // a save published: its record and log line (rank 0)
  void evaluate();    // collective: replica d evaluates units d, d+D, ... (and eval.tasks)
  void evaluate_val_loss();  // evaluate()'s data.val part
  void log_step(int64_t first_step, double loss, double lr, double norm, double dt,
                double elapsed, const parallel::StepStats& st, const MoeStepReport* moe);
  bool depth_stats_due(int64_t k) const;
  void attach_depth_stats(bool attach);
  void attach_moe_stats(bool attach);  // over a training step's forward passes (MoE models)
  void write_depth_stats(int64_t step);

  const Config& cfg_;
  const TrainingConfig& tc_;
  const int64_t B_, T_, A_;
  const parallel::GpuPin gpu_;  // this rank's GPU, if pinned
  const parallel::ProcessGrid grid_;
  const bool root_;
  const int64_t replica_;
  data::TokenLoader train_data_;
  std::unique_ptr<data::TokenLoader> val_data_;
  TaskEvaluator tasks_;  // eval.tasks
  DeviceChoice dev_;
  std::unique_ptr<Stepper> stepper_;  // the model, runtime and optimizers
  parallel::Runtime& rt() { return stepper_->runtime(); }
  TrainState state_;
  std::string last_checkpoint_;
  std::unique_ptr<MetricsWriter> metrics_;    // rank 0
  CheckpointSaver saver_;
  model::DepthStats depth_stats_;
  model::MoeStats moe_stats_;
  std::unique_ptr<MetricsWriter> depth_log_;  // rank 0, with run.depth_stats_every
  const std::unordered_map<std::string, size_t> ckpt_order_;  // checkpoint_order
};

Engine::Engine(const Config& cfg, const parallel::Comm& world, const parallel::GpuPin& gpu)
    : cfg_(cfg),
      tc_(cfg.training),
      B_(tc_.micro_batch_size),
      T_(tc_.seq_len),
      A_(tc_.grad_accum),
      gpu_(gpu),
      grid_(world, static_cast<int>(cfg.parallel.pipeline), static_cast<int>(cfg.parallel.data),
            static_cast<int>(cfg.parallel.expert)),
      root_(grid_.rank() == 0),
      replica_(grid_.replica()),
      // The data, validated by every rank before any compute.
      train_data_(open_train_data(cfg)),
      val_data_(open_val_data(cfg)),
      tasks_(cfg),
      saver_(cfg, grid_.world(), cfg.checkpoint.async),
      depth_stats_(cfg.model.n_sublayers()),
      moe_stats_(cfg.model.has_moe() ? cfg.model.n_layers : 0, cfg.model.moe.experts),
      ckpt_order_(checkpoint_order(cfg.model)) {
  if (root_) spdlog::info("resolved config: {}", cfg.to_json().dump());
  check_tokenizer(cfg, root_);
  choose_device();
  const parallel::RuntimeOptions ro = runtime_options();
  stepper_ = std::make_unique<Stepper>(grid_, cfg, ro);  // this rank's chunks and optimizers
  prefault_staging();  // beside the rest of the start-up
  init_weights();
  log_model(ro);
  resume();
  open_metrics();
}

void Engine::prefault_staging() {
  // Only where a save comes while training goes on (the save at the last
  // step ends the run, which waits for all of it anyway), and only for an
  // asynchronous sharded save, the one that stages.
  const CheckpointConfig& ck = cfg_.checkpoint;
  if (ck.dir.empty() || !ck.async || !ck.sharded || ck.every <= 0 || ck.every >= tc_.steps) return;
  SaveParts parts = save_parts();
  std::vector<Tensor> like;
  for (const SavePart* part : {&parts.weights, &parts.moments})
    if (part->index >= 0)
      for (const NamedTensor& t : part->tensors) like.push_back(t.tensor);
  if (!like.empty()) saver_.prefault_staging(like);
}

void Engine::choose_device() {
  if (tc_.device == Device::CUDA && cuda::device_count() == 0)
    fail("config key training.device is \"cuda\" but no CUDA device is visible",
         grid_.world().is_solo() ? "" : " to rank " + std::to_string(grid_.rank()),
         " (driver or GPU missing, or CUDA_VISIBLE_DEVICES hides them",
         std::getenv("CUDA_VISIBLE_DEVICES")
             ? std::string(": CUDA_VISIBLE_DEVICES=") + std::getenv("CUDA_VISIBLE_DEVICES")
             : std::string(),
         ")");
  if (tc_.device == Device::CUDA && cfg_.model.has_moe() && root_)
    spdlog::warn("model.moe on cuda: the mixture-of-experts CUDA kernels (kernels/cuda/moe.cu) "
                 "have not run on a GPU yet (docs/cuda.md's never-run list); compare a few steps "
                 "with the CPU first");
  dev_ = device_choice(tc_);
  if (dev_.on_gpu && root_)
    spdlog::info("device: {} ({}, {} logits; peak {:.0f} TFLOP/s for MFU{})",
                 cuda::device_description(), precision_name(tc_.precision),
                 precision_name(logit_dtype(tc_.logits, dev_.dtype)), dev_.peak_flops * 1e-12,
                 dev_.peak_flops == 0 ? ": unknown GPU, set training.peak_tflops" : "");
  if (dev_.on_gpu) {  // which attention runs (an error here under "cudnn" where it cannot)
    const model::ModelConfig& m = cfg_.model;
    const kernels::AttnShape shape{tc_.micro_batch_size, tc_.seq_len, m.n_heads, m.n_kv_heads,
                                   m.head_dim()};
    std::string why;
    const bool cudnn =
        kernels::attention_uses_cudnn(tc_.attention_kernel, shape, dev_.dtype, Device::CUDA, &why);
    if (root_) spdlog::info("attention: {}", cudnn ? "cuDNN's fused attention" : "ours (" + why + ")");
  }
}

parallel::RuntimeOptions Engine::runtime_options() {
  parallel::RuntimeOptions ro;
  ro.V = static_cast<int>(cfg_.parallel.virtual_stages);
  ro.layers_per_chunk = cfg_.parallel.layers_per_chunk;
  ro.cache_blocks = cfg_.parallel.cache_blocks;
  ro.recompute = tc_.recompute;
  ro.zero = cfg_.parallel.zero == 1;
  if (cfg_.optimizer.type == OptimizerType::Muon)  // each Muon matrix has one owner replica
    ro.zero_whole = [](const model::Param& p) { return Optimizer::takes_muon(p); };
  ro.transport = choose_transport();
  ro.cuda_graphs = cfg_.cuda_graphs();
  const bool peers = grid_.world().size() > 1;
  if (ro.cuda_graphs && peers && ro.transport != TransportKind::Nccl)
    fail("config key training.cuda_graphs: true with ", grid_.world().size(),
         " ranks captures their communication too, which needs the NCCL transport; "
         "parallel.transport \"auto\" chose mpi (", parallel::nccl_compiled()
             ? "ranks of this job share a GPU" : "this build has no NCCL",
         "): use one process per GPU, or cuda_graphs = false");
  if (ro.cuda_graphs && root_)
    spdlog::info("CUDA graphs: the step runs eagerly once, is captured at the second and "
                 "replayed{}", peers ? " (on every rank, with its NCCL operations)" : "");
  return ro;
}

TransportKind Engine::choose_transport() {
  // Ranks sharing a GPU (more processes than GPUs on some node) can only talk
  // through MPI: NCCL refuses two ranks on one device. Every rank must pick
  // the same transport, so the nodes agree first.
  int64_t shared = gpu_.sharing > 1;
  grid_.world().allreduce_max(&shared, 1);
  if (gpu_.local_rank == 0 && !gpu_.warning.empty()) spdlog::warn("{}", gpu_.warning);
  const TransportKind asked = cfg_.parallel.transport;
  if (shared && asked == TransportKind::Nccl)
    fail("config key parallel.transport is \"nccl\", but ranks of this job share a GPU (more "
         "processes than GPUs on a node) and NCCL refuses two ranks on one device: use \"mpi\" "
         "or \"auto\", or one process per GPU");
  if (asked != TransportKind::Auto) return asked;
  return dev_.on_gpu && parallel::nccl_compiled() && !shared ? TransportKind::Nccl
                                                             : TransportKind::Mpi;
}

void Engine::init_weights() {
  if (cfg_.model.init_from.empty()) {
    stepper_->init_weights(tc_.seed);
    return;
  }
  check_layer_pattern(cfg_.model.init_from, cfg_.model);
  for (int v = 0; v < rt().model().size(); ++v) load_weights(cfg_.model.init_from, rt().model().chunk(v));
  if (root_) spdlog::info("initialised weights from {}", cfg_.model.init_from);
}

void Engine::log_model(const parallel::RuntimeOptions& ro) {
  const int P = grid_.P(), D = grid_.D();
  auto& rm = rt().model();
  int64_t n_all[2] = {0, 0};  // the routed experts' apart (expert parallelism)
  for (const auto& chunk : rm.owned_params())
    for (const model::Param* p : chunk) n_all[p->expert >= 0] += p->value.numel();
  grid_.world().allreduce_sum(n_all, 2);
  // Every replica holds the whole model but the routed experts, which every
  // expert group holds once.
  const int64_t n = n_all[0] / D + n_all[1] / (D / grid_.EP());
  const model::ModelConfig& mc = cfg_.model;
  const std::string moe =
      mc.has_moe()
          ? fmt::format(", MoE: {} of {} experts (+{} shared) from layer {}, {} non-embedding "
                        "activated per token", mc.moe.top_k, mc.moe.experts, mc.moe.shared_experts,
                        mc.moe.dense_layers, model::activated_non_embedding_params(mc))
          : "";
  if (root_)
    spdlog::info("model: {} parameters ({} residual, {} layers, d={}{}), {} tokens per step", n,
                 model::residual_mode_name(mc.mode), mc.n_layers, mc.d_model, moe,
                 A_ * B_ * T_ * D);
  if (grid_.world().is_solo()) return;
  std::string chunks;
  for (int v = 0; v < rm.size(); ++v) {
    const auto lr = rt().layout().layers(rm.chunk_id(v));
    chunks += fmt::format("{}chunk {} = layers [{}, {})", v ? ", " : "", rm.chunk_id(v), lr.begin,
                          lr.end);
  }
  const int EP = grid_.EP();
  std::string experts;
  if (EP > 1) {
    const int64_t per = mc.moe.experts / EP, first = grid_.expert_rank() * per;
    chunks += fmt::format("; routed experts [{}, {})", first, first + per);
    experts = fmt::format(" (expert parallel: groups of {} replicas, {} of {} routed experts each)",
                          EP, per, mc.moe.experts);
  }
  if (root_)
    spdlog::info("parallel: {} pipeline stages x {} virtual x {} replicas{}, {} transport, "
                 "cache_blocks {}; rank = replica * {} + stage", P, ro.V, D, experts,
                 transport_name(ro.transport), cfg_.parallel.cache_blocks, P);
  spdlog::info("rank {} = stage {} of replica {}: {}", grid_.rank(), grid_.stage(), replica_,
               chunks);
}

void Engine::resume() {
  // Rank 0 picks the checkpoint, every rank loads its part.
  std::string resume_dir;
  if (root_) {
    resume_dir = choose_resume_dir(cfg_.checkpoint);
    if (!resume_dir.empty()) verify_checkpoint(resume_dir);
  }
  grid_.world().bcast(resume_dir, 0);
  const std::vector<Optimizer*> opts = stepper_->optimizers();
  if (!resume_dir.empty()) {
    // Checkpoints hold global tensor names: any layout loads any checkpoint.
    state_ = load_checkpoint(resume_dir, cfg_.model, stepper_->tables(), opts,
                             stepper_->state_tables(), /*verify=*/false);
    if (root_) spdlog::info("resumed from {} at step {}", resume_dir, state_.step);
  }
  for (Optimizer* opt : opts) opt->take_master_slices();  // ZeRO-1, bf16: the weights are final
  if (state_.step >= tc_.steps && root_)
    spdlog::warn("checkpoint is at step {} >= training.steps = {}: nothing to train", state_.step,
                 tc_.steps);
  last_checkpoint_ = resume_dir;
}

void Engine::open_metrics() {
  if (!root_) return;
  // A resumed run appends, after dropping the records of steps past its
  // checkpoint; so does a restarted one that resumed from nothing (its file
  // keeps the earlier restart records).
  const char* restart = std::getenv("ATTNRES_RESTART");
  const bool restarted = restart && *restart;
  fs::create_directories(cfg_.run.dir);
  metrics_ = std::make_unique<MetricsWriter>((fs::path(cfg_.run.dir) / "metrics.jsonl").string(),
                                             state_.step > 0 || restarted, state_.step);
  if (cfg_.run.depth_stats_every > 0)
    depth_log_ = std::make_unique<MetricsWriter>(depth_stats_path(cfg_), state_.step > 0,
                                                 state_.step);
  // Started again by `attnres supervise` (tools/cmd_supervise.cpp): the
  // restart in the run's record, with the step it resumed from.
  if (restarted) {
    json r;
    try {
      r = json::parse(restart);
    } catch (const json::exception&) {
      r = {{"reason", restart}};
    }
    if (!r.is_object()) r = {{"reason", restart}};
    r["step"] = state_.step;
    r["event"] = "restart";
    r["resumed_from"] = last_checkpoint_;
    metrics_->write(r);
    spdlog::warn("restart {} ({}): resumed from {}", r.value("restart", 0),
                 r.value("reason", std::string("?")),
                 last_checkpoint_.empty() ? "nothing (fresh)" : last_checkpoint_);
  }
}

parallel::StepStats Engine::step(int64_t k, double grad_scale, bool graph) {
  const int64_t D = grid_.D();
  return stepper_->forward_backward(static_cast<int>(A_), [&](int mb) {
    return train_data_.unit((k * A_ + mb) * D + replica_);  // docs/model.md section 5
  }, grad_scale, graph);
}

Engine::SaveParts Engine::save_parts() {
  const bool sharded = cfg_.checkpoint.sharded;
  const int P = grid_.P(), D = grid_.D(), stage = grid_.stage(), replica = grid_.replica();
  const int EP = grid_.EP();
  // What this rank writes: sharded (the default), replica 0 of every stage
  // the weights and moments of the parameters its chunks own (a tied
  // embedding's copy in the last chunk belongs to chunk 0) as its own files,
  // and with expert parallelism the other members of replica 0's expert
  // group those of their routed experts; with ZeRO-1 every replica the
  // slices of the moments (and of a bf16 run's fp32 masters) it owns
  // instead, so no rank holds another's. Gathered (checkpoint.sharded =
  // false): those ranks hand the same parts to rank 0.
  auto writes_whole = [&](const model::Param& p) {
    return replica == 0 || (p.expert >= 0 && replica < EP);
  };
  SaveParts s;
  SavePart& weights = s.weights;
  SavePart& moments = s.moments;
  auto& rm = rt().model();
  const auto owned = rm.owned_params();
  const auto& opts = stepper_->optimizers();
  const bool zero = opts[0]->sharded(), masters = !opts[0]->master_slices().empty();
  if (sharded) {
    const int whole = replica < EP ? stage * EP + replica : -1;
    weights.index = masters ? stage * D + replica : whole;
    weights.count = masters ? P * D : P * EP;
    moments.index = zero ? stage * D + replica : whole;
    moments.count = zero ? P * D : P * EP;
  } else {
    weights.index = moments.index = root_ ? 0 : -1;
  }
  // A slice i of parameter `param` (flat, offset lo), or the whole tensor.
  auto add = [&](SavePart& part, const std::string& name, const Tensor& t, const model::Param& param,
                 const parallel::ZeroShard* shard, size_t i) {
    if (sharded && part.index < 0) return;  // another replica writes it
    if (!shard) {
      if (writes_whole(param)) part.tensors.push_back({name, t});
      return;
    }
    const parallel::OwnedRange r = shard->owned()[i];
    if (r.size() == 0) return;
    const std::string stored = name + "@" + std::to_string(r.lo);
    part.tensors.push_back({stored, t});
    part.slices[stored] = {name, r.lo, param.value.shape()};
  };
  for (int v = 0; v < rm.size(); ++v) {
    const auto& all = rm.chunk(v).params().all();
    const Optimizer& opt = *opts[static_cast<size_t>(v)];
    auto state = opt.state_tensors();
    const auto& mine = owned[static_cast<size_t>(v)];
    std::vector<Tensor> master = opt.master_slices();
    const parallel::ZeroShard* shard = sharded ? opt.zero_shard() : nullptr;
    if (!sharded && opt.sharded()) {
      // Gathered: the whole moments and masters, assembled in host memory, a
      // replica's slice at a time on the device (collective).
      if (!master.empty()) master = rt().gather_owned_to_host(v, master);
      const size_t n = all.size();
      for (size_t half : {size_t{0}, n}) {
        std::vector<Tensor> parts;
        for (size_t i = 0; i < n; ++i) parts.push_back(state[half + i].tensor);
        const auto whole = rt().gather_owned_to_host(v, parts);
        for (size_t i = 0; i < n; ++i)  // (a Muon matrix has no second moment)
          if (state[half + i].tensor.defined()) state[half + i].tensor = whole[i];
      }
    }
    for (size_t i = 0; i < all.size(); ++i) {
      if (std::find(mine.begin(), mine.end(), &all[i]) == mine.end()) continue;
      if (master.empty())
        add(weights, all[i].name, all[i].weights(), all[i], nullptr, i);
      else
        add(weights, all[i].name, master[i], all[i], shard, i);
      add(moments, state[i].name, state[i].tensor, all[i], shard, i);
      if (state[all.size() + i].tensor.defined())  // none for a Muon matrix
        add(moments, state[all.size() + i].name, state[all.size() + i].tensor, all[i], shard, i);
    }
    // The model state (the MoE routers' biases) is whole and the same on
    // every replica: replica 0 writes it, with the weights.
    if (replica == 0 && (!sharded || weights.index >= 0))
      for (const model::Param& p : rm.chunk(v).state().all()) weights.tensors.push_back({p.name, p.value});
  }
  return s;
}

void Engine::checkpoint() {
  if (cfg_.checkpoint.dir.empty()) return;
  // The previous save first (its wait counts as its stall): its staging
  // buffers then serve this one, so there is never more than one copy.
  if (saver_.in_flight()) finish_saves(/*wait=*/true);
  const auto t0 = Clock::now();
  CheckpointSaver::Prepared prepared;
  prepared.resident_mib = rss_mib();
  reset_peak_rss();
  const bool sharded = cfg_.checkpoint.sharded, async = cfg_.checkpoint.async;
  auto [weights, moments] = save_parts();
  // A background save must not see training change what it writes: it gets
  // host copies (the staging copy). Host tensors are copied by the save's own
  // thread, while the next step's forward and backward run (they only read
  // the weights); the update waits for the copies (wait_staged). Device
  // tensors are copied here. A synchronous save writes the tensors as they
  // are (device tensors copied to the host). Ranks that write nothing copy
  // nothing.
  for (SavePart* part : {&weights, &moments}) {
    const bool writes = part->index >= 0, deferred = async && writes && sharded;
    if (deferred) part->sources.assign(part->tensors.size(), Tensor());
    for (size_t i = 0; i < part->tensors.size(); ++i) {
      Tensor& t = part->tensors[i].tensor;
      if (deferred && t.is_cpu()) {
        part->sources[i] = t;
        t = saver_.staging_buffer(t);
      } else {
        t = async && writes ? saver_.staging_copy(t) : t.is_cpu() ? t : t.to(Device::CPU);
      }
    }
  }
  // Sharded, every tensor written is this rank's staging copy (when async);
  // gathered, rank 0 also holds what the others sent.
  weights.staged = moments.staged = async && sharded;
  if (!sharded) {
    weights.tensors = rt().gather_to_root(weights.tensors);
    moments.tensors = rt().gather_to_root(moments.tensors);
  }
  if (weights.index < 0) weights.tensors.clear();
  if (moments.index < 0) moments.tensors.clear();
  // The single process's order (slices after their tensor's place), the
  // deferred sources kept beside their buffers.
  auto in_order = [&](SavePart& part) {
    auto key = [&](size_t i) {
      const NamedTensor& t = part.tensors[i];
      auto it = part.slices.find(t.name);
      return std::make_pair(ckpt_order_.at(it == part.slices.end() ? t.name : it->second.tensor),
                            it == part.slices.end() ? 0 : it->second.offset);
    };
    std::vector<size_t> order(part.tensors.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
    std::vector<NamedTensor> tensors;
    std::vector<Tensor> sources;
    for (size_t i : order) {
      tensors.push_back(std::move(part.tensors[i]));
      if (!part.sources.empty()) sources.push_back(std::move(part.sources[i]));
    }
    part.tensors = std::move(tensors);
    part.sources = std::move(sources);
  };
  in_order(weights);
  in_order(moments);
  const int64_t opt_steps = stepper_->optimizers()[0]->steps_taken();
  prepared.sec = std::chrono::duration<double>(Clock::now() - t0).count();
  if (auto r = saver_.start(std::move(weights), std::move(moments), opt_steps, state_, prepared))
    saved(*r);
}

void Engine::finish_saves(bool wait) {
  if (auto r = wait ? saver_.wait() : saver_.poll()) saved(*r);
}

void Engine::saved(const SaveRecord& r) {
  last_checkpoint_ = r.dir;
  if (!root_) return;
  metrics_->write({{"step", r.step},
                   {"event", "checkpoint"},
                   {"dir", r.dir},
                   {"stall_sec", r.stall_sec},
                   {"write_sec", r.write_sec},
                   {"bytes", r.bytes},
                   {"resident_mib", r.resident_mib},
                   {"peak_rss_mib", r.peak_rss_mib},
                   {"rank_peak_rss_mib", r.rank_peak_rss_mib}});
  spdlog::info("checkpoint written: {} ({}, {:.1f} MB; training stopped {:.2f} s of the {:.2f} s "
               "to durable files; peak RSS {:.1f} MiB, {:.1f} before)",
               r.dir,
               !cfg_.checkpoint.sharded ? "gathered at rank 0"
               : grid_.P() > 1         ? fmt::format("{} shards", grid_.P())
                                       : std::string("one file"),
               static_cast<double>(r.bytes) * 1e-6, r.stall_sec, r.write_sec, r.peak_rss_mib,
               r.resident_mib);
}

void Engine::evaluate() {
  rt().trim_device_memory();  // beside a CUDA graph: not both sets of activations at once
  for (const auto& r : tasks_.evaluate(rt()))
    if (root_) {
      metrics_->write(TaskEvaluator::record(state_.step, r));
      spdlog::info("{}", TaskEvaluator::progress(state_.step, r));
    }
  if (val_data_) evaluate_val_loss();
  rt().trim_device_memory();
}

void Engine::evaluate_val_loss() {
  const int64_t D = grid_.D();
  const int64_t n = std::min(cfg_.eval.batches, val_data_->units_per_epoch());
  const int M = static_cast<int>(n > replica_ ? (n - replica_ + D - 1) / D : 0);
  const double sum =
      rt().eval_loss_sum(M, [&](int mb) { return val_data_->unit((replica_ + int64_t(mb) * D) % n); });
  const double loss = sum / static_cast<double>(n * B_ * T_);
  if (root_) {
    metrics_->write({{"step", state_.step}, {"val_loss", loss}});
    spdlog::info("step {:>6} | val loss {:.6f} ({} tokens)", state_.step, loss, n * B_ * T_);
  }
}

bool Engine::depth_stats_due(int64_t k) const {
  // Depth statistics on every depth_stats_every-th step and the last one.
  const int64_t every = cfg_.run.depth_stats_every;
  return every > 0 && ((k + 1) % every == 0 || k + 1 == tc_.steps);
}

void Engine::attach_depth_stats(bool attach) {
  // Every rank fills the sublayers of its chunks (zeros elsewhere) over its
  // replica's microbatches; summing over all ranks gives the single
  // process's numbers for the global batch.
  if (attach) depth_stats_.reset(cfg_.model.n_sublayers());
  auto& rm = rt().model();
  for (int v = 0; v < rm.size(); ++v) rm.chunk(v).set_depth_stats(attach ? &depth_stats_ : nullptr);
}

void Engine::attach_moe_stats(bool attach) {
  // As depth statistics: every rank routes its own layers' tokens, summed
  // over the job after the step (finish_moe_step).
  if (attach) moe_stats_.reset(cfg_.model.n_layers, cfg_.model.moe.experts);
  auto& rm = rt().model();
  for (int v = 0; v < rm.size(); ++v) rm.chunk(v).set_moe_stats(attach ? &moe_stats_ : nullptr);
}

void Engine::write_depth_stats(int64_t step) {
  for (auto* part : {&depth_stats_.output_sumsq, &depth_stats_.output_count,
                     &depth_stats_.grad_sumsq, &depth_stats_.grad_count})
    grid_.world().allreduce_sum(part->data(), static_cast<int>(part->size()));
  if (root_) depth_log_->write(depth_stats_record(step, depth_stats_));
}

void Engine::log_step(int64_t first_step, double loss, double lr, double norm, double dt,
                      double elapsed, const parallel::StepStats& st, const MoeStepReport* moe) {
  const int64_t tokens_per_step = A_ * B_ * T_ * grid_.D();
  const double tok_s = tokens_per_step / dt;
  // Model FLOP/s (6N + attention) against the peak of all the job's devices.
  const double achieved = tok_s * model::training_flops_per_token(cfg_.model, T_);
  const double peak = dev_.peak_flops * grid_.P() * grid_.D();
  const bool mfu = dev_.on_gpu && peak > 0;
  const bool pipeline = !grid_.world().is_solo();  // pp_bytes and bubble mean something
  json row = {{"step", state_.step}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
              {"tokens", state_.tokens}, {"tokens_per_sec", tok_s}, {"elapsed_sec", elapsed}};
  if (pipeline) {
    row["pp_bytes"] = st.pp_bytes;
    if (st.bubble) row["bubble"] = *st.bubble;  // not measured in a CUDA graph with peers
  }
  if (mfu) row["mfu"] = achieved / peak;
  if (moe) row.update(moe->fields);
  metrics_->write(row);
  if (state_.step == first_step + 1)
    spdlog::info("memory per rank (largest): {:.3f} MiB resident in tensors (weights, gradients, "
                 "optimizer state) + {:.3f} MiB step high-water (activations, messages; "
                 "training.recompute = {})", st.resident_bytes / 1048576.0,
                 st.peak_step_bytes / 1048576.0, model::recompute_name(tc_.recompute));
  if (state_.step == first_step + 1 && st.resident_by_rank.size() > 1) {
    std::string by_rank;
    for (size_t r = 0; r < st.resident_by_rank.size(); ++r)
      by_rank += fmt::format("{}rank {} (stage {}, replica {}) {:.3f} MiB", r ? " | " : "", r,
                             r % static_cast<size_t>(grid_.P()), r / static_cast<size_t>(grid_.P()),
                             st.resident_by_rank[r] / 1048576.0);
    spdlog::info("resident memory by rank: {}", by_rank);
  }
  if (state_.step % cfg_.run.log_every == 0 || state_.step == tc_.steps ||
      state_.step == first_step + 1) {
    const double avg = elapsed / static_cast<double>(state_.step - first_step);
    const std::string rate = mfu ? fmt::format("{:.1f} TFLOP/s | MFU {:.1f}%", achieved * 1e-12,
                                               100 * achieved / peak)
                                 : fmt::format("{:.1f} GFLOP/s", achieved * 1e-9);
    const std::string pipe = !pipeline ? ""
                                       : fmt::format(" | bubble {} | pp {:.1f} MB",
                                                     st.bubble ? fmt::format("{:.2f}", *st.bubble)
                                                               : std::string("n/a (CUDA graph)"),
                                                     st.pp_bytes * 1e-6);
    spdlog::info("step {:>6}/{} | loss {:.6f} | lr {:.3e} | grad norm {:.4f} | {:.0f} tok/s | "
                 "{}{}{} | ETA {}", state_.step, tc_.steps, loss, lr, norm, tok_s, rate, pipe,
                 moe ? moe->line : std::string(), format_duration(avg * (tc_.steps - state_.step)));
  }
}

int Engine::run() {
  const auto& ck = cfg_.checkpoint;
  // The staging buffers made beside the start-up, in the pool before the
  // first step (so that the step's memory high-water does not see them).
  const auto t_ready = Clock::now();
  if (const int64_t bytes = saver_.staging_ready(); bytes > 0 && root_)
    spdlog::info("checkpoint.async: staging buffers for rank 0's saves ({:.3f} MB) made and touched "
                 "beside the start-up (waited {:.2f} s for them)", bytes * 1e-6,
                 std::chrono::duration<double>(Clock::now() - t_ready).count());
  if (ck.save_initial && state_.step == 0) checkpoint();
  StopSignals signals;
  const int64_t tokens_per_step = A_ * B_ * T_ * grid_.D();
  const double grad_scale = 1.0 / static_cast<double>(tokens_per_step);
  const auto t_start = Clock::now();
  const int64_t first_step = state_.step;
  while (state_.step < tc_.steps) {
    const auto t0 = Clock::now();
    const int64_t k = state_.step;
    const bool depth_stats = depth_stats_due(k), moe = cfg_.model.has_moe();
    if (depth_stats) attach_depth_stats(true);
    if (moe) attach_moe_stats(true);
    const parallel::StepStats st = step(k, grad_scale, /*graph=*/!depth_stats);
    if (depth_stats) attach_depth_stats(false);
    if (moe) attach_moe_stats(false);
    const double loss = st.loss_sum * grad_scale;
    const double norm = stepper_->grad_norm();
    if (!std::isfinite(loss) || !std::isfinite(norm)) {  // global values: every rank stops
      finish_saves(/*wait=*/true);  // the last good checkpoint, published
      spdlog::error("step {}: non-finite {} (loss {}, grad norm {}); stopping without an update. "
                    "Last good checkpoint: {}", k + 1, std::isfinite(loss) ? "gradient" : "loss",
                    loss, norm, last_checkpoint_.empty() ? "none" : last_checkpoint_);
      return kExitNonFinite;
    }
    const double lr = learning_rate(cfg_.schedule, cfg_.optimizer.lr, k, tc_.steps);
    saver_.wait_staged();  // a background save's copies of what the update changes
    stepper_->update(lr, norm);
    std::optional<MoeStepReport> moe_report;
    if (moe) {  // the step's routing over the job, and the routers' balancing
      std::vector<model::Model*> chunks;
      for (int v = 0; v < rt().model().size(); ++v) chunks.push_back(&rt().model().chunk(v));
      moe_report = finish_moe_step(moe_stats_, chunks, cfg_.model, grid_.world());
    }
    state_.step = k + 1;
    state_.tokens += tokens_per_step;
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
    if (root_) log_step(first_step, loss, lr, norm, dt, elapsed, st, moe_report ? &*moe_report : nullptr);
    if (depth_stats) write_depth_stats(state_.step);
    const bool last = state_.step == tc_.steps;
    const bool saved = last || (ck.every > 0 && state_.step % ck.every == 0);
    if (cfg_.eval.every > 0 && (state_.step % cfg_.eval.every == 0 || last)) evaluate();
    if (saved) checkpoint();
    finish_saves(/*wait=*/false);  // a background save: published once every rank has written
    if (cfg_.run.stop_after > 0 && state_.step - first_step >= cfg_.run.stop_after && !last) {
      if (root_)
        spdlog::info("run.stop_after = {}: stopping at step {}", cfg_.run.stop_after, state_.step);
      if (!saved) checkpoint();
      finish_saves(/*wait=*/true);
      return 0;
    }
    // A signal may reach only some ranks: stop when any rank got one.
    if (const int sig = static_cast<int>(rt().max(signals.pending()))) {
      if (root_)
        spdlog::warn("received {}: stopping after step {}", sig == SIGINT ? "SIGINT" : "SIGTERM",
                     state_.step);
      if (!saved) checkpoint();
      finish_saves(/*wait=*/true);
      if (ck.dir.empty() && root_) spdlog::warn("checkpoint.dir is not set: nothing was saved");
      return 128 + sig;
    }
  }
  if (cfg_.eval.every == 0 && state_.step > first_step) evaluate();
  finish_saves(/*wait=*/true);  // the end of training waits for the save in flight
  return 0;
}

// Under mpirun: every rank runs the engine; any exception ends the whole job
// (MpiSession::abort), since the other ranks may be blocked on this one.
int train_under_mpi(const Config& cfg) {
  // One GPU per process, chosen before MPI_Init where the launcher says the
  // local rank (a CUDA-aware MPI may initialise CUDA inside it).
  const bool cuda = cfg.training.device == Device::CUDA;
  const int chosen = cuda ? parallel::pin_gpu_before_mpi(
                                /*nccl=*/cfg.parallel.transport != TransportKind::Mpi)
                          : -1;
  parallel::MpiSession mpi;
  init_logging(mpi.world_rank());
  try {
    const std::string threads = parallel::share_node_cores(mpi.local_size());
    if (mpi.world_rank() == 0 && !cuda) log_cpu_setup(threads);
    const parallel::GpuPin gpu = cuda ? parallel::pin_gpu(mpi, chosen) : parallel::GpuPin{};
    const parallel::Comm world = parallel::Comm::world();
    const int rc = Engine(cfg, world, gpu).run();
    // Nobody leaves while a peer may still need it (e.g. rank 0 still writing).
    world.barrier();
    return rc;
  } catch (const InternalError& e) {
    parallel::MpiSession::abort(1, std::string("internal error: ") + e.what());
  } catch (const Error& e) {
    parallel::MpiSession::abort(2, e.what());
  } catch (const std::exception& e) {
    parallel::MpiSession::abort(1, e.what());
  }
}

}  // namespace

int train(const Config& cfg) {
  const int64_t world = cfg.parallel.pipeline * cfg.parallel.data;
  const int launched = parallel::launcher_world_size();
  if (world > 1 && launched == 1)
    fail("config keys parallel.pipeline * parallel.data = ", cfg.parallel.pipeline, " * ",
         cfg.parallel.data, " = ", world, " processes: start the job with mpirun -np ", world,
         " (it was started as a single process)");
  if (launched > 1) return train_under_mpi(cfg);
  // One process: the same engine, on a communicator of its own (no MPI).
  if (cfg.training.device == Device::CPU)
    log_cpu_setup(std::to_string(omp_get_max_threads()) + " OpenMP threads");
  const parallel::Comm solo = parallel::Comm::solo();
  return Engine(cfg, solo, parallel::GpuPin{}).run();
}

}  // namespace attnres::train
