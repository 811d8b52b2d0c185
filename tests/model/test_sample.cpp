// The sampler of `attnres generate` (model/sample.h): for fixed logits the
// frequencies of many draws are softmax(logits / T) restricted to the k
// largest logits and renormalised, ids outside those k are never drawn, k = 1
// and T <= 0 are greedy, and a seed fixes the sequence of draws.
//
// Tolerance of a frequency: n draws of an id kept with probability p give a
// Binomial(n, p) count, whose frequency has standard error sqrt(p (1 - p) / n);
// a check allows 5 of them. For independent uniform draws a correct sampler
// fails one check with probability 5.7e-7 (two-sided normal tail at 5), all of
// this file's ~100 frequency checks together about 6e-5. The draws are a fixed function of
// the seeds (core/rng.h), so the test gives the same answer on every run; the
// bound says that the seeds chosen are not special. With n = 200000 a bound is
// at most 5 x 0.5 / sqrt(n) = 0.0056, against what the faults below move:
// temperature applied as a multiply (at T = 0.5 the top token's 0.67 becomes
// 0.41), or a (k+1)-th id kept (drawn thousands of times where 0 is allowed).
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "core/rng.h"
#include "model/sample.h"

using namespace attnres;
using model::sample_token;

namespace {

constexpr int64_t kDraws = 200000;

// Eight logits, no two equal. In decreasing order: id 1 (3.0), 5 (2.5),
// 3 (2.0), 0 (1.0), 4 (0.25), 7 (0.0), 2 (-0.5), 6 (-2.0).
const std::vector<float> kLogits = {1.0f, 3.0f, -0.5f, 2.0f, 0.25f, 2.5f, -2.0f, 0.0f};
const std::vector<int32_t> kByLogit = {1, 5, 3, 0, 4, 7, 2, 6};

// softmax(logits / T) over the ids `kept`, renormalised over them: written
// directly, exp(l_i / T) / sum_j exp(l_j / T) in long double (the logits here
// are small: no overflow without the sampler's max subtraction).
std::map<int32_t, double> reference_probs(const std::vector<float>& logits, double T,
                                          const std::vector<int32_t>& kept) {
  long double z = 0;
  for (int32_t i : kept) z += std::exp(static_cast<long double>(logits[i]) / T);
  std::map<int32_t, double> p;
  for (int32_t i : kept) p[i] = static_cast<double>(std::exp(static_cast<long double>(logits[i]) / T) / z);
  return p;
}

// How often each id is drawn in generate's first n draws under `seed`.
std::vector<int64_t> histogram(const std::vector<float>& logits, double T, int64_t k, uint64_t seed,
                               int64_t n) {
  std::vector<int64_t> count(logits.size(), 0);
  int64_t out_of_range = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = sample_token(logits, T, k, seed, static_cast<uint64_t>(i));
    if (id < 0 || id >= static_cast<int32_t>(logits.size())) ++out_of_range;
    else ++count[static_cast<size_t>(id)];
  }
  REQUIRE(out_of_range == 0);
  return count;
}

// Every id outside `want` is never drawn; each id in it is drawn with its
// probability within 5 standard errors.
void check_frequencies(const std::vector<int64_t>& count, const std::map<int32_t, double>& want,
                       int64_t n) {
  double total = 0;
  for (const auto& [id, p] : want) total += p;
  REQUIRE(total == Approx(1.0).epsilon(1e-12));
  for (size_t id = 0; id < count.size(); ++id) {
    const auto it = want.find(static_cast<int32_t>(id));
    INFO("id " << id << ": drawn " << count[id] << " times of " << n);
    if (it == want.end()) {
      CHECK(count[id] == 0);
      continue;
    }
    const double p = it->second, f = static_cast<double>(count[id]) / static_cast<double>(n);
    const double se = std::sqrt(p * (1 - p) / static_cast<double>(n));
    INFO("frequency " << f << ", softmax " << p << ", 5 standard errors " << 5 * se);
    CHECK(std::abs(f - p) <= 5 * se);
  }
}

std::vector<int32_t> first(const std::vector<int32_t>& ids, size_t k) {
  return {ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(std::min(k, ids.size()))};
}

}  // namespace

