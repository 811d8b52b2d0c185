// Mixture-of-experts routing, permutation and combine (kernels/moe.h): the
// choice and gate weights against values worked out by hand and against a
// plain transcription of the rule, the capacity's drop order, and every
// backward by finite differences (in double).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/moe.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
using kernels::MoeRouteOptions;
using kernels::MoeRouter;
using kernels::MoeRouting;

namespace {

Tensor from_rows(const std::vector<std::vector<double>>& rows) {
  const int64_t n = static_cast<int64_t>(rows.size()), m = static_cast<int64_t>(rows[0].size());
  Tensor t = Tensor::empty({n, m}, DType::F64);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) set(t, i * m + j, rows[i][j]);
  return t;
}

std::vector<int32_t> ints(const Tensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

MoeRouting route(const Tensor& logits, const Tensor* bias, MoeRouteOptions opt) {
  MoeRouting r;
  kernels::moe_route(r, logits, bias, opt);
  return r;
}

// The rule of kernels/moe.h written out plainly for one token: scores, the K
// best (key desc, index asc), ascending, weights.
void reference_token(const std::vector<double>& logit, const std::vector<double>& bias,
                     const MoeRouteOptions& o, std::vector<int32_t>& chosen,
                     std::vector<double>& gate) {
  const size_t E = logit.size();
  std::vector<double> s(E);
  if (o.router == MoeRouter::Sigmoid) {
    for (size_t e = 0; e < E; ++e) s[e] = sigmoid(logit[e]);
  } else {
    double z = 0;
    for (size_t e = 0; e < E; ++e) z += std::exp(logit[e]);
    for (size_t e = 0; e < E; ++e) s[e] = std::exp(logit[e]) / z;
  }
  std::vector<int32_t> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return s[a] + bias[a] > s[b] + bias[b];
  });
  chosen.assign(order.begin(), order.begin() + o.top_k);
  std::sort(chosen.begin(), chosen.end());
  double sum = 0;
  for (int32_t e : chosen) sum += s[e];
  gate.clear();
  for (int32_t e : chosen) gate.push_back(o.scale * s[e] / sum);
}

}  // namespace

TEST_CASE("moe routing: top-k by score + bias, ties to the lower expert, weights from the scores",
          "[kernels][moe]") {
  // Token 0: experts 3 and 1 lead; token 1: expert 0, then a tie between 1
  // and 2 that goes to 1; token 2: the bias moves expert 0 in, but its gate
  // weight comes from its score alone.
  const Tensor logits = from_rows({{-3.0, 1.0, -2.0, 3.0}, {2.0, 0.5, 0.5, -1.0}, {0.0, 0.2, 0.4, 0.3}});
  const Tensor bias = from_rows({{0.5, 0.0, 0.0, 0.0}}).reshape({4});
  MoeRouteOptions o;
  o.top_k = 2;
  o.scale = 2.5;
  const MoeRouting r = route(logits, &bias, o);
  CHECK(ints(r.expert) == std::vector<int32_t>{1, 3, 0, 1, 0, 2});
  const double s1 = sigmoid(1.0), s3 = sigmoid(3.0);
  CHECK(at(r.gate, 0) == Approx(2.5 * s1 / (s1 + s3)).epsilon(1e-14));
  CHECK(at(r.gate, 1) == Approx(2.5 * s3 / (s1 + s3)).epsilon(1e-14));
  const double s0 = sigmoid(0.0), s2 = sigmoid(0.4);
  CHECK(at(r.gate, 4) == Approx(2.5 * s0 / (s0 + s2)).epsilon(1e-14));
  // Rows grouped by expert, in token order: expert 0 has tokens 1, 2; 1 has
  // 0, 1; 2 has 2; 3 has 0.
  CHECK(r.offsets == std::vector<int64_t>{0, 2, 4, 5, 6});
  CHECK(ints(r.token) == std::vector<int32_t>{1, 2, 0, 1, 2, 0});
  CHECK(ints(r.row) == std::vector<int32_t>{2, 5, 0, 3, 1, 4});
  CHECK(r.load == std::vector<int64_t>{2, 2, 1, 1});
  CHECK(r.dropped == 0);

  // Without the bias, token 2 takes experts 2 and 3.
  const MoeRouting nb = route(logits, nullptr, o);
  CHECK(ints(nb.expert) == std::vector<int32_t>{1, 3, 0, 1, 2, 3});

  // Softmax: the chosen renormalised, i.e. a softmax over the chosen logits.
  o.router = MoeRouter::Softmax;
  o.scale = 1;
  const MoeRouting sm = route(logits, nullptr, o);
  CHECK(ints(sm.expert) == std::vector<int32_t>{1, 3, 0, 1, 2, 3});
  CHECK(at(sm.gate, 0) == Approx(std::exp(1.0) / (std::exp(1.0) + std::exp(3.0))).epsilon(1e-14));
}

