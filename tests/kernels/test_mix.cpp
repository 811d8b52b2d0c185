// AttnRes depth Mix: forward vs an explicit per-row softmax, gradients (w and
// every source, through the rstd path) vs finite differences for k = 1, 2, 5,
// k = 1 identity, accumulation, precision, determinism and errors; the
// two-phase form: Q queries at once equal Q single calls bit for bit, the
// merge with m recent sources equals the one-pass softmax over all sources,
// and its gradients (through lse and the recent sources' rstd) match finite
// differences, also into aliased gradient buffers.
#include <omp.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/mix.h"
#include "kernels/reduce.h"
#include "kernels/rmsnorm.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
namespace kern = attnres::kernels;

namespace {

constexpr float kEps = 1e-5f;
// Finite-difference step and gradient floor. The loss sums N*d terms, so its
// rounding noise divided by a small step swamps gradient elements far below
// the typical O(0.1..1) size; comparing those against a 1e-3 floor keeps the
// check tight where it matters (an absolute error of 1e-9 still fails it).
// h = 1e-4 keeps the O(h^2) truncation error near 1e-7.
constexpr double kH = 1e-4, kFloor = 1e-3;


std::vector<Tensor> random_sources(int64_t k, int64_t N, int64_t d, uint64_t seed,
                                   DType dt = DType::F64) {
  std::vector<Tensor> v;
  // Different scales per source so the softmax is far from uniform.
  for (int64_t j = 0; j < k; ++j) v.push_back(randn({N, d}, seed + j, dt, 0.5 + 0.4 * j));
  return v;
}

std::vector<Tensor> rstds_of(const std::vector<Tensor>& sources) {
  std::vector<Tensor> r;
  for (const Tensor& v : sources) {
    Tensor t = Tensor::empty({v.dim(0)}, v.dtype());
    kern::mix_source_rstd(t, v, kEps);
    r.push_back(t);
  }
  return r;
}

struct MixOut {
  Tensor out, probs;
};

MixOut mix(const Tensor& w, const std::vector<Tensor>& sources, const std::vector<Tensor>& rstds) {
  const int64_t N = sources[0].dim(0), d = sources[0].dim(1);
  MixOut m{Tensor::empty({N, d}, w.dtype()),
           Tensor::empty({N, static_cast<int64_t>(sources.size())}, w.dtype())};
  kern::mix_forward(m.out, m.probs, w, sources, rstds);
  return m;
}

std::vector<Tensor> zeros_like(const std::vector<Tensor>& ts) {
  std::vector<Tensor> z;
  for (const Tensor& t : ts) z.push_back(Tensor::zeros(t.shape(), t.dtype()));
  return z;
}

}  // namespace

TEST_CASE("mix_source_rstd and mix forward match an explicit per-row softmax", "[kernels]") {
  const int64_t N = 7, d = 12;
  for (int64_t k : {int64_t(1), int64_t(2), int64_t(5)}) {
    std::vector<Tensor> src = random_sources(k, N, d, 10 * k);
    Tensor w = randn({d}, 3);
    std::vector<Tensor> rs = rstds_of(src);
    MixOut m = mix(w, src, rs);
    for (int64_t n = 0; n < N; ++n) {
      std::vector<double> logit(k), a(k);
      for (int64_t j = 0; j < k; ++j) {
        double ss = 0, dot = 0;
        for (int64_t c = 0; c < d; ++c) ss += at(src[j], n * d + c) * at(src[j], n * d + c);
        const double r = 1 / std::sqrt(ss / d + kEps);
        REQUIRE(at(rs[j], n) == Approx(r).epsilon(1e-14));
        for (int64_t c = 0; c < d; ++c) dot += w.data<double>()[c] * at(src[j], n * d + c) * r;
        logit[j] = dot;
      }
      double z = 0;
      for (int64_t j = 0; j < k; ++j) z += std::exp(logit[j]);
      for (int64_t j = 0; j < k; ++j) {
        a[j] = std::exp(logit[j]) / z;
        REQUIRE(at(m.probs, n * k + j) == Approx(a[j]).epsilon(1e-13));
      }
      for (int64_t c = 0; c < d; ++c) {
        double o = 0, terms = 0;
        for (int64_t j = 0; j < k; ++j) {
          o += a[j] * at(src[j], n * d + c);
          terms += std::fabs(a[j] * at(src[j], n * d + c));
        }
        REQUIRE(at(m.out, n * d + c) == approx_terms(o, 1e-14, terms));
      }
    }
  }
}

