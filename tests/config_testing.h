// Config tests' helpers: a small valid config to change a key of, and the
// error a config's validation reports ("" when it is valid), so a test can
// check that a bad key is refused and named.
#pragma once
#include <cstdint>
#include <string>

#include "core/error.h"
#include "train/config.h"

namespace attnres::testing {

// A valid config of the smallest kind: a block AttnRes model (V 97, d 32, 4
// query and 2 KV heads) of n_layers layers, S = block_size, trained 8 steps
// on 2 x 16 tokens from train.bin (which need not exist: validation does not
// open it).
inline train::json small_config(int64_t n_layers, int64_t block_size) {
  train::json j = train::json::parse(R"({
    "model": {"vocab_size": 97, "d_model": 32, "n_heads": 4, "n_kv_heads": 2, "d_ff": 80},
    "training": {"steps": 8, "micro_batch_size": 2, "seq_len": 16},
    "data": {"train": "train.bin"}})");
  j["model"]["n_layers"] = n_layers;
  j["model"]["residual"] = {{"mode", "block"}, {"block_size", block_size}};
  return j;
}

inline std::string config_error(const train::json& j) {
  try {
    train::Config::from_json(j, "cfg.json").validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace attnres::testing
