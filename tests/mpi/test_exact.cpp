// The proof of docs/parallel.md: a pipeline / data-parallel run computes the same
// function as the single process. For every residual mode, P in {2, 4} x
// V in {1, 2} x cache on/off, data parallel D = 2 (alone and with P = 2) and
// tied embeddings, three AdamW steps give per-step losses, gradient norms and
// final weights equal to a single process with the same microbatches
// (relative 1e-5, tensor by tensor; without data parallelism or tied
// embeddings, the naive protocol in every mode and the baseline cached or not
// are bit-identical), and the pipeline bytes the transport counted equal the
// exact count from the layout.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "core/rng.h"
#include "core/worst.h"
#include "kernels/reduce.h"
#include "model/model.h"
#include "model/model_testing.h"
#include "mpi_testing.h"
#include "parallel/runtime.h"
#include "train/optimizer.h"

using namespace attnres;
using namespace attnres::testing;
using model::ResidualMode;

namespace {

constexpr int64_t kB = 2, kT = 8, kSteps = 3;

model::ModelConfig tiny_model(ResidualMode mode, bool tie, int64_t layers = 8) {
  // Block S = 3: blocks straddle chunk boundaries.
  const int64_t S = mode == ResidualMode::Block ? 3 : 0;
  return testing::resized(testing::tiny(mode, S, 0, tie, layers), 37, 16, 2, 1, 24);
}

train::OptimizerConfig optimizer() {
  train::OptimizerConfig o;
  o.lr = 2e-2;
  o.grad_clip = 0.5;  // exercised: the tiny model's norms are around 1
  // AdamW divides each gradient element by its own RMS: with eps = 1e-8 an
  // element whose contributions nearly cancel (a sum of +-1e-2 terms ending
  // near 1e-8) moves by ~lr whatever its rounding, so any reassociation of
  // sums (caching, replicas) shows up in single weights. A larger eps keeps
  // the update smooth in the gradient; the gradients themselves are compared
  // at full precision below.
  o.eps = 1e-4;
  return o;
}

// Unit u of a synthetic token stream: B*T+1 tokens, targets shifted by one.
data::TokenLoader::Batch unit(int64_t u, int64_t vocab) {
  data::TokenLoader::Batch b;
  b.inputs = Tensor::empty({kB * kT}, DType::I32);
  b.targets = Tensor::empty({kB * kT}, DType::I32);
  auto tok = [&](int64_t i) {
    return static_cast<int32_t>(random_u64(99, static_cast<uint64_t>(u), static_cast<uint64_t>(i)) %
                                static_cast<uint64_t>(vocab));
  };
  for (int64_t i = 0; i < kB * kT; ++i) {
    b.inputs.data<int32_t>()[i] = tok(i);
    b.targets.data<int32_t>()[i] = tok(i + 1);
  }
  return b;
}

struct Reference {
  std::vector<double> losses, norms;
  std::map<std::string, Tensor> grads;    // after the first step's backward
  std::map<std::string, Tensor> weights;  // after the last update
};

// The single process with A*D microbatches per step (the units the D
// replicas see together: u = (k*A + a)*D + r covers k*A*D .. (k+1)*A*D - 1).
Reference single_process(const model::ModelConfig& cfg, int64_t A, int64_t D, DType dtype) {
  model::Model m(cfg, dtype);
  m.params().init(5);
  train::Optimizer opt(m.params(), optimizer());
  Reference ref;
  const double scale = 1.0 / static_cast<double>(A * D * kB * kT);
  for (int64_t k = 0; k < kSteps; ++k) {
    m.params().zero_grads();
    double loss = 0;
    for (int64_t a = 0; a < A * D; ++a) {
      auto b = unit(k * A * D + a, cfg.vocab_size);
      loss += m.forward_backward(b.inputs, b.targets, kB, kT, scale);
    }
    const double norm = opt.grad_norm();
    if (k == 0)
      for (const auto& p : m.params().all()) ref.grads[p.name] = p.grad.clone();
    opt.step(optimizer().lr, norm);
    ref.losses.push_back(loss * scale);
    ref.norms.push_back(norm);
  }
  for (const auto& p : m.params().all()) ref.weights[p.name] = p.value.clone();
  return ref;
}

double rel(double a, double b) {
  return std::fabs(a - b) / std::max({std::fabs(a), std::fabs(b), 1e-12});
}

// ||a - b|| / ||b|| over a whole tensor. (Element by element, AdamW turns
// rounding-level differences in gradients that nearly cancel into visible
// relative differences of single small weights; the tensor is what must agree.)
double max_rel(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return INFINITY;
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.dtype() == DType::F64 ? a.data<double>()[i] : a.data<float>()[i];
    const double y = b.dtype() == DType::F64 ? b.data<double>()[i] : b.data<float>()[i];
    diff += (x - y) * (x - y);
    ref += y * y;
  }
  return std::sqrt(diff) / std::max(std::sqrt(ref), 1e-12);
}

