#include "train/sweep_report.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/error.h"
#include "train/fit.h"

namespace attnres::train {

using nlohmann::json;

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

// printf onto a table being built (a C variadic, so the compiler checks the
// arguments against the format).
__attribute__((format(printf, 2, 3))) void put(std::ostringstream& os, const char* format, ...) {
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  std::string line(static_cast<size_t>(std::vsnprintf(nullptr, 0, format, args)), '\0');
  std::vsnprintf(line.data(), line.size() + 1, format, again);
  va_end(again);
  va_end(args);
  os << line;
}

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
                             {"loss_se", finite_or_null(p.losses.standard_error())},
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
                  {"loss_se", finite_or_null(p.losses.standard_error())},
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
  put(os, "  %-14s %6s %12s %10s %8s %10s\n", "mode", "points", "A", "alpha", "R^2", "rmse(lnL)");
  for (auto it = fits["modes"].begin(); it != fits["modes"].end(); ++it) {
    const json& m = it.value();
    if (m.contains("error")) {
      os << "  " << it.key() << ": no fit: " << m["error"].get<std::string>() << "\n";
      continue;
    }
    put(os, "  %-14s %6lld %12.6g %10.5f %8.4f %10.5f\n", it.key().c_str(),
                  (long long)m["n"].get<int64_t>(), m["A"].get<double>(), m["alpha"].get<double>(),
                  m["r2"].get<double>(), m["rmse_ln"].get<double>());
  }
  if (fits.contains("multipliers_error")) {
    os << "compute multipliers: " << fits["multipliers_error"].get<std::string>() << "\n";
    return os.str();
  }
  const std::string base = fits.value("baseline", std::string());
  os << "compute multiplier over " << base
     << " (baseline compute for the same loss / compute used; > 1 = ahead of the baseline)\n";
  put(os, "  %-12s %-24s %10s %9s %8s %9s %10s %15s %8s\n", "mode", "point",
                "C", "loss", "+-se", "baseline", "x measured", "95% interval", "x fit");
  auto num = [](const json& r, const char* k) {
    return r.contains(k) && r[k].is_number() ? r[k].get<double>() : NAN;
  };
  auto interval = [](const json& ci) {
    return ci.is_array() ? fmt_g(ci[0].get<double>(), 3) + " - " + fmt_g(ci[1].get<double>(), 3)
                         : std::string("-");
  };
  for (const auto& r : fits["multipliers"]) {
    put(os, "  %-12s %-24s %10.4g %9.4f %8s %9s %10s %15s %8s\n",
                  r["mode"].get<std::string>().c_str(), r["point"].get<std::string>().c_str(),
                  num(r, "compute"), num(r, "loss"), fmt_g(num(r, "loss_se"), 2).c_str(),
                  fmt_g(num(r, "baseline_loss")).c_str(),
                  fmt_g(num(r, "multiplier_measured"), 3).c_str(),
                  interval(r.value("ci95", json())).c_str(),
                  fmt_g(num(r, "multiplier_fit"), 3).c_str());
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
      S = std::to_string(m.resolved_block_size());
      N = std::to_string(m.resolved_n_blocks());
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
  put(os, "%-28s %-9s %3s %5s %4s %5s %11s %13s %7s %10s %10s  %s\n", "run",
                "residual", "S", "d", "L", "H", "params", "tokens", "steps", "C (FLOPs)",
                "PF-days", "status");
  double total = 0;
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    const auto& r = plan.runs[i];
    const auto& m = r.config.model;
    total += r.flops;
    put(os, "%-28s %-9s %3s %5lld %4lld %5lld %11lld %13lld %7lld %10.3e %10.3e  %s\n",
                  r.name.c_str(), model::residual_mode_name(m.mode),
                  m.attnres() ? std::to_string(m.resolved_block_size()).c_str() : "-",
                  (long long)m.d_model, (long long)m.n_layers, (long long)m.n_heads,
                  (long long)r.params, (long long)r.tokens, (long long)r.steps, r.flops,
                  r.flops / kFlopsPerPflopsDay, outcomes[i].status.c_str());
  }
  put(os, "%zu runs, %.3e FLOPs (6ND) in all = %.3g PFLOP/s-days\n",
                plan.runs.size(), total, total / kFlopsPerPflopsDay);
  return os.str();
}

}  // namespace attnres::train
