#include "train/sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"
#include "model/params.h"
#include "parallel/mpi.h"
#include "train/checkpoint_io.h"
#include "train/trainer.h"

namespace attnres::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ---------------------------------------------------------------------------
// The sweep file
// ---------------------------------------------------------------------------

// Keys the sweep sets for every run itself; a base config or a size that sets
// them is an error rather than silently overridden.
const std::vector<std::string> kSweepOwnedKeys = {"model.residual", "training.steps", "run.dir",
                                                  "checkpoint.dir", "checkpoint.resume"};

// Keys that may change between invocations without invalidating a run that
// already started or finished (bookkeeping, not the function trained).
const std::set<std::string> kBookkeepingKeys = {"run.stop_after", "run.log_every",
                                                "run.depth_stats_every", "checkpoint.every",
                                                "checkpoint.keep_last"};

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

// Flattened "a.b.c" -> value for comparing two configs key by key.
void flatten(const json& j, const std::string& prefix, std::map<std::string, json>& out) {
  if (j.is_object() && !j.empty()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else {
    out[prefix] = j;
  }
}

// The first key (outside kBookkeepingKeys) whose value differs, or "".
std::string first_difference(const json& a, const json& b) {
  std::map<std::string, json> fa, fb;
  flatten(a, "", fa);
  flatten(b, "", fb);
  std::set<std::string> keys;
  for (const auto& kv : fa) keys.insert(kv.first);
  for (const auto& kv : fb) keys.insert(kv.first);
  for (const auto& k : keys) {
    if (kBookkeepingKeys.count(k)) continue;
    auto ia = fa.find(k), ib = fb.find(k);
    const std::string va = ia == fa.end() ? "(absent)" : ia->second.dump();
    const std::string vb = ib == fb.end() ? "(absent)" : ib->second.dump();
    if (va != vb) return "config key '" + k + "': " + va + " -> " + vb;
  }
  return "";
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
};

ModeSpec parse_mode(const json& m, size_t i, const std::string& source) {
  const std::string where = "modes[" + std::to_string(i) + "]";
  check_keys(m, where, {"name", "mode", "block_size", "n_blocks"}, source);
  ModeSpec spec;
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
  run.params = model::non_embedding_params(c.model);
  run.params_total = model::total_params(c.model);
  run.flops = 6.0 * static_cast<double>(run.params) * static_cast<double>(run.tokens);
  return run;
}

}  // namespace

