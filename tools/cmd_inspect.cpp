// attnres inspect checkpoint DIR        verify + summarise a checkpoint
// attnres inspect config CONFIG.json    print the resolved, validated config
// attnres inspect keys                  every config key as docs/config.md's Markdown table
// attnres inspect cpu                   the CPU's instruction set and the BLAS kernels that run
// attnres inspect attention --checkpoint DIR --data GLOB [--batches N]
//                                       depth-attention weights (sublayer x source), JSON
// attnres inspect compare DIR_A DIR_B [--rtol R]
//                                       weights and optimizer state of two checkpoints,
//                                       tensor by tensor (||a-b|| / ||b||); exit 2 above R
// attnres inspect schedule --pipeline P --virtual V --microbatches M [--comm]
//                          [--layers L --mode baseline|full|block --block-size S | --blocks N]
//                          [--tokens B*T --d-model d --bytes 4]
//                                       the pipeline schedule, its simulated bubble and,
//                                       given a model, what crosses each chunk boundary
// attnres inspect plan CONFIG.json ...  predicted cost of a pipeline run (tools/inspect_plan.cpp)
// attnres inspect memory CONFIG.json ... bytes per rank of a run (tools/inspect_memory.cpp)
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/cpu_features.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "core/worst.h"
#include "data/loader.h"
#include "data/shard.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/blas_cores.h"
#include "kernels/reduce.h"
#include "model/depth_attention.h"
#include "parallel/layout.h"
#include "parallel/schedule.h"
#include "parallel/simulator.h"
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
  const auto files = train::checkpoint_weight_map(dir, "model");
  std::set<std::string> shards;
  for (const auto& [name, file] : files) shards.insert(file);
  if (shards.size() > 1)
    std::printf("sharded: %zu model shards (model.safetensors.index.json)\n", shards.size());
  auto tensors = train::read_checkpoint_tensors(dir, "model");
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
  if (!cfg.model.depth_sources())
    fail("inspect attention: the checkpoint's model uses baseline residuals (no depth attention)");
  const int64_t B = cfg.training.micro_batch_size, T = cfg.training.seq_len;
  data::TokenLoader loader(data::resolve_data_spec(f.required("data", "inspect attention"), "--data"),
                           B, T, false, cfg.training.seed);
  model::Model model(cfg.model, DType::F32);
  train::load_weights(dir, model);
  const int64_t n = std::min<int64_t>(f.get_int("batches", 1, "inspect attention"), loader.units_per_epoch());
  std::vector<std::vector<double>> mean;
  for (int64_t u = 0; u < n; ++u) {
    auto batch = loader.unit(u);
    auto w = model::depth_attention(model, batch.inputs, B, T);
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
  // A depth window reads the embedding and the W most recent outputs: which
  // ones, per row, as indices into [b_0 = embedding, b_1 = y_0, ...]. (Sigmoid
  // weights need not sum to one; heads are averaged.)
  const model::ResidualVariant& v = cfg.model.variant;
  if (v.window > 0) {
    json sources = json::array();
    for (int64_t s = 0; s <= cfg.model.n_sublayers(); ++s) {
      json row = {0};
      for (int64_t j = std::max<int64_t>(1, s - v.window + 1); j <= s; ++j) row.push_back(j);
      sources.push_back(row);
    }
    out["window"] = v.window;
    out["sources"] = sources;
  }
  if (cfg.model.one_pass_mix()) out["score"] = model::mix_score_name(v.score);
  // DenseFormer: its learnt weights (no tokens involved), a row per average:
  // before layers 1 .. L-1 over X_0 .. X_l, then the head's over X_0 .. X_L.
  if (cfg.model.denseformer()) out["rows_are"] = "depth-weighted average weights before layers 1..L-1, then the head's";
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

int inspect_compare(const Args& args) {
  const char* cmd = "inspect compare";
  Flags f(args, cmd, {"rtol"});
  if (f.positional().size() != 2) fail(cmd, ": expected two checkpoint directories");
  const double rtol = f.get_double("rtol", 1e-5, cmd);
  double worst = 0;
  std::string worst_name;
  size_t n = 0;
  for (const char* file : {"model", "optimizer"}) {
    std::map<std::string, Tensor> a;
    for (auto& t : train::read_checkpoint_tensors(f.positional()[0], file)) a[t.name] = t.tensor;
    auto b = train::read_checkpoint_tensors(f.positional()[1], file);
    if (a.size() != b.size())
      fail(cmd, ": ", file, " holds ", a.size(), " tensors in the first checkpoint, ", b.size(),
           " in the second");
    for (const auto& tb : b) {
      auto it = a.find(tb.name);
      if (it == a.end()) fail(cmd, ": tensor '", tb.name, "' is only in the second checkpoint");
      if (it->second.shape() != tb.tensor.shape())
        fail(cmd, ": tensor '", tb.name, "' has shapes ", shape_str(it->second.shape()), " and ",
             shape_str(tb.tensor.shape()));
      const Tensor x = it->second.to(DType::F64), y = tb.tensor.to(DType::F64);
      double diff = 0, ref = 0;
      for (int64_t i = 0; i < x.numel(); ++i) {
        const double u = x.data<double>()[i], v = y.data<double>()[i];
        diff += (u - v) * (u - v);
        ref += v * v;
      }
      // NaN or infinite when either side holds a NaN or an infinity: such a
      // tensor is the worst and stays so (worse(), core/worst.h), failing --rtol.
      const double r = ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
      if (worse(r, worst)) worst = r, worst_name = tb.name;
      ++n;
    }
  }
  std::printf("%zu tensors compared; largest relative difference %.3g%s%s\n", n, worst,
              worst_name.empty() ? "" : " in ", worst_name.c_str());
  if (!(worst <= rtol))
    fail(cmd, ": tensor '", worst_name, "' differs by ", worst, " (relative), above --rtol ", rtol);
  return 0;
}

int inspect_schedule(const Args& args) {
  const char* cmd = "inspect schedule";
  Flags f(args, cmd,
          {"pipeline", "virtual", "microbatches", "layers", "mode", "block-size", "blocks", "tokens",
           "d-model", "bytes"},
          {"comm", "forward-only"});
  parallel::ScheduleSpec spec;
  spec.P = static_cast<int>(f.get_int("pipeline", 1, cmd));
  spec.V = static_cast<int>(f.get_int("virtual", 1, cmd));
  spec.M = static_cast<int>(f.get_int("microbatches", 1, cmd));
  spec.forward_only = f.has("forward-only");
  parallel::check_spec(spec);
  const auto lists = parallel::pipeline_schedule(spec);
  parallel::validate_schedule(spec, lists);
  std::printf("schedule P=%d V=%d M=%d (%s)\n", spec.P, spec.V, spec.M,
              spec.forward_only ? "forward only"
              : spec.V == 1     ? "1F1B"
                                : "interleaved 1F1B, microbatch groups of P");
  std::printf("%s", parallel::dump_schedule(spec, f.has("comm")).c_str());
  std::printf("simulated with t_b = 2 t_f and free communication:\n");
  using parallel::CommModel;
  std::vector<int> peak;
  for (CommModel m : {CommModel::Mpi, CommModel::Nccl, CommModel::NcclOneStream}) {
    const auto sim = parallel::simulate(spec, lists, m);
    if (m == CommModel::NcclOneStream && sim.deadlock) {
      std::printf("  %-26s DEADLOCK (why the executor gives every link its own stream)\n",
                  parallel::comm_model_name(m));
      continue;
    }
    if (sim.deadlock) fail(cmd, ": deadlock under ", parallel::comm_model_name(m), ": ", sim.detail);
    std::printf("  %-26s bubble %.4f", parallel::comm_model_name(m), sim.bubble);
    if (m == CommModel::Mpi && !spec.forward_only)
      std::printf(" (formula (P-1)/(V*M) = %.4f)", double(spec.P - 1) / (spec.V * spec.M));
    if (m == CommModel::NcclOneStream) std::printf(" (groups on one stream: not what runs)");
    std::printf("\n");
    if (m == CommModel::Mpi) peak = sim.peak_in_flight;
  }
  std::printf("  peak in-flight microbatch-chunks per rank:");
  for (int v : peak) std::printf(" %d", v);
  std::printf("\n");

  if (!f.has("layers")) return 0;
  // What crosses each chunk boundary for a given model.
  model::ModelConfig m;
  m.n_layers = f.get_int("layers", 0, cmd);
  const std::string mode = f.get("mode", f.has("block-size") || f.has("blocks") ? "block" : "full");
  m.mode = model::parse_residual_mode(mode, std::string(cmd) + ": --mode");
  m.block_size = f.get_int("block-size", 0, cmd);
  m.n_blocks = f.get_int("blocks", 0, cmd);
  if (m.mode == model::ResidualMode::Block && (m.block_size > 0) == (m.n_blocks > 0))
    fail(cmd, ": block mode needs exactly one of --block-size or --blocks");
  const parallel::PipelineLayout layout(m.n_layers, spec.P, spec.V);
  const auto plan = parallel::DepthPlan::of(m);
  std::printf("model: %lld layers, %s residuals%s\n", (long long)m.n_layers, mode.c_str(),
              plan.attnres ? (", block size " + std::to_string(plan.S) + " sublayers").c_str() : "");
  std::printf("chunk  rank  layers     into chunk: naive            cached\n");
  for (int c = 0; c < layout.C(); ++c) {
    std::printf("%5d %5d  [%3lld,%3lld)", c, layout.rank_of(c), (long long)layout.layers(c).begin,
                (long long)layout.layers(c).end);
    if (c == 0) {
      std::printf("  (embedding)\n");
      continue;
    }
    auto describe = [&](bool cache) {
      const auto b = parallel::boundary_message(layout, plan, c, cache);
      if (b.hidden) return std::string("hidden");
      std::string s = b.hi - b.lo > 1   ? "b" + std::to_string(b.lo) + "..b" + std::to_string(b.hi - 1)
                      : b.hi - b.lo == 1 ? "b" + std::to_string(b.lo)
                                         : "-";
      if (b.partial) s += " +partial";
      return s + " (" + std::to_string(b.tensors()) + ")";
    };
    std::printf("  %-22s %s\n", describe(false).c_str(), describe(true).c_str());
  }
  const auto naive = parallel::comm_volume(layout, plan, false);
  const auto cached = parallel::comm_volume(layout, plan, true);
  std::printf("per microbatch and direction, in [B*T, d] tensors (sources + partials):\n");
  std::printf("  naive  %lld (%lld + %lld), largest hop %lld\n", (long long)naive.tensors(),
              (long long)naive.sources, (long long)naive.partials, (long long)naive.max_hop);
  std::printf("  cached %lld (%lld + %lld), largest hop %lld\n", (long long)cached.tensors(),
              (long long)cached.sources, (long long)cached.partials, (long long)cached.max_hop);
  if (f.has("tokens") && f.has("d-model")) {
    const int64_t N = f.get_int("tokens", 0, cmd), d = f.get_int("d-model", 0, cmd),
                  eb = f.get_int("bytes", 4, cmd);
    for (bool cache : {false, true})
      std::printf("  %s: %.3f MB per step (forward + backward, %d microbatches, one replica)\n",
                  cache ? "cached" : "naive ",
                  parallel::pipeline_bytes_per_step(layout, plan, cache, spec.M, 1, N, d, eb) / 1e6,
                  spec.M);
  }
  return 0;
}

// What a CPU run's GEMMs run on: the CPU, its best instruction set, the BLAS
// and its kernels (and who chose them), as "key: value" lines.
int inspect_cpu() {
  const CpuFeatures cpu = read_cpu_features();
  std::printf("cpu: %s\n", cpu_identity(cpu).c_str());
  std::printf("cpu instruction set: %s\n", isa_name(best_isa(cpu)));
  std::printf("blas: %s\n", kernels::cpu::blas_description().c_str());
  std::printf("blas kernels' instruction set: %s\n",
              isa_name(kernels::cpu::blas_core_isa(kernels::cpu::blas_core_name())));
  for (const std::string& w : kernels::cpu::blas_warnings()) std::printf("warning: %s\n", w.c_str());
  return 0;
}

}  // namespace

