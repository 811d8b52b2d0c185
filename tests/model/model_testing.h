// Helpers shared by the tests that build small models (model, train, gpu,
// mpi): a tiny configuration, random parameters away from their
// initialisation, and the parameters as the literal reference (reference.h)
// reads them.
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

// `c` with these widths (vocabulary, d_model, heads, KV heads, d_ff), validated.
inline model::ModelConfig resized(model::ModelConfig c, int64_t vocab, int64_t d, int64_t heads,
                                  int64_t kv_heads, int64_t d_ff) {
  c.vocab_size = vocab;
  c.d_model = d;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.d_ff = d_ff;
  c.validate();
  return c;
}

inline model::ModelConfig tiny(model::ResidualMode mode, int64_t block_size = 0,
                               int64_t n_blocks = 0, bool tie = false, int64_t layers = 2) {
  model::ModelConfig c;
  c.n_layers = layers;
  c.tie_embeddings = tie;
  c.mode = mode;
  c.block_size = block_size;
  c.n_blocks = n_blocks;
  return resized(c, 11, 8, 2, 1, 12);
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