struct Layout {
  ResidualMode mode;
  int P, V, D;
  bool cache, tie;
  std::vector<int64_t> split = {};
  int64_t layers = 8;
  DType dtype = DType::F32;
  model::Recompute recompute = model::Recompute::None;
  bool zero = false;
};

std::string describe(const Layout& l) {
  return std::string(model::residual_mode_name(l.mode)) + " P=" + std::to_string(l.P) +
         " V=" + std::to_string(l.V) + " D=" + std::to_string(l.D) +
         (l.cache ? " cached" : " naive") + (l.tie ? " tied" : "") +
         (l.dtype == DType::F64 ? " fp64" : "") +
         (l.recompute != model::Recompute::None
              ? std::string(" recompute=") + model::recompute_name(l.recompute)
              : "") +
         (l.zero ? " zero=1" : "");
}

// Runs one layout on every group of P*D ranks and checks it against the
// single process; all ranks take part in the final (collective) checks.
// Tolerance: relative 1e-5 in fp32 (docs/parallel.md's bound); in fp64 rounding is
// ~1e-16, so 1e-11 leaves no room for a missing or doubled contribution.
void check_layout(const Layout& L) {
  const double tol = L.dtype == DType::F64 ? 1e-11 : 1e-5;
  const int K = L.P * L.D;
  if (world().size() % K != 0) {
    WARN("skipped (needs a multiple of " << K << " ranks): " << describe(L));
    return;
  }
  const int64_t A = 4;  // microbatches per replica and step
  const model::ModelConfig cfg = tiny_model(L.mode, L.tie, L.layers);
  double loss_diff = 0, norm_diff = 0, grad_diff = 0, weight_diff = 0;
  int64_t bitwise = 1;
  int64_t bytes_wrong = 0, traffic_asym = 0, compared = 0;
  int64_t bytes_seen = 0, bytes_expected = 0, state_wrong = 0;
  guarded([&] {
    const Reference ref = single_process(cfg, A, L.D, L.dtype);
    parallel::Comm group = group_of(K);
    parallel::ProcessGrid grid(group, L.P, L.D);
    parallel::RuntimeOptions ro;
    ro.V = L.V;
    ro.cache_blocks = L.cache;
    ro.layers_per_chunk = L.split;
    ro.recompute = L.recompute;
    ro.zero = L.zero;
    parallel::Runtime rt(grid, cfg, L.dtype, Device::CPU, ro, kB, kT);
    std::vector<std::unique_ptr<train::Optimizer>> opts;
    for (int v = 0; v < rt.model().size(); ++v) {
      rt.model().chunk(v).params().init(5);
      opts.push_back(std::make_unique<train::Optimizer>(rt.model().chunk(v).params(), optimizer(),
                                                    rt.zero_shard(v)));
      // ZeRO-1: this replica holds 1/D of the chunk's AdamW state (up to
      // the padding of the flat space to a multiple of D).
      const int64_t per = 2 * static_cast<int64_t>(dtype_size(L.dtype));  // two moments
      const int64_t n = rt.model().chunk(v).params().numel();
      const int64_t want = per * (L.zero ? (n + L.D - 1) / L.D : n);
      if (opts.back()->state_bytes() > want || opts.back()->state_bytes() < want - per * L.D)
        ++state_wrong;
    }
    const int64_t d = grid.replica();
    const double scale = 1.0 / static_cast<double>(A * L.D * kB * kT);
    bytes_expected = parallel::pipeline_bytes_per_step(rt.layout(), parallel::DepthPlan::of(cfg),
                                                       L.cache, A, L.D, kB * kT, cfg.d_model,
                                                       static_cast<int64_t>(dtype_size(L.dtype)));
    for (int64_t k = 0; k < kSteps; ++k) {
      auto st = rt.train_step(
          static_cast<int>(A), [&](int mb) { return unit((k * A + mb) * L.D + d, cfg.vocab_size); },
          scale);
      const double norm = rt.grad_norm();
      if (k == 0)  // with ZeRO-1 only the owned slices are summed
        for (int v = 0; v < rt.model().size(); ++v) {
          const auto& ps = rt.model().chunk(v).params().all();
          const parallel::ZeroShard* z = rt.zero_shard(v);
          for (size_t i = 0; i < ps.size(); ++i) {
            const Tensor& want = ref.grads.at(ps[i].name);
            grad_diff = nan_max(grad_diff, z ? max_rel(z->owned_view(i, ps[i].grad),
                                                       z->owned_view(i, want))
                                             : max_rel(ps[i].grad, want));
          }
        }
      for (auto& o : opts) o->step(optimizer().lr, norm);
      rt.gather_updated_weights();
      if (st.loss_sum * scale != ref.losses[k] || norm != ref.norms[k]) bitwise = 0;
      loss_diff = nan_max(loss_diff, rel(st.loss_sum * scale, ref.losses[k]));
      norm_diff = nan_max(norm_diff, rel(norm, ref.norms[k]));
      bytes_seen = st.pp_bytes;
      if (st.pp_bytes != bytes_expected) ++bytes_wrong;
    }
    // Final weights: every parameter this rank holds, including the tied copy.
    for (model::Param* p : rt.model().params()) {
      const double d = max_rel(p->value, ref.weights.at(p->name));
      weight_diff = nan_max(weight_diff, d);
      if (d != 0) bitwise = 0;
      ++compared;
    }
    // Per-peer counters: what a sent to b is what b received from a.
    std::vector<double> mine;
    for (int64_t x : rt.transport().traffic().sent) mine.push_back(double(x));
    for (int64_t x : rt.transport().traffic().received) mine.push_back(double(x));
    const auto all = grid.pipeline().allgather(mine);
    for (int a = 0; a < L.P; ++a)
      for (int b = 0; b < L.P; ++b)
        if (all[a][b] != all[b][L.P + a]) ++traffic_asym;
  });
  const bool identical = max_over_ranks(bitwise ? 0.0 : 1.0) == 0;
  INFO(describe(L) << ": max relative differences: loss " << max_over_ranks(loss_diff)
                   << ", grad norm " << max_over_ranks(norm_diff) << ", first-step gradients "
                   << max_over_ranks(grad_diff) << ", weights " << max_over_ranks(weight_diff)
                   << (identical ? " (bit-identical)" : "") << "; pipeline bytes/step "
                   << bytes_seen << " (exact count " << bytes_expected << ")");
  CHECK(max_over_ranks(loss_diff) <= tol);
  CHECK(max_over_ranks(norm_diff) <= tol);
  CHECK(max_over_ranks(grad_diff) <= tol);
  CHECK(max_over_ranks(weight_diff) <= tol);
  // Without the cache, data parallelism or tied embeddings no sum is
  // reassociated: the pipeline must then reproduce the single process bit for
  // bit (the Mix groups' split of sources does not depend on the chunks). The
  // baseline has no sources to cache: cached or not, the same.
  if ((!L.cache || L.mode == ResidualMode::Baseline) && L.D == 1 && !L.tie) CHECK(identical);
  CHECK(max_over_ranks(static_cast<double>(bytes_wrong)) == 0);
  CHECK(max_over_ranks(static_cast<double>(state_wrong)) == 0);
  CHECK(max_over_ranks(static_cast<double>(traffic_asym)) == 0);
  CHECK(max_over_ranks(compared == 0 ? 1.0 : 0.0) == 0);
}

