#include "train/trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <algorithm>
#include <filesystem>
#include <functional>
#include <unordered_map>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "data/shard.h"
#include "kernels/cpu/blas.h"
#include "model/flops.h"
#include "parallel/mpi.h"
#include "parallel/nccl_transport.h"
#include "parallel/runtime.h"
#include "train/checkpoint.h"
#include "train/checkpoint_io.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/lr_schedule.h"

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

std::string fmt_duration(double sec) {
  if (!std::isfinite(sec) || sec < 0) return "?";
  auto s = static_cast<int64_t>(sec + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(s / 3600), (long long)(s / 60 % 60));
  else std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  return buf;
}

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
DeviceChoice choose_device(const TrainingConfig& tc) {
  DeviceChoice c;
  c.on_gpu = tc.device == Device::CUDA;
  c.device = tc.device;
  c.dtype = tc.precision;
  c.peak_flops = tc.peak_tflops * 1e12;
  if (c.on_gpu && c.peak_flops == 0 && cuda::device_count() > 0)
    c.peak_flops = cuda::peak_dense_flops(0, c.dtype == DType::BF16);
  return c;
}

// The CPU's threads and BLAS, for the start-up log of a CPU run.
void log_cpu_setup(const std::string& threads) {
  spdlog::info("cpu: {}; BLAS: {}", threads, kernels::cpu::blas_description());
  if (const std::string w = kernels::cpu::blas_warning(); !w.empty()) spdlog::warn("{}", w);
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

// What the training loop needs from whoever runs the model: the single process
// and the pipeline / data-parallel runtime differ only in these.
struct StepStats {
  double loss_sum = 0;   // summed token loss of the step's microbatches (all replicas)
  int64_t pp_bytes = -1; // pipeline bytes sent this step, all ranks (-1: no pipeline)
  double bubble = 0;     // measured pipeline bubble fraction
};
struct LoopHooks {
  std::function<StepStats(int64_t step, double grad_scale)> forward_backward;
  std::function<double()> grad_norm;                 // global L2 norm of the gradients
  std::function<void(double lr, double norm)> update;
  std::function<void()> checkpoint;                  // collective under mpirun
  std::function<void()> evaluate;                    // collective under mpirun
  std::function<int()> pending_signal;               // a signal any rank received, or 0
  MetricsWriter* metrics = nullptr;                  // rank 0 only: also prints progress
  const std::string* last_checkpoint = nullptr;
  // Depth statistics (set only when run.depth_stats_every > 0): attach (true)
  // or detach (false) the stats sink of this rank's model around one step's
  // forward-backward, then write the step's record (collective under mpirun).
  std::function<void(bool attach)> depth_stats_attach;
  std::function<void(int64_t step)> depth_stats_write;
};

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

// The optimizer-step loop (docs/model.md sections 4-6), written once for every
// layout: learning rate, update, metrics, progress, evaluation, checkpoints,
// non-finite values, run.stop_after and signals.
int run_loop(const Config& cfg, TrainState& state, double peak_flops, const LoopHooks& h) {
  const auto& tc = cfg.training;
  const auto& ck = cfg.checkpoint;
  const bool root = h.metrics != nullptr;
  const int64_t tokens_per_step =
      tc.grad_accum * tc.micro_batch_size * tc.seq_len * cfg.parallel.data;
  const double grad_scale = 1.0 / static_cast<double>(tokens_per_step);
  const double flops_per_token = model::training_flops_per_token(cfg.model, tc.seq_len);
  const bool on_gpu = tc.device == Device::CUDA;
  const auto t_start = Clock::now();
  const int64_t first_step = state.step;
  while (state.step < tc.steps) {
    const auto t0 = Clock::now();
    const int64_t k = state.step;
    // Depth statistics on every depth_stats_every-th step and the last one.
    const int64_t every = cfg.run.depth_stats_every;
    const bool depth_stats = h.depth_stats_write && every > 0 &&
                             ((k + 1) % every == 0 || k + 1 == tc.steps);
    if (depth_stats) h.depth_stats_attach(true);
    const StepStats st = h.forward_backward(k, grad_scale);
    if (depth_stats) h.depth_stats_attach(false);
    const double loss = st.loss_sum * grad_scale;
    const double norm = h.grad_norm();
    if (!std::isfinite(loss) || !std::isfinite(norm)) {  // global values: every rank stops
      spdlog::error("step {}: non-finite {} (loss {}, grad norm {}); stopping without an update. "
                    "Last good checkpoint: {}", k + 1, std::isfinite(loss) ? "gradient" : "loss",
                    loss, norm, h.last_checkpoint->empty() ? "none" : *h.last_checkpoint);
      return kExitNonFinite;
    }
    const double lr = learning_rate(cfg.schedule, cfg.optimizer.lr, k, tc.steps);
    h.update(lr, norm);
    state.step = k + 1;
    state.tokens += tokens_per_step;

    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
    const double tok_s = tokens_per_step / dt;
    const double achieved = tok_s * flops_per_token;  // model FLOP/s (6N + attention)
    if (root) {
      json row = {{"step", state.step}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                  {"tokens", state.tokens}, {"tokens_per_sec", tok_s}, {"elapsed_sec", elapsed}};
      if (st.pp_bytes >= 0) {
        row["pp_bytes"] = st.pp_bytes;
        row["bubble"] = st.bubble;
      }
      if (on_gpu && peak_flops > 0) row["mfu"] = achieved / peak_flops;
      h.metrics->write(row);
      if (state.step % cfg.run.log_every == 0 || state.step == tc.steps ||
          state.step == first_step + 1) {
        const double avg = elapsed / static_cast<double>(state.step - first_step);
        const std::string rate = on_gpu && peak_flops > 0
                                     ? fmt::format("{:.1f} TFLOP/s | MFU {:.1f}%",
                                                   achieved * 1e-12, 100 * achieved / peak_flops)
                                     : fmt::format("{:.1f} GFLOP/s", achieved * 1e-9);
        const std::string pipe = st.pp_bytes < 0 ? ""
                                     : fmt::format(" | bubble {:.2f} | pp {:.1f} MB", st.bubble,
                                                   st.pp_bytes * 1e-6);
        spdlog::info("step {:>6}/{} | loss {:.6f} | lr {:.3e} | grad norm {:.4f} | {:.0f} tok/s | "
                     "{}{} | ETA {}", state.step, tc.steps, loss, lr, norm, tok_s, rate, pipe,
                     fmt_duration(avg * (tc.steps - state.step)));
      }
    }
    if (depth_stats) h.depth_stats_write(state.step);
    const bool last = state.step == tc.steps;
    const bool saved = last || (ck.every > 0 && state.step % ck.every == 0);
    if (cfg.eval.every > 0 && (state.step % cfg.eval.every == 0 || last)) h.evaluate();
    if (saved) h.checkpoint();
    if (cfg.run.stop_after > 0 && state.step - first_step >= cfg.run.stop_after && !last) {
      if (root) spdlog::info("run.stop_after = {}: stopping at step {}", cfg.run.stop_after, state.step);
      if (!saved) h.checkpoint();
      return 0;
    }
    if (const int sig = h.pending_signal()) {
      if (root)
        spdlog::warn("received {}: stopping after step {}", sig == SIGINT ? "SIGINT" : "SIGTERM",
                     state.step);
      if (!saved) h.checkpoint();
      if (ck.dir.empty() && root) spdlog::warn("checkpoint.dir is not set: nothing was saved");
      return 128 + sig;
    }
  }
  if (cfg.eval.every == 0 && state.step > first_step) h.evaluate();
  return 0;
}

}  // namespace

