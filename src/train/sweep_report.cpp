#include "train/sweep_report.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <sstream>

#include <boost/math/distributions/students_t.hpp>

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

namespace {
// The mean of xs and its 95% Student-t interval (none below two values).
struct MeanInterval {
  double mean = NAN, lo = NAN, hi = NAN;
  size_t n = 0;
};
MeanInterval t_interval(const std::vector<double>& xs) {
  MeanInterval m;
  m.n = xs.size();
  if (xs.empty()) return m;
  double sum = 0;
  for (double x : xs) sum += x;
  m.mean = sum / static_cast<double>(xs.size());
  if (xs.size() < 2) return m;
  double ss = 0;
  for (double x : xs) ss += (x - m.mean) * (x - m.mean);
  const double n = static_cast<double>(xs.size());
  const boost::math::students_t t(n - 1);
  const double half = boost::math::quantile(boost::math::complement(t, 0.025)) *
                      std::sqrt(ss / (n - 1) / n);
  m.lo = m.mean - half;
  m.hi = m.mean + half;
  return m;
}

json interval_json(const MeanInterval& m) {
  return std::isfinite(m.lo) ? json::array({m.lo, m.hi}) : json(nullptr);
}

// Row minus `other`, seed by seed over the seeds both completed.
json paired_difference(const std::map<int64_t, double>& row, const std::map<int64_t, double>& other,
                       const std::string& other_name, double paper_row, double paper_other) {
  std::vector<double> d;
  for (const auto& [seed, loss] : row)
    if (auto it = other.find(seed); it != other.end()) d.push_back(loss - it->second);
  const MeanInterval m = t_interval(d);
  json out = {{"of", other_name}, {"pairs", m.n}, {"diff", finite_or_null(m.mean)},
              {"ci95", interval_json(m)}};
  out["verdict"] = !std::isfinite(m.lo) ? "no interval (fewer than two paired seeds)"
                   : m.hi < 0           ? "ahead of " + other_name + " at 95%"
                   : m.lo > 0           ? "behind " + other_name + " at 95%"
                                        : "not distinguishable from " + other_name + " at 95%";
  if (std::isfinite(paper_row) && std::isfinite(paper_other)) out["paper_diff"] = paper_row - paper_other;
  return out;
}
}  // namespace

json ablation_sweep(const SweepPlan& plan, const std::vector<RunOutcome>& outcomes) {
  ATTNRES_CHECK(outcomes.size() == plan.runs.size(), "ablation_sweep: one outcome per run");
  std::map<std::string, std::map<int64_t, double>> losses;  // mode -> seed -> final loss
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    const double loss = run_loss(plan, outcomes[i]);
    if (outcomes[i].status == "done" && std::isfinite(loss))
      losses[plan.runs[i].mode][plan.runs[i].seed] = loss;
  }
  auto paper = [&](const std::string& mode) {
    const auto it = plan.paper.find(mode);
    return it == plan.paper.end() ? NAN : it->second;
  };
  const std::string& ref = plan.ablation_reference;
  const std::string& base = plan.baseline_mode;
  json out = {{"loss", plan.fit_loss == "val" ? "val_loss" : "train_loss"},
              {"reference", ref},
              {"baseline", base},
              {"interval", "95%, Student t over seeds; differences paired by seed"},
              {"rows", json::array()}};
  for (const std::string& mode : plan.modes) {
    const auto& mine = losses[mode];
    std::vector<double> xs;
    for (const auto& [seed, loss] : mine) xs.push_back(loss);
    const MeanInterval m = t_interval(xs);
    json row = {{"mode", mode}, {"seeds", m.n}, {"loss", finite_or_null(m.mean)},
                {"ci95", interval_json(m)}, {"paper", finite_or_null(paper(mode))}};
    if (mode != ref) row["vs_reference"] = paired_difference(mine, losses[ref], ref, paper(mode), paper(ref));
    if (!base.empty() && mode != base)
      row["vs_baseline"] = paired_difference(mine, losses[base], base, paper(mode), paper(base));
    out["rows"].push_back(row);
  }
  return out;
}

std::string ablation_table(const json& a) {
  std::ostringstream os;
  const std::string ref = a["reference"].get<std::string>(), base = a["baseline"].get<std::string>();
  os << "ablation table (final " << a["loss"].get<std::string>() << "; " << a["interval"].get<std::string>()
     << "; verdicts: lower loss = ahead)\n";
  auto num = [](const json& j, const char* k) {
    return j.contains(k) && j[k].is_number() ? j[k].get<double>() : NAN;
  };
  auto interval = [](const json& ci) {
    if (!ci.is_array()) return std::string("-");
    char buf[64];
    std::snprintf(buf, sizeof buf, "%+.4f..%+.4f", ci[0].get<double>(), ci[1].get<double>());
    return std::string(buf);
  };
  auto signed4 = [](double v) {
    if (!std::isfinite(v)) return std::string("-");
    char buf[32];
    std::snprintf(buf, sizeof buf, "%+.4f", v);
    return std::string(buf);
  };
  auto verdict = [](const json& d) {
    const std::string v = d["verdict"].get<std::string>();
    return v.rfind("ahead", 0) == 0 ? "ahead" : v.rfind("behind", 0) == 0 ? "behind"
                                             : v.rfind("not", 0) == 0      ? "n.d."
                                                                           : "-";
  };
  put(os, "  %-22s %5s %8s %17s | %8s %17s %6s %8s | %8s %17s %6s %8s | %6s\n", "row", "seeds",
      "loss", "95% interval", ("- " + ref).c_str(), "95% interval", "", "paper",
      ("- " + base).c_str(), "95% interval", "", "paper", "paper");
  for (const json& r : a["rows"]) {
    const double loss = num(r, "loss");
    std::string lo_hi = "-";
    if (r["ci95"].is_array()) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.4f..%.4f", r["ci95"][0].get<double>(), r["ci95"][1].get<double>());
      lo_hi = buf;
    }
    std::string cols[2][4];
    const char* keys[2] = {"vs_reference", "vs_baseline"};
    for (int c = 0; c < 2; ++c) {
      if (!r.contains(keys[c])) {
        for (auto& x : cols[c]) x = "";
        cols[c][0] = "-";
        continue;
      }
      const json& d = r[keys[c]];
      cols[c][0] = signed4(num(d, "diff"));
      cols[c][1] = interval(d["ci95"]);
      cols[c][2] = verdict(d);
      cols[c][3] = signed4(num(d, "paper_diff"));
    }
    put(os, "  %-22s %5lld %8s %17s | %8s %17s %6s %8s | %8s %17s %6s %8s | %6s\n",
        r["mode"].get<std::string>().c_str(), (long long)r["seeds"].get<int64_t>(),
        std::isfinite(loss) ? fmt_g(loss, 5).c_str() : "-", lo_hi.c_str(), cols[0][0].c_str(),
        cols[0][1].c_str(), cols[0][2].c_str(), cols[0][3].c_str(), cols[1][0].c_str(),
        cols[1][1].c_str(), cols[1][2].c_str(), cols[1][3].c_str(),
        std::isfinite(num(r, "paper")) ? fmt_g(num(r, "paper"), 4).c_str() : "-");
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
