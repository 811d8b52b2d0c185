#include <catch2/catch.hpp>
#include <set>

#include "data/loader.h"
#include "temp_dir.h"

using namespace attnres;
using namespace attnres::data;
using attnres::testing::TempDir;
using Catch::Contains;

namespace {

// Shard whose token i is base + i, so a token names its shard and offset.
std::string make_shard(const TempDir& dir, const std::string& name, int32_t base, int32_t count,
                       int token_bytes = 2) {
  std::vector<int32_t> t(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) t[i] = base + i;
  const std::string path = dir.file(name);
  write_shard(path, t, token_bytes);
  return path;
}

std::vector<int32_t> to_vec(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

}  // namespace

TEST_CASE("loader units follow docs/model.md section 5, shard boundaries included", "[data]") {
  TempDir dir;
  const int64_t B = 2, T = 3;  // a unit is 7 tokens, advancing by 6
  // Shard 0: 20 tokens -> units at 0, 6, 12 (the unit at 18 would need 25 tokens).
  // Shard 1: 5 tokens  -> too short for a unit, contributes none.
  // Shard 2: 13 tokens -> units at 0 and 6 (exactly fits: 6 + 7 = 13).
  std::vector<std::string> paths = {make_shard(dir, "s0.bin", 1000, 20), make_shard(dir, "s1.bin", 2000, 5),
                                    make_shard(dir, "s2.bin", 3000, 13, 4)};
  TokenLoader loader(paths, B, T, /*shuffle=*/false, /*seed=*/1);
  REQUIRE(loader.units_per_epoch() == 5);
  CHECK(loader.tokens_total() == 38);

  const std::vector<int32_t> starts = {1000, 1006, 1012, 3000, 3006};
  for (int64_t u = 0; u < 12; ++u) {  // two full epochs and a bit: the counter wraps
    const int32_t o = starts[static_cast<size_t>(u % 5)];
    TokenLoader::Batch b = loader.unit(u);
    REQUIRE(b.inputs.dtype() == DType::I32);
    REQUIRE(b.inputs.shape() == Shape{B * T});
    REQUIRE(b.targets.shape() == Shape{B * T});
    std::vector<int32_t> in = to_vec(b.inputs), tg = to_vec(b.targets);
    for (int64_t s = 0; s < B; ++s)
      for (int64_t j = 0; j < T; ++j) {
        // Sequence s is tokens [o + s*T, o + s*T + T); its targets are shifted by one.
        CHECK(in[s * T + j] == o + s * T + j);
        CHECK(tg[s * T + j] == o + s * T + j + 1);
      }
    CHECK(loader.stream_index(u) == u % 5);
  }
}

TEST_CASE("loader errors name the data key, B and T", "[data]") {
  TempDir dir;
  std::vector<std::string> paths = {make_shard(dir, "a.bin", 0, 10), make_shard(dir, "b.bin", 0, 12)};
  // B*T+1 = 13 tokens: no shard has that many, though together they do.
  REQUIRE_THROWS_WITH(TokenLoader(paths, 3, 4, false, 0, "data.val"),
                      Contains("data.val") && Contains("B = 3") && Contains("T = 4"));
  CHECK(TokenLoader(paths, 1, 11, false, 0).units_per_epoch() == 1);  // exactly 12 tokens fits
  REQUIRE_THROWS_WITH(TokenLoader({}, 1, 1, false, 0, "data.train"), Contains("data.train"));
  REQUIRE_THROWS_WITH(TokenLoader(paths, 0, 4, false, 0, "data.train"), Contains("data.train"));
  REQUIRE_THROWS_WITH(TokenLoader({dir.file("missing.bin")}, 1, 1, false, 0), Contains("missing.bin"));
  TokenLoader ok(paths, 1, 2, false, 0);
  REQUIRE_THROWS(ok.unit(-1));
}

TEST_CASE("shuffled loader: a seeded permutation per epoch, resumable from the counter", "[data]") {
  TempDir dir;
  const int64_t B = 1, T = 4;
  // 4001 tokens -> 1000 units of 5 tokens advancing by 4.
  std::vector<std::string> paths = {make_shard(dir, "big.bin", 0, 4001)};
  TokenLoader plain(paths, B, T, false, 0);
  TokenLoader shuffled(paths, B, T, true, 42);
  const int64_t n = shuffled.units_per_epoch();
  REQUIRE(n == 1000);

  auto epoch_order = [&](TokenLoader& l, int64_t epoch) {
    std::vector<int64_t> order;
    for (int64_t i = 0; i < n; ++i) order.push_back(l.stream_index(epoch * n + i));
    return order;
  };
  const auto e0 = epoch_order(shuffled, 0);
  const auto e1 = epoch_order(shuffled, 1);
  const auto e2 = epoch_order(shuffled, 2);

  // Each epoch visits every unit exactly once.
  for (const auto* e : {&e0, &e1, &e2}) {
    std::set<int64_t> seen(e->begin(), e->end());
    CHECK(seen.size() == static_cast<size_t>(n));
    CHECK(*seen.begin() == 0);
    CHECK(*seen.rbegin() == n - 1);
  }
  // Actually shuffled, and differently per epoch.
  std::vector<int64_t> identity(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) identity[i] = i;
  CHECK(e0 != identity);
  CHECK(e0 != e1);
  CHECK(e1 != e2);

  // A different seed gives a different order.
  TokenLoader other_seed(paths, B, T, true, 43);
  CHECK(epoch_order(other_seed, 0) != e0);

  // Resumability: a fresh loader jumping straight to epoch 1 (no history) sees
  // the same order, and going back to epoch 0 rebuilds it identically.
  TokenLoader fresh(paths, B, T, true, 42);
  CHECK(epoch_order(fresh, 1) == e1);
  CHECK(epoch_order(fresh, 0) == e0);
  CHECK(shuffled_units(n, 42, 1) == e1);

  // The tokens of shuffled unit u are those of stream unit stream_index(u).
  for (int64_t u : {int64_t{0}, int64_t{1}, int64_t{999}, int64_t{1000}, int64_t{2537}}) {
    TokenLoader::Batch s = fresh.unit(u);
    TokenLoader::Batch p = plain.unit(fresh.stream_index(u));
    CHECK(to_vec(s.inputs) == to_vec(p.inputs));
    CHECK(to_vec(s.targets) == to_vec(p.targets));
    CHECK(to_vec(s.inputs)[0] == fresh.stream_index(u) * B * T);
  }
}

TEST_CASE("trainer addressing: step k, microbatch a, rank r read distinct units", "[data]") {
  TempDir dir;
  std::vector<std::string> paths = {make_shard(dir, "s.bin", 0, 97)};
  TokenLoader loader(paths, 2, 4, false, 0);  // 12 units
  const int64_t A = 2, D = 3;
  std::set<int32_t> firsts;
  for (int64_t a = 0; a < A; ++a)
    for (int64_t r = 0; r < D; ++r) firsts.insert(to_vec(loader.unit((1 * A + a) * D + r).inputs)[0]);
  // Step 1 uses units 6..11, i.e. offsets 48, 56, ..., 88.
  CHECK(firsts == std::set<int32_t>{48, 56, 64, 72, 80, 88});
}
