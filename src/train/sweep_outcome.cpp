#include "train/sweep_outcome.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "core/fileio.h"
#include "train/checkpoint_io.h"

namespace attnres::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Keys that may change between invocations without invalidating a run that
// already started or finished (bookkeeping, not the function trained).
const std::set<std::string> kBookkeepingKeys = {"run.stop_after", "run.log_every",
                                                "run.depth_stats_every", "checkpoint.every",
                                                "checkpoint.keep_last"};

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

double num_or_nan(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

}  // namespace

json finite_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

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
  if (fs::exists(run.result_file())) {
    const json r = json::parse(read_text_file(run.result_file()));
    RunOutcome o;
    o.status = r.value("status", "done");
    o.step = r.value("step", int64_t{0});
    o.train_loss = num_or_nan(r, "train_loss");
    o.train_loss_avg = num_or_nan(r, "train_loss_avg");
    o.val_loss = num_or_nan(r, "val_loss");
    o.wall_sec = r.value("wall_sec", 0.0);
    return o;
  }
  RunOutcome o = outcome_from_metrics(run.metrics_file(), run.steps);
  // Not finished (no result.json yet) but with checkpoints: it will resume.
  if (o.status == "new" && !list_checkpoints(run.config.checkpoint.dir).empty()) o.status = "partial";
  return o;
}

void write_result(const SweepRun& run, const RunOutcome& o) {
  const json r = {{"status", o.status},
                  {"step", o.step},
                  {"train_loss", finite_or_null(o.train_loss)},
                  {"train_loss_avg", finite_or_null(o.train_loss_avg)},
                  {"val_loss", finite_or_null(o.val_loss)},
                  {"wall_sec", o.wall_sec},
                  {"config", run.config.to_json()}};
  write_text_file_atomic(run.result_file(), r.dump(2) + "\n");
}

std::string changed_config(const SweepRun& run) {
  const json current = run.config.to_json();
  for (const std::string& p : {run.config_file(), run.result_file()}) {
    if (!fs::exists(p)) continue;
    json stored = json::parse(read_text_file(p));
    if (p == run.result_file()) stored = stored.value("config", json::object());
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

}  // namespace attnres::train