TEST_CASE("mix backward matches finite differences for w and every source", "[kernels]") {
  const int64_t N = 7, d = 12;
  for (int64_t k : {int64_t(1), int64_t(2), int64_t(5)}) {
    std::vector<Tensor> src = random_sources(k, N, d, 20 * k);
    Tensor w = randn({d}, 4);
    Tensor wt = randn({N, d}, 5);
    // rstd is recomputed from the (perturbed) sources, so the finite
    // differences see the rstd path that the backward must include.
    auto loss = [&] { return weighted_sum(mix(w, src, rstds_of(src)).out, wt); };
    std::vector<Tensor> rs = rstds_of(src);
    MixOut m = mix(w, src, rs);
    std::vector<Tensor> dsrc = zeros_like(src);
    Tensor dw = Tensor::zeros({d}, DType::F64);
    kern::mix_backward(dsrc, dw, wt, w, src, rs, m.probs);
    INFO("k=" << k);
    REQUIRE(fd_check(w, dw, loss, kH, kFloor) < 1e-6);
    for (int64_t j = 0; j < k; ++j) {
      INFO("source " << j);
      REQUIRE(fd_check(src[j], dsrc[j], loss, kH, kFloor) < 1e-6);
    }
  }
}

TEST_CASE("mix with one source is the identity", "[kernels]") {
  for (DType dt : {DType::F64, DType::F32}) {
    const int64_t N = 9, d = 12;
    std::vector<Tensor> src = random_sources(1, N, d, 30, dt);
    Tensor w = randn({d}, 31, dt, 3.0);
    std::vector<Tensor> rs = rstds_of(src);
    MixOut m = mix(w, src, rs);
    REQUIRE(same_bits(m.out, src[0]));
    for (int64_t n = 0; n < N; ++n) REQUIRE(at(m.probs, n) == 1.0);
    Tensor dout = randn({N, d}, 32, dt);
    std::vector<Tensor> dsrc = zeros_like(src);
    Tensor dw = Tensor::zeros({d}, dt);
    kern::mix_backward(dsrc, dw, dout, w, src, rs, m.probs);
    REQUIRE(same_bits(dsrc[0], dout));
    for (int64_t c = 0; c < d; ++c) REQUIRE(at(dw, c) == 0.0);
  }
}

TEST_CASE("mix backward accumulates, and float32 agrees with float64", "[kernels]") {
  const int64_t N = 37, d = 24, k = 5;
  std::vector<Tensor> src = random_sources(k, N, d, 40);
  Tensor w = randn({d}, 41), dout = randn({N, d}, 42);
  std::vector<Tensor> rs = rstds_of(src);
  MixOut m = mix(w, src, rs);
  std::vector<Tensor> dsrc = zeros_like(src);
  Tensor dw = Tensor::zeros({d}, DType::F64);
  kern::mix_backward(dsrc, dw, dout, w, src, rs, m.probs);
  std::vector<Tensor> once;
  for (const Tensor& t : dsrc) once.push_back(t.clone());
  Tensor dw1 = dw.clone();
  kern::mix_backward(dsrc, dw, dout, w, src, rs, m.probs);
  for (int64_t j = 0; j < k; ++j)
    for (int64_t i = 0; i < dsrc[j].numel(); ++i)
      REQUIRE(at(dsrc[j], i) == approx_terms(2 * at(once[j], i), 1e-14, 1.0));
  for (int64_t c = 0; c < d; ++c) REQUIRE(at(dw, c) == approx_terms(2 * at(dw1, c), 1e-14, 1.0));

  std::vector<Tensor> src32;
  for (const Tensor& t : src) src32.push_back(t.to(DType::F32));
  Tensor w32 = w.to(DType::F32);
  std::vector<Tensor> rs32 = rstds_of(src32);
  MixOut m32 = mix(w32, src32, rs32);
  REQUIRE(max_rel_diff(rs32[2], rs[2]) < 1e-6);
  REQUIRE(scaled_diff(m32.probs, m.probs) < 1e-5);
  REQUIRE(scaled_diff(m32.out, m.out) < 1e-5);
  std::vector<Tensor> dsrc32 = zeros_like(src32);
  Tensor dw32 = Tensor::zeros({d}, DType::F32);
  kern::mix_backward(dsrc32, dw32, dout.to(DType::F32), w32, src32, rs32, m32.probs);
  for (int64_t j = 0; j < k; ++j) REQUIRE(scaled_diff(dsrc32[j], once[j]) < 1e-5);
  REQUIRE(scaled_diff(dw32, dw1) < 1e-5);
}