SweepPlan parse_sweep(const json& j, const std::string& source,
                      const std::vector<std::string>& overrides) {
  check_keys(j, "", {"description", "out_dir", "base", "sizes", "modes", "tokens", "seeds",
                     "warmup_fraction", "fit", "plots"}, source);
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
    for (size_t k = 0; k + 1 < modes.size(); ++k)
      if (modes[k].name == modes.back().name)
        fail(source, ": 'modes[", i, "]': two modes are named \"", modes.back().name,
             "\" (give one a \"name\")");
    plan.modes.push_back(modes.back().name);
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

// ---------------------------------------------------------------------------
// Run outcomes
// ---------------------------------------------------------------------------

namespace {

std::string result_path(const SweepRun& r) { return (fs::path(r.dir) / "result.json").string(); }
std::string config_path(const SweepRun& r) { return (fs::path(r.dir) / "config.json").string(); }
std::string metrics_path(const SweepRun& r) { return (fs::path(r.dir) / "metrics.jsonl").string(); }

json num_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
double num_or_nan(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

json outcome_json(const RunOutcome& o) {
  return {{"status", o.status},
          {"step", o.step},
          {"train_loss", num_or_null(o.train_loss)},
          {"train_loss_avg", num_or_null(o.train_loss_avg)},
          {"val_loss", num_or_null(o.val_loss)},
          {"wall_sec", o.wall_sec}};
}

}  // namespace

RunOutcome outcome_from_metrics(const std::string& path, int64_t steps) {
  RunOutcome o;
  o.status = "new";
  if (!fs::exists(path)) return o;
  std::ifstream f(path);
  if (!f) fail(path, ": cannot open");
  // A run resumed from a checkpoint older than its last logged step logs
  // those steps again (with the same values: resume is exact), so later
  // records win.
  std::map<int64_t, double> loss, val;
  double prev_elapsed = -1;
  int64_t prev_step = -1;
  std::string line;
  for (int64_t ln = 1; std::getline(f, line); ++ln) {
    if (line.empty()) continue;
    json r;
    try {
      r = json::parse(line);
    } catch (const json::parse_error&) {
      // A crash can leave a torn last line; anything else is damage.
      if (f.peek() == EOF) break;
      fail(path, ":", ln, ": not a JSON record");
    }
    if (!r.contains("step")) continue;
    const int64_t step = r["step"].get<int64_t>();
    if (r.contains("val_loss")) val[step] = num_or_nan(r, "val_loss");
    if (!r.contains("loss")) continue;
    loss[step] = num_or_nan(r, "loss");
    // Each invocation's elapsed_sec restarts at 0: sum the segments.
    const double elapsed = num_or_nan(r, "elapsed_sec");
    if (step <= prev_step || elapsed < prev_elapsed) o.wall_sec += prev_elapsed;
    prev_elapsed = std::isfinite(elapsed) ? elapsed : prev_elapsed;
    prev_step = step;
  }
  if (prev_elapsed > 0) o.wall_sec += prev_elapsed;
  if (loss.empty()) return o;
  o.step = loss.rbegin()->first;
  o.status = o.step >= steps ? "done" : "partial";
  if (auto it = loss.find(steps); it != loss.end()) o.train_loss = it->second;
  const int64_t window = std::max<int64_t>(1, steps / 10);
  double sum = 0;
  int64_t n = 0;
  for (auto it = loss.lower_bound(steps - window + 1); it != loss.end() && it->first <= steps; ++it)
    sum += it->second, ++n;
  if (n > 0 && o.status == "done") o.train_loss_avg = sum / n;
  if (auto it = val.find(steps); it != val.end()) o.val_loss = it->second;
  return o;
}

RunOutcome read_outcome(const SweepRun& run) {
  if (fs::exists(result_path(run))) {
    const json r = json::parse(read_text_file(result_path(run)));
    RunOutcome o;
    o.status = r.value("status", "done");
    o.step = r.value("step", int64_t{0});
    o.train_loss = num_or_nan(r, "train_loss");
    o.train_loss_avg = num_or_nan(r, "train_loss_avg");
    o.val_loss = num_or_nan(r, "val_loss");
    o.wall_sec = r.value("wall_sec", 0.0);
    return o;
  }
  RunOutcome o = outcome_from_metrics(metrics_path(run), run.steps);
  // Not finished (no result.json yet) but with checkpoints: it will resume.
  if (o.status == "new" && !list_checkpoints(run.config.checkpoint.dir).empty()) o.status = "partial";
  return o;
}

// ---------------------------------------------------------------------------
// Fits and tables
// ---------------------------------------------------------------------------

namespace {

double run_loss(const SweepPlan& plan, const RunOutcome& o) {
  return plan.fit_loss == "val" ? o.val_loss : o.train_loss;
}

std::string fmt_g(double v, int digits = 4) {
  if (!std::isfinite(v)) return "-";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

}  // namespace

namespace {

// A grid point of one mode and the completed seeds behind it.
struct Point {
  std::string name, size;
  int64_t budget = 0, tokens = 0;
  SeedLosses losses;
  json runs = json::array();
};

// Per mode (in file order), its points with at least one completed seed, in
// grid order.
std::map<std::string, std::vector<Point>> collect_points(const SweepPlan& plan,
                                                         const std::vector<RunOutcome>& outcomes) {
  std::map<std::string, std::vector<Point>> points;
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    const auto& r = plan.runs[i];
    const double loss = run_loss(plan, outcomes[i]);
    if (outcomes[i].status != "done" || !std::isfinite(loss)) continue;
    auto& list = points[r.mode];
    auto it = std::find_if(list.begin(), list.end(), [&](const Point& p) { return p.name == r.point; });
    if (it == list.end()) {
      list.push_back({r.point, r.size, r.budget, r.tokens, {r.flops / kFlopsPerPflopsDay, {}}});
      it = list.end() - 1;
    }
    it->losses.losses.push_back(loss);
    it->runs.push_back(r.name);
  }
  return points;
}

std::vector<SeedLosses> losses_of(const std::vector<Point>& points) {
  std::vector<SeedLosses> out;
  for (const auto& p : points) out.push_back(p.losses);
  return out;
}

// The generator seed of the multipliers' bootstrap: fixed, so a report is reproducible.
constexpr uint64_t kBootstrapSeed = 0x5eed5;

}  // namespace

json fit_sweep(const SweepPlan& plan, const std::vector<RunOutcome>& outcomes) {
  ATTNRES_CHECK(outcomes.size() == plan.runs.size(), "fit_sweep: one outcome per run");
  json out = {{"loss", plan.fit_loss == "val" ? "val_loss" : "train_loss"},
              {"compute_unit", "PFLOP/s-days"},
              {"flops_per_unit", kFlopsPerPflopsDay},
              {"law", "L = A * C^-alpha, least squares of ln L on ln C through the points' mean "
                      "losses over their seeds"},
              {"seeds", plan.seeds},
              {"interval", {{"level", 0.95},
                            {"method", "percentile bootstrap over seeds, pooled relative "
                                       "residuals (docs/sweeps.md)"},
                            {"replicates", plan.bootstrap},
                            {"rng_seed", kBootstrapSeed}}},
              {"baseline", plan.baseline_mode},
              {"modes", json::object()},
              {"multipliers", json::array()},
              {"summary", json::object()}};
  const auto points = collect_points(plan, outcomes);
  std::vector<std::vector<SeedLosses>> all;
  for (const auto& [mode, list] : points) all.push_back(losses_of(list));

  std::map<std::string, PowerLawFit> fits;
  for (const auto& mode : plan.modes) {
    const auto it = points.find(mode);
    const std::vector<Point> list = it == points.end() ? std::vector<Point>{} : it->second;
    json m = {{"points", json::array()}};
    for (const auto& p : list)
      m["points"].push_back({{"point", p.name}, {"size", p.size}, {"tokens", p.tokens},
                             {"compute", p.losses.compute}, {"loss", p.losses.mean()},
                             {"loss_se", num_or_null(p.losses.standard_error())},
                             {"seeds", p.losses.losses.size()}, {"runs", p.runs}});
    try {
      const PowerLawFit f = fit_means(losses_of(list), "mode " + mode);
      for (size_t k = 0; k < list.size(); ++k) {
        m["points"][k]["fitted"] = f.predict(list[k].losses.compute);
        m["points"][k]["residual_ln"] = f.residuals[k];
      }
      m.update({{"A", f.A}, {"alpha", f.alpha}, {"r2", f.r2}, {"rmse_ln", f.rmse}, {"n", f.n}});
      fits[mode] = f;
    } catch (const Error& e) {
      m["error"] = e.what();
    }
    out["modes"][mode] = m;
  }

  // Multipliers: for every point of an AttnRes mode, the baseline line's
  // compute for the point's mean loss over the compute it used (and the same
  // from the mode's own line), with a bootstrap interval over seeds.
  auto base = fits.find(plan.baseline_mode);
  if (plan.baseline_mode.empty()) {
    out["multipliers_error"] = "no baseline mode in the sweep";
    return out;
  }
  if (base == fits.end()) {
    out["multipliers_error"] = "the baseline fit failed: " +
                               out["modes"][plan.baseline_mode].value("error", std::string("no points"));
    return out;
  }
  const std::vector<Point>& base_points = points.at(plan.baseline_mode);
  for (const auto& mode : plan.modes) {
    if (mode == plan.baseline_mode || !points.count(mode)) continue;
    const std::vector<Point>& list = points.at(mode);
    MultiplierEstimate est;
    try {
      est = estimate_multiplier(base->second, losses_of(list));
    } catch (const Error& e) {
      out["summary"][mode] = {{"error", e.what()}};
      continue;
    }
    const MultiplierInterval ci = bootstrap_multiplier(losses_of(base_points), losses_of(list), all,
                                                       plan.bootstrap, kBootstrapSeed);
    auto interval = [](const Interval& i) {
      return std::isfinite(i.lo) ? json::array({i.lo, i.hi}) : json(nullptr);
    };
    for (size_t k = 0; k < list.size(); ++k) {
      const Point& p = list[k];
      json row = {{"mode", mode}, {"point", p.name}, {"size", p.size}, {"tokens", p.tokens},
                  {"compute", p.losses.compute}, {"loss", p.losses.mean()},
                  {"loss_se", num_or_null(p.losses.standard_error())},
                  {"seeds", p.losses.losses.size()},
                  {"multiplier_measured", est.per_point[k]},
                  {"ci95", interval(ci.per_point[k])}};
      for (const auto& b : base_points)  // the baseline point of the same size and budget
        if (b.size == p.size && b.budget == p.budget) row["baseline_loss"] = b.losses.mean();
      if (auto f = fits.find(mode); f != fits.end())
        row["multiplier_fit"] = compute_multiplier(base->second, f->second.predict(p.losses.compute),
                                                   p.losses.compute);
      out["multipliers"].push_back(row);
    }
    json summary = {{"geomean_multiplier_measured", est.geomean}, {"points", list.size()},
                    {"ci95", interval(ci.geomean)}};
    std::string verdict;
    if (!std::isfinite(ci.geomean.lo)) {
      verdict = plan.seeds.size() < 2
                    ? "no interval: one seed per point (give the sweep \"seeds\")"
                    : "no interval yet: no point has two completed seeds";
    } else {
      summary["distinguished_from_1"] = ci.geomean.excludes(1.0);
      verdict = ci.geomean.lo > 1.0   ? "ahead of " + plan.baseline_mode + " at 95%"
                : ci.geomean.hi < 1.0 ? "behind " + plan.baseline_mode + " at 95%"
                                      : "not distinguishable from " + plan.baseline_mode + " at 95%";
      if (ci.failed > 0)
        verdict += " (" + std::to_string(ci.failed) + " of " + std::to_string(ci.replicates) +
                   " replicates had no falling baseline line and are left out)";
    }
    summary["verdict"] = verdict;
    out["summary"][mode] = summary;
  }
  return out;
}

std::string fits_table(const json& fits) {
  std::ostringstream os;
  os << "power-law fits L = A * C^-alpha  (C in PFLOP/s-days, L = final "
     << fits.value("loss", std::string("val_loss")) << ", mean over "
     << fits.value("seeds", json::array()).size() << " seed(s) per point)\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-14s %6s %12s %10s %8s %10s\n", "mode", "points", "A", "alpha",
                "R^2", "rmse(lnL)");
  os << buf;
  for (auto it = fits["modes"].begin(); it != fits["modes"].end(); ++it) {
    const json& m = it.value();
    if (m.contains("error")) {
      os << "  " << it.key() << ": no fit: " << m["error"].get<std::string>() << "\n";
      continue;
    }
    std::snprintf(buf, sizeof buf, "  %-14s %6lld %12.6g %10.5f %8.4f %10.5f\n", it.key().c_str(),
                  (long long)m["n"].get<int64_t>(), m["A"].get<double>(), m["alpha"].get<double>(),
                  m["r2"].get<double>(), m["rmse_ln"].get<double>());
    os << buf;
  }
  if (fits.contains("multipliers_error")) {
    os << "compute multipliers: " << fits["multipliers_error"].get<std::string>() << "\n";
    return os.str();
  }
  const std::string base = fits.value("baseline", std::string());
  os << "compute multiplier over " << base
     << " (baseline compute for the same loss / compute used; > 1 = ahead of the baseline)\n";
  std::snprintf(buf, sizeof buf, "  %-12s %-24s %10s %9s %8s %9s %10s %15s %8s\n", "mode", "point",
                "C", "loss", "+-se", "baseline", "x measured", "95% interval", "x fit");
  os << buf;
  auto num = [](const json& r, const char* k) {
    return r.contains(k) && r[k].is_number() ? r[k].get<double>() : NAN;
  };
  auto interval = [](const json& ci) {
    return ci.is_array() ? fmt_g(ci[0].get<double>(), 3) + " - " + fmt_g(ci[1].get<double>(), 3)
                         : std::string("-");
  };
  for (const auto& r : fits["multipliers"]) {
    std::snprintf(buf, sizeof buf, "  %-12s %-24s %10.4g %9.4f %8s %9s %10s %15s %8s\n",
                  r["mode"].get<std::string>().c_str(), r["point"].get<std::string>().c_str(),
                  num(r, "compute"), num(r, "loss"), fmt_g(num(r, "loss_se"), 2).c_str(),
                  fmt_g(num(r, "baseline_loss")).c_str(),
                  fmt_g(num(r, "multiplier_measured"), 3).c_str(),
                  interval(r.value("ci95", json())).c_str(),
                  fmt_g(num(r, "multiplier_fit"), 3).c_str());
    os << buf;
  }
  for (auto it = fits["summary"].begin(); it != fits["summary"].end(); ++it) {
    const json& s = it.value();
    if (s.contains("error")) {
      os << "  " << it.key() << ": " << s["error"].get<std::string>() << "\n";
      continue;
    }
    os << "  " << it.key() << ": " << fmt_g(s["geomean_multiplier_measured"].get<double>(), 3)
       << "x (geometric mean over " << s["points"].get<int>() << " points), 95% interval "
       << interval(s.value("ci95", json())) << ": " << s["verdict"].get<std::string>() << "\n";
  }
  return os.str();
}

std::string results_csv(const SweepPlan& plan, const std::vector<RunOutcome>& outcomes) {
  std::ostringstream os;
  os << "run,point,size,mode,seed,residual,block_size,n_blocks,d_model,n_layers,n_heads,n_kv_heads,d_ff,"
        "params,params_total,tokens,steps,flops,pflops_days,train_loss,train_loss_avg,val_loss,"
        "wall_sec,status\n";
  auto num = [](double v) { return std::isfinite(v) ? fmt_g(v, 9) : std::string(); };
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    const auto& r = plan.runs[i];
    const auto& m = r.config.model;
    const auto& o = outcomes[i];
    std::string S, N;
    if (m.attnres()) {
      const int64_t s = m.resolved_block_size();
      S = std::to_string(s);
      N = std::to_string((m.n_sublayers() + s - 1) / s);
    }
    os << r.name << ',' << r.point << ',' << r.size << ',' << r.mode << ',' << r.seed << ','
       << model::residual_mode_name(m.mode) << ',' << S << ',' << N << ',' << m.d_model << ',' << m.n_layers << ',' << m.n_heads << ','
       << m.n_kv_heads << ',' << m.d_ff << ',' << r.params << ',' << r.params_total << ','
       << r.tokens << ',' << r.steps << ',' << fmt_g(r.flops, 9) << ','
       << fmt_g(r.flops / kFlopsPerPflopsDay, 9) << ',' << num(o.train_loss) << ','
       << num(o.train_loss_avg) << ',' << num(o.val_loss) << ',' << fmt_g(o.wall_sec, 6) << ','
       << o.status << '\n';
  }
  return os.str();
}