const ResidualMode kModes[] = {ResidualMode::Baseline, ResidualMode::Full, ResidualMode::Block};

}  // namespace

TEST_CASE("pipeline = single process: modes x P {2,4} x V {1,2} x cache on/off", "[mpi][exact]") {
  for (ResidualMode mode : kModes)
    for (int P : {2, 4})
      for (int V : {1, 2})
        for (bool cache : {true, false}) check_layout({mode, P, V, 1, cache, false});
}

TEST_CASE("data parallel = single process: D = 2, and P = 2 x D = 2", "[mpi][exact]") {
  for (ResidualMode mode : kModes) {
    check_layout({mode, 1, 1, 2, true, false});
    for (int V : {1, 2})
      for (bool cache : {true, false}) check_layout({mode, 2, V, 2, cache, false});
  }
}

TEST_CASE("recomputation (mix, layer) under P = 2 x V = 2 = the single process without it",
          "[mpi][exact][recompute]") {
  // Naive: bit-identical to the single process with recompute = none; cached:
  // within the cache's reassociation bound.
  for (ResidualMode mode : kModes)
    for (auto r : {model::Recompute::Mix, model::Recompute::Layer})
      for (bool cache : {false, true}) {
        Layout L{mode, 2, 2, 1, cache, false};
        L.recompute = r;
        check_layout(L);
      }
}