TEST_CASE("mix is deterministic and independent of the thread count", "[kernels]") {
  const int64_t N = 1501, d = 64, k = 5;  // several dw row chunks, parallel path
  std::vector<Tensor> src = random_sources(k, N, d, 50, DType::F32);
  Tensor w = randn({d}, 51, DType::F32), dout = randn({N, d}, 52, DType::F32);
  std::vector<Tensor> rs = rstds_of(src);
  const int saved = omp_get_max_threads();
  MixOut m[3];
  std::vector<Tensor> dsrc[3];
  Tensor dw[3];
  for (int r = 0; r < 3; ++r) {  // 2 threads, 2 threads again, 1 thread
    omp_set_num_threads(r == 2 ? 1 : 2);
    m[r] = mix(w, src, rs);
    dsrc[r] = zeros_like(src);
    dw[r] = Tensor::zeros({d}, DType::F32);
    kern::mix_backward(dsrc[r], dw[r], dout, w, src, rs, m[r].probs);
  }
  omp_set_num_threads(saved);
  for (int r = 1; r < 3; ++r) {
    INFO("run " << r);
    REQUIRE(same_bits(m[r].out, m[0].out));
    REQUIRE(same_bits(m[r].probs, m[0].probs));
    REQUIRE(same_bits(dw[r], dw[0]));
    for (int64_t j = 0; j < k; ++j) REQUIRE(same_bits(dsrc[r][j], dsrc[0][j]));
  }
}

namespace {

// Phase 1 for queries ws over src: outputs, probs [Q, N, k], lse [Q, N].
struct GroupOut {
  std::vector<Tensor> outs;
  Tensor probs, lse;
};
GroupOut mix_group(const std::vector<Tensor>& ws, const std::vector<Tensor>& src,
                   const std::vector<Tensor>& rs) {
  const int64_t N = src[0].dim(0), d = src[0].dim(1), Q = static_cast<int64_t>(ws.size());
  const DType dt = ws[0].dtype();
  GroupOut g;
  for (int64_t q = 0; q < Q; ++q) g.outs.push_back(Tensor::empty({N, d}, dt));
  g.probs = Tensor::empty({Q, N, static_cast<int64_t>(src.size())}, dt);
  g.lse = Tensor::empty({Q, N}, dt);
  kern::mix_forward(g.outs, g.probs, &g.lse, ws, src, rs);
  return g;
}

// The two-phase Mix of one sublayer and its RMSNorm: phase 1 over src, then
// the merge with the recent sources fused with the norm (gain g); returns u.
Tensor two_phase(const Tensor& w, const std::vector<Tensor>& src,
                 const std::vector<Tensor>& recent, const Tensor& g, Tensor* stats,
                 GroupOut* g1 = nullptr) {
  const int64_t N = src[0].dim(0), d = src[0].dim(1), m = static_cast<int64_t>(recent.size());
  GroupOut grp = mix_group({w}, src, rstds_of(src));
  Tensor u = Tensor::empty({N, d}, w.dtype());
  Tensor st = Tensor::empty({N, 2 * m + 2}, w.dtype());
  kern::mix_merge_norm_forward(u, st, w, grp.outs[0], grp.lse.reshape({N}), recent, g, kEps);
  if (stats) *stats = st;
  if (g1) *g1 = grp;
  return u;
}

// The unfused reference: RMSNorm(one-pass Mix over all sources; g).
struct OneNorm {
  MixOut m;
  Tensor u, rstd;
};
OneNorm one_pass_norm(const Tensor& w, const std::vector<Tensor>& src, const Tensor& g) {
  OneNorm r{mix(w, src, rstds_of(src)), Tensor(), Tensor()};
  r.u = Tensor::empty(r.m.out.shape(), w.dtype());
  r.rstd = Tensor::empty({r.m.out.dim(0)}, w.dtype());
  kern::rmsnorm_forward(r.u, r.rstd, r.m.out, &g, kEps);
  return r;
}

}  // namespace

