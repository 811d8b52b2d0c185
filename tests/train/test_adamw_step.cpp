// train::Optimizer::step (clipping factor, the weight-decay mask, ZeRO-1 slices)
// against an independent reference: PyTorch's torch.nn.utils.clip_grad_norm_
// followed by torch.optim.AdamW, written out below in plain double-precision
// C++ from their documented algorithms and docs/model.md section 4, sharing no
// code with src/ (no kernels, no Param::decay: the reference decides decay
// from each tensor's shape itself).
//
// The table is a real model's (make_params of a tiny Full AttnRes config):
// 2-D matrices, which are decayed, and 1-D norm gains and AttnRes queries,
// which are not. Weights, gradients and the learning rate change every step;
// the gradients' global norm is below the clip on some steps and far above it
// (by different factors) on others. That matters: Adam is nearly invariant to
// a constant scale of g (m / sqrt(v) cancels it whenever eps << |g|), so a
// wrong clip factor shows in the weights only when the factor changes from
// step to step or eps is not negligible; it shows in the first moment m = the
// clipped gradients' running mean at once, so m and v are checked too.
//
// bf16 master weights (the optimizer updating fp32 masters and writing the
// bf16 copies) run on CUDA (tests/gpu/test_adamw.cpp and the GPU model tests);
// this file is CPU-only, where the last case builds a bf16 table by hand.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "kernels/reduce.h"
#include "model/config.h"
#include "model/model_testing.h"
#include "model/params.h"
#include "parallel/zero.h"
#include "testing.h"
#include "train/optimizer.h"

using namespace attnres;
using namespace attnres::testing;

