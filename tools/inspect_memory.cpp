// attnres inspect memory CONFIG.json [--gpu-memory GiB] [--json] [--section.key=value ...]
// What each pipeline rank of the config's layout holds (train/memory.h):
// weights, fp32 master weights, gradients, AdamW state, the activations one
// microbatch keeps per chunk x the microbatches in flight under the
// schedule, the step's activation high-water and the total. With
// --gpu-memory: whether the largest rank fits, and the largest n_layers (at
// this width and layout) and micro_batch_size that would.
#include <algorithm>
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/params.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/config.h"
#include "train/memory.h"

namespace attnres::tools {

namespace {

double mib(int64_t b) { return static_cast<double>(b) / 1048576.0; }

// 49.12B, 377.5M, 2.9K: three significant figures or more.
std::string count(int64_t n) {
  const double v = static_cast<double>(n);
  if (v >= 1e9) return fmt::format("{:.2f}B", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.1f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f}K", v / 1e3);
  return std::to_string(n);
}

// The parameter counts (model/params.h), and a hybrid's layer kinds.
void print_params(const model::ModelConfig& m) {
  const int64_t total = model::total_params(m), body = model::non_embedding_params(m);
  const int64_t act = model::activated_non_embedding_params(m), emb = total - body;
  std::printf("parameters: %s total (%s non-embedding)", count(total).c_str(), count(body).c_str());
  if (m.has_moe())
    std::printf("; activated per token %s non-embedding, %s with the embedding and head",
                count(act).c_str(), count(act + emb).c_str());
  std::printf("\n");
  if (!m.has_kda() && !m.has_mla()) return;
  std::string kda, soft;
  int64_t n_kda = 0;
  for (int64_t l = 0; l < m.n_layers; ++l) {
    if (m.kda_layer(l)) ++n_kda;
    else soft += (soft.empty() ? "" : " ") + std::to_string(l + 1);
  }
  if (m.has_kda())
    kda = fmt::format("{} KDA ({} heads of {}, conv {}), ", n_kda, m.kda.heads, m.kda.head_dim,
                      m.kda.conv_size);
  const std::string attn =
      m.has_mla() ? fmt::format("MLA ({} heads, r {}, dn {}, dr {}, dv {}, {})", m.n_heads,
                                m.mla.kv_lora_rank, m.mla.qk_nope_head_dim,
                                m.mla.qk_rope_head_dim, m.mla.v_head_dim,
                                m.mla.rope ? "RoPE" : "NoPE")
                  : fmt::format("GQA ({} heads, {} KV)", m.n_heads, m.n_kv_heads);
  std::printf("layers: %s%lld %s in layers %s (1-based)\n", kda.c_str(),
              (long long)(m.n_layers - n_kda), attn.c_str(), soft.c_str());
}

int64_t largest_total(const train::Config& cfg) {
  int64_t m = 0;
  for (const auto& r : train::plan_memory(cfg)) m = std::max(m, r.total());
  return m;
}

}  // namespace

int inspect_memory(const Args& args) {
  const char* cmd = "inspect memory";
  const auto [flags, overrides] = split_config_overrides(args);
  Flags f(flags, cmd, {"gpu-memory"}, {"help", "json"});
  if (f.has("help") || f.positional().size() != 1) {
    std::puts(
        "usage: attnres inspect memory CONFIG.json [--gpu-memory GiB] [--json]\n"
        "                              [--section.key=value ...]\n"
        "  Bytes per pipeline rank of the config's layout: weights, fp32 master weights,\n"
        "  gradients, optimizer state (AdamW: 2 moments, Muon: 1 buffer), activations (kept per microbatch x in flight under the\n"
        "  schedule, and the step's high-water, replayed from the model's allocations), total.\n"
        "  --gpu-memory G: does it fit in G GiB, and the largest model.n_layers and\n"
        "  training.micro_batch_size that would.");
    return f.has("help") ? 0 : 2;
  }
  const train::Config cfg = train::load_config(f.positional()[0], overrides);
  const auto ranks = train::plan_memory(cfg);
  const double budget_gib = f.get_double("gpu-memory", 0, cmd);
  if (f.has("gpu-memory") && !(budget_gib > 0))
    fail(cmd, ": --gpu-memory must be a positive number of GiB");
  const int64_t budget = static_cast<int64_t>(budget_gib * 1073741824.0);

  if (f.has("json")) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : ranks)
      out.push_back({{"stage", r.stage}, {"weights", r.weights}, {"master", r.master},
                     {"grads", r.grads}, {"optimizer", r.optimizer},
                     {"replica_resident", r.replica_resident},
                     {"kept_per_microbatch", r.kept_per_microbatch}, {"in_flight", r.in_flight},
                     {"activations", r.activations}, {"total", r.total()}});
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  const auto& m = cfg.model;
  std::printf("model: d=%lld L=%lld V=%lld, %s residuals | B=%lld T=%lld | %s %s, recompute %s\n",
              (long long)m.d_model, (long long)m.n_layers, (long long)m.vocab_size,
              model::residual_mode_name(m.mode), (long long)cfg.training.micro_batch_size,
              (long long)cfg.training.seq_len, device_name(cfg.training.device),
              train::precision_name(cfg.training.precision),
              model::recompute_name(cfg.training.recompute));
  print_params(m);
  std::printf("layout: P=%lld x V=%lld x D=%lld, %lld microbatches per step (%s)\n",
              (long long)cfg.parallel.pipeline, (long long)cfg.parallel.virtual_stages,
              (long long)cfg.parallel.data, (long long)cfg.training.grad_accum,
              cfg.parallel.cache_blocks ? "cached blocks" : "naive");
  std::printf("\nMiB per rank  %9s %9s %9s %9s  %-24s %11s %10s\n", "weights", "master", "grads",
              "optimizer", "kept/microbatch x held", "activations", "total");
  for (const auto& r : ranks) {
    std::string chunks;
    for (size_t v = 0; v < r.kept_per_microbatch.size(); ++v) {
      char b[48];
      std::snprintf(b, sizeof b, "%s%.1fx%d", v ? " + " : "", mib(r.kept_per_microbatch[v]),
                    r.in_flight[v]);
      chunks += b;
    }
    std::printf("stage %-7d %9.1f %9.1f %9.1f %9.1f  %-24s %11.1f %10.1f\n", r.stage,
                mib(r.weights), mib(r.master), mib(r.grads), mib(r.optimizer), chunks.c_str(),
                mib(r.activations), mib(r.total()));
  }
  std::printf("\nlargest single tensors (MiB):\n");
  for (const auto& r : ranks) {
    std::printf("stage %-7d", r.stage);
    for (const auto& b : r.largest) std::printf("  %s %.2f;", b.what.c_str(), mib(b.bytes));
    std::printf("\n");
  }
  std::printf("activations = the step's high-water above the resident state, from a replay of the\n"
              "tensors the model and the executor allocate (docs/memory.md).\n");
  if (budget > 0) {
    const int64_t worst = largest_total(cfg);
    std::printf("\n--gpu-memory %.1f GiB: the largest rank needs %.2f GiB: %s\n", budget_gib,
                worst / 1073741824.0, worst <= budget ? "fits" : "does NOT fit");
    // Each plan replays every layer's tensors: a tiny model on a large GPU
    // would otherwise search up to 10^5 layers (a minute); past the bound the
    // answer says "or more".
    const int64_t min_layers = cfg.parallel.pipeline * cfg.parallel.virtual_stages;
    const int64_t bound = std::max<int64_t>(4096, min_layers);
    const int64_t L = train::largest_fitting(min_layers, 1, [&](int64_t v) {
      train::Config c = cfg;
      c.model.n_layers = v;
      return largest_total(c) <= budget;
    }, bound);
    const int64_t B = train::largest_fitting(1, 1, [&](int64_t v) {
      train::Config c = cfg;
      c.training.micro_batch_size = v;
      return largest_total(c) <= budget;
    }, bound);
    auto amount = [&](int64_t v) {
      return v == bound ? fmt::format("{} or more (the search stops there)", bound)
                        : std::to_string(v);
    };
    if (L < min_layers)
      std::printf("  no n_layers fits at this width and layout\n");
    else
      std::printf("  largest model.n_layers that fits (this width and layout): %s\n", amount(L).c_str());
    if (B < 1)
      std::printf("  no micro_batch_size fits\n");
    else
      std::printf("  largest training.micro_batch_size that fits: %s\n", amount(B).c_str());
  }
  return 0;
}

}  // namespace attnres::tools