TEST_CASE("ZeRO-1 = single process: D = 2, P = 2 x D = 2, tied embeddings, recompute",
          "[mpi][exact][zero]") {
  // The replicas' sums reassociate (reduce-scatter): within the data-parallel
  // bound; optimizer state per rank 1/D (checked in check_layout).
  for (ResidualMode mode : kModes) {
    Layout a{mode, 1, 1, 2, true, false};
    a.zero = true;
    check_layout(a);
    for (int V : {1, 2}) {
      Layout b{mode, 2, V, 2, true, false};
      b.zero = true;
      check_layout(b);
    }
  }
  Layout tied{ResidualMode::Block, 2, 2, 2, true, true};
  tied.zero = true;
  tied.recompute = model::Recompute::Layer;
  check_layout(tied);
}

TEST_CASE("tied embeddings across the first and last stage", "[mpi][exact]") {
  check_layout({ResidualMode::Block, 4, 2, 1, true, true});
  check_layout({ResidualMode::Baseline, 2, 1, 2, true, true});
  check_layout({ResidualMode::Full, 2, 2, 2, false, true});
}

TEST_CASE("in fp64 the reassociated sums agree to 1e-11 (no contribution lost or doubled)",
          "[mpi][exact]") {
  // The cases that are not bit-identical in fp32: the cache reassociates the
  // source-gradient sums, data parallelism and tied embeddings the parameter
  // gradient sums.
  for (ResidualMode mode : {ResidualMode::Full, ResidualMode::Block}) {
    for (int P : {2, 4}) check_layout({mode, P, 2, 1, true, false, {}, 8, DType::F64});
    check_layout({mode, 2, 2, 2, true, true, {}, 8, DType::F64});
  }
  check_layout({ResidualMode::Block, 2, 2, 1, true, false, {3, 1, 2, 1}, 7, DType::F64});
}

TEST_CASE("one rank, two chunks (P = 1, V = 2): messages to itself, tied copy summed locally",
          "[mpi][exact]") {
  // Not a configuration users can choose (parallel.virtual_stages needs
  // parallel.pipeline > 1); it is how the NCCL test drives the executor on
  // a single GPU, checked here on the CPU through MPI.
  for (ResidualMode mode : kModes)
    for (bool cache : {true, false})
      check_layout({mode, 1, 2, 1, cache, mode == ResidualMode::Block});
}