TEST_CASE("mix with Q queries equals Q single-query calls bit for bit", "[kernels]") {
  const int64_t N = 300, d = 16, k = 4, Q = 3;  // several dw row chunks
  for (DType dt : {DType::F32, DType::F64}) {
    std::vector<Tensor> src = random_sources(k, N, d, 40, dt);
    std::vector<Tensor> rs = rstds_of(src);
    std::vector<Tensor> ws, douts;
    for (int64_t q = 0; q < Q; ++q) {
      ws.push_back(randn({d}, 50 + q, dt));
      douts.push_back(randn({N, d}, 60 + q, dt));
    }
    GroupOut g = mix_group(ws, src, rs);
    // Backward of the group, and query by query in descending order.
    std::vector<Tensor> dsrc = zeros_like(src), dws = zeros_like(ws);
    kern::mix_backward(dsrc, dws, douts, nullptr, ws, src, rs, g.probs);
    std::vector<Tensor> dsrc1 = zeros_like(src), dws1 = zeros_like(ws);
    for (int64_t q = Q - 1; q >= 0; --q) {
      MixOut m = mix(ws[q], src, rs);
      INFO("query " << q);
      REQUIRE(same_bits(m.out, g.outs[q]));
      REQUIRE(same_bits(m.probs, g.probs.rows(q, 1).reshape({N, k})));
      // lse against the logits recomputed in double. lse can be near zero;
      // its rounding error scales with the logits' terms |w_c x_c| rstd.
      for (int64_t n = 0; n < N; n += 37) {
        double mx = -INFINITY, l = 0, terms = 0;
        std::vector<double> z;
        for (int64_t j = 0; j < k; ++j) {
          double dot = 0, abs_dot = 0;
          for (int64_t c = 0; c < d; ++c) {
            dot += at(ws[q], c) * at(src[j], n * d + c);
            abs_dot += std::fabs(at(ws[q], c) * at(src[j], n * d + c));
          }
          z.push_back(dot * at(rs[j], n));
          mx = std::max(mx, z.back());
          terms = std::max(terms, abs_dot * at(rs[j], n));
        }
        for (double zj : z) l += std::exp(zj - mx);
        REQUIRE(at(g.lse, q * N + n) == approx_terms(mx + std::log(l), dt == DType::F32 ? 1e-6 : 1e-14,
                                                     terms + std::log(l)));
      }
      kern::mix_backward(dsrc1, dws1[q], douts[q], ws[q], src, rs, m.probs);
    }
    for (int64_t j = 0; j < k; ++j) REQUIRE(same_bits(dsrc[j], dsrc1[j]));
    for (int64_t q = 0; q < Q; ++q) REQUIRE(same_bits(dws[q], dws1[q]));
  }
}

