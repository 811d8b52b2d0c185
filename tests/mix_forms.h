// The forms of the residual variants' depth Mix (kernels/mix_variant.h) the
// CPU and GPU kernel tests run: every query kind x score x key norm x heads
// (scalar logits with one head and their score only), and DenseFormer's weights.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/mix_variant.h"

namespace attnres::testing {

inline std::vector<kernels::MixForm> mix_forms() {
  using kernels::MixLogits;
  using kernels::MixScore;
  std::vector<kernels::MixForm> out;
  for (MixLogits l : {MixLogits::Query, MixLogits::RowQueries, MixLogits::Scalars})
    for (MixScore s : {MixScore::Softmax, MixScore::Sigmoid})
      for (bool norm : {true, false})
        for (int64_t H : {int64_t(1), int64_t(4)}) {
          if (l == MixLogits::Scalars && (H != 1 || !norm)) continue;
          out.push_back(kernels::MixForm{l, s, norm, H});
        }
  out.push_back(kernels::MixForm{MixLogits::Weights});  // DenseFormer's: no score
  return out;
}

inline std::string mix_form_name(const kernels::MixForm& f) {
  const char* l[] = {"query", "row queries", "scalars", "weights"};
  return std::string(l[static_cast<int>(f.logits)]) +
         (f.score == kernels::MixScore::Sigmoid ? ", sigmoid" : ", softmax") +
         (f.key_norm ? ", key norm" : ", raw keys") + ", heads " + std::to_string(f.heads);
}

// The query's shape: [d] (one query), [N, d] (a query per row), [k] (scalars, weights).
inline std::vector<int64_t> mix_query_shape(const kernels::MixForm& f, int64_t N, int64_t d,
                                            int64_t k) {
  if (f.logits == kernels::MixLogits::Query) return {d};
  if (f.logits == kernels::MixLogits::RowQueries) return {N, d};
  return {k};
}

}  // namespace attnres::testing