std::string plan_table(const SweepPlan& plan, const std::vector<RunOutcome>& outcomes) {
  std::ostringstream os;
  char buf[320];
  std::snprintf(buf, sizeof buf, "%-28s %-9s %3s %5s %4s %5s %11s %13s %7s %10s %10s  %s\n", "run",
                "residual", "S", "d", "L", "H", "params", "tokens", "steps", "C (FLOPs)",
                "PF-days", "status");
  os << buf;
  double total = 0;
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    const auto& r = plan.runs[i];
    const auto& m = r.config.model;
    total += r.flops;
    std::snprintf(buf, sizeof buf, "%-28s %-9s %3s %5lld %4lld %5lld %11lld %13lld %7lld %10.3e %10.3e  %s\n",
                  r.name.c_str(), model::residual_mode_name(m.mode),
                  m.attnres() ? std::to_string(m.resolved_block_size()).c_str() : "-",
                  (long long)m.d_model, (long long)m.n_layers, (long long)m.n_heads,
                  (long long)r.params, (long long)r.tokens, (long long)r.steps, r.flops,
                  r.flops / kFlopsPerPflopsDay, outcomes[i].status.c_str());
    os << buf;
  }
  std::snprintf(buf, sizeof buf, "%zu runs, %.3e FLOPs (6ND) in all = %.3g PFLOP/s-days\n",
                plan.runs.size(), total, total / kFlopsPerPflopsDay);
  os << buf;
  return os.str();
}