TEST_CASE("two-phase mix + norm equals the one-pass softmax over all sources, then RMSNorm",
          "[kernels]") {
  const int64_t N = 9, d = 12;
  struct C { int64_t k, m; };  // phase-1 sources, recent sources
  for (const C& c : {C{1, 1}, C{3, 1}, C{2, 4}}) {
    INFO("phase-1 sources " << c.k << ", recent sources " << c.m);
    const int64_t ns = 2 * c.m + 2;
    std::vector<Tensor> src = random_sources(c.k + c.m, N, d, 70 + c.k);
    std::vector<Tensor> first(src.begin(), src.begin() + c.k);
    std::vector<Tensor> recent(src.begin() + c.k, src.end());
    const Tensor w = randn({d}, 80), g = randn({d}, 82);
    Tensor stats;
    GroupOut grp;  // phase 1's output and lse, for the gradients below
    const Tensor u = two_phase(w, first, recent, g, &stats, &grp);
    const OneNorm one = one_pass_norm(w, src, g);
    REQUIRE(scaled_diff(u, one.u) < 1e-13);
    const int64_t kt = c.k + c.m;
    for (int64_t n = 0; n < N; ++n) {
      // a_0 = the phase-1 sources' total weight, a_j = recent source j's; rstd of x
      double a0 = 0;
      for (int64_t j = 0; j < c.k; ++j) a0 += at(one.m.probs, n * kt + j);
      REQUIRE(at(stats, ns * n) == Approx(a0).epsilon(1e-12));
      for (int64_t j = 0; j < c.m; ++j)
        REQUIRE(at(stats, ns * n + 1 + j) ==
                Approx(at(one.m.probs, n * kt + c.k + j)).epsilon(1e-12));
      REQUIRE(at(stats, ns * n + ns - 1) == Approx(at(one.rstd, n)).epsilon(1e-12));
    }

    // Gradients of the composite (phase-1 backward fed by the merge's d_o
    // and dlse) against the one-pass RMSNorm + Mix backward.
    const Tensor wt = randn({N, d}, 81);
    std::vector<Tensor> rs = rstds_of(first);
    Tensor d_o = Tensor::empty({N, d}, DType::F64), dlse = Tensor::empty({1, N}, DType::F64);
    std::vector<Tensor> drecent = zeros_like(recent);
    Tensor dw = Tensor::zeros({d}, DType::F64), dg = Tensor::zeros({d}, DType::F64);
    Tensor dlse_row = dlse.reshape({N});
    kern::mix_merge_norm_backward(d_o, dlse_row, drecent, dw, dg, wt, w, grp.outs[0], recent, g,
                               stats);
    std::vector<Tensor> dsrc = zeros_like(first);
    std::vector<Tensor> dws{dw}, douts{d_o}, qs{w};
    kern::mix_backward(dsrc, dws, douts, &dlse, qs, first, rs, grp.probs);

    Tensor dx = Tensor::zeros({N, d}, DType::F64), dg1 = Tensor::zeros({d}, DType::F64);
    kern::rmsnorm_backward(dx, &dg1, wt, one.m.out, one.rstd, &g);
    std::vector<Tensor> dsrc1 = zeros_like(src);
    Tensor dw1 = Tensor::zeros({d}, DType::F64);
    kern::mix_backward(dsrc1, dw1, dx, w, src, rstds_of(src), one.m.probs);
    REQUIRE(scaled_diff(dg, dg1) < 1e-12);
    REQUIRE(scaled_diff(dw, dw1) < 1e-12);
    for (int64_t j = 0; j < c.m; ++j) REQUIRE(scaled_diff(drecent[j], dsrc1[c.k + j]) < 1e-12);
    for (int64_t j = 0; j < c.k; ++j) REQUIRE(scaled_diff(dsrc[j], dsrc1[j]) < 1e-12);
  }
}