std::pair<double, int64_t> evaluate(model::Model& model, data::TokenLoader& loader, int64_t batches,
                                    int64_t B, int64_t T) {
  const int64_t n = std::min(batches, loader.units_per_epoch());
  double sum = 0;
  for (int64_t u = 0; u < n; ++u) {
    auto batch = loader.unit(u);
    sum += model.forward_loss(batch.inputs, batch.targets, B, T);
  }
  const int64_t tokens = n * B * T;
  return {sum / static_cast<double>(tokens), tokens};
}

namespace {

// ---------------------------------------------------------------------------
// The same loop under mpirun: P pipeline stages x D data-parallel replicas
// (docs/parallel.md). Every rank runs this function; rank 0 (stage 0 of
// replica 0) prints progress, writes metrics.jsonl and the checkpoints.
// Every decision that ends or branches the loop (non-finite values, signals,
// stop_after) is taken from globally reduced values, so all ranks take it
// together; any exception ends the whole job (MpiSession::abort).
// ---------------------------------------------------------------------------

// Checkpoint tensors travel to rank 0 tagged with their sort key, so rank 0
// can write them in the single-process order whatever the layout:
// "<kind>:<chunk, 6 digits>:<position, 9 digits>|<name>" with kind 0 =
// weights, 1 = exp_avg, 2 = exp_avg_sq.
std::string ckpt_key(int kind, int chunk, size_t pos, const std::string& name) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%d:%06d:%09zu|", kind, chunk, pos);
  return buf + name;
}