TEST_CASE("moe routing equals the rule written out, on random logits, both routers",
          "[kernels][moe]") {
  const int64_t N = 37, E = 9;
  const Tensor logits = randn({N, E}, 41);
  const Tensor bias = randn({E}, 42, DType::F64, 0.3);
  for (MoeRouter router : {MoeRouter::Sigmoid, MoeRouter::Softmax})
    for (int64_t K : {1, 3, 9}) {
      MoeRouteOptions o;
      o.router = router;
      o.top_k = K;
      o.scale = 1.7;
      const MoeRouting r = route(logits, &bias, o);
      int64_t worst_choice = 0;
      double worst_gate = 0;
      for (int64_t t = 0; t < N; ++t) {
        std::vector<double> l(E), b(E), gate;
        for (int64_t e = 0; e < E; ++e) l[e] = at(logits, t * E + e), b[e] = at(bias, e);
        std::vector<int32_t> chosen;
        reference_token(l, b, o, chosen, gate);
        for (int64_t j = 0; j < K; ++j) {
          worst_choice += r.expert.data<int32_t>()[t * K + j] != chosen[j];
          worst_gate = nan_max(worst_gate, std::fabs(at(r.gate, t * K + j) - gate[j]));
        }
      }
      CHECK(worst_choice == 0);
      CHECK(worst_gate < 1e-14);
      // Every slot is kept exactly once, in its expert's range.
      CHECK(r.rows() == N * K);
      for (int64_t i = 0; i < N * K; ++i) {
        const int32_t e = r.expert.data<int32_t>()[i], row = r.row.data<int32_t>()[i];
        CHECK(row >= r.offsets[e]);
        CHECK(row < r.offsets[e + 1]);
        CHECK(r.token.data<int32_t>()[row] == i / K);
      }
    }
}

