#include "train/sweep_spec.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "model/params.h"

namespace attnres::train {

namespace fs = std::filesystem;
using nlohmann::json;

std::string SweepRun::config_file() const { return (fs::path(dir) / "config.json").string(); }
std::string SweepRun::metrics_file() const { return (fs::path(dir) / "metrics.jsonl").string(); }
std::string SweepRun::result_file() const { return (fs::path(dir) / "result.json").string(); }

namespace {

// Keys the sweep sets for every run itself; a base config or a size that sets
// them is an error rather than silently overridden.
const std::vector<std::string> kSweepOwnedKeys = {"model.residual", "training.steps", "run.dir",
                                                  "checkpoint.dir", "checkpoint.resume"};

const json* find_path(const json& j, const std::string& dotted) {
  const json* node = &j;
  std::stringstream ss(dotted);
  std::string part;
  while (std::getline(ss, part, '.')) {
    if (!node->is_object()) return nullptr;
    auto it = node->find(part);
    if (it == node->end()) return nullptr;
    node = &*it;
  }
  return node;
}

// Strict reading of the sweep file's own objects: unknown keys are errors.
void check_keys(const json& obj, const std::string& where, const std::set<std::string>& allowed,
                const std::string& source) {
  if (!obj.is_object()) fail(source, ": '", where, "' must be an object, got ", obj.dump());
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (!allowed.count(it.key()))
      fail(source, ": unknown key '", where.empty() ? "" : where + ".", it.key(), "'");
}

std::string get_string(const json& obj, const char* key, const std::string& where,
                       const std::string& source, const std::string& fallback, bool required) {
  const std::string name = where.empty() ? key : where + "." + key;
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) fail(source, ": '", name, "' is missing");
    return fallback;
  }
  if (!it->is_string()) fail(source, ": '", name, "' must be a string, got ", it->dump());
  return it->get<std::string>();
}

// Run, size and mode names become directory names and CSV fields.
void check_name(const std::string& name, const std::string& where, const std::string& source) {
  static const std::regex ok("[A-Za-z0-9][A-Za-z0-9_.+-]*");
  if (!std::regex_match(name, ok))
    fail(source, ": '", where, "' = \"", name,
         "\" is not a usable name (letters, digits, '_', '.', '+', '-'; no leading punctuation)");
}

std::vector<int64_t> token_list(const json& v, const std::string& where, const std::string& source) {
  if (!v.is_array() || v.empty())
    fail(source, ": '", where, "' must be a non-empty array of token counts, got ", v.dump());
  std::vector<int64_t> out;
  for (const auto& x : v) {
    // 2.5e6 is a convenient way to write a budget: accept integral numbers.
    if (!x.is_number() || !(x.get<double>() >= 1) || x.get<double>() != std::floor(x.get<double>()))
      fail(source, ": '", where, "' must hold positive whole token counts, got ", x.dump());
    out.push_back(static_cast<int64_t>(x.get<double>()));
  }
  return out;
}

// 262144 -> "262k", 1048576 -> "1.05M", 3.87e10 -> "38.7B": three significant digits.
std::string tokens_label(int64_t n) {
  static const char* const suffixes[] = {"", "k", "M", "B", "T"};
  double v = static_cast<double>(n);
  size_t i = 0;
  // Below 999.5 "%.3g" prints no exponent (999999 must become "1M", not "1e+03k").
  while (v >= 999.5 && i + 1 < std::size(suffixes)) v /= 1000, ++i;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g%s", v, suffixes[i]);
  return buf;
}

struct ModeSpec {
  std::string name;
  json residual;          // model.residual of its runs
  bool baseline = false;  // residual mode "baseline"
  json config = json::object();  // more config keys of its runs (e.g. optimizer.type)
  double paper = NAN;     // "paper": the published loss of the row (the ablation table's)
};

// model.residual's keys a mode may set besides mode, block_size and n_blocks:
// the residual variants (docs/model.md "Residual variants"), checked by the
// config's own validation.
const std::vector<std::string> kModeResidualKeys = {"query", "weights", "score",
                                                    "key_norm", "heads", "window"};

