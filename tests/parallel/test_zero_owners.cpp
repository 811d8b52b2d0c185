// Muon's ZeRO-1 owners (parallel/zero.h whole_owners): the assignment itself
// against its documented rule, written out here independently (largest
// Newton-Schulz work min(a, b)^2 max(a, b) first, each to the replica with the
// least work so far, ties to the lower replica), on inputs where other rules
// (every matrix on one replica, table order, round robin, smallest first)
// give other owners; and ZeroShard's spaces built from it. Every loss stays
// exact whichever replica owns a matrix, so nothing else would notice.
#include <algorithm>
#include <numeric>

#include "parallel/zero.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;

namespace {

double ns_work(const Shape& s) {
  double a = static_cast<double>(s[0]), b = 1;
  for (size_t k = 1; k < s.size(); ++k) b *= static_cast<double>(s[k]);
  return std::min(a, b) * std::min(a, b) * std::max(a, b);
}

// The rule, plainly: visit the matrices by work, descending (equal works in
// table order); give each to the first replica of least load.
std::vector<int> rule(const std::vector<Shape>& shapes, int members) {
  std::vector<size_t> order(shapes.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return ns_work(shapes[x]) > ns_work(shapes[y]); });
  std::vector<double> load(static_cast<size_t>(members), 0);
  std::vector<int> owner(shapes.size());
  for (size_t i : order) {
    int best = 0;
    for (int r = 1; r < members; ++r)
      if (load[size_t(r)] < load[size_t(best)]) best = r;
    owner[i] = best;
    load[size_t(best)] += ns_work(shapes[i]);
  }
  return owner;
}

}  // namespace

TEST_CASE("zero-1 whole owners: largest Newton-Schulz work first, each to the least-loaded replica",
          "[parallel][zero]") {
  // Works (min^2 max): 64x64 262144, 32x128 131072 (and 128x32: the same),
  // 16x512 131072, 64x16 16384, 8x8 512. Two replicas: 64x64 -> 0, then the
  // three of 131072 in table order -> 1, 1, then 0 (262144 each: the tie to
  // the lower replica), 64x16 -> 1, 8x8 -> 1.
  const std::vector<Shape> shapes = {{8, 8}, {32, 128}, {64, 64}, {128, 32}, {64, 16}, {16, 512}};
  const std::vector<int> got = parallel::whole_owners(shapes, 2);
  CHECK(got == std::vector<int>{1, 1, 0, 1, 1, 0});
  CHECK(got == rule(shapes, 2));
  // Not what the tempting wrong rules give: all on one replica, table order
  // round robin, smallest first.
  CHECK(got != std::vector<int>(shapes.size(), 0));
  CHECK(got != std::vector<int>{0, 1, 0, 1, 0, 1});
  // One replica owns everything; more replicas than matrices leaves some idle
  // (the largest to 0, the next to 1, ...).
  CHECK(parallel::whole_owners(shapes, 1) == std::vector<int>(shapes.size(), 0));
  CHECK(parallel::whole_owners(shapes, 8) == std::vector<int>{5, 1, 0, 2, 4, 3});
  // A 3-D shape folds its trailing dims into b: [4, 8, 8] is 4 x 64.
  CHECK(parallel::whole_owners({{4, 8, 8}, {16, 16}}, 2) == std::vector<int>{1, 0});
}

TEST_CASE("zero-1 whole owners equal the rule on random shapes, and balance the work",
          "[parallel][zero]") {
  uint64_t state = 12345;
  auto next = [&](int lo, int hi) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + static_cast<int>((state >> 33) % static_cast<uint64_t>(hi - lo + 1));
  };
  for (int trial = 0; trial < 50; ++trial) {
    const int n = next(1, 40), members = next(1, 9);
    std::vector<Shape> shapes;
    for (int i = 0; i < n; ++i) shapes.push_back({next(1, 12) * 16, next(1, 12) * 16});
    const std::vector<int> got = parallel::whole_owners(shapes, members);
    INFO("trial " << trial << ": " << n << " matrices over " << members << " replicas");
    REQUIRE(got == rule(shapes, members));
    // The greedy's guarantee: no replica's work exceeds the least loaded's
    // by more than the largest single matrix (so never all on one replica
    // while another idles, with more matrices than replicas).
    std::vector<double> load(static_cast<size_t>(members), 0);
    double largest = 0;
    for (int i = 0; i < n; ++i) {
      load[size_t(got[size_t(i)])] += ns_work(shapes[size_t(i)]);
      largest = std::max(largest, ns_work(shapes[size_t(i)]));
    }
    const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    CHECK(*hi - *lo <= largest);
  }
}
