#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "data/shard.h"
#include "model/flops.h"
#include "train/checkpoint.h"
#include "train/checkpoint_io.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/schedule.h"

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

int train(const Config& cfg) {
  const auto& tc = cfg.training;
  const int64_t B = tc.micro_batch_size, T = tc.seq_len, A = tc.grad_accum;
  const int64_t D = cfg.parallel.data, r = 0;  // data-parallel rank (single process: 0 of 1)
  if (cfg.parallel.pipeline * cfg.parallel.data != 1)
    fail("config keys parallel.pipeline / parallel.data: values > 1 need the parallel runtime, "
         "which this build does not have yet");

  spdlog::info("resolved config: {}", cfg.to_json().dump());

  // ---- data (validated before any compute) ----
  data::TokenLoader train_data(data::resolve_data_spec(cfg.data.train, "data.train"), B, T,
                               cfg.data.shuffle, tc.seed);
  std::unique_ptr<data::TokenLoader> val_data;
  if (!cfg.data.val.empty())
    val_data = std::make_unique<data::TokenLoader>(
        data::resolve_data_spec(cfg.data.val, "data.val"), B, T, false, tc.seed);

  // ---- device + model + optimizer ----
  const bool on_gpu = tc.device == "cuda";
  if (on_gpu && cuda::device_count() == 0)
    fail("config key training.device is \"cuda\" but no CUDA device is visible (driver or GPU "
         "missing, or CUDA_VISIBLE_DEVICES hides them)");
  const Device device = on_gpu ? Device::CUDA : Device::CPU;
  const DType dtype = tc.precision == "bf16" ? DType::BF16 : DType::F32;
  double peak_flops = tc.peak_tflops * 1e12;
  if (on_gpu) {
    if (peak_flops == 0) peak_flops = cuda::peak_dense_flops(0, dtype == DType::BF16);
    spdlog::info("device: {} ({}; peak {:.0f} TFLOP/s for MFU{})", cuda::device_description(0),
                 tc.precision, peak_flops * 1e-12,
                 peak_flops == 0 ? ": unknown GPU, set training.peak_tflops" : "");
  }
  model::Model model(cfg.model, dtype, {}, device);
  if (cfg.model.init_from.empty()) {
    model.params().init(tc.seed);
  } else {
    load_weights(cfg.model.init_from, model.params());
    spdlog::info("initialised weights from {}", cfg.model.init_from);
  }
  AdamW opt(model.params(), cfg.optimizer);
  spdlog::info("model: {} parameters ({} residual, {} layers, d={}), {} tokens per step",
               model.params().numel(), model::residual_mode_name(cfg.model.mode),
               cfg.model.n_layers, cfg.model.d_model, A * B * T * D);

  // ---- resume ----
  TrainState state;
  const auto& ck = cfg.checkpoint;
  std::string resume_dir;
  if (ck.resume == "auto") {
    if (auto latest = find_latest_checkpoint(ck.dir)) resume_dir = *latest;
    else spdlog::info("checkpoint.resume = auto: no checkpoint in '{}', starting fresh", ck.dir);
  } else if (ck.resume != "never") {
    resume_dir = ck.resume;
  } else if (!ck.dir.empty() && !list_checkpoints(ck.dir).empty()) {
    fail("config key checkpoint.resume is \"never\" but checkpoint.dir '", ck.dir,
         "' already holds checkpoints; set checkpoint.resume=auto to continue that run or choose "
         "another checkpoint.dir (nothing was overwritten)");
  }
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

  auto run_eval = [&]() {
    if (!val_data) return;
    auto [loss, tokens] = evaluate(model, *val_data, cfg.eval.batches, B, T);
    metrics.write({{"step", state.step}, {"val_loss", loss}});
    spdlog::info("step {:>6} | val loss {:.6f} ({} tokens)", state.step, loss, tokens);
  };

  // ---- the loop ----
  StopSignals signals;
  const double flops_per_token = model::training_flops_per_token(cfg.model, T);
  const int64_t tokens_per_step = A * B * T * D;
  const double grad_scale = 1.0 / static_cast<double>(A * B * T * D);
  const auto t_start = Clock::now();
  const int64_t first_step = state.step;
  while (state.step < tc.steps) {
    const auto t0 = Clock::now();
    const int64_t k = state.step;
    model.params().zero_grads();
    double loss_sum = 0;
    for (int64_t a = 0; a < A; ++a) {
      auto batch = train_data.unit((k * A + a) * D + r);
      loss_sum += model.forward_backward(batch.inputs, batch.targets, B, T, grad_scale);
    }
    const double loss = loss_sum * grad_scale;
    const double norm = opt.grad_norm();
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      spdlog::error("step {}: non-finite {} (loss {}, grad norm {}); stopping without an update. "
                    "Last good checkpoint: {}", k + 1, std::isfinite(loss) ? "gradient" : "loss",
                    loss, norm, last_checkpoint.empty() ? "none" : last_checkpoint);
      return kExitNonFinite;
    }
    const double lr = learning_rate(cfg.schedule, cfg.optimizer.lr, k, tc.steps);
    opt.step(lr, norm);
    state.step = k + 1;
    state.tokens += tokens_per_step;

    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
    const double tok_s = tokens_per_step / dt;
    const double achieved = tok_s * flops_per_token;  // model FLOP/s (6N + attention)
    json row = {{"step", state.step}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                {"tokens", state.tokens}, {"tokens_per_sec", tok_s}, {"elapsed_sec", elapsed}};
    if (on_gpu && peak_flops > 0) row["mfu"] = achieved / peak_flops;
    metrics.write(row);
    if (state.step % cfg.run.log_every == 0 || state.step == tc.steps || state.step == first_step + 1) {
      const double avg = elapsed / static_cast<double>(state.step - first_step);
      const std::string rate = on_gpu && peak_flops > 0
                                   ? fmt::format("{:.1f} TFLOP/s | MFU {:.1f}%", achieved * 1e-12,
                                                 100 * achieved / peak_flops)
                                   : fmt::format("{:.1f} GFLOP/s", achieved * 1e-9);
      spdlog::info("step {:>6}/{} | loss {:.6f} | lr {:.3e} | grad norm {:.4f} | {:.0f} tok/s | "
                   "{} | ETA {}", state.step, tc.steps, loss, lr, norm, tok_s, rate,
                   fmt_duration(avg * (tc.steps - state.step)));
    }
    const bool last = state.step == tc.steps;
    if (cfg.eval.every > 0 && (state.step % cfg.eval.every == 0 || last)) run_eval();
    if (last || (ck.every > 0 && state.step % ck.every == 0)) checkpoint();
    if (cfg.run.stop_after > 0 && state.step - first_step >= cfg.run.stop_after && !last) {
      spdlog::info("run.stop_after = {}: stopping at step {}", cfg.run.stop_after, state.step);
      if (!(ck.every > 0 && state.step % ck.every == 0)) checkpoint();
      return 0;
    }
    if (int sig = signals.pending()) {
      spdlog::warn("received {}: stopping after step {}", sig == SIGINT ? "SIGINT" : "SIGTERM",
                   state.step);
      if (!last && !(ck.every > 0 && state.step % ck.every == 0)) checkpoint();
      if (ck.dir.empty()) spdlog::warn("checkpoint.dir is not set: nothing was saved");
      return 128 + sig;
    }
  }
  if (cfg.eval.every == 0 && val_data && state.step > first_step) run_eval();
  return 0;
}

}  // namespace attnres::train
