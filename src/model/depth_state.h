// What flows between chunks of layers (docs/model.md section 2, docs/parallel.md
// "What crosses a chunk boundary").
//
// baseline:   the residual stream x = e + sum of sublayer outputs so far.
// full/block: the completed sources [b_0 = e, b_1, ...] and the partial sum of
//             the current block (undefined at a block boundary). Full AttnRes
//             is Block AttnRes with S = 1, so it never has a partial.
#pragma once
#include <vector>

#include "core/tensor.h"

namespace attnres::model {

struct DepthState {
  Tensor hidden;                     // baseline only, [N, d]
  std::vector<Tensor> sources;       // attnres: b_0 .. b_{n-1}, each [N, d]
  std::vector<Tensor> source_rstd;   // attnres: RMS statistics of each source, [N]
  Tensor partial;                    // attnres: current block's partial sum, or undefined
};

// Gradients with the same structure; accumulated during backward.
struct DepthGrad {
  Tensor hidden;
  std::vector<Tensor> sources;
  Tensor partial;
};

}  // namespace attnres::model