TEST_CASE("moe routing ties: each rule on an input where another rule gives another answer",
          "[kernels][moe]") {
  // Where ties only ever meet at the top, "ties to the lower index" cannot be
  // told from "ties to the later index" or "the first K seen": here the tie
  // sits at the K-th place and a larger key comes after it, so the kept set
  // moves while the tie is decided.
  MoeRouteOptions o;
  o.top_k = 2;
  SECTION("a tie for the K-th place, then a larger key (sigmoid)") {
    // Keys 0.5, 0.5, 0.5, 0.9-ish: expert 3 first, then 0 of the three tied.
    const Tensor logits = from_rows({{0, 0, 0, 2}, {2, 0, 0, 0}, {0, 2, 0, 0}});
    const MoeRouting r = route(logits, nullptr, o);
    CHECK(ints(r.expert) == std::vector<int32_t>{0, 3, 0, 1, 0, 1});
  }
  SECTION("a tie across the bias: equal keys from unequal scores") {
    // Expert 1's score is larger (sigmoid(1) > sigmoid(0)) but its key
    // s + b equals expert 0's to the last bit: the key decides, and the tie
    // goes to expert 0; a later expert 3 with the larger key takes first
    // place. A rule breaking ties by the score would pick 1.
    const double s0 = sigmoid(0.0), s1 = sigmoid(1.0), b0 = 0.25;
    double b1 = s0 + b0 - s1;
    for (int i = 0; i < 8 && s1 + b1 != s0 + b0; ++i)  // round to the exact tie
      b1 = std::nextafter(b1, s1 + b1 < s0 + b0 ? 1.0 : -1.0);
    REQUIRE(s1 + b1 == s0 + b0);
    const Tensor logits = from_rows({{0, 1, -1, 3}});
    const Tensor bias = from_rows({{b0, b1, 0.0, 0.0}}).reshape({4});
    o.scale = 2;
    const MoeRouting r = route(logits, &bias, o);
    CHECK(ints(r.expert) == std::vector<int32_t>{0, 3});
    // The gate weights come from the scores alone, not the keys.
    const double s3 = sigmoid(3.0);
    CHECK(at(r.gate, 0) == Approx(2 * s0 / (s0 + s3)).epsilon(1e-14));
    // And the order of the tied pair in the input does not matter: swapped
    // (the larger score first), the lower index (now the larger score) wins.
    const Tensor swapped = from_rows({{1, 0, -1, 3}});
    const Tensor bias_sw = from_rows({{b1, b0, 0.0, 0.0}}).reshape({4});
    CHECK(ints(route(swapped, &bias_sw, o).expert) == std::vector<int32_t>{0, 3});
  }
  SECTION("ties in the softmax router") {
    // Equal logits give equal softmax scores exactly; the tie at the K-th
    // place (experts 1, 2, 4) goes to 1, after the larger expert 3.
    o.router = MoeRouter::Softmax;
    const Tensor logits = from_rows({{-1, 0.5, 0.5, 2, 0.5}});
    const MoeRouting r = route(logits, nullptr, o);
    CHECK(ints(r.expert) == std::vector<int32_t>{1, 3});
    // K = 3: the two lowest of the three tied.
    o.top_k = 3;
    CHECK(ints(route(logits, nullptr, o).expert) == std::vector<int32_t>{1, 2, 3});
  }
}

TEST_CASE("moe capacity: slots past an expert's capacity are dropped in token order",
          "[kernels][moe]") {
  // Every token prefers expert 0 then 1 (top-2 of 3): with capacity 2, tokens
  // 2 and 3 lose both (their gate 0, no row); expert 2 is never chosen.
  const Tensor logits = from_rows({{3, 2, -1}, {3, 2, -1}, {3, 2, -1}, {3, 2, -1}});
  MoeRouteOptions o;
  o.top_k = 2;
  o.capacity = 2;
  const MoeRouting r = route(logits, nullptr, o);
  CHECK(ints(r.row) == std::vector<int32_t>{0, 2, 1, 3, -1, -1, -1, -1});
  CHECK(r.offsets == std::vector<int64_t>{0, 2, 4, 4});
  CHECK(r.dropped == 4);
  CHECK(r.load == std::vector<int64_t>{4, 4, 0});
  CHECK(at(r.gate, 4) == 0);
  CHECK(at(r.gate, 0) > 0);
  // A dropped slot adds nothing: token 2's output is its base.
  Tensor y = randn({4, 3}, 5), base = randn({4, 3}, 6), out = Tensor::empty({4, 3}, DType::F64);
  kernels::moe_combine(out, y, r, &base);
  for (int64_t i = 6; i < 12; ++i) CHECK(at(out, i) == at(base, i));

  // GShard's rule where renormalising would differ: token 1 loses only its
  // expert-0 slot (token 0 took expert 0's one place); its expert-2 slot
  // keeps the weight s_2 / (s_0 + s_2), not 1.
  const Tensor two = from_rows({{3, 2, -1}, {3, -1, 2}});
  o.capacity = 1;
  const MoeRouting r2 = route(two, nullptr, o);
  CHECK(ints(r2.expert) == std::vector<int32_t>{0, 1, 0, 2});
  CHECK(r2.dropped == 1);
  CHECK(at(r2.gate, 2) == 0);
  CHECK(at(r2.gate, 3) == Approx(sigmoid(2.0) / (sigmoid(3.0) + sigmoid(2.0))).epsilon(1e-14));
}

