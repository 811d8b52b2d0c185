// attnres bench: CPU training throughput (forward + backward + AdamW) on
// synthetic tokens, for the residual modes side by side. A benchmark, not a
// test: it prints figures.
//
// Defaults are the foundation issue's reference model: d=256, L=6, H=8,
// Hkv=4, d_ff=688, V=4096, T=256, B=8, Block AttnRes with S=4.
#include <omp.h>

#include <chrono>
#include <cstdio>

#include "core/rng.h"
#include "model/flops.h"
#include "model/model.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/optimizer.h"

namespace attnres::tools {

namespace {

struct BenchResult {
  double tokens_per_sec, gflops, step_ms;
};

BenchResult bench_mode(model::ModelConfig cfg, int64_t B, int64_t T, int warmup, int steps) {
  model::Model m(cfg, DType::F32);
  m.params().init(1);
  train::AdamW opt(m.params(), train::OptimizerConfig{});
  Tensor tokens = Tensor::empty({B * T}, DType::I32), targets = Tensor::empty({B * T}, DType::I32);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>(random_u64(3, 1, i) % cfg.vocab_size);
    targets.data<int32_t>()[i] = static_cast<int32_t>(random_u64(3, 2, i) % cfg.vocab_size);
  }
  auto step = [&]() {
    m.params().zero_grads();
    m.forward_backward(tokens, targets, B, T, 1.0 / (B * T));
    opt.step(1e-4, opt.grad_norm());
  };
  for (int i = 0; i < warmup; ++i) step();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
  double tps = B * T / sec;
  return {tps, tps * model::training_flops_per_token(cfg, T) * 1e-9, sec * 1e3};
}

}  // namespace

int cmd_bench(const Args& args) {
  Flags f(args, "bench",
          {"mode", "steps", "warmup", "d-model", "layers", "heads", "kv-heads", "d-ff", "vocab",
           "seq-len", "batch", "block-size"},
          {"help"});
  if (f.has("help")) {
    std::puts("usage: attnres bench [--mode baseline|full|block|all] [--steps 5] [--warmup 1]\n"
              "  [--d-model 256] [--layers 6] [--heads 8] [--kv-heads 4] [--d-ff 688]\n"
              "  [--vocab 4096] [--seq-len 256] [--batch 8] [--block-size 4]");
    return 0;
  }
  model::ModelConfig c;
  c.d_model = f.get_int("d-model", 256, "bench");
  c.n_layers = f.get_int("layers", 6, "bench");
  c.n_heads = f.get_int("heads", 8, "bench");
  c.n_kv_heads = f.get_int("kv-heads", 4, "bench");
  c.d_ff = f.get_int("d-ff", 688, "bench");
  c.vocab_size = f.get_int("vocab", 4096, "bench");
  const int64_t T = f.get_int("seq-len", 256, "bench"), B = f.get_int("batch", 8, "bench");
  const int steps = static_cast<int>(f.get_int("steps", 5, "bench"));
  const int warmup = static_cast<int>(f.get_int("warmup", 1, "bench"));
  const int64_t S = f.get_int("block-size", 4, "bench");
  const std::string which = f.get("mode", "all");

  std::printf("attnres CPU benchmark: d=%lld L=%lld H=%lld Hkv=%lld d_ff=%lld V=%lld T=%lld B=%lld, "
              "%d threads, %d timed steps\n",
              (long long)c.d_model, (long long)c.n_layers, (long long)c.n_heads,
              (long long)c.n_kv_heads, (long long)c.d_ff, (long long)c.vocab_size, (long long)T,
              (long long)B, omp_get_max_threads(), steps);
  std::printf("%-18s %12s %12s %12s %10s\n", "mode", "step ms", "tokens/s", "GFLOP/s", "vs base");
  double base_ms = 0;
  for (const char* mode : {"baseline", "block", "full"}) {
    if (which != "all" && which != mode) continue;
    model::ModelConfig mc = c;
    std::string label = mode;
    if (std::string(mode) == "block") {
      mc.mode = model::ResidualMode::Block;
      mc.block_size = S;
      label += " S=" + std::to_string(S);
    } else if (std::string(mode) == "full") {
      mc.mode = model::ResidualMode::Full;
    }
    mc.validate();
    BenchResult r = bench_mode(mc, B, T, warmup, steps);
    if (std::string(mode) == "baseline") base_ms = r.step_ms;
    char rel[32] = "-";
    if (base_ms > 0 && std::string(mode) != "baseline")
      std::snprintf(rel, sizeof rel, "%+.1f%%", 100.0 * (r.step_ms / base_ms - 1));
    std::printf("%-18s %12.1f %12.0f %12.1f %10s\n", label.c_str(), r.step_ms, r.tokens_per_sec,
                r.gflops, rel);
  }
  return 0;
}

}  // namespace attnres::tools