int train_parallel_impl(const Config& cfg, const parallel::MpiSession& mpi) {
  const auto& tc = cfg.training;
  const int64_t B = tc.micro_batch_size, T = tc.seq_len, A = tc.grad_accum;
  const int P = static_cast<int>(cfg.parallel.pipeline), D = static_cast<int>(cfg.parallel.data);
  const bool on_gpu = tc.device == Device::CUDA;
  // One GPU per process; before anything touches CUDA.
  const std::string gpu = on_gpu ? parallel::pin_local_gpu(mpi.local_rank(), mpi.local_size()) : "";

  const parallel::Comm world = parallel::Comm::world();
  const parallel::ProcessGrid grid(world, P, D);
  const bool root = grid.rank() == 0;
  const int64_t d = grid.replica();
  if (root) spdlog::info("resolved config: {}", cfg.to_json().dump());

  // ---- data (every rank validates the same shards) ----
  data::TokenLoader train_data = open_train_data(cfg);
  const std::unique_ptr<data::TokenLoader> val_data = open_val_data(cfg);

  // ---- device, transport, this rank's chunks, optimizers ----
  if (on_gpu && cuda::device_count() == 0)
    fail("config key training.device is \"cuda\" but no CUDA device is visible to rank ",
         grid.rank(), gpu.empty() ? "" : " (CUDA_VISIBLE_DEVICES=" + gpu + ")");
  const DeviceChoice dev = choose_device(tc);
  parallel::RuntimeOptions ro;
  ro.V = static_cast<int>(cfg.parallel.virtual_stages);
  ro.cache_blocks = cfg.parallel.cache_blocks;
  ro.transport = cfg.parallel.transport;
  if (ro.transport == TransportKind::Auto)
    ro.transport = on_gpu && parallel::nccl_compiled() ? TransportKind::Nccl : TransportKind::Mpi;
  parallel::Runtime rt(grid, cfg.model, dev.dtype, dev.device, ro, B, T);
  auto& rm = rt.model();
  std::vector<model::ParamTable*> tables;
  std::vector<std::unique_ptr<AdamW>> opts;
  std::vector<AdamW*> opt_ptrs;
  for (int v = 0; v < rm.size(); ++v) {
    model::ParamTable& t = rm.chunk(v).params();
    if (cfg.model.init_from.empty()) t.init(tc.seed);
    else load_weights(cfg.model.init_from, t);
    tables.push_back(&t);
    opts.push_back(std::make_unique<AdamW>(t, cfg.optimizer));
    opt_ptrs.push_back(opts.back().get());
  }
  {
    int64_t n = 0;
    for (const auto& chunk : rm.owned_params())
      for (const model::Param* p : chunk) n += p->value.numel();
    world.allreduce_sum(&n, 1);
    n /= D;  // every replica holds the whole model
    std::string chunks;
    for (int v = 0; v < rm.size(); ++v) {
      const auto lr = rt.layout().layers(rm.chunk_id(v));
      chunks += fmt::format("{}chunk {} = layers [{}, {})", v ? ", " : "", rm.chunk_id(v), lr.begin, lr.end);
    }
    spdlog::info("model: {} parameters ({} residual, {} layers, d={}), {} tokens per step", n,
                 model::residual_mode_name(cfg.model.mode), cfg.model.n_layers, cfg.model.d_model,
                 A * B * T * D);
    spdlog::info("parallel: {} pipeline stages x {} virtual x {} replicas, {} transport, "
                 "cache_blocks {}; rank = replica * {} + stage", P, ro.V, D, transport_name(ro.transport),
                 cfg.parallel.cache_blocks, P);
    spdlog::info("rank {} = stage {} of replica {}: {}", grid.rank(), grid.stage(), d, chunks);
  }

  // ---- resume: rank 0 picks the checkpoint, every rank loads its part ----
  TrainState state;
  const auto& ck = cfg.checkpoint;
  std::string resume_dir;
  if (root) {
    resume_dir = choose_resume_dir(ck);
    if (!resume_dir.empty()) verify_checkpoint(resume_dir);
  }
  world.bcast(resume_dir, 0);
  if (!resume_dir.empty()) {
    // Checkpoints hold global tensor names: any layout loads any checkpoint.
    state = load_checkpoint(resume_dir, cfg.model, tables, opt_ptrs, /*verify=*/false);
    spdlog::info("resumed from {} at step {}", resume_dir, state.step);
  }
  if (state.step >= tc.steps)
    spdlog::warn("checkpoint is at step {} >= training.steps = {}: nothing to train", state.step,
                 tc.steps);

  std::unique_ptr<MetricsWriter> metrics;
  if (root) {
    fs::create_directories(cfg.run.dir);
    metrics = std::make_unique<MetricsWriter>((fs::path(cfg.run.dir) / "metrics.jsonl").string(),
                                              state.step > 0);
  }
  std::string last_checkpoint = resume_dir;
  auto checkpoint = [&]() {  // collective
    if (ck.dir.empty()) return;
    std::vector<NamedTensor> mine;
    const auto owned = rm.owned_params();
    for (int v = 0; v < rm.size(); ++v) {
      const int c = rm.chunk_id(v);
      for (size_t i = 0; i < owned[v].size(); ++i)
        mine.push_back({ckpt_key(0, c, i, owned[v][i]->name), owned[v][i]->weights()});
      // AdamW's moments, of the owned parameters only.
      std::unordered_map<std::string, size_t> pos;
      for (size_t i = 0; i < owned[v].size(); ++i) pos[owned[v][i]->name] = i;
      for (auto& t : opts[v]->state_tensors()) {
        const bool first = t.name.rfind("exp_avg.", 0) == 0;
        const std::string param = t.name.substr(first ? 8 : 11);
        auto it = pos.find(param);
        if (it != pos.end()) mine.push_back({ckpt_key(first ? 1 : 2, c, it->second, t.name), t.tensor});
      }
    }
    auto all = rt.gather_to_root(mine);
    std::string dir;
    if (root) {
      std::sort(all.begin(), all.end(),
                [](const NamedTensor& a, const NamedTensor& b) { return a.name < b.name; });
      std::vector<NamedTensor> weights, moments;
      for (auto& t : all) {
        const bool is_weight = t.name[0] == '0';
        t.name = t.name.substr(t.name.find('|') + 1);
        (is_weight ? weights : moments).push_back(std::move(t));
      }
      dir = save_checkpoint(cfg, weights, moments, opts[0]->steps_taken(), state);
      prune_checkpoints(ck.dir, static_cast<int>(ck.keep_last));
      spdlog::info("checkpoint written: {}", dir);
    }
    world.bcast(dir, 0);
    last_checkpoint = dir;
  };
  if (ck.save_initial && state.step == 0) checkpoint();

  auto run_eval = [&]() {  // collective: replica d evaluates units d, d+D, ...
    if (!val_data) return;
    const int64_t n = std::min(cfg.eval.batches, val_data->units_per_epoch());
    const int M = static_cast<int>(n > d ? (n - d + D - 1) / D : 0);
    const double sum = rt.eval_loss_sum(M, [&](int mb) { return val_data->unit(d + int64_t(mb) * D); });
    const double loss = sum / static_cast<double>(n * B * T);
    if (root) {
      metrics->write({{"step", state.step}, {"val_loss", loss}});
      spdlog::info("step {:>6} | val loss {:.6f} ({} tokens)", state.step, loss, n * B * T);
    }
  };

  // ---- the loop ----
  StopSignals signals;
  LoopHooks hooks;
  hooks.forward_backward = [&](int64_t k, double grad_scale) {
    const auto step = rt.train_step(static_cast<int>(A), [&](int mb) {
      return train_data.unit((k * A + mb) * D + d);  // docs/model.md section 5
    }, grad_scale);
    return StepStats{step.loss_sum, step.pp_bytes, step.bubble};
  };
  hooks.grad_norm = [&] { return rt.grad_norm(); };
  hooks.update = [&](double lr, double norm) {
    for (auto& opt : opts) opt->step(lr, norm);
  };
  hooks.checkpoint = checkpoint;
  hooks.evaluate = run_eval;
  // A signal may reach only some ranks: stop when any rank got one.
  hooks.pending_signal = [&] { return static_cast<int>(rt.max(signals.pending())); };
  hooks.metrics = metrics.get();
  hooks.last_checkpoint = &last_checkpoint;
  // Depth statistics: every rank fills the sublayers of its chunks (zeros
  // elsewhere) over its replica's microbatches; summing over all ranks gives
  // the single process's numbers for the global batch, written by rank 0.
  model::DepthStats depth_stats(cfg.model.n_sublayers());
  std::unique_ptr<MetricsWriter> depth_log;
  if (cfg.run.depth_stats_every > 0) {
    if (root) depth_log = std::make_unique<MetricsWriter>(depth_stats_path(cfg), state.step > 0);
    hooks.depth_stats_attach = [&](bool attach) {
      if (attach) depth_stats.reset(cfg.model.n_sublayers());
      for (int v = 0; v < rm.size(); ++v) rm.chunk(v).set_depth_stats(attach ? &depth_stats : nullptr);
    };
    hooks.depth_stats_write = [&](int64_t step) {
      for (auto* part : {&depth_stats.output_sumsq, &depth_stats.output_count,
                         &depth_stats.grad_sumsq, &depth_stats.grad_count})
        world.allreduce_sum(part->data(), static_cast<int>(part->size()));
      if (root) depth_log->write(depth_stats_record(step, depth_stats));
    };
  }
  return run_loop(cfg, state, dev.peak_flops * grid.P() * grid.D(), hooks);
}