TEST_CASE("uneven and explicit layer splits", "[mpi][exact]") {
  // 7 layers over 4 chunks (1, 2, 2, 2), and an explicit (3, 1, 2, 1).
  for (bool cache : {true, false}) {
    check_layout({ResidualMode::Block, 2, 2, 1, cache, false, {}, 7});
    check_layout({ResidualMode::Block, 2, 2, 1, cache, false, {3, 1, 2, 1}, 7});
    check_layout({ResidualMode::Full, 4, 1, 1, cache, false, {1, 3, 2, 1}, 7});
  }
}

TEST_CASE("cached traffic is smaller than naive for V > 1", "[mpi][bytes]") {
  if (world().size() % 4 != 0) return;
  int64_t bytes[2] = {0, 0};
  const model::ModelConfig cfg = tiny_model(ResidualMode::Full, false);
  guarded([&] {
    for (int cache = 0; cache < 2; ++cache) {
      parallel::Comm group = group_of(4);
      parallel::ProcessGrid grid(group, 4, 1);
      parallel::RuntimeOptions ro;
      ro.V = 2;
      ro.cache_blocks = cache == 1;
      parallel::Runtime rt(grid, cfg, DType::F32, Device::CPU, ro, kB, kT);
      for (int v = 0; v < rt.model().size(); ++v) rt.model().chunk(v).params().init(5);
      bytes[cache] = rt.train_step(
                           4, [&](int mb) { return unit(mb, cfg.vocab_size); }, 0.01)
                         .pp_bytes;
    }
  });
  INFO("naive " << bytes[0] << " bytes/step, cached " << bytes[1]);
  CHECK(bytes[1] < bytes[0]);
  // Full AttnRes, 8 layers over 8 chunks (2 sources per chunk), N*d = 256
  // floats per tensor: naive forward per microbatch sum_{c=1..7} (1 + 2c) = 63
  // tensors; cached 3 + 5 + 7 + 4 * 6 = 39; x2 directions x 4 microbatches x 1 KiB.
  CHECK(bytes[0] == 2 * 4 * 63 * 1024);
  CHECK(bytes[1] == 2 * 4 * 39 * 1024);
}

TEST_CASE("evaluation through the pipeline equals the single-process loss", "[mpi][eval]") {
  for (ResidualMode mode : kModes)
    for (auto [P, V, D] : {std::tuple{2, 2, 1}, std::tuple{4, 1, 1}, std::tuple{2, 1, 2}}) {
      const int K = P * D;
      if (world().size() % K != 0) continue;
      const model::ModelConfig cfg = tiny_model(mode, false);
      double want = 0, got = 0;
      const int64_t n = 5;  // units; with D = 2 the replicas get 3 and 2
      guarded([&] {
        model::Model m(cfg);
        m.params().init(3);
        for (int64_t u = 0; u < n; ++u) {
          auto b = unit(u, cfg.vocab_size);
          want += m.forward_loss(b.inputs, b.targets, kB, kT);
        }
        parallel::Comm group = group_of(K);
        parallel::ProcessGrid grid(group, P, D);
        parallel::RuntimeOptions ro;
        ro.V = V;
        parallel::Runtime rt(grid, cfg, DType::F32, Device::CPU, ro, kB, kT);
        for (int v = 0; v < rt.model().size(); ++v) rt.model().chunk(v).params().init(3);
        const int d = grid.replica();
        const int M = static_cast<int>((n - d + D - 1) / D);
        // Summed over the group's replicas (the grid's communicator).
        got =
            rt.eval_loss_sum(M, [&](int mb) { return unit(d + int64_t(mb) * D, cfg.vocab_size); });
      });
      INFO(model::residual_mode_name(mode)
           << " P=" << P << " V=" << V << " D=" << D << ": " << got << " vs " << want);
      CHECK(max_over_ranks(rel(got, want)) <= 1e-6);
    }
}