namespace {

// ---------------------------------------------------------------------------
// The reference, in double, on plain vectors.
// ---------------------------------------------------------------------------

struct RefTensor {
  std::string name;
  bool decay;                      // decided here from the shape: >= 2 dims
  std::vector<double> p, m, v;     // weights and the two moments
  std::vector<double> m_terms;     // running sum of the |terms| behind m (for tolerances)
};

struct RefOptions {
  double beta1, beta2, eps, weight_decay, max_norm;
};

// clip_grad_norm_ (total L2 norm over every gradient), in docs/model.md's
// form: when max_norm > 0 and norm > max_norm, every gradient is multiplied by
// max_norm / (norm + 1e-6). PyTorch computes clip_coef = max_norm / (norm +
// 1e-6) and multiplies by min(clip_coef, 1) always; the two differ only for
// norm in (max_norm - 1e-6, max_norm], where PyTorch scales by a factor just
// below 1 and the repo does not. The test's norms stay far from that window.
// Returns the factor applied.
double ref_clip(std::vector<std::vector<double>>& grads, double max_norm) {
  double sq = 0;
  for (const auto& g : grads)
    for (double x : g) sq += x * x;
  const double norm = std::sqrt(sq);
  const double factor = max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
  for (auto& g : grads)
    for (double& x : g) x *= factor;
  return factor;
}

// torch.optim.AdamW's step t (1-based) on one tensor with its (clipped)
// gradient g, as docs/model.md section 4 writes it:
//   p *= 1 - lr wd                (decoupled decay; only tensors of >= 2 dims)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
void ref_adamw(RefTensor& r, const std::vector<double>& g, double lr, int t, const RefOptions& o) {
  const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
  for (size_t i = 0; i < r.p.size(); ++i) {
    if (r.decay) r.p[i] *= 1 - lr * o.weight_decay;
    r.m[i] = o.beta1 * r.m[i] + (1 - o.beta1) * g[i];
    r.m_terms[i] = o.beta1 * r.m_terms[i] + (1 - o.beta1) * std::fabs(g[i]);
    r.v[i] = o.beta2 * r.v[i] + (1 - o.beta2) * g[i] * g[i];
    r.p[i] -= lr * (r.m[i] / bc1) / (std::sqrt(r.v[i] / bc2) + o.eps);
  }
}

// ---------------------------------------------------------------------------
// The scenario.
// ---------------------------------------------------------------------------

// A tiny Full AttnRes model: its table has the embedding, the projections and
// the LM head (2-D), and the norm gains, the per-sublayer queries and the
// final query (1-D). 664 elements, so D = 3 cuts tensors mid-way.
model::ModelConfig tiny_config() {
  return testing::resized(testing::tiny(model::ResidualMode::Full, 0, 0, false, /*layers=*/1), 11, 8, 2, 1, 10);
}

// Global gradient norms of the steps, against a clip of `clip`: below it,
// above it by 3x, 10x, below again, above by 2x. The learning rate changes
// each step too, as a schedule's would.
const double kNormOverClip[] = {0.5, 3.0, 10.0, 0.8, 2.0};
double lr_at(int step) { return 0.02 * (1 + 0.5 * step); }

// The gradients of step k: random N(0, 1) per tensor (seeded by tensor and
// step, never zero), then scaled so that their global norm (in double) is
// `target`; returned in double, exactly the values the optimizer sees after
// rounding to `dtype`.
std::vector<std::vector<double>> make_grads(const model::ParamTable& t, int step, double target,
                                            DType dtype) {
  std::vector<std::vector<double>> g;
  double sq = 0;
  for (size_t i = 0; i < t.all().size(); ++i) {
    const Tensor r = randn({t.all()[i].value.numel()}, 1000 * (step + 1) + i, DType::F64);
    g.emplace_back();
    for (int64_t j = 0; j < r.numel(); ++j) g.back().push_back(at(r, j));
    for (double x : g.back()) sq += x * x;
  }
  const double s = target / std::sqrt(sq);
  for (auto& x : g)
    for (double& y : x) y = dtype == DType::F32 ? double(float(y * s)) : y * s;
  return g;
}

std::string fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

void set_values(Tensor& t, const std::vector<double>& v) {
  REQUIRE(static_cast<int64_t>(v.size()) == t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) set(t, i, v[i]);
}

// Tolerances (docs/testing.md: scaled by the terms, never relative-only where
// a value can be near zero). A weight after k steps is its start times the
// decay factors minus k updates of size about lr each (|m_hat| / sqrt(v_hat)
// is O(1) for b1^2 < b2), so its terms are |p| + the sum of the learning
// rates. fp64 carries ~1e-16 per operation (the fp64 runs pass at 1e-14);
// fp32 ~6e-8, and a few dozen operations over 5 steps plus the clip factor
// rounded to fp32 (kernels/adamw.h) came to between 2e-7 and 6e-7 of that
// scale here: 2e-6 leaves a margin of 3 or more. A wrong decay (wd = 0.1, lr >= 0.02) moves a weight by
// >= 2e-3 |p| per step; a wrong clip factor moves m by a factor of 3 or more.
double tol_of(DType dt) { return dt == DType::F64 ? 1e-12 : 2e-6; }

struct Mismatch {
  int64_t count = 0;
  std::string first;
  void check(bool ok, const std::string& what) {
    if (ok) return;
    if (count++ == 0) first = what;
  }
};

// |got - want| <= tol * scale, false for NaN.
bool close(double got, double want, double tol, double scale) {
  return std::fabs(got - want) <= tol * scale;
}

// Runs the scenario through `replicas` AdamW optimizers (one with no shard,
// or D with one ZeroShard each, every replica on its own copy of the table
// as ZeRO-1's data-parallel ranks are) and the reference; after each step,
// compares every element each replica owns: weight, first and second moment.
void run_scenario(DType dt, const train::OptimizerConfig& oc, int D,
                  const model::ModelConfig& cfg = tiny_config()) {
  const int replicas = D == 0 ? 1 : D;

  // The reference's tensors: random weights (the gains and queries too, which
  // start at 1 and 0 in a real run: random values make their decay visible),
  // decay decided from the shape alone.
  std::vector<RefTensor> ref;
  {
    model::ParamTable shape_of = model::make_params(cfg, DType::F64);
    for (size_t i = 0; i < shape_of.all().size(); ++i) {
      const model::Param& p = shape_of.all()[i];
      const Tensor w = randn({p.value.numel()}, 77 + i, DType::F64, 0.5);
      // Decayed: two or more dims, but the depth Mix's parameters (an input
      // query's W_l [d, d], docs/model.md "Residual variants").
      const bool depth = p.name.find("_res.") != std::string::npos;
      RefTensor r{p.name, p.value.shape().size() >= 2 && !depth, {}, {}, {}, {}};
      for (int64_t j = 0; j < w.numel(); ++j)
        r.p.push_back(dt == DType::F32 ? double(float(at(w, j))) : at(w, j));
      r.m.assign(r.p.size(), 0.0);
      r.v.assign(r.p.size(), 0.0);
      r.m_terms.assign(r.p.size(), 0.0);
      ref.push_back(std::move(r));
    }
  }
  // The scenario must hold both kinds of tensors, named as docs/model.md
  // section 3 names them.
  int n_gains = 0, n_queries = 0, n_matrices = 0;
  for (const auto& r : ref) {
    const bool gain = r.name.find("layernorm.weight") != std::string::npos || r.name == "model.norm.weight";
    const bool query = r.name.find(".query") != std::string::npos;  // w_l, or W_l (query_proj)
    n_gains += gain;
    n_queries += query;
    n_matrices += r.decay;
    CHECK(r.decay == !(gain || query));  // the doc's list of undecayed tensors is the 1-D ones
  }
  REQUIRE(n_gains == 3);
  REQUIRE(n_queries == 3);
  REQUIRE(n_matrices == 9);
  const bool input_query = cfg.variant.query == model::MixQuery::Input;
  REQUIRE(std::count_if(ref.begin(), ref.end(), [](const RefTensor& r) {
            return r.name.find("query_proj.weight") != std::string::npos;
          }) == (input_query ? 3 : 0));

  // The replicas: each its own table with the same starting weights.
  std::vector<model::ParamTable> tables;
  for (int r = 0; r < replicas; ++r) {
    tables.push_back(model::make_params(cfg, dt));
    for (size_t i = 0; i < ref.size(); ++i) set_values(tables[r].all()[i].weights(), ref[i].p);
  }
  std::vector<std::unique_ptr<parallel::ZeroShard>> shards;
  std::vector<std::unique_ptr<train::Optimizer>> opts;
  for (int r = 0; r < replicas; ++r) {
    if (D > 0) {
      std::vector<model::Param*> ps;
      for (auto& p : tables[r].all()) ps.push_back(&p);
      shards.push_back(std::make_unique<parallel::ZeroShard>(ps, D, r));
    }
    opts.push_back(std::make_unique<train::Optimizer>(tables[r], oc, D > 0 ? shards[r].get() : nullptr));
  }
  const std::vector<std::vector<double>> start = [&] {
    std::vector<std::vector<double>> s;
    for (const auto& r : ref) s.push_back(r.p);
    return s;
  }();

  const RefOptions ro{oc.beta1, oc.beta2, oc.eps, oc.weight_decay, oc.grad_clip};
  const double tol = tol_of(dt);
  double lr_sum = 0;
  int64_t compared = 0;
  for (int k = 0; k < static_cast<int>(std::size(kNormOverClip)); ++k) {
    const int t = k + 1;
    const double lr = lr_at(k);
    lr_sum += lr;
    auto grads = make_grads(tables[0], k, kNormOverClip[k] * oc.grad_clip, dt);
    for (auto& table : tables)
      for (size_t i = 0; i < ref.size(); ++i) set_values(table.all()[i].grad, grads[i]);
    // The norm the trainer passes to step(): grad_norm() over the whole
    // gradients (under ZeRO-1 the runtime sums the owned slices' squares
    // over the replicas instead; the same number). A norm is a positive
    // sum: a relative tolerance is right.
    const double norm = opts[0]->grad_norm();
    double want_sq = 0;
    for (const auto& g : grads)
      for (double x : g) want_sq += x * x;
    REQUIRE(norm == Approx(std::sqrt(want_sq)).epsilon(1e-12));

    const double factor = ref_clip(grads, ro.max_norm);
    INFO("step " << t << ": norm " << norm << " against clip " << ro.max_norm << " (factor "
                 << factor << "), lr " << lr);
    CHECK((factor < 1) == (kNormOverClip[k] > 1));  // the scenario clips where it says it does
    for (size_t i = 0; i < ref.size(); ++i) ref_adamw(ref[i], grads[i], lr, t, ro);
    for (auto& o : opts) o->step(lr, norm);

    Mismatch bad;
    for (int r = 0; r < replicas; ++r) {
      const auto state = opts[r]->state_tensors();  // exp_avg.* then exp_avg_sq.*, owned parts
      for (size_t i = 0; i < ref.size(); ++i) {
        const RefTensor& want = ref[i];
        const Tensor& w = tables[r].all()[i].weights();
        const int64_t n = w.numel();
        const int64_t lo = D > 0 ? shards[r]->owned()[i].lo : 0;
        const int64_t hi = D > 0 ? std::max(lo, shards[r]->owned()[i].hi) : n;
        const Tensor& m = state[i].tensor;
        const Tensor& v = state[ref.size() + i].tensor;
        REQUIRE(m.numel() == hi - lo);
        REQUIRE(v.numel() == hi - lo);
        for (int64_t j = 0; j < n; ++j) {
          const std::string where = "replica " + std::to_string(r) + " " + want.name + "[" +
                                    std::to_string(j) + "]";
          const double got = at(w, j);
          if (j < lo || j >= hi) {
            // Not this replica's: untouched until ZeRO's all-gather.
            bad.check(got == start[i][j], where + " (not owned) changed to " + std::to_string(got));
            continue;
          }
          ++compared;
          bad.check(std::fabs(got - want.p[j]) <= tol * (std::fabs(want.p[j]) + lr_sum),
                    where + ": weight " + fmt(got) + ", reference " +
                        fmt(want.p[j]));
          const double gm = at(m, j - lo), gv = at(v, j - lo);
          bad.check(close(gm, want.m[j], tol, want.m_terms[j]),
                    where + ": first moment " + fmt(gm) + ", reference " + fmt(want.m[j]));
          bad.check(close(gv, want.v[j], tol, want.v[j]),  // a positive sum
                    where + ": second moment " + fmt(gv) + ", reference " + fmt(want.v[j]));
        }
      }
    }
    INFO(bad.count << " mismatching values; the first: " << bad.first);
    CHECK(bad.count == 0);
  }
  // Every element was compared on every step exactly once over the replicas.
  int64_t total = 0;
  for (const auto& r : ref) total += static_cast<int64_t>(r.p.size());
  CHECK(compared == total * static_cast<int64_t>(std::size(kNormOverClip)));
}

// The optimizer settings: the defaults (eps negligible), and one where eps is
// of the gradients' size (so the scale of the clipped gradient reaches the
// weights directly) with other betas, decay and clip.
std::vector<std::pair<std::string, train::OptimizerConfig>> settings() {
  train::OptimizerConfig defaults;  // b1 0.9, b2 0.95, eps 1e-8, wd 0.1, clip 1
  train::OptimizerConfig other;
  other.beta1 = 0.8;
  other.beta2 = 0.999;
  other.eps = 1e-2;
  other.weight_decay = 0.3;
  other.grad_clip = 2.5;
  return {{"defaults", defaults}, {"eps 1e-2, b 0.8/0.999, wd 0.3, clip 2.5", other}};
}

}  // namespace

