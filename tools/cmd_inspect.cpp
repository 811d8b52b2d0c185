// attnres inspect checkpoint DIR        verify + summarise a checkpoint
// attnres inspect config CONFIG.json    print the resolved, validated config
// attnres inspect attention --checkpoint DIR --data GLOB [--batches N]
//                                       depth-attention weights (sublayer x source), JSON
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/fileio.h"
#include "core/safetensors.h"
#include "data/loader.h"
#include "data/shard.h"
#include "kernels/reduce.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/checkpoint.h"
#include "train/checkpoint_io.h"

namespace attnres::tools {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int inspect_checkpoint(const std::string& dir) {
  train::verify_checkpoint(dir);  // throws naming the damaged file
  json st = json::parse(read_text_file((fs::path(dir) / "state.json").string()));
  std::printf("checkpoint %s: verified (all files match manifest.json)\n", dir.c_str());
  std::printf("step %lld, tokens %lld\n", (long long)st["step"].get<int64_t>(),
              (long long)st["tokens"].get<int64_t>());
  auto tensors = read_safetensors((fs::path(dir) / "model.safetensors").string());
  int64_t total = 0;
  for (const auto& t : tensors) {
    total += t.tensor.numel();
    std::printf("  %-48s %-8s %-14s rms %.4g\n", t.name.c_str(), dtype_name(t.tensor.dtype()),
                shape_str(t.tensor.shape()).c_str(),
                t.tensor.numel() ? std::sqrt(kernels::sum_squares(t.tensor) / t.tensor.numel()) : 0.0);
  }
  std::printf("%zu tensors, %lld parameters\nconfig: %s\n", tensors.size(), (long long)total,
              st["config"].dump().c_str());
  return 0;
}

int inspect_attention(const Args& args) {
  Flags f(args, "inspect attention", {"checkpoint", "data", "batches"});
  const std::string dir = f.required("checkpoint", "inspect attention");
  train::Config cfg = train::config_from_checkpoint(dir);
  if (!cfg.model.attnres())
    fail("inspect attention: the checkpoint's model uses baseline residuals (no depth attention)");
  const int64_t B = cfg.training.micro_batch_size, T = cfg.training.seq_len;
  data::TokenLoader loader(data::resolve_data_spec(f.required("data", "inspect attention"), "--data"),
                           B, T, false, cfg.training.seed);
  model::Model model(cfg.model, DType::F32);
  train::load_weights(dir, model.params());
  const int64_t n = std::min<int64_t>(f.get_int("batches", 1, "inspect attention"), loader.units_per_epoch());
  std::vector<std::vector<double>> mean;
  for (int64_t u = 0; u < n; ++u) {
    auto batch = loader.unit(u);
    auto w = model.depth_attention(batch.inputs, B, T);
    if (mean.empty()) mean.assign(w.size(), {});
    for (size_t s = 0; s < w.size(); ++s) {
      mean[s].resize(w[s].size(), 0.0);
      for (size_t j = 0; j < w[s].size(); ++j) mean[s][j] += w[s][j] / n;
    }
  }
  // Rows: sublayers 0..2L-1 then the final Mix; columns: sources in order
  // (b_0 = embedding, completed blocks, then the partial sum if present).
  json out = {{"mode", model::residual_mode_name(cfg.model.mode)},
              {"block_size", cfg.model.resolved_block_size()},
              {"rows", mean}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int cmd_inspect(const Args& args) {
  if (args.empty() || args[0] == "--help") {
    std::puts("usage: attnres inspect checkpoint DIR\n"
              "       attnres inspect config CONFIG.json [--section.key=value ...]\n"
              "       attnres inspect attention --checkpoint DIR --data GLOB [--batches N]");
    return args.empty() ? 2 : 0;
  }
  const std::string what = args[0];
  Args rest(args.begin() + 1, args.end());
  if (what == "checkpoint") {
    if (rest.size() != 1) fail("inspect checkpoint: expected one checkpoint directory");
    return inspect_checkpoint(rest[0]);
  }
  if (what == "config") {
    if (rest.empty()) fail("inspect config: expected a config file");
    train::Config c = train::load_config(rest[0], Args(rest.begin() + 1, rest.end()));
    std::printf("%s\n", c.to_json().dump(2).c_str());
    return 0;
  }
  if (what == "attention") return inspect_attention(rest);
  fail("inspect: unknown topic '", what, "' (checkpoint, config or attention)");
}

}  // namespace attnres::tools