std::string changed_config(const SweepRun& run) {
  const json current = run.config.to_json();
  for (const std::string& p : {config_path(run), result_path(run)}) {
    if (!fs::exists(p)) continue;
    json stored = json::parse(read_text_file(p));
    if (p == result_path(run)) stored = stored.value("config", json::object());
    const std::string diff = first_difference(stored, current);
    if (!diff.empty())
      return "run " + run.name + ": its config changed since it was started (" + diff + ", in " +
             p + "). Delete " + run.dir +
             " to train it again with the new settings, or restore the old value";
  }
  return "";
}

std::vector<std::string> changed_configs(const SweepPlan& plan) {
  std::vector<std::string> changed;
  for (const auto& r : plan.runs)
    if (std::string c = changed_config(r); !c.empty()) changed.push_back(std::move(c));
  return changed;
}

// ---------------------------------------------------------------------------
// Running a sweep
// ---------------------------------------------------------------------------

namespace {

// Single-quoted for /bin/sh.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// What to do with a run, decided on rank 0: "skip" or "train".
std::string decide(const SweepRun& run, bool train) {
  if (fs::exists(result_path(run))) return "skip";
  return train ? "train" : "skip";
}

void write_outputs(const SweepPlan& plan, const SweepOptions& opt) {
  std::vector<RunOutcome> outcomes;
  for (const auto& r : plan.runs) outcomes.push_back(read_outcome(r));
  fs::create_directories(plan.out_dir);
  const std::string csv = (fs::path(plan.out_dir) / "results.csv").string();
  const std::string fits_path = (fs::path(plan.out_dir) / "fits.json").string();
  write_text_file_atomic(csv, results_csv(plan, outcomes));
  const json fits = fit_sweep(plan, outcomes);
  write_text_file_atomic(fits_path, fits.dump(2) + "\n");
  const auto done = std::count_if(outcomes.begin(), outcomes.end(),
                                  [](const RunOutcome& o) { return o.status == "done"; });
  spdlog::info("sweep: {} of {} runs complete; wrote {} and {}", done, plan.runs.size(), csv, fits_path);
  std::printf("%s", fits_table(fits).c_str());
  std::fflush(stdout);
  if (!opt.plots || done == 0) return;
  if (!fs::exists(plan.plot_script)) {
    spdlog::warn("plots skipped: {} not found (run the sweep from the repository root or set "
                 "\"plots\": {{\"script\": ...}} in the sweep file)", plan.plot_script);
    return;
  }
  std::string cmd = shell_quote(plan.python) + " " + shell_quote(plan.plot_script) + " " +
                    shell_quote(plan.out_dir);
  if (!opt.attnres_bin.empty()) cmd += " --attnres " + shell_quote(opt.attnres_bin);
  spdlog::info("plotting: {}", cmd);
  const int rc = std::system(cmd.c_str());
  if (rc != 0)
    spdlog::warn("plots: `{}` failed (status {}); results.csv and fits.json are written", cmd, rc);
  else
    spdlog::info("plots written to {}", (fs::path(plan.out_dir) / "plots").string());
}

}  // namespace