TEST_CASE("mix backward with Store::Set writes what zeroing then adding gives", "[kernels]") {
  // The final Mix is the first backward to reach the sources: it writes
  // their gradients instead of adding (kernels/store.h). Over NaN-filled
  // buffers (never read under Set), the same bits as Add into zeros.
  const int64_t N = 7, d = 10, k = 3, m = 2;
  std::vector<Tensor> src = random_sources(k + m, N, d, 300);
  std::vector<Tensor> first(src.begin(), src.begin() + k), recent(src.begin() + k, src.end());
  const Tensor w = randn({d}, 310), g = randn({d}, 311), du = randn({N, d}, 312);
  Tensor stats;
  GroupOut grp;
  two_phase(w, first, recent, g, &stats, &grp);
  auto nan_like = [](const std::vector<Tensor>& ts) {
    std::vector<Tensor> r;
    for (const Tensor& t : ts) {
      r.push_back(Tensor::empty(t.shape(), t.dtype()));
      for (int64_t i = 0; i < t.numel(); ++i) r.back().data<double>()[i] = std::nan("");
    }
    return r;
  };
  // The merge's recent sources, then phase 1's sources.
  std::vector<Tensor> de_add = zeros_like(recent), de_set = nan_like(recent);
  Tensor d_o[2], dlse[2], dw[2], dg[2];
  for (int r = 0; r < 2; ++r) {
    d_o[r] = Tensor::empty({N, d}, DType::F64);
    dlse[r] = Tensor::empty({1, N}, DType::F64);
    dw[r] = Tensor::zeros({d}, DType::F64);
    dg[r] = Tensor::zeros({d}, DType::F64);
    Tensor dlse_row = dlse[r].reshape({N});
    kern::mix_merge_norm_backward(d_o[r], dlse_row, r == 0 ? de_add : de_set, dw[r], dg[r], du, w,
                                  grp.outs[0], recent, g, stats,
                                  r == 0 ? kern::Store::Add : kern::Store::Set);
  }
  for (int64_t j = 0; j < m; ++j) CHECK(same_bits(de_add[j], de_set[j]));
  CHECK(same_bits(dw[0], dw[1]));
  std::vector<Tensor> ds_add = zeros_like(first), ds_set = nan_like(first);
  const std::vector<Tensor> rs = rstds_of(first);
  for (int r = 0; r < 2; ++r) {
    std::vector<Tensor> dws{Tensor::zeros({d}, DType::F64)}, douts{d_o[0]}, qs{w};
    kern::mix_backward(r == 0 ? ds_add : ds_set, dws, douts, &dlse[0], qs, first, rs, grp.probs,
                       r == 0 ? kern::Store::Add : kern::Store::Set);
  }
  for (int64_t j = 0; j < k; ++j) {
    INFO("source " << j);
    CHECK(same_bits(ds_add[j], ds_set[j]));
    double largest = 0;  // every element finite, some not 0
    bool finite = true;
    for (int64_t i = 0; i < ds_set[j].numel(); ++i) {
      finite = finite && std::isfinite(at(ds_set[j], i));
      largest = std::max(largest, std::fabs(at(ds_set[j], i)));
    }
    CHECK(finite);
    CHECK(largest > 0);
  }
  // Set cannot write one tensor twice: aliased gradients are refused.
  std::vector<Tensor> aliased{ds_set[0], ds_set[1], ds_set[0]};
  std::vector<Tensor> dws{Tensor::zeros({d}, DType::F64)}, douts{d_o[0]}, qs{w};
  CHECK_THROWS_WITH(kern::mix_backward(aliased, dws, douts, &dlse[0], qs, first, rs, grp.probs,
                                       kern::Store::Set),
                    Catch::Contains("dsources[0] and dsources[2] are one tensor"));
}

