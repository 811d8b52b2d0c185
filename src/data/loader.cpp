#include "data/loader.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "core/rng.h"

namespace attnres::data {

std::vector<int64_t> shuffled_units(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  // One RNG stream per epoch, separated from every other use of the seed (e.g.
  // parameter init, which hashes parameter names) by a domain constant.
  const uint64_t stream = mix64(fnv1a64("attnres.data.shuffle") ^ static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    // j uniform in [0, i]: multiply-high maps 64 random bits onto the range
    // with bias below (i+1) / 2^64, far beneath anything observable.
    const uint64_t r = random_u64(seed, stream, static_cast<uint64_t>(i));
    const int64_t j = static_cast<int64_t>((static_cast<unsigned __int128>(r) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

TokenLoader::TokenLoader(std::vector<std::string> shard_paths, int64_t B, int64_t T, bool shuffle,
                         uint64_t seed, std::string key)
    : key_(std::move(key)), B_(B), T_(T), shuffle_(shuffle), seed_(seed) {
  if (B <= 0 || T <= 0) fail(key_, ": batch size B = ", B, " and sequence length T = ", T, " must be positive");
  if (B > std::numeric_limits<int32_t>::max() / T)
    fail(key_, ": B*T = ", B, "*", T, " is too large");
  if (shard_paths.empty()) fail(key_, ": no token shards given");

  const int64_t span = B * T;  // advance per unit; a unit reads span + 1 tokens
  shards_.reserve(shard_paths.size());
  unit_start_.reserve(shard_paths.size() + 1);
  unit_start_.push_back(0);
  for (const std::string& path : shard_paths) {
    shards_.emplace_back(path);
    const int64_t count = shards_.back().size();
    // Unit j starts at j*span and needs j*span + span + 1 <= count.
    const int64_t units = count >= span + 1 ? (count - 1) / span : 0;
    unit_start_.push_back(unit_start_.back() + units);
  }
  units_per_epoch_ = unit_start_.back();
  if (units_per_epoch_ == 0) {
    int64_t largest = 0;
    for (const auto& s : shards_) largest = std::max(largest, s.size());
    fail(key_, ": no shard holds a full unit of B*T+1 = ", span + 1, " tokens (B = ", B, ", T = ", T,
         "; ", shards_.size(), " shard(s), the largest has ", largest,
         " tokens): use more data or a smaller micro batch / sequence length");
  }
}

int64_t TokenLoader::tokens_total() const {
  int64_t n = 0;
  for (const auto& s : shards_) n += s.size();
  return n;
}

void TokenLoader::build_permutation(int64_t epoch) {
  if (perm_epoch_ == epoch) return;
  perm_ = shuffled_units(units_per_epoch_, seed_, epoch);
  perm_epoch_ = epoch;
}

int64_t TokenLoader::stream_index(int64_t u) {
  if (u < 0) fail(key_, ": negative unit counter ", u);
  const int64_t epoch = u / units_per_epoch_;
  const int64_t pos = u % units_per_epoch_;
  if (!shuffle_) return pos;
  build_permutation(epoch);
  return perm_[static_cast<size_t>(pos)];
}

TokenLoader::Batch TokenLoader::unit(int64_t u) {
  const int64_t idx = stream_index(u);
  // The shard holding stream unit idx: the last i with unit_start_[i] <= idx.
  // Shards that contribute no units have equal starts and are stepped over.
  const auto it = std::upper_bound(unit_start_.begin(), unit_start_.end(), idx);
  const size_t shard = static_cast<size_t>(it - unit_start_.begin()) - 1;
  const int64_t span = B_ * T_;
  const int64_t offset = (idx - unit_start_[shard]) * span;

  // One read of span+1 tokens; inputs and targets are the two overlapping windows.
  std::vector<int32_t> buf(static_cast<size_t>(span + 1));
  shards_[shard].read(offset, Span<int32_t>(buf.data(), buf.size()));
  Batch b{Tensor::empty({span}, DType::I32), Tensor::empty({span}, DType::I32)};
  std::copy(buf.begin(), buf.end() - 1, b.inputs.data<int32_t>());
  std::copy(buf.begin() + 1, buf.end(), b.targets.data<int32_t>());
  return b;
}

}  // namespace attnres::data