ModeSpec parse_mode(const json& m, size_t i, const std::string& source) {
  const std::string where = "modes[" + std::to_string(i) + "]";
  std::set<std::string> keys = {"name", "mode", "block_size", "n_blocks", "config", "paper"};
  keys.insert(kModeResidualKeys.begin(), kModeResidualKeys.end());
  check_keys(m, where, keys, source);
  ModeSpec spec;
  if (m.contains("paper")) {
    if (!m["paper"].is_number()) fail(source, ": '", where, ".paper' must be a number (a loss), got ", m["paper"].dump());
    spec.paper = m["paper"].get<double>();
  }
  if (m.contains("config")) {
    if (!m["config"].is_object()) fail(source, ": '", where, ".config' must be an object");
    if (find_path(m["config"], "model.residual"))
      fail(source, ": '", where, ".config' sets model.residual, which the mode's own keys set");
    spec.config = m["config"];
  }
  const std::string mode = get_string(m, "mode", where, source, "", true);
  const model::ResidualMode rm = model::parse_residual_mode(mode, source + ": '" + where + ".mode'");
  spec.residual = {{"mode", mode}};
  spec.baseline = rm == model::ResidualMode::Baseline;
  if (rm == model::ResidualMode::Block) {
    const bool s = m.contains("block_size"), n = m.contains("n_blocks");
    if (s == n) fail(source, ": '", where, "': block mode needs exactly one of block_size or n_blocks");
    const char* key = s ? "block_size" : "n_blocks";
    if (!m[key].is_number_integer() || m[key].get<int64_t>() < 1)
      fail(source, ": '", where, ".", key, "' must be a positive integer, got ", m[key].dump());
    spec.residual[key] = m[key];
    spec.name = std::string("block_") + (s ? "s" : "n") + std::to_string(m[key].get<int64_t>());
  } else {
    if (m.contains("block_size") || m.contains("n_blocks"))
      fail(source, ": '", where, "': block_size / n_blocks apply to block mode only");
    spec.name = mode;
  }
  for (const std::string& k : kModeResidualKeys)
    if (m.contains(k)) spec.residual[k] = m[k];
  spec.name = get_string(m, "name", where, source, spec.name, false);
  check_name(spec.name, where + ".name", source);
  return spec;
}

void forbid_sweep_keys(const json& j, const std::string& where, const std::string& source) {
  for (const auto& k : kSweepOwnedKeys)
    if (find_path(j, k))
      fail(source, ": '", where, "' sets config key '", k,
           "', which the sweep sets for every run (modes, token budgets and run directories); "
           "remove it");
}

// One run of the grid: what the sweep file says about it.
struct RunSpec {
  const std::string& size;
  const json& size_base;  // the base config with the size's keys merged in
  const ModeSpec& mode;
  int64_t budget;
  bool seeded;            // the sweep has "seeds": the name carries the seed
  int64_t seed;
};

// The run's name, directory and resolved, validated config.
SweepRun make_run(const SweepPlan& plan, const RunSpec& spec, double warmup_fraction) {
  SweepRun run;
  run.size = spec.size;
  run.mode = spec.mode.name;
  run.budget = spec.budget;
  run.point = spec.size + "_" + spec.mode.name + "_" + tokens_label(spec.budget);
  run.name = spec.seeded ? run.point + "_s" + std::to_string(spec.seed) : run.point;
  run.dir = (fs::path(plan.out_dir) / "runs" / run.name).string();
  const std::string run_source = plan.source + " (run " + run.name + ")";

  json cj = spec.size_base;
  cj.merge_patch(spec.mode.config);
  cj["model"]["residual"] = spec.mode.residual;
  cj["training"]["steps"] = 1;  // placeholder until the batch size is known
  if (spec.seeded) {
    if (find_path(spec.size_base, "training.seed"))
      fail(plan.source, ": size '", spec.size, "' sets config key 'training.seed', but 'seeds' "
           "sets it for every run; remove one");
    cj["training"]["seed"] = spec.seed;
  }
  Config c = Config::from_json(cj, run_source);
  run.seed = c.training.seed;
  const int64_t per_step = c.training.micro_batch_size * c.training.seq_len *
                           c.training.grad_accum * c.parallel.data;
  run.steps = static_cast<int64_t>(std::llround(static_cast<double>(spec.budget) / per_step));
  if (run.steps < 1)
    fail(run_source, ": token budget ", spec.budget, " is less than half a step (", per_step,
         " tokens per step = micro_batch_size * seq_len * grad_accum * parallel.data)");
  run.tokens = run.steps * per_step;
  c.training.steps = run.steps;
  if (warmup_fraction >= 0)
    c.schedule.warmup_steps = static_cast<int64_t>(std::llround(warmup_fraction * run.steps));
  c.run.dir = run.dir;
  c.checkpoint.dir = (fs::path(run.dir) / "ckpt").string();
  c.checkpoint.resume = "auto";
  // Evaluate inside the training loop at the last step, i.e. before the
  // final checkpoint, so a run with a final checkpoint has its val loss.
  if (c.eval.every == 0 && !c.data.val.empty()) c.eval.every = run.steps;
  try {
    c.validate();
  } catch (const Error& e) {
    fail(run_source, ": ", e.what());
  }
  if (plan.fit_loss == "val" && c.data.val.empty())
    fail(run_source, ": 'fit.loss' is \"val\" but the config has no data.val; set "
         "base.data.val or \"fit\": {\"loss\": \"train\"}");
  run.config = c;
  // The scaling law's N: activated non-embedding parameters (all of them in
  // a dense model; a MoE token meets top_k of the experts: the paper's axis).
  run.params = model::activated_non_embedding_params(c.model);
  run.params_total = model::total_params(c.model);
  run.flops = 6.0 * static_cast<double>(run.params) * static_cast<double>(run.tokens);
  return run;
}

}  // namespace