int run_sweep(const SweepPlan& plan, const SweepOptions& opt) {
  // Under mpirun every rank runs every run together (each train() call is one
  // parallel job). MPI can be initialised only once per process, so the
  // sweep holds the session for its whole life; train() adopts it.
  const int launched = parallel::launcher_world_size();
  std::unique_ptr<parallel::MpiSession> mpi;
  if (launched > 1) {
    for (const auto& r : plan.runs)
      if (opt.train && r.config.parallel.pipeline * r.config.parallel.data != launched)
        fail(plan.source, " (run ", r.name, "): parallel.pipeline * parallel.data = ",
             r.config.parallel.pipeline * r.config.parallel.data, " but mpirun started ", launched,
             " processes; every run of a sweep uses the same layout");
    mpi = std::make_unique<parallel::MpiSession>();
    init_logging(mpi->world_rank());
  }
  const bool root = !mpi || mpi->world_rank() == 0;
  // Rank 0 decides from the files; everyone follows.
  auto agree = [&](std::string s) {
    if (mpi) parallel::Comm::world().bcast(s, 0);
    return s;
  };

  // A started run whose config the file now changes: refuse the whole sweep
  // before anything trains (a changed sweep is never mixed with the old one).
  std::string refused;
  if (root) {
    try {
      for (const std::string& c : changed_configs(plan)) refused += (refused.empty() ? "" : "\n") + c;
    } catch (const std::exception& e) {  // e.g. an unreadable stored config: still agree
      refused = e.what();
    }
  }
  refused = agree(refused);
  if (!refused.empty()) fail(refused);

  int rc = 0;
  int64_t trained = 0, skipped = 0, paused = 0;
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    const SweepRun& run = plan.runs[i];
    std::string decision;
    if (root) decision = decide(run, opt.train);
    decision = agree(decision);
    if (decision == "skip") {
      if (opt.train && root) spdlog::info("[{}/{}] {}: complete, skipped", i + 1, plan.runs.size(), run.name);
      ++skipped;
      continue;
    }
    if (root) {
      fs::create_directories(run.dir);
      if (!fs::exists(config_path(run)))
        write_text_file_atomic(config_path(run), run.config.to_json().dump(2) + "\n");
      spdlog::info("[{}/{}] {}: {} residual, {} non-embedding params, {} steps = {} tokens, "
                   "C = {:.3e} FLOPs", i + 1, plan.runs.size(), run.name,
                   model::residual_mode_name(run.config.model.mode), run.params, run.steps,
                   run.tokens, run.flops);
    }
    if (mpi) parallel::Comm::world().barrier();  // config.json exists before anyone trains
    const int code = train(run.config);
    ++trained;
    if (code == kExitNonFinite) {
      if (root) {
        RunOutcome o = outcome_from_metrics(metrics_path(run), run.steps);
        o.status = "diverged";
        json r = outcome_json(o);
        r["config"] = run.config.to_json();
        write_text_file_atomic(result_path(run), r.dump(2) + "\n");
        spdlog::warn("{}: non-finite loss or gradient; recorded as diverged (delete {} to retry)",
                     run.name, run.dir);
      }
      continue;
    }
    if (code != 0) {
      if (root)
        spdlog::warn("sweep stopped during {} (exit code {}); its checkpoint is kept: run the same "
                     "command again to resume", run.name, code);
      rc = code;
      break;
    }
    if (root) {
      RunOutcome o = outcome_from_metrics(metrics_path(run), run.steps);
      if (o.status == "done") {
        json r = outcome_json(o);
        r["config"] = run.config.to_json();
        write_text_file_atomic(result_path(run), r.dump(2) + "\n");
        spdlog::info("{}: done, train loss {:.4f}, val loss {:.4f}, {:.1f} s", run.name,
                     o.train_loss, o.val_loss, o.wall_sec);
      } else {
        // run.stop_after ended this invocation early: the next one resumes.
        ++paused;
        spdlog::info("{}: stopped at step {} of {} (run.stop_after); run the sweep again to continue",
                     run.name, o.step, run.steps);
      }
    }
  }
  if (root) {
    if (opt.train)
      spdlog::info("sweep: {} runs trained or resumed this time, {} already complete{}", trained,
                   skipped, paused ? fmt::format(", {} paused by run.stop_after", paused) : "");
    write_outputs(plan, opt);
  }
  if (mpi) parallel::Comm::world().barrier();
  return rc;
}

}  // namespace attnres::train