int cmd_inspect(const Args& args) {
  if (args.empty() || args[0] == "--help") {
    std::puts("usage: attnres inspect checkpoint DIR\n"
              "       attnres inspect config CONFIG.json [--section.key=value ...]\n"
              "       attnres inspect keys\n"
              "       attnres inspect cpu\n"
              "       attnres inspect attention --checkpoint DIR --data GLOB [--batches N]\n"
              "       attnres inspect compare DIR_A DIR_B [--rtol 1e-5]\n"
              "       attnres inspect schedule --pipeline P --virtual V --microbatches M [--comm]\n"
              "                                [--forward-only] [--layers L --mode baseline|full|block\n"
              "                                 --block-size S | --blocks N] [--tokens B*T --d-model d\n"
              "                                 --bytes 4]\n"
              "       attnres inspect plan CONFIG.json [--profile cpu|h100] [--gpus N] [--top K]\n"
              "                            [--steps S] [--section.key=value ...]\n"
              "       attnres inspect memory CONFIG.json [--gpu-memory GiB] [--json]\n"
              "                              [--section.key=value ...]");
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
  if (what == "keys") {
    if (!rest.empty()) fail("inspect keys: takes no arguments");
    std::fputs(train::config_reference_table().c_str(), stdout);
    return 0;
  }
  if (what == "cpu") {
    if (!rest.empty()) fail("inspect cpu: takes no arguments");
    return inspect_cpu();
  }
  if (what == "attention") return inspect_attention(rest);
  if (what == "schedule") return inspect_schedule(rest);
  if (what == "compare") return inspect_compare(rest);
  if (what == "plan") return inspect_plan(rest);
  if (what == "memory") return inspect_memory(rest);
  fail("inspect: unknown topic '", what,
       "' (checkpoint, config, keys, cpu, attention, schedule, compare, plan or memory)");
}

}  // namespace attnres::tools
