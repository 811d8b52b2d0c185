// TokenLoader: turns sorted token shards into training units (docs/model.md section 5).
//
// A unit is B*T+1 consecutive tokens starting at offset o of one shard; units
// advance by B*T and never straddle a shard boundary (a shard's tail that can't
// hold a whole unit is skipped). The stream is all units of shard 0, then of
// shard 1, and so on. Sequence b of a unit is tokens [o+b*T, o+b*T+T), its
// targets the same range shifted by one.
//
// Units are addressed by a global counter u that runs across epochs:
// epoch = u / units_per_epoch, position = u % units_per_epoch. Without shuffling
// the position is the stream index; with shuffling it indexes a permutation
// that is a pure function of (seed, epoch). So the whole data cursor is the
// single number u: resuming needs no other state.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/shard.h"

namespace attnres::data {

class TokenLoader {
 public:
  struct Batch {
    Tensor inputs;   // I32 [B*T]: sequence b is inputs[b*T, b*T+T)
    Tensor targets;  // I32 [B*T]: next token of each input position
  };

  // Validates and maps every shard. `key` names the config key (e.g.
  // "data.train") in error messages. Throws if no shard holds a full unit.
  TokenLoader(std::vector<std::string> shard_paths, int64_t B, int64_t T, bool shuffle, uint64_t seed,
              std::string key = "data");

  int64_t units_per_epoch() const { return units_per_epoch_; }
  int64_t B() const { return B_; }
  int64_t T() const { return T_; }
  int64_t tokens_total() const;  // tokens in all shards, used or not

  // Stream index (0 .. units_per_epoch-1) that global unit u reads. With
  // shuffling this builds (and caches) the permutation of u's epoch.
  int64_t stream_index(int64_t u);

  // The tokens of global unit u. The trainer asks for u = (k*A + a)*D + r.
  // Not thread-safe (the epoch permutation is cached).
  Batch unit(int64_t u);

 private:
  void build_permutation(int64_t epoch);

  std::string key_;
  int64_t B_, T_;
  bool shuffle_;
  uint64_t seed_;
  std::vector<MappedShard> shards_;
  // unit_start_[i] = first stream index of shard i; size shards+1, last = total.
  std::vector<int64_t> unit_start_;
  int64_t units_per_epoch_ = 0;
  std::vector<int64_t> perm_;  // permutation for perm_epoch_
  int64_t perm_epoch_ = -1;
};

// Fisher-Yates permutation of [0, n) driven by the counter-based RNG: a pure
// function of (seed, epoch). Exposed for tests and tools.
std::vector<int64_t> shuffled_units(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace attnres::data
