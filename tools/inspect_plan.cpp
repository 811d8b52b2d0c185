// attnres inspect plan CONFIG.json [--profile cpu|h100] [--gpus N] [--top K] [--steps S]
//                      [--section.key=value ...]
// What a pipeline run of the config will cost (train/plan.h): predicted step
// time, tokens/s, MFU, bubble, exposed communication and memory per rank, and
// for AttnRes the overhead over the baseline model on the same layout.
// Without --gpus: the config's own layout. With --gpus N: every layout of N
// devices for the config's global batch, best first.
#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "parallel/layout.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/config.h"
#include "train/plan.h"

namespace attnres::tools {

namespace {

void print_rank_detail(const train::Prediction& p) {
  std::printf("per rank (simulated):  rank  busy ms  end ms  peak in-flight\n");
  for (size_t r = 0; r < p.sim.busy.size(); ++r)
    std::printf("                       %4zu %8.2f %7.2f %15d\n", r, p.sim.busy[r] * 1e3,
                p.sim.end[r] * 1e3, p.sim.peak_in_flight[r]);
}

// A split as the override takes it: [4,4,3].
std::string split_text(const std::vector<int64_t>& split) {
  std::string s = "[";
  for (size_t i = 0; i < split.size(); ++i) s += (i ? "," : "") + std::to_string(split[i]);
  return s + "]";
}

// The layers per chunk that a layout runs: its explicit split, else the even one.
std::vector<int64_t> split_of(const train::Config& cfg, const train::PlanLayout& L) {
  const parallel::PipelineLayout pl(cfg.model.n_layers, L.P, L.V, L.split);
  std::vector<int64_t> out;
  for (int c = 0; c < pl.C(); ++c) out.push_back(pl.layers(c).size());
  return out;
}

}  // namespace

int inspect_plan(const Args& args) {
  const char* cmd = "inspect plan";
  const auto [flags, overrides] = split_config_overrides(args);
  Flags f(flags, cmd, {"profile", "gpus", "top", "steps"}, {"help"});
  if (f.has("help") || f.positional().size() != 1) {
    std::puts(
        "usage: attnres inspect plan CONFIG.json [--profile cpu|h100] [--gpus N] [--top 12]\n"
        "                            [--steps 3] [--section.key=value ...]\n"
        "  Predicts a pipeline step of the config with the timed simulator: step time,\n"
        "  tokens/s, MFU, bubble, exposed communication, memory per rank, and the AttnRes\n"
        "  overhead over the baseline model on the same layout. --profile cpu measures the\n"
        "  chunk times here (--steps steps) for the config's layout; h100 computes them.\n"
        "  --gpus N ranks every layout of N GPUs for the config's global batch. Without it,\n"
        "  also the config's layout with its stages balanced by cost (--parallel.layers_per_chunk).");
    return f.has("help") ? 0 : 2;
  }
  const train::Config cfg = train::load_config(f.positional()[0], overrides);
  const train::HardwareProfile hw = train::hardware_profile(f.get("profile", "cpu"));
  std::printf("profile %s: %s\n", hw.name.c_str(), hw.description.c_str());
  const int64_t B = cfg.training.micro_batch_size, T = cfg.training.seq_len;
  std::printf("model: d=%lld L=%lld V=%lld, %s residuals | B=%lld T=%lld, %lld microbatches "
              "per step\n",
              (long long)cfg.model.d_model, (long long)cfg.model.n_layers,
              (long long)cfg.model.vocab_size, model::residual_mode_name(cfg.model.mode),
              (long long)B, (long long)T,
              (long long)(cfg.training.grad_accum * cfg.parallel.data));

  if (hw.measure_cpu) {
    if (f.has("gpus")) fail(cmd, ": --gpus ranks GPU layouts; the cpu profile predicts the config's own");
    const train::PlanLayout L = train::layout_of(cfg);
    const int threads = train::threads_per_rank(hw, L);
    const int steps = static_cast<int>(f.get_int("steps", 3, cmd));
    std::printf("measuring %d chunks in one process, %d thread%s, %d steps ...\n", L.P * L.V,
                threads, threads == 1 ? "" : "s", steps);
    auto measure_and_predict = [&](const train::PlanLayout& at) {
      const auto times = train::measure_chunk_times(cfg, at.P * at.V, threads, steps, at.split);
      std::printf("chunk  layers  fwd ms  bwd ms  update ms  (per microbatch; update per step)\n");
      const auto split = split_of(cfg, at);
      for (size_t c = 0; c < times.fwd.size(); ++c)
        std::printf("%5zu %7lld %7.2f %7.2f %10.2f\n", c, (long long)split[c], times.fwd[c] * 1e3,
                    times.bwd[c] * 1e3, times.update[c] * 1e3);
      const auto p = train::predict(cfg, at, hw, &times);
      std::printf("layout %s, M=%d: predicted step %.1f ms, %.0f tokens/s, bubble %.3f, exposed "
                  "communication %.2f ms\n",
                  train::describe(at).c_str(), at.M, p.step_time * 1e3, p.tokens_per_sec,
                  p.sim.bubble, p.exposed_comm * 1e3);
      print_rank_detail(p);
      return p;
    };
    const auto p = measure_and_predict(L);
    train::PlanLayout balanced = L;
    balanced.split = train::balanced_split(cfg, L, hw);
    if (balanced.split == split_of(cfg, L)) {
      std::printf("stages balanced by cost: the split %s already is\n",
                  split_text(balanced.split).c_str());
      return 0;
    }
    std::printf("stages balanced by cost (FLOPs): --parallel.layers_per_chunk=%s, measured:\n",
                split_text(balanced.split).c_str());
    const auto q = measure_and_predict(balanced);
    std::printf("balanced split: step %+.1f%% over %s\n", 100 * (q.step_time / p.step_time - 1),
                split_text(split_of(cfg, L)).c_str());
    return 0;
  }

  std::vector<train::PlanLayout> layouts;
  if (f.has("gpus")) {
    layouts = train::candidate_layouts(cfg, static_cast<int>(f.get_int("gpus", 1, cmd)));
    if (layouts.empty()) fail(cmd, ": no layout of ", f.get("gpus", ""), " GPUs fits the config");
  } else {
    layouts.push_back(train::layout_of(cfg));
  }
  // The baseline model on each layout: what AttnRes costs on top of it.
  train::Config base = cfg;
  base.model.mode = model::ResidualMode::Baseline;
  struct Row {
    train::Prediction p, b;
  };
  std::vector<Row> rows;
  for (const auto& L : layouts) {
    train::PlanLayout bl = L;
    bl.cache = true;
    rows.push_back({train::predict(cfg, L, hw), train::predict(base, bl, hw)});
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    if (a.p.fits != b.p.fits) return a.p.fits;
    return a.p.tokens_per_sec > b.p.tokens_per_sec;
  });
  std::printf("%-18s %5s %9s %11s %6s %7s %10s %8s %5s %9s %9s\n", "layout", "M", "step ms",
              "tokens/s", "MFU", "bubble", "exposed ms", "GiB/rank", "fits", "vs base", "comm part");
  const size_t top = static_cast<size_t>(f.get_int("top", 12, cmd));
  for (size_t i = 0; i < rows.size() && i < top; ++i) {
    const auto& [p, b] = rows[i];
    std::printf("%-18s %5d %9.1f %11.0f %5.1f%% %7.4f %10.2f %8.1f %5s %+8.1f%% %+8.1f%%\n",
                train::describe(p.layout).c_str(), p.layout.M, p.step_time * 1e3,
                p.tokens_per_sec, 100 * p.mfu, p.sim.bubble, p.exposed_comm * 1e3,
                p.bytes_per_rank / (1 << 30), p.fits ? "yes" : "NO",
                100 * (p.step_time / b.step_time - 1),
                100 * (p.exposed_comm - b.exposed_comm) / b.step_time);
  }
  if (rows.size() > top) std::printf("(%zu more; --top N shows them)\n", rows.size() - top);
  std::printf("vs base: step time over the baseline model on the same layout (AttnRes compute\n"
              "and messages); comm part: the share of it that is exposed communication.\n");
  if (f.has("gpus")) return 0;
  print_rank_detail(rows[0].p);
  // The same layout with its stages balanced by cost (train::balanced_split).
  const train::PlanLayout& L = rows[0].p.layout;
  train::PlanLayout balanced = L;
  balanced.split = train::balanced_split(cfg, L, hw);
  if (balanced.split == split_of(cfg, L)) {
    std::printf("stages balanced by cost: the split %s already is\n", split_text(balanced.split).c_str());
    return 0;
  }
  const auto q = train::predict(cfg, balanced, hw);
  std::printf("stages balanced by cost: --parallel.layers_per_chunk=%s (now %s): predicted step "
              "%.1f ms (%+.1f%%), %.0f tokens/s, MFU %.1f%%, %.1f GiB/rank%s\n",
              split_text(balanced.split).c_str(), split_text(split_of(cfg, L)).c_str(),
              q.step_time * 1e3, 100 * (q.step_time / rows[0].p.step_time - 1), q.tokens_per_sec,
              100 * q.mfu, q.bytes_per_rank / (1 << 30), q.fits ? "" : " (does NOT fit)");
  // The balance evens the stages' compute; where the step is made of
  // latencies and the bubble instead (a tiny model), it may not pay.
  if (q.step_time >= rows[0].p.step_time)
    std::printf("  no faster than %s here (the step is not the stages' compute): keep it\n",
                split_text(split_of(cfg, L)).c_str());
  else
    print_rank_detail(q);
  return 0;
}

}  // namespace attnres::tools
