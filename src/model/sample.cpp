// Sampling the next token (model/sample.h). Moved here from tools/cmd_generate.cpp
// unchanged, so that tests can call it; generate's output is the same bits.
#include "model/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace attnres::model {

int32_t sample_token(const std::vector<float>& logits, double temperature, int64_t top_k, double u) {
  const int64_t V = static_cast<int64_t>(logits.size());
  ATTNRES_CHECK(V > 0, "sample_token: no logits");
  std::vector<int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  if (temperature <= 0)
    return *std::max_element(idx.begin(), idx.end(),
                             [&](int32_t a, int32_t b) { return logits[a] < logits[b]; });
  const int64_t k = top_k > 0 ? std::min(top_k, V) : V;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::vector<double> p(k);
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += p[i] = std::exp((logits[idx[i]] - logits[idx[0]]) / temperature);
  double acc = 0;
  for (int64_t i = 0; i < k; ++i) {
    acc += p[i] / sum;
    if (u <= acc) return idx[i];
  }
  return idx[k - 1];
}

double sample_uniform(uint64_t seed, uint64_t i) { return random_uniform(seed, 0x5eed, i); }

int32_t sample_token(const std::vector<float>& logits, double temperature, int64_t top_k,
                     uint64_t seed, uint64_t i) {
  return sample_token(logits, temperature, top_k, sample_uniform(seed, i));
}

}  // namespace attnres::model