TEST_CASE("AdamW step = clip_grad_norm_ + torch.optim.AdamW written out in double", "[adamw]") {
  for (DType dt : {DType::F64, DType::F32})
    for (const auto& [name, oc] : settings()) {
      INFO(dtype_name(dt) << ", " << name);
      run_scenario(dt, oc, 0);
    }
}

TEST_CASE("AdamW with an input query: its W_l [d, d] is a depth parameter, never decayed",
          "[adamw]") {
  model::ModelConfig cfg = tiny_config();
  cfg.variant.query = model::MixQuery::Input;
  cfg.validate();
  for (const auto& [name, oc] : settings()) {
    INFO(name);
    run_scenario(DType::F64, oc, 0, cfg);
  }
}

TEST_CASE("AdamW with ZeRO-1 shards: each replica's slice = the reference on its elements",
          "[adamw][zero]") {
  for (int D : {2, 3})
    for (DType dt : {DType::F64, DType::F32})
      for (const auto& [name, oc] : settings()) {
        INFO("D = " << D << ", " << dtype_name(dt) << ", " << name);
        run_scenario(dt, oc, D);
      }
}

// ZeRO-1 in a bf16 run (the table built by hand on the CPU: make_params
// refuses bf16 there): the bf16 parameters hand their fp32 masters' owned
// slices to the optimizer, the router (kept at full precision: an fp32 value,
// no master, model::ParamShape::full_precision) is updated in its value
// itself and its ZeroShard space is of fp32, so after the all-gather every
// replica computes with the same fp32 router weights as an unsharded run.
// (Before: the router's master was sliced away too and the forward met its
// bf16 value beside fp32 activations.)
TEST_CASE("ZeRO-1 with bf16 values: a full-precision router keeps fp32 weights on every replica",
          "[adamw][zero]") {
  const int D = 2;
  const std::vector<std::pair<std::string, Shape>> shapes = {
      {"model.layers.0.self_attn.q_proj.weight", {4, 5}},    // bf16 + fp32 master
      {"model.layers.0.mlp.gate.weight", {3, 5}},            // the router: fp32
      {"model.layers.0.input_layernorm.weight", {5}}};       // bf16 + fp32 master
  const size_t kRouter = 1;
  auto make_table = [&](bool bf16) {
    model::ParamTable t;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const DType dt = bf16 && i != kRouter ? DType::BF16 : DType::F32;
      model::Param& p = t.add(shapes[i].first, shapes[i].second, dt, Device::CPU, 0.02);
      p.weights().copy_from(randn(shapes[i].second, 300 + i, DType::F32, 0.5));
      p.sync_value();
    }
    return t;
  };
  model::ParamTable ref = make_table(false);  // fp32, unsharded: the same fp32 update
  std::vector<model::ParamTable> tables;
  for (int r = 0; r < D; ++r) tables.push_back(make_table(true));
  std::vector<std::unique_ptr<parallel::ZeroShard>> shards;
  std::vector<std::unique_ptr<train::Optimizer>> opts;
  train::OptimizerConfig oc;
  for (int r = 0; r < D; ++r) {
    std::vector<model::Param*> ps;
    for (auto& p : tables[r].all()) ps.push_back(&p);
    shards.push_back(std::make_unique<parallel::ZeroShard>(ps, D, r));
    opts.push_back(std::make_unique<train::Optimizer>(tables[r], oc, shards[r].get()));
    opts.back()->take_master_slices();
  }
  train::Optimizer ref_opt(ref, oc, nullptr);
  // The spaces: the bf16 parameters', then the fp32 router's.
  REQUIRE(shards[0]->spaces() == 2);
  CHECK(shards[0]->params(0) == std::vector<size_t>{0, 2});
  CHECK(shards[0]->params(1) == std::vector<size_t>{kRouter});
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Tensor g = randn(shapes[i].second, 400 + 10 * step + i, DType::F32, 0.1);
      ref.all()[i].grad.copy_from(g);
      for (auto& t : tables) t.all()[i].grad.copy_from(g);
    }
    const double lr = 1e-2 * (step + 1);
    ref_opt.step(lr, ref_opt.grad_norm());
    for (auto& o : opts) o->step(lr, ref_opt.grad_norm());
    // The all-gather of each space in its dtype (as Runtime::
    // gather_updated_weights does it, over the replicas' packed slices).
    for (int s = 0; s < shards[0]->spaces(); ++s) {
      const DType dt = tables[0].all()[shards[0]->params(s).front()].value.dtype();
      std::vector<Tensor> parts;
      for (int r = 0; r < D; ++r) {
        std::vector<Tensor> owned;
        for (size_t i = 0; i < shapes.size(); ++i)
          owned.push_back(shards[r]->owned_view(i, tables[r].all()[i].weights()));
        parts.push_back(shards[r]->pack_owned(s, owned, dt));
      }
      Tensor flat = Tensor::empty({parts[0].numel() * D}, dt, Device::CPU);
      for (int r = 0; r < D; ++r) flat.rows(r * parts[0].numel(), parts[0].numel()).copy_from(parts[r]);
      for (int r = 0; r < D; ++r) {
        std::vector<Tensor> out;
        for (auto& p : tables[r].all()) out.push_back(p.weights());
        shards[r]->unpack_all(s, flat, out);
      }
    }
    for (int r = 0; r < D; ++r) {
      const model::Param& router = tables[r].all()[kRouter];
      REQUIRE(router.value.dtype() == DType::F32);
      CHECK_FALSE(router.master.defined());
      INFO("step " << step << ", replica " << r);
      // One code path (the CPU's fp32 AdamW on the same elements): bit for bit.
      CHECK(same_bits(router.value, ref.all()[kRouter].value));
      for (size_t i = 0; i < shapes.size(); ++i) {
        if (i == kRouter) continue;
        const model::Param& p = tables[r].all()[i];
        REQUIRE(p.value.dtype() == DType::BF16);
        Tensor rounded = Tensor::empty(p.value.shape(), DType::BF16, Device::CPU);
        kernels::convert(rounded, ref.all()[i].value);
        CHECK(same_bits(p.value, rounded));  // bf16 of the same fp32 master
        const Tensor& mine = opts[r]->master_slices()[i];
        if (mine.defined())
          CHECK(same_bits(mine, shards[r]->owned_view(i, ref.all()[i].value)));
      }
    }
  }
}