int train_parallel(const Config& cfg) {
  parallel::MpiSession mpi;
  init_logging(mpi.world_rank());
  try {
    const std::string threads = parallel::share_node_cores(mpi.local_size());
    if (mpi.world_rank() == 0 && cfg.training.device == Device::CPU) log_cpu_setup(threads);
    const int rc = train_parallel_impl(cfg, mpi);
    // Nobody leaves while a peer may still need it (e.g. rank 0 still writing).
    parallel::Comm::world().barrier();
    return rc;
  } catch (const InternalError& e) {
    // The other ranks may be blocked on this one: end the whole job now.
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
  if (world > 1 || launched > 1) {
    if (launched == 1)
      fail("config keys parallel.pipeline * parallel.data = ", cfg.parallel.pipeline, " * ",
           cfg.parallel.data, " = ", world, " processes: start the job with mpirun -np ", world,
           " (it was started as a single process)");
    return train_parallel(cfg);
  }
  const auto& tc = cfg.training;
  const int64_t B = tc.micro_batch_size, T = tc.seq_len, A = tc.grad_accum;

  spdlog::info("resolved config: {}", cfg.to_json().dump());

  // ---- data (validated before any compute) ----
  data::TokenLoader train_data = open_train_data(cfg);
  const std::unique_ptr<data::TokenLoader> val_data = open_val_data(cfg);

  // ---- device + model + optimizer ----
  const DeviceChoice dev = choose_device(tc);
  if (!dev.on_gpu) log_cpu_setup(std::to_string(omp_get_max_threads()) + " OpenMP threads");
  if (dev.on_gpu) {
    if (cuda::device_count() == 0)
      fail("config key training.device is \"cuda\" but no CUDA device is visible (driver or GPU "
           "missing, or CUDA_VISIBLE_DEVICES hides them)");
    spdlog::info("device: {} ({}; peak {:.0f} TFLOP/s for MFU{})", cuda::device_description(0),
                 precision_name(tc.precision), dev.peak_flops * 1e-12,
                 dev.peak_flops == 0 ? ": unknown GPU, set training.peak_tflops" : "");
  }
  model::Model model(cfg.model, dev.dtype, {}, dev.device);
  if (cfg.model.init_from.empty()) {
    model.params().init(tc.seed);
  } else {
    load_weights(cfg.model.init_from, model.params());
    spdlog::info("initialised weights from {}", cfg.model.init_from);
  }
  AdamW opt(model.params(), cfg.optimizer);
  spdlog::info("model: {} parameters ({} residual, {} layers, d={}), {} tokens per step",
               model.params().numel(), model::residual_mode_name(cfg.model.mode),
               cfg.model.n_layers, cfg.model.d_model, A * B * T);

  // ---- resume ----
  TrainState state;
  const auto& ck = cfg.checkpoint;
  const std::string resume_dir = choose_resume_dir(ck);
  if (!resume_dir.empty()) {
    state = load_checkpoint(resume_dir, model, opt);
    spdlog::info("resumed from {} at step {}", resume_dir, state.step);
  }
  if (state.step >= tc.steps)
    spdlog::warn("checkpoint is at step {} >= training.steps = {}: nothing to train", state.step,
                 tc.steps);

  fs::create_directories(cfg.run.dir);
  MetricsWriter metrics((fs::path(cfg.run.dir) / "metrics.jsonl").string(), state.step > 0);
  std::string last_checkpoint = resume_dir;
  auto checkpoint = [&]() {
    if (ck.dir.empty()) return;
    last_checkpoint = save_checkpoint(cfg, model, opt, state);
    prune_checkpoints(ck.dir, static_cast<int>(ck.keep_last));
    spdlog::info("checkpoint written: {}", last_checkpoint);
  };
  if (ck.save_initial && state.step == 0) checkpoint();

  // ---- the loop ----
  StopSignals signals;
  LoopHooks hooks;
  hooks.forward_backward = [&](int64_t k, double grad_scale) {
    model.params().zero_grads();
    StepStats st;
    for (int64_t a = 0; a < A; ++a) {
      auto batch = train_data.unit(k * A + a);  // docs/model.md section 5 with D = 1
      st.loss_sum += model.forward_backward(batch.inputs, batch.targets, B, T, grad_scale);
    }
    return st;
  };
  hooks.grad_norm = [&] { return opt.grad_norm(); };
  hooks.update = [&](double lr, double norm) { opt.step(lr, norm); };
  hooks.checkpoint = checkpoint;
  hooks.evaluate = [&]() {
    if (!val_data) return;
    auto [loss, tokens] = evaluate(model, *val_data, cfg.eval.batches, B, T);
    metrics.write({{"step", state.step}, {"val_loss", loss}});
    spdlog::info("step {:>6} | val loss {:.6f} ({} tokens)", state.step, loss, tokens);
  };
  hooks.pending_signal = [&] { return signals.pending(); };
  hooks.metrics = &metrics;
  hooks.last_checkpoint = &last_checkpoint;
  model::DepthStats depth_stats(cfg.model.n_sublayers());
  std::unique_ptr<MetricsWriter> depth_log;
  if (cfg.run.depth_stats_every > 0) {
    depth_log = std::make_unique<MetricsWriter>(depth_stats_path(cfg), state.step > 0);
    hooks.depth_stats_attach = [&](bool attach) {
      if (attach) depth_stats.reset(cfg.model.n_sublayers());
      model.set_depth_stats(attach ? &depth_stats : nullptr);
    };
    hooks.depth_stats_write = [&](int64_t step) {
      depth_log->write(depth_stats_record(step, depth_stats));
    };
  }
  return run_loop(cfg, state, dev.peak_flops, hooks);
}

}  // namespace attnres::train