TEST_CASE("moe permute, combine and routing backward match finite differences", "[kernels][moe]") {
  const int64_t N = 11, E = 5, K = 2, d = 6;
  for (MoeRouter router : {MoeRouter::Sigmoid, MoeRouter::Softmax}) {
    MoeRouteOptions o;
    o.router = router;
    o.top_k = K;
    o.scale = 1.3;
    o.capacity = router == MoeRouter::Sigmoid ? 4 : 0;  // drops in one of the two
    Tensor logits = randn({N, E}, 7);
    const MoeRouting r0 = route(logits, nullptr, o);
    const int64_t M = r0.rows();
    Tensor y = randn({M, d}, 8), base = randn({N, d}, 9), w = randn({N, d}, 10);
    // L = sum(w * combine(base, y; routing of logits)), the choice held fixed
    // (h small enough not to change it).
    auto loss = [&]() {
      MoeRouting r;
      kernels::moe_route(r, logits, nullptr, o);
      Tensor out = Tensor::empty({N, d}, DType::F64);
      kernels::moe_combine(out, y, r, &base);
      return weighted_sum(out, w);
    };
    Tensor dy = Tensor::empty({M, d}, DType::F64), dgate = Tensor::empty({N, K}, DType::F64);
    kernels::moe_combine_backward(dy, dgate, w, y, r0);
    Tensor dlogits = Tensor::empty({N, E}, DType::F64);
    kernels::moe_route_backward(dlogits, dgate, logits, r0, o);
    INFO("router " << (router == MoeRouter::Sigmoid ? "sigmoid, capacity 4" : "softmax"));
    CHECK(scaled_diff(dy, fd_gradient(y, loss, 1e-3)) < 1e-9);  // linear in y: exact
    CHECK(scaled_diff(dlogits, fd_gradient(logits, loss)) < 1e-7);

    // permute and unpermute_add are each other's transposes: <P u, v> = <u, P^T v>.
    const Tensor u = randn({N, d}, 11), v = randn({M, d}, 12);
    Tensor pu = Tensor::empty({M, d}, DType::F64), ptv = Tensor::zeros({N, d}, DType::F64);
    kernels::moe_permute(pu, u, r0);
    kernels::moe_unpermute_add(ptv, v, r0);
    const double lhs = weighted_sum(pu, v), rhs = weighted_sum(u, ptv);
    CHECK(lhs == approx_terms(rhs, 1e-14, weighted_sum(abs_of(pu), abs_of(v))));
  }
}

TEST_CASE("moe balance term: 1/E at perfect balance, its gradient by finite differences",
          "[kernels][moe]") {
  // Equal logits: P_e = 1/E for both routers, and 4 tokens over 4 experts,
  // top-1 with a bias making token t choose expert t: f_e = 1/4.
  const Tensor flat = Tensor::zeros({4, 4}, DType::F64);
  MoeRouteOptions o;
  o.top_k = 1;
  for (MoeRouter router : {MoeRouter::Sigmoid, MoeRouter::Softmax}) {
    o.router = router;
    MoeRouting r = route(flat, nullptr, o);
    r.load = {1, 1, 1, 1};
    CHECK(kernels::moe_balance(flat, r, router) == Approx(0.25).epsilon(1e-14));
  }
  const int64_t N = 13, E = 6, K = 2;
  for (MoeRouter router : {MoeRouter::Sigmoid, MoeRouter::Softmax}) {
    o.router = router;
    o.top_k = K;
    Tensor logits = randn({N, E}, 21);
    const MoeRouting r = route(logits, nullptr, o);
    auto loss = [&]() { return 3.0 * kernels::moe_balance(logits, r, router); };
    Tensor d = randn({N, E}, 22);  // added to: the result is d + the gradient
    const Tensor before = d.clone();
    kernels::moe_balance_backward(d, logits, r, router, 3.0);
    Tensor grad = Tensor::empty({N, E}, DType::F64);
    for (int64_t i = 0; i < N * E; ++i) set(grad, i, at(d, i) - at(before, i));
    CHECK(scaled_diff(grad, fd_gradient(logits, loss)) < 1e-7);
  }
}