TEST_CASE("mix merge + norm backward matches finite differences", "[kernels]") {
  const int64_t N = 6, d = 10;
  for (int64_t m : {int64_t(1), int64_t(3)}) {
    INFO("recent sources " << m);
    std::vector<Tensor> e;
    for (int64_t j = 0; j < m; ++j) e.push_back(randn({N, d}, 91 + 10 * j, DType::F64, 1.7));
    Tensor o = randn({N, d}, 90), lse = randn({N}, 92), w = randn({d}, 93);
    Tensor wt = randn({N, d}, 94), g = randn({d}, 96);
    auto merge = [&] {
      Tensor u = Tensor::empty({N, d}, DType::F64);
      Tensor st = Tensor::empty({N, 2 * m + 2}, DType::F64);
      kern::mix_merge_norm_forward(u, st, w, o, lse, e, g, kEps);
      return std::make_pair(u, st);
    };
    auto loss = [&] { return weighted_sum(merge().first, wt); };
    const Tensor stats = merge().second;
    // The recent sources' gradients accumulate: start them from random
    // values and subtract those after.
    std::vector<Tensor> de0, de;
    for (int64_t j = 0; j < m; ++j) {
      de0.push_back(randn({N, d}, 95 + 10 * j));
      de.push_back(de0[j].clone());
    }
    Tensor d_o = Tensor::empty({N, d}, DType::F64), dlse = Tensor::empty({N}, DType::F64);
    Tensor dw = Tensor::zeros({d}, DType::F64), dg = Tensor::zeros({d}, DType::F64);
    kern::mix_merge_norm_backward(d_o, dlse, de, dw, dg, wt, w, o, e, g, stats);
    REQUIRE(fd_check(o, d_o, loss, kH, kFloor) < 1e-6);
    REQUIRE(fd_check(lse, dlse, loss, kH, kFloor) < 1e-6);
    for (int64_t j = 0; j < m; ++j) {
      for (int64_t i = 0; i < de[j].numel(); ++i) set(de[j], i, at(de[j], i) - at(de0[j], i));
      REQUIRE(fd_check(e[j], de[j], loss, kH, kFloor) < 1e-6);
    }
    REQUIRE(fd_check(w, dw, loss, kH, kFloor) < 1e-6);
    REQUIRE(fd_check(g, dg, loss, kH, kFloor) < 1e-6);

    // The recent sources' gradients may alias: one buffer receives the sum.
    Tensor shared = Tensor::zeros({N, d}, DType::F64), d_o2 = Tensor::empty({N, d}, DType::F64);
    Tensor dlse2 = Tensor::empty({N}, DType::F64), dw2 = Tensor::zeros({d}, DType::F64);
    Tensor dg2 = Tensor::zeros({d}, DType::F64);
    std::vector<Tensor> aliased(static_cast<size_t>(m), shared);
    kern::mix_merge_norm_backward(d_o2, dlse2, aliased, dw2, dg2, wt, w, o, e, g, stats);
    Tensor sum = Tensor::zeros({N, d}, DType::F64);
    for (const Tensor& t : de) kern::add_(sum, t);
    REQUIRE(scaled_diff(shared, sum) < 1e-14);
  }
}

TEST_CASE("mix backward's lse gradient matches finite differences", "[kernels]") {
  const int64_t N = 5, d = 8, k = 3, Q = 2;
  std::vector<Tensor> src = random_sources(k, N, d, 100);
  std::vector<Tensor> ws{randn({d}, 101), randn({d}, 102)};
  const Tensor wl = randn({Q, N}, 103);  // loss = sum wl * lse (no output term)
  auto loss = [&] { return weighted_sum(mix_group(ws, src, rstds_of(src)).lse, wl); };
  std::vector<Tensor> rs = rstds_of(src);
  GroupOut g = mix_group(ws, src, rs);
  std::vector<Tensor> dsrc = zeros_like(src), dws = zeros_like(ws);
  std::vector<Tensor> douts{Tensor::zeros({N, d}, DType::F64), Tensor::zeros({N, d}, DType::F64)};
  kern::mix_backward(dsrc, dws, douts, &wl, ws, src, rs, g.probs);
  // lse is more curved than the outputs: a smaller step keeps truncation low.
  for (int64_t q = 0; q < Q; ++q) REQUIRE(fd_check(ws[q], dws[q], loss, kH / 10, kFloor) < 1e-6);
  for (int64_t j = 0; j < k; ++j)
    REQUIRE(fd_check(src[j], dsrc[j], loss, kH / 10, kFloor) < 1e-6);
}