TEST_CASE("sampling frequencies are softmax(logits / T) over the k largest logits", "[model][sample]") {
  struct Case {
    double T;
    int64_t top_k;
    size_t kept;  // how many of kByLogit are kept
    uint64_t seed;
  };
  // T = 1 is where a temperature multiplied instead of divided goes unseen:
  // every case but one has T != 1. top_k <= 0 and top_k > V keep all 8.
  const Case cases[] = {
      {1.0, 0, 8, 1},  {0.5, 3, 3, 2},   {2.0, 5, 5, 3},  {0.7, 8, 8, 4},
      {1.5, 100, 8, 5}, {1.25, 2, 2, 6}, {3.0, -1, 8, 7}, {0.4, 6, 6, 8},
  };
  for (const Case& c : cases) {
    INFO("T = " << c.T << ", top_k = " << c.top_k << ", seed " << c.seed);
    const auto want = reference_probs(kLogits, c.T, first(kByLogit, c.kept));
    check_frequencies(histogram(kLogits, c.T, c.top_k, c.seed, kDraws), want, kDraws);
  }
}

TEST_CASE("sampling with generate's defaults (T 0.8, top_k 40) from 64 logits", "[model][sample]") {
  const int64_t V = 64;
  std::vector<float> logits(V);
  for (int64_t i = 0; i < V; ++i) logits[i] = static_cast<float>(2.0 * random_normal(42, 3, i));
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  for (int64_t i = 1; i < V; ++i) REQUIRE(logits[order[i - 1]] > logits[order[i]]);  // no ties
  const auto want = reference_probs(logits, 0.8, first(order, 40));
  check_frequencies(histogram(logits, 0.8, 40, 11, kDraws), want, kDraws);
}

TEST_CASE("sampling inverts the cumulative sum at u, in order of decreasing logit", "[model][sample]") {
  // Exact, not statistical: with the kept ids in decreasing order and c_j the
  // running sum of their probabilities, u in (c_{j-1}, c_j] draws the j-th.
  for (const auto& [T, k] : std::vector<std::pair<double, int64_t>>{{0.5, 3}, {2.0, 5}, {1.0, 0}}) {
    const size_t kept = k > 0 ? static_cast<size_t>(k) : kLogits.size();
    const auto p = reference_probs(kLogits, T, first(kByLogit, kept));
    double c = 0;
    for (size_t j = 0; j < kept; ++j) {
      const int32_t id = kByLogit[j];
      INFO("T = " << T << ", top_k = " << k << ", the " << j + 1 << "-th largest logit (id " << id
                  << "), its interval of u (" << c << ", " << c + p.at(id) << "]");
      CHECK(sample_token(kLogits, T, k, c + 1e-9) == id);  // just above the previous boundary
      CHECK(sample_token(kLogits, T, k, c + 0.5 * p.at(id)) == id);
      c += p.at(id);
      if (j + 1 < kept) CHECK(sample_token(kLogits, T, k, c - 1e-9) == id);  // just below its own
    }
    CHECK(sample_token(kLogits, T, k, 1.0) == kByLogit[kept - 1]);  // u = 1: the last kept id
  }
}

TEST_CASE("sampling: k = 1 and T <= 0 are greedy: the argmax, the lowest id on a tie for T <= 0", "[model][sample]") {
  for (uint64_t i = 0; i < 2000; ++i) {
    const double u = model::sample_uniform(9, i);
    INFO("u = " << u);
    CHECK(sample_token(kLogits, 0.0, 40, u) == 1);
    CHECK(sample_token(kLogits, -1.0, 0, u) == 1);
    CHECK(sample_token(kLogits, 1.0, 1, u) == 1);
    CHECK(sample_token(kLogits, 100.0, 1, u) == 1);  // a flat softmax, but only one id kept
    CHECK(sample_token(kLogits, 1e-3, 0, u) == 1);   // e^-500 for the runner-up: greedy in effect
  }
  // T <= 0 on a tie at the maximum: the lowest id (std::max_element's first).
  const std::vector<float> tied = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f};
  for (double u : {1e-12, 0.3, 0.7, 1.0}) {
    CHECK(sample_token(tied, 0.0, 0, u) == 1);
    CHECK(sample_token(tied, 0.0, 1, u) == 1);
  }
  // k = 1 with T > 0 on a tie: one of the tied maxima (partial_sort's pick),
  // the same one for every u.
  const int32_t pick = sample_token(tied, 1.0, 1, 0.5);
  CHECK((pick == 1 || pick == 2 || pick == 4));
  for (uint64_t i = 0; i < 2000; ++i) CHECK(sample_token(tied, 1.0, 1, model::sample_uniform(10, i)) == pick);
}

