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
        "  --gpus N ranks every layout of N GPUs for the config's global batch.");
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
    const auto times = train::measure_chunk_times(cfg, L.P * L.V, threads, steps);
    std::printf("chunk  fwd ms  bwd ms  update ms  (per microbatch; update per step)\n");
    for (size_t c = 0; c < times.fwd.size(); ++c)
      std::printf("%5zu %7.2f %7.2f %10.2f\n", c, times.fwd[c] * 1e3, times.bwd[c] * 1e3,
                  times.update[c] * 1e3);
    const auto p = train::predict(cfg, L, hw, &times);
    std::printf("layout %s, M=%d: predicted step %.1f ms, %.0f tokens/s, bubble %.3f, exposed "
                "communication %.2f ms\n",
                train::describe(L).c_str(), L.M, p.step_time * 1e3, p.tokens_per_sec,
                p.sim.bubble, p.exposed_comm * 1e3);
    print_rank_detail(p);
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
  if (!f.has("gpus")) print_rank_detail(rows[0].p);
  return 0;
}

}  // namespace attnres::tools
