// The mean token loss of a whole model over the first units of a token
// stream, in one process: what `attnres eval` prints, and the val loss the
// trainer logs for the same checkpoint, data and number of units.
#pragma once
#include <cstdint>
#include <utility>

#include "data/loader.h"
#include "model/model.h"

namespace attnres::train {

// Mean token loss over units [0, batches) of `loader` (fewer if it has fewer),
// B sequences of T tokens each. Returns {mean loss, tokens evaluated}.
std::pair<double, int64_t> evaluate(model::Model& model, data::TokenLoader& loader, int64_t batches,
                                    int64_t B, int64_t T);

}  // namespace attnres::train