TEST_CASE("mix rejects bad arguments", "[kernels]") {
  const int64_t N = 4, d = 6;
  std::vector<Tensor> src = random_sources(2, N, d, 60);
  std::vector<Tensor> rs = rstds_of(src);
  Tensor w = randn({d}, 61);
  Tensor out = Tensor::empty({N, d}, DType::F64), probs = Tensor::empty({N, 2}, DType::F64);
  REQUIRE_NOTHROW(kern::mix_forward(out, probs, w, src, rs));

  std::vector<Tensor> none;
  REQUIRE_THROWS_AS(kern::mix_forward(out, probs, w, none, none), Error);
  REQUIRE_THROWS_WITH(kern::mix_forward(out, probs, w, none, none),
                      Catch::Contains("mix_forward: needs at least one source"));
  std::vector<Tensor> one_rstd{rs[0]};
  REQUIRE_THROWS_WITH(kern::mix_forward(out, probs, w, src, one_rstd),
                      Catch::Contains("2 sources but 1 rstds"));
  std::vector<Tensor> bad_src{src[0], randn({N, d + 1}, 62)};
  REQUIRE_THROWS_WITH(kern::mix_forward(out, probs, w, bad_src, rs),
                      Catch::Contains("mix_forward: sources[1] has shape [4, 7], expected [4, 6]"));
  std::vector<Tensor> bad_rs{rs[0], Tensor::empty({N + 1}, DType::F64)};
  REQUIRE_THROWS_WITH(kern::mix_forward(out, probs, w, src, bad_rs),
                      Catch::Contains("rstds[1] has shape [5], expected [4]"));
  Tensor bad_probs = Tensor::empty({N, 3}, DType::F64);
  REQUIRE_THROWS_WITH(kern::mix_forward(out, bad_probs, w, src, rs),
                      Catch::Contains("probs has shape [4, 3], expected [4, 2]"));
  Tensor w32 = w.to(DType::F32);
  REQUIRE_THROWS_WITH(kern::mix_forward(out, probs, w32, src, rs),
                      Catch::Contains("sources[0] is F64, expected F32"));
  Tensor w2 = randn({1, d}, 63);
  REQUIRE_THROWS_WITH(kern::mix_forward(out, probs, w2, src, rs), Catch::Contains("w must be 1-D"));

  std::vector<Tensor> dsrc = zeros_like(src);
  Tensor dw = Tensor::zeros({d}, DType::F64), dout = randn({N, d}, 64);
  REQUIRE_NOTHROW(kern::mix_backward(dsrc, dw, dout, w, src, rs, probs));
  std::vector<Tensor> dsrc1{dsrc[0]};
  REQUIRE_THROWS_WITH(kern::mix_backward(dsrc1, dw, dout, w, src, rs, probs),
                      Catch::Contains("mix_backward: 2 sources but 1 dsources"));
  Tensor bad_dw = Tensor::zeros({d + 1}, DType::F64);
  REQUIRE_THROWS_WITH(kern::mix_backward(dsrc, bad_dw, dout, w, src, rs, probs),
                      Catch::Contains("dw has shape [7], expected [6]"));

  Tensor rstd = Tensor::empty({N + 1}, DType::F64);
  REQUIRE_THROWS_WITH(kern::mix_source_rstd(rstd, src[0], kEps),
                      Catch::Contains("mix_source_rstd: rstd has shape [5], expected [4]"));

  // The merge: stats [N, 2m + 2] for m recent sources, m >= 1, one gradient each.
  Tensor u = Tensor::empty({N, d}, DType::F64), lse = randn({N}, 65), g = randn({d}, 66);
  Tensor stats = Tensor::empty({N, 6}, DType::F64);
  REQUIRE_NOTHROW(kern::mix_merge_norm_forward(u, stats, w, out, lse, src, g, kEps));
  REQUIRE_THROWS_WITH(kern::mix_merge_norm_forward(u, stats, w, out, lse, none, g, kEps),
                      Catch::Contains("mix_merge_norm_forward: needs at least one recent source"));
  Tensor stats3 = Tensor::empty({N, 3}, DType::F64);
  REQUIRE_THROWS_WITH(kern::mix_merge_norm_forward(u, stats3, w, out, lse, src, g, kEps),
                      Catch::Contains("stats has shape [4, 3], expected [4, 6]"));
  REQUIRE_THROWS_WITH(kern::mix_merge_norm_forward(u, stats, w, out, lse, bad_src, g, kEps),
                      Catch::Contains("recent[1] has shape [4, 7], expected [4, 6]"));
  Tensor d_o = Tensor::empty({N, d}, DType::F64), dlse = Tensor::empty({N}, DType::F64);
  Tensor dg = Tensor::zeros({d}, DType::F64);
  REQUIRE_NOTHROW(kern::mix_merge_norm_backward(d_o, dlse, dsrc, dw, dg, dout, w, out, src, g, stats));
  REQUIRE_THROWS_WITH(
      kern::mix_merge_norm_backward(d_o, dlse, dsrc1, dw, dg, dout, w, out, src, g, stats),
      Catch::Contains("mix_merge_norm_backward: 2 recent sources but 1 gradients"));
}