SweepPlan parse_sweep(const json& j, const std::string& source,
                      const std::vector<std::string>& overrides) {
  check_keys(j, "", {"description", "out_dir", "base", "sizes", "modes", "tokens", "seeds",
                     "warmup_fraction", "fit", "plots", "ablation"}, source);
  SweepPlan plan;
  plan.source = source;
  plan.out_dir = get_string(j, "out_dir", "", source, "", true);
  if (plan.out_dir.empty()) fail(source, ": 'out_dir' must not be empty");

  if (!j.contains("base")) fail(source, ": 'base' (the training config shared by every run) is missing");
  json base = j["base"];
  if (!base.is_object()) fail(source, ": 'base' must be an object (a training config)");
  for (const auto& o : overrides) {
    // --out_dir=DIR is the sweep's own key (e.g. a replicate with another
    // training.seed); everything else is a key of the base config.
    if (o.rfind("--out_dir=", 0) == 0) {
      plan.out_dir = o.substr(10);
      if (plan.out_dir.empty()) fail("override '", o, "': out_dir must not be empty");
    } else {
      apply_override(base, o);
    }
  }
  forbid_sweep_keys(base, "base", source);

  // Seeds: every point is trained once per seed (training.seed: the weights'
  // initialisation and the data order), as <point>_s<seed>. Without "seeds",
  // the base config's seed alone and the runs are named <point>.
  const bool seeded = j.contains("seeds");
  if (seeded) {
    const json& sj = j["seeds"];
    if (!sj.is_array() || sj.empty())
      fail(source, ": 'seeds' must be a non-empty array of seeds, e.g. [1, 2, 3], got ", sj.dump());
    if (find_path(base, "training.seed"))
      fail(source, ": 'base' sets config key 'training.seed', but 'seeds' sets it for every run; "
           "remove one");
    for (const auto& x : sj) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0)
        fail(source, ": 'seeds' must hold non-negative integers, got ", x.dump());
      if (std::count(plan.seeds.begin(), plan.seeds.end(), x.get<int64_t>()))
        fail(source, ": 'seeds' lists ", x.dump(), " twice");
      plan.seeds.push_back(x.get<int64_t>());
    }
  }

  // Modes.
  if (!j.contains("modes") || !j["modes"].is_array() || j["modes"].empty())
    fail(source, ": 'modes' must be a non-empty array, e.g. [{\"mode\": \"baseline\"}, {\"mode\": \"full\"}]");
  std::vector<ModeSpec> modes;
  for (size_t i = 0; i < j["modes"].size(); ++i) {
    modes.push_back(parse_mode(j["modes"][i], i, source));
    forbid_sweep_keys(modes.back().config, "modes[" + std::to_string(i) + "].config", source);
    for (size_t k = 0; k + 1 < modes.size(); ++k)
      if (modes[k].name == modes.back().name)
        fail(source, ": 'modes[", i, "]': two modes are named \"", modes.back().name,
             "\" (give one a \"name\")");
    plan.modes.push_back(modes.back().name);
    if (std::isfinite(modes.back().paper)) plan.paper[modes.back().name] = modes.back().paper;
  }

  // Fit settings.
  std::string baseline;
  for (const auto& m : modes)
    if (baseline.empty() && m.baseline) baseline = m.name;
  if (j.contains("fit")) {
    const json& f = j["fit"];
    check_keys(f, "fit", {"loss", "baseline"}, source);
    plan.fit_loss = get_string(f, "loss", "fit", source, "val", false);
    if (plan.fit_loss != "val" && plan.fit_loss != "train")
      fail(source, ": 'fit.loss' = \"", plan.fit_loss, "\" (expected \"val\" or \"train\")");
    baseline = get_string(f, "baseline", "fit", source, baseline, false);
    if (std::find(plan.modes.begin(), plan.modes.end(), baseline) == plan.modes.end())
      fail(source, ": 'fit.baseline' = \"", baseline, "\" is not one of the modes' names");
  }
  plan.baseline_mode = baseline;
  if (j.contains("ablation")) {
    const json& a = j["ablation"];
    check_keys(a, "ablation", {"reference"}, source);
    plan.ablation_reference = get_string(a, "reference", "ablation", source, "", true);
    if (std::find(plan.modes.begin(), plan.modes.end(), plan.ablation_reference) == plan.modes.end())
      fail(source, ": 'ablation.reference' = \"", plan.ablation_reference,
           "\" is not one of the modes' names");
  }
  if (j.contains("plots")) {
    const json& p = j["plots"];
    check_keys(p, "plots", {"python", "script"}, source);
    plan.python = get_string(p, "python", "plots", source, plan.python, false);
    plan.plot_script = get_string(p, "script", "plots", source, plan.plot_script, false);
  }
  double warmup_fraction = -1;
  if (j.contains("warmup_fraction")) {
    const json& w = j["warmup_fraction"];
    if (!w.is_number() || !(w.get<double>() >= 0 && w.get<double>() < 1))
      fail(source, ": 'warmup_fraction' must be a number in [0, 1), got ", w.dump());
    warmup_fraction = w.get<double>();
  }
  std::vector<int64_t> global_tokens;
  if (j.contains("tokens")) global_tokens = token_list(j["tokens"], "tokens", source);

  // Sizes x modes x budgets.
  if (!j.contains("sizes") || !j["sizes"].is_array() || j["sizes"].empty())
    fail(source, ": 'sizes' must be a non-empty array of {\"name\", \"model\": {...}}");
  std::set<std::string> size_names, run_names;
  for (size_t si = 0; si < j["sizes"].size(); ++si) {
    const json& sz = j["sizes"][si];
    const std::string where = "sizes[" + std::to_string(si) + "]";
    check_keys(sz, where, {"name", "model", "tokens", "config"}, source);
    const std::string size_name = get_string(sz, "name", where, source, "", true);
    check_name(size_name, where + ".name", source);
    if (!size_names.insert(size_name).second)
      fail(source, ": '", where, ".name': two sizes are named \"", size_name, "\"");
    if (!sz.contains("model") || !sz["model"].is_object())
      fail(source, ": '", where, ".model' must be an object of model keys (d_model, n_layers, ...)");
    if (sz["model"].contains("residual"))
      fail(source, ": '", where, ".model.residual': residual settings come from 'modes'");
    std::vector<int64_t> budgets = global_tokens;
    if (sz.contains("tokens")) budgets = token_list(sz["tokens"], where + ".tokens", source);
    if (budgets.empty())
      fail(source, ": '", where, "' has no token budgets: give the sweep a 'tokens' list or the size one");
    json size_base = base;
    if (sz.contains("config")) {
      if (!sz["config"].is_object()) fail(source, ": '", where, ".config' must be an object");
      if (sz["config"].contains("model"))
        fail(source, ": '", where, ".config.model': put model keys in '", where, ".model'");
      forbid_sweep_keys(sz["config"], where + ".config", source);
      size_base.merge_patch(sz["config"]);
    }
    size_base["model"].merge_patch(sz["model"]);

    for (const auto& mode : modes)
      for (int64_t budget : budgets)
        for (size_t k = 0; k < (seeded ? plan.seeds.size() : 1); ++k) {
          RunSpec spec{size_name, size_base, mode, budget, seeded, seeded ? plan.seeds[k] : 0};
          SweepRun run = make_run(plan, spec, warmup_fraction);
          if (!run_names.insert(run.name).second)
            fail(source, ": two runs would be named \"", run.name, "\" (token budgets of size \"",
                 size_name, "\" that agree to three digits); make the budgets more distinct");
          plan.runs.push_back(std::move(run));
        }
  }
  if (!seeded) plan.seeds = {plan.runs.front().seed};
  // The ablation table compares one point per mode (one size, one budget):
  // equal compute, the seeds its replicates.
  if (!plan.ablation_reference.empty() &&
      plan.runs.size() != plan.modes.size() * plan.seeds.size())
    fail(source, ": 'ablation' compares the modes at one point (one size and one token budget, "
         "the same for every mode); this sweep has ", plan.runs.size() / plan.modes.size() / plan.seeds.size(),
         " points per mode");
  return plan;
}

SweepPlan load_sweep(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream f(path);
  if (!f) fail(path, ": cannot open sweep file");
  json j;
  try {
    j = json::parse(f, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
  return parse_sweep(j, path, overrides);
}

}  // namespace attnres::train
