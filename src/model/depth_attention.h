// Where each Mix looks: the mean softmax weight of every depth Mix over the
// tokens of a batch (`attnres inspect attention`). An analysis of a trained
// model built on the Model's chunked API, not part of the model itself.
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"

namespace attnres::model {

// Average softmax weights of every Mix over tokens, [sublayer][source]; the
// last row is the final Mix. AttnRes modes only.
std::vector<std::vector<double>> depth_attention(Model& model, const Tensor& tokens, int64_t B,
                                                 int64_t T);

}  // namespace attnres::model
