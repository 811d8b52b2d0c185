// train::largest_fitting, the search behind `inspect memory --gpu-memory` and
// `bench --batch auto`: the largest value that fits, for thresholds anywhere,
// and never a question past the caller's bound.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>

#include "train/memory.h"

using attnres::train::largest_fitting;

TEST_CASE("largest_fitting finds the largest value that fits, for every threshold", "[memory]") {
  for (int64_t lo : {1, 4}) {
    for (int64_t step : {1, 3}) {
      for (int64_t limit = lo - step; limit < lo + 200; ++limit) {
        int64_t asked_max = 0;
        const int64_t got = largest_fitting(lo, step, [&](int64_t v) {
          asked_max = std::max(asked_max, v);
          return v <= limit;
        });
        // The largest lo + k step <= limit; lo - step when lo itself does not fit.
        const int64_t want = limit < lo ? lo - step : lo + (limit - lo) / step * step;
        INFO("lo " << lo << ", step " << step << ", fits up to " << limit);
        CHECK(got == want);
        // Doubling asks at most about twice the answer.
        CHECK(asked_max <= std::max(lo + step, 2 * want + step));
      }
    }
  }
}

TEST_CASE("largest_fitting stops at its bound and asks nothing beyond it", "[memory]") {
  for (int64_t hi : {1, 2, 5, 64, 100}) {
    for (int64_t limit : {hi - 1, hi, hi + 1, int64_t{1} << 40}) {
      int64_t asked_max = 0;
      const int64_t got = largest_fitting(1, 1, [&](int64_t v) {
        asked_max = std::max(asked_max, v);
        return v <= limit;
      }, hi);
      INFO("bound " << hi << ", fits up to " << limit);
      CHECK(got == std::min(limit, hi));
      CHECK(asked_max <= hi);
    }
  }
  // A bound off the grid: the last grid value below it.
  CHECK(largest_fitting(2, 5, [](int64_t) { return true; }, 20) == 17);
  CHECK(largest_fitting(2, 5, [](int64_t v) { return v <= 13; }, 20) == 12);
}
