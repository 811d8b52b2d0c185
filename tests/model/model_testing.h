// Helpers shared by the tests that build small models (model, train): a tiny
// configuration, random parameters away from their initialisation, and the
// parameters as the literal reference (reference.h) reads them.
#pragma once
#include <string>

#include "model/config.h"
#include "model/params.h"
#include "model/reference.h"
#include "testing.h"

namespace attnres::testing {

// A configuration with a name for SECTIONs.
struct NamedConfig {
  const char* name;
  model::ModelConfig cfg;
};

inline model::ModelConfig tiny(model::ResidualMode mode, int64_t block_size = 0,
                               int64_t n_blocks = 0, bool tie = false, int64_t layers = 2) {
  model::ModelConfig c;
  c.vocab_size = 11;
  c.d_model = 8;
  c.n_layers = layers;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.d_ff = 12;
  c.tie_embeddings = tie;
  c.mode = mode;
  c.block_size = block_size;
  c.n_blocks = n_blocks;
  c.validate();
  return c;
}

// Random parameters everywhere (queries and gains too, so every Mix and norm
// is exercised away from its zero/one initialisation).
inline void randomize(model::ParamTable& t, uint64_t seed) {
  uint64_t i = 0;
  for (auto& p : t.all()) {
    fill_normal(p.value, seed + i++, 0.5);
    if (p.value.ndim() == 1 && p.name.find("layernorm") != std::string::npos)
      for (int64_t j = 0; j < p.value.numel(); ++j) set(p.value, j, 1.0 + 0.3 * at(p.value, j));
  }
}

inline reference::ParamFn param_fn(const model::ParamTable& t) {
  return [&t](const std::string& name) {
    Tensor v = t.get(name).value.to(DType::F64);
    return reference::Vec(v.data<double>(), v.data<double>() + v.numel());
  };
}

}  // namespace attnres::testing
