// attnres bench: training throughput (forward + backward + AdamW) on
// synthetic tokens, the residual modes side by side, on the CPU or a GPU; and
// with --kernels, each op's time against its floors. A benchmark, not a test:
// it prints figures.
//
// Defaults are the foundation issue's CPU reference model: d=256, L=6, H=8,
// Hkv=4, d_ff=688, V=4096, T=256, B=8, Block AttnRes with S=4. The GPU
// presets (--preset 124m | 350m) are the CUDA issue's models.
#include <omp.h>

#include <chrono>
#include <cstdio>

#include "core/device.h"
#include "core/rng.h"
#include "model/flops.h"
#include "model/model.h"
#include "tools/bench_kernels.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/optimizer.h"

namespace attnres::tools {

namespace {

struct BenchResult {
  double tokens_per_sec, flops, step_ms;
};

Tensor random_ids(int64_t n, int64_t vocab, uint64_t stream) {
  Tensor t = Tensor::empty({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>(random_u64(3, stream, i) % vocab);
  return t;
}

BenchResult bench_mode(const model::ModelConfig& cfg, int64_t B, int64_t T, int64_t A, int warmup,
                       int steps, Device device, DType dtype) {
  model::Model m(cfg, dtype, {}, device);
  m.params().init(1);
  train::AdamW opt(m.params(), train::OptimizerConfig{});
  Tensor tokens = random_ids(B * T, cfg.vocab_size, 1), targets = random_ids(B * T, cfg.vocab_size, 2);
  auto step = [&]() {
    m.params().zero_grads();
    for (int64_t a = 0; a < A; ++a) m.forward_backward(tokens, targets, B, T, 1.0 / (A * B * T));
    opt.step(1e-4, opt.grad_norm());  // grad_norm returns to the host: the step is done
  };
  for (int i = 0; i < warmup; ++i) step();
  cuda::synchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  cuda::synchronize();
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
  double tps = A * B * T / sec;
  return {tps, tps * model::training_flops_per_token(cfg, T), sec * 1e3};
}

}  // namespace

int cmd_bench(const Args& args) {
  Flags f(args, "bench",
          {"mode", "steps", "warmup", "d-model", "layers", "heads", "kv-heads", "d-ff", "vocab",
           "seq-len", "batch", "grad-accum", "block-size", "n-blocks", "device", "precision",
           "preset"},
          {"help", "kernels"});
  if (f.has("help")) {
    std::puts(
        "usage: attnres bench [--device cpu|cuda] [--precision fp32|bf16] [--preset 124m|350m]\n"
        "  [--mode baseline|full|block|all] [--steps 5] [--warmup 1] [--d-model 256]\n"
        "  [--layers 6] [--heads 8] [--kv-heads 4] [--d-ff 688] [--vocab 4096] [--seq-len 256]\n"
        "  [--batch 8] [--grad-accum 1] [--block-size 4 | --n-blocks N] [--kernels]\n"
        "--kernels times each CUDA op at the model's shapes against its floors\n"
        "(bytes / bandwidth, FLOPs / peak) instead of whole training steps.");
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
  const std::string dev_name = f.get("device", "cpu");
  if (dev_name != "cpu" && dev_name != "cuda") fail("bench: --device is cpu or cuda, got ", dev_name);
  const Device device = dev_name == "cuda" ? Device::CUDA : Device::CPU;
  const std::string prec = f.get("precision", device == Device::CUDA ? "bf16" : "fp32");
  if (prec != "fp32" && prec != "bf16") fail("bench: --precision is fp32 or bf16, got ", prec);
  const DType dtype = prec == "bf16" ? DType::BF16 : DType::F32;
  if (device == Device::CPU && dtype == DType::BF16) fail("bench: bf16 is a CUDA precision");
  if (device == Device::CUDA && cuda::device_count() == 0)
    fail("bench: --device cuda, but no CUDA device is visible");

  double peak = 0;
  if (device == Device::CUDA) {
    peak = cuda::peak_dense_flops(0, dtype == DType::BF16);
    std::printf("attnres GPU benchmark on %s, %s\n", cuda::device_description(0).c_str(),
                prec.c_str());
  } else {
    std::printf("attnres CPU benchmark, %d threads\n", omp_get_max_threads());
  }
  std::printf("model: d=%lld L=%lld H=%lld Hkv=%lld d_ff=%lld V=%lld | T=%lld B=%lld A=%lld | "
              "%d timed steps after %d warm-up\n",
              (long long)c.d_model, (long long)c.n_layers, (long long)c.n_heads,
              (long long)c.n_kv_heads, (long long)c.d_ff, (long long)c.vocab_size, (long long)T,
              (long long)B, (long long)A, steps, warmup);
  if (f.has("kernels")) {
    if (device != Device::CUDA) fail("bench --kernels times the CUDA ops: add --device cuda");
    bench_kernels(c, B, T, dtype, NB > 0 ? NB : 8);
    return 0;
  }

  std::printf("%-20s %10s %12s %12s %8s %10s\n", "mode", "step ms", "tokens/s",
              device == Device::CUDA ? "TFLOP/s" : "GFLOP/s", "MFU", "vs base");
  double base_ms = 0;
  for (const char* mode : {"baseline", "block", "full"}) {
    if (which != "all" && which != mode) continue;
    model::ModelConfig mc = c;
    std::string label = mode;
    if (std::string(mode) == "block") {
      mc.mode = model::ResidualMode::Block;
      if (NB > 0) {
        mc.n_blocks = NB;
        label += " N=" + std::to_string(NB);
      } else {
        mc.block_size = S;
        label += " S=" + std::to_string(S);
      }
    } else if (std::string(mode) == "full") {
      mc.mode = model::ResidualMode::Full;
    }
    mc.validate();
    BenchResult r = bench_mode(mc, B, T, A, warmup, steps, device, dtype);
    if (std::string(mode) == "baseline") base_ms = r.step_ms;
    char rel[32] = "-", mfu[32] = "-";
    if (base_ms > 0 && std::string(mode) != "baseline")
      std::snprintf(rel, sizeof rel, "%+.1f%%", 100.0 * (r.step_ms / base_ms - 1));
    if (peak > 0) std::snprintf(mfu, sizeof mfu, "%.1f%%", 100.0 * r.flops / peak);
    std::printf("%-20s %10.1f %12.0f %12.1f %8s %10s\n", label.c_str(), r.step_ms,
                r.tokens_per_sec, device == Device::CUDA ? r.flops * 1e-12 : r.flops * 1e-9, mfu,
                rel);
  }
  if (device == Device::CUDA) {
    auto ms = cuda::memory_stats();
    std::printf("GPU memory: peak %.2f GiB in tensors, pool %.2f GiB\n", ms.peak / 1073741824.0,
                ms.reserved / 1073741824.0);
  }
  return 0;
}

}  // namespace attnres::tools
