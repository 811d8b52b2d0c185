// train::evaluate (attnres eval's validation loss): the mean per-token loss
// over the first `batches` units of the data, or over all of them when the
// data holds fewer.
#include <algorithm>
#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

#include "data/loader.h"
#include "data/shard.h"
#include "model/model.h"
#include "model/model_testing.h"
#include "temp_dir.h"
#include "testing.h"
#include "train/evaluate.h"

using namespace attnres;

TEST_CASE("evaluate averages over the units asked for, and over every unit when the data holds fewer",
          "[evaluate]") {
  constexpr int64_t B = 2, T = 8, units = 3;
  testing::TempDir dir;
  // units x B x T tokens and the one more that the last unit's targets need:
  // exactly `units` units (docs/model.md section 5).
  data::write_shard(dir / "val.bin", testing::learnable_tokens(7, units * B * T + 1), 2);
  data::TokenLoader loader({dir / "val.bin"}, B, T, /*shuffle=*/false, /*seed=*/1);
  REQUIRE(loader.units_per_epoch() == units);

  model::Model m(testing::resized(testing::tiny(model::ResidualMode::Block, 2), 64, 8, 2, 1, 12));
  testing::randomize(m.params(), 3);
  // Each unit's mean per-token loss, one unit at a time.
  std::vector<double> unit_mean;
  for (int64_t u = 0; u < units; ++u) {
    auto b = loader.unit(u);
    unit_mean.push_back(m.forward_loss(b.inputs, b.targets, B, T) / (B * T));
    REQUIRE(std::isfinite(unit_mean.back()));
  }
  REQUIRE(unit_mean[0] != unit_mean[1]);  // the units differ, so which ones count shows

  auto mean_of_first = [&](int64_t n) {
    double s = 0;
    for (int64_t u = 0; u < n; ++u) s += unit_mean[u];
    return s / static_cast<double>(n);
  };
  for (int64_t batches : {int64_t{1}, int64_t{2}, units, units + 1, int64_t{100}}) {
    INFO("batches " << batches);
    const int64_t n = std::min(batches, units);
    const auto [loss, tokens] = train::evaluate(m, loader, batches, B, T);
    CHECK(tokens == n * B * T);
    CHECK(loss == Approx(mean_of_first(n)).epsilon(1e-12));  // a positive mean: relative
  }
}