TEST_CASE("sampling: equal logits at the k-th place: exactly k ids kept, all the larger ones among them", "[model][sample]") {
  // ids 1, 2, 4 tie at 2.0 below id 5 (3.0); ids 0 and 3 are below the tie.
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f, 2.0f, 3.0f};
  const std::set<int32_t> tied = {1, 2, 4};
  struct Case {
    double T;
    int64_t top_k;
  };
  for (const Case& c : {Case{1.0, 2}, Case{0.6, 3}, Case{2.0, 4}}) {
    INFO("T = " << c.T << ", top_k = " << c.top_k);
    const auto count = histogram(logits, c.T, c.top_k, 12, kDraws);
    std::vector<int32_t> drawn;
    for (int32_t id = 0; id < static_cast<int32_t>(logits.size()); ++id)
      if (count[id] > 0) drawn.push_back(id);
    // Each kept id has probability above 0.1 here (the least, a tied id at
    // T = 0.6, top_k = 3: e^(2/0.6) / (e^(3/0.6) + 2 e^(2/0.6)) = 0.137): in
    // 200000 draws every kept id is drawn, so the ids drawn are the ids kept.
    REQUIRE(static_cast<int64_t>(drawn.size()) == c.top_k);
    CHECK(count[5] > 0);  // the larger logit is always kept
    CHECK(count[0] == 0);
    CHECK(count[3] == 0);
    for (int32_t id : drawn) CHECK((id == 5 || tied.count(id) == 1));
    // top_k = 4 keeps the whole tie; top_k 2 and 3 some of it (partial_sort's
    // choice). Over whichever ids are kept, the frequencies are their softmax.
    check_frequencies(count, reference_probs(logits, c.T, drawn), kDraws);
  }
}

TEST_CASE("sampling: the same seed draws the same sequence, another seed another", "[model][sample]") {
  const int64_t n = 1000;
  auto draws = [&](uint64_t seed) {
    std::vector<int32_t> v;
    for (int64_t i = 0; i < n; ++i) v.push_back(sample_token(kLogits, 1.0, 0, seed, static_cast<uint64_t>(i)));
    return v;
  };
  const auto a = draws(1), again = draws(1), b = draws(2);
  CHECK(a == again);
  // Two independent draws differ with probability 1 - sum p_i^2 (0.72 here):
  // about 720 of 1000 positions; ask for half of that.
  double same = 0;
  for (const auto& [id, p] : reference_probs(kLogits, 1.0, kByLogit)) same += p * p;
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += a[i] != b[i];
  INFO(differ << " of " << n << " positions differ; expected about " << (1 - same) * n);
  CHECK(differ > (1 - same) * n / 2);
  // The draw is a function of (seed, i) alone: the i-th token does not depend
  // on the draws before it (generate can stop and the sequence is the same).
  for (int64_t i : {0, 1, 17, 999})
    CHECK(sample_token(kLogits, 1.0, 0, 1, static_cast<uint64_t>(i)) == a[static_cast<size_t>(i)]);
  CHECK(model::sample_uniform(1, 0) != model::sample_uniform(2, 0));
  CHECK(model::sample_uniform(1, 0) != model::sample_uniform(1, 1));
}

TEST_CASE("sampling from no logits is refused", "[model][sample]") {
  CHECK_THROWS(sample_token(std::vector<float>{}, 1.0, 0, 0.5));
  CHECK_THROWS(sample_token(std::vector<float>{}, 0.0, 0, 0.5));
}
