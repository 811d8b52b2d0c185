// attnres bench: training throughput (forward + backward + AdamW) on
// synthetic tokens, the residual modes side by side, on the CPU or a GPU; and
// with --kernels, each op's time against its floors. A benchmark, not a test:
// it prints figures.
//
// Defaults are the CPU reference model: d=256, L=6, H=8,
// Hkv=4, d_ff=688, V=4096, T=256, B=8, Block AttnRes with S=4. The GPU
// presets (--preset 124m | 350m) are configs/gpu_124m.json and gpu_350m.json's models.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/rng.h"
#include "kernels/cpu/blas.h"
#include "model/flops.h"
#include "model/model.h"
#include "tools/bench_kernels.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/config.h"
#include "train/optimizer.h"

namespace attnres::tools {

namespace {

Tensor random_ids(int64_t n, int64_t vocab, uint64_t stream) {
  Tensor t = Tensor::empty({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>(random_u64(3, stream, i) % vocab);
  return t;
}

// One residual mode's model and optimizer, stepping on fixed synthetic tokens
// and recording how long each full training step (forward + backward of A
// microbatches + AdamW) took.
class ModeRunner {
 public:
  ModeRunner(std::string label, const model::ModelConfig& cfg, int64_t B, int64_t T, int64_t A,
             Device device, DType dtype, DType logits)
      : label_(std::move(label)), cfg_(cfg), B_(B), T_(T), A_(A), device_(device),
        model_(cfg, dtype, {}, device), opt_(model_.params(), {}),
        tokens_(random_ids(B * T, cfg.vocab_size, 1)), targets_(random_ids(B * T, cfg.vocab_size, 2)) {
    model_.params().init(1);  // (AdamW only took the shapes: its moments start at zero)
    model_.set_logits(logits);
  }

  void step(bool timed) {
    const auto t0 = std::chrono::steady_clock::now();
    model_.params().zero_grads();
    // The step's tensor high-water above what lives between steps (weights,
    // gradients, AdamW state): activations and workspace.
    const size_t resident = tensor_memory(device_).in_use;
    reset_tensor_peak(device_);
    for (int64_t a = 0; a < A_; ++a)
      model_.forward_backward(tokens_, targets_, B_, T_, 1.0 / static_cast<double>(A_ * B_ * T_));
    opt_.step(1e-4, opt_.grad_norm());  // grad_norm returns to the host: the step is done
    if (device_ == Device::CUDA) cuda::synchronize();
    act_peak_ = std::max(act_peak_, tensor_memory(device_).peak - resident);
    if (timed) times_.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  void set_recompute(model::Recompute r) { model_.set_recompute(r); }
  size_t activation_peak_bytes() const { return act_peak_; }
  const std::string& label() const { return label_; }
  // Median step time in seconds: robust to a machine busy with something else
  // for part of the run.
  double median_sec() const {
    std::vector<double> t = times_;
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  double tokens_per_step() const { return static_cast<double>(A_ * B_ * T_); }
  double flops_per_token() const { return model::training_flops_per_token(cfg_, T_); }

 private:
  std::string label_;
  model::ModelConfig cfg_;
  int64_t B_, T_, A_;
  Device device_;
  model::Model model_;
  train::AdamW opt_;
  Tensor tokens_, targets_;
  std::vector<double> times_;
  size_t act_peak_ = 0;
};

}  // namespace

int cmd_bench(const Args& args) {
  Flags f(args, "bench",
          {"mode", "steps", "warmup", "d-model", "layers", "heads", "kv-heads", "d-ff", "vocab",
           "seq-len", "batch", "grad-accum", "block-size", "n-blocks", "device", "precision",
           "preset", "only", "recompute", "logits"},
          {"help", "kernels"});
  if (f.has("help")) {
    std::puts(
        "usage: attnres bench [--device cpu|cuda] [--precision fp32|bf16] [--preset 124m|350m]\n"
        "  [--mode baseline|full|block|all] [--steps 5] [--warmup 1] [--d-model 256]\n"
        "  [--layers 6] [--heads 8] [--kv-heads 4] [--d-ff 688] [--vocab 4096] [--seq-len 256]\n"
        "  [--batch 8] [--grad-accum 1] [--block-size 4 | --n-blocks N]\n"
        "  [--recompute none|mix|layer|all] [--logits auto|fp32|bf16] [--kernels [--only TEXT]]\n"
        "--kernels times each CUDA op at the model's shapes against its floors\n"
        "(bytes / bandwidth, FLOPs / peak) instead of whole training steps;\n"
        "--only times just the ops whose row name contains TEXT, e.g. 'phase-1 bwd'.\n"
        "--recompute all runs each mode with none, mix and layer (training.recompute);\n"
        "--logits: the LM head's logits as training.logits (auto: bf16 in a bf16 run);\n"
        "the act MiB column is the step's tensor high-water above weights, gradients and\n"
        "AdamW state (activations and workspace), measured by the allocator.");
    return 0;
  }
  const std::string preset = f.get("preset", "");
  model::ModelConfig c;
  int64_t T = 256, B = 8, S = 4, NB = 0;
  if (preset == "124m") {  // GPT-2 small widths with Llama blocks
    c.d_model = 768, c.n_layers = 12, c.n_heads = 12, c.n_kv_heads = 12, c.d_ff = 2048;
    c.vocab_size = 50304, T = 1024, B = 16, NB = 8;
  } else if (preset == "350m") {
    c.d_model = 1024, c.n_layers = 24, c.n_heads = 16, c.n_kv_heads = 16, c.d_ff = 2816;
    c.vocab_size = 50304, T = 2048, B = 8, NB = 8;
  } else if (!preset.empty()) {
    fail("bench: unknown --preset '", preset, "' (124m or 350m)");
  } else {
    c.d_model = 256, c.n_layers = 6, c.n_heads = 8, c.n_kv_heads = 4, c.d_ff = 688;
    c.vocab_size = 4096;
  }
  c.d_model = f.get_int("d-model", c.d_model, "bench");
  c.n_layers = f.get_int("layers", c.n_layers, "bench");
  c.n_heads = f.get_int("heads", c.n_heads, "bench");
  c.n_kv_heads = f.get_int("kv-heads", c.n_kv_heads, "bench");
  c.d_ff = f.get_int("d-ff", c.d_ff, "bench");
  c.vocab_size = f.get_int("vocab", c.vocab_size, "bench");
  T = f.get_int("seq-len", T, "bench");
  B = f.get_int("batch", B, "bench");
  const int64_t A = f.get_int("grad-accum", 1, "bench");
  const int steps = static_cast<int>(f.get_int("steps", 5, "bench"));
  const int warmup = static_cast<int>(f.get_int("warmup", 1, "bench"));
  NB = f.get_int("n-blocks", f.has("block-size") ? 0 : NB, "bench");
  S = f.get_int("block-size", S, "bench");
  const std::string which = f.get("mode", "all");
  if (f.has("only") && !f.has("kernels"))
    fail("bench: --only selects rows of --kernels; add --kernels");
  const Device device = train::parse_device(f.get("device", "cpu"), "bench: --device");
  const DType dtype = f.has("precision") ? train::parse_precision(f.get("precision", ""), "bench: --precision")
                      : device == Device::CUDA ? DType::BF16 : DType::F32;
  if (device == Device::CPU && dtype == DType::BF16) fail("bench: bf16 is a CUDA precision");
  const train::Logits logits_arg = train::parse_logits(f.get("logits", "auto"), "bench: --logits");
  if (logits_arg == train::Logits::BF16 && dtype != DType::BF16)
    fail("bench: --logits bf16 needs --precision bf16 (an fp32 run keeps fp32 logits)");
  const DType logits = train::logit_dtype(logits_arg, dtype);
  if (device == Device::CUDA && cuda::device_count() == 0)
    fail("bench: --device cuda, but no CUDA device is visible");

  double peak = 0;
  if (device == Device::CUDA) {
    peak = cuda::peak_dense_flops(0, dtype == DType::BF16);
    std::printf("attnres GPU benchmark on %s, %s, %s logits\n", cuda::device_description(0).c_str(),
                train::precision_name(dtype), train::precision_name(logits));
  } else {
    std::printf("attnres CPU benchmark, %d OpenMP threads; BLAS: %s\n", omp_get_max_threads(),
                kernels::cpu::blas_description().c_str());
    if (const std::string w = kernels::cpu::blas_warning(); !w.empty())
      std::printf("warning: %s\n", w.c_str());
  }
  std::printf("model: d=%lld L=%lld H=%lld Hkv=%lld d_ff=%lld V=%lld | T=%lld B=%lld A=%lld | "
              "median of %d timed steps after %d warm-up\n",
              (long long)c.d_model, (long long)c.n_layers, (long long)c.n_heads,
              (long long)c.n_kv_heads, (long long)c.d_ff, (long long)c.vocab_size, (long long)T,
              (long long)B, (long long)A, steps, warmup);
  if (f.has("kernels")) {
    if (device != Device::CUDA) fail("bench --kernels times the CUDA ops: add --device cuda");
    bench_kernels(c, B, T, dtype, NB > 0 ? NB : 8, f.get("only", ""));
    return 0;
  }

  std::vector<model::Recompute> recomputes;
  if (const std::string r = f.get("recompute", "none"); r == "all")
    recomputes = {model::Recompute::None, model::Recompute::Mix, model::Recompute::Layer};
  else
    recomputes = {train::parse_recompute(r, "bench: --recompute (or all)")};
  std::printf("%-26s %10s %12s %12s %8s %10s %10s\n", "mode", "step ms", "tokens/s",
              device == Device::CUDA ? "TFLOP/s" : "GFLOP/s", "MFU", "vs base", "act MiB");
  // All modes live side by side and take their steps in turn (baseline, block,
  // full, baseline, ...), so a slow phase of the machine hits every mode alike
  // and the "vs base" column compares like with like.
  std::vector<std::unique_ptr<ModeRunner>> runners;
  const bool all = which == "all";
  const model::ResidualMode only = all ? model::ResidualMode::Baseline
                                       : model::parse_residual_mode(which, "bench: --mode (or all)");
  for (const model::ResidualMode mode :
       {model::ResidualMode::Baseline, model::ResidualMode::Block, model::ResidualMode::Full}) {
    if (!all && mode != only) continue;
    model::ModelConfig mc = c;
    mc.mode = mode;
    std::string label = model::residual_mode_name(mode);
    if (mode == model::ResidualMode::Block) {
      if (NB > 0) {
        mc.n_blocks = NB;
        label += " N=" + std::to_string(NB);
      } else {
        mc.block_size = S;
        label += " S=" + std::to_string(S);
      }
    }
    mc.validate();
    for (model::Recompute r : recomputes) {
      const std::string l = recomputes.size() > 1 || r != model::Recompute::None
                                ? label + " rc=" + model::recompute_name(r)
                                : label;
      runners.push_back(std::make_unique<ModeRunner>(l, mc, B, T, A, device, dtype, logits));
      runners.back()->set_recompute(r);
    }
  }
  // The timed steps are the region a profiler started with profiling off
  // records (scripts/gpu_profile.sh: ncu --profile-from-start off).
  for (int i = 0; i < warmup + steps; ++i) {
    if (i == warmup && device == Device::CUDA) cuda::profiler_start();
    for (auto& r : runners) r->step(/*timed=*/i >= warmup);
  }
  if (device == Device::CUDA) cuda::profiler_stop();

  // "vs base": against the first row (the baseline with --mode all; the
  // mode without recomputation with --recompute all).
  const double base_ms = runners.size() > 1 ? runners[0]->median_sec() * 1e3 : 0;
  for (const auto& r : runners) {
    const double ms = r->median_sec() * 1e3;
    const double tps = r->tokens_per_step() / (ms * 1e-3), flops = tps * r->flops_per_token();
    char rel[32] = "-", mfu[32] = "-";
    if (base_ms > 0 && r != runners[0])
      std::snprintf(rel, sizeof rel, "%+.1f%%", 100.0 * (ms / base_ms - 1));
    if (peak > 0) std::snprintf(mfu, sizeof mfu, "%.1f%%", 100.0 * flops / peak);
    std::printf("%-26s %10.1f %12.0f %12.1f %8s %10s %10.2f\n", r->label().c_str(), ms, tps,
                device == Device::CUDA ? flops * 1e-12 : flops * 1e-9, mfu, rel,
                r->activation_peak_bytes() / 1048576.0);
  }
  if (device == Device::CUDA) {
    auto ms = cuda::memory_stats();
    std::printf("GPU memory: peak %.2f GiB in tensors, pool %.2f GiB\n", ms.peak / 1073741824.0,
                ms.reserved / 1073741824.0);
  }
  return 0;
}

}  // namespace attnres::tools
