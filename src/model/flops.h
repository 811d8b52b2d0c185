// FLOP accounting for throughput and MFU reports, and for the pipeline
// planner's chunk costs (train/plan.h).
#pragma once
#include "model/config.h"
#include "model/params.h"

namespace attnres::model {

// Parameters of `parts` that take part in matmuls per token: every weight
// matrix, the LM head included (the embedding when tied, counted with the
// head); norms, queries and the embedding lookup excluded.
double matmul_params(const ModelConfig& c, const ModelParts& parts = {});

// A KDA layer's core and convolutions per token, forward (model.kda; the
// projections are matmul params): H (6 K^2 + 5 C K) + 6 W H K with C = 64
// (docs/model.md "FLOPs per token").
double kda_core_flops_per_token(const ModelConfig& c);

// Forward FLOPs per token of the matmuls and causal attention of `parts`:
// 2 per matmul weight, and 2 T d per softmax layer (QK^T and PV, half the
// T x T under the mask), a KDA layer's core in place of the latter. The
// AttnRes Mix is not counted here.
double forward_flops_per_token(const ModelConfig& c, int64_t T, const ModelParts& parts = {});

// Training FLOPs per token (forward + backward = 3x forward): 6 * matmul
// params + causal attention 6 * L * T * d, the usual PaLM-style estimate.
// The AttnRes Mix adds O(sources*d) per sublayer and token, which this
// counts too (negligible, but honest).
double training_flops_per_token(const ModelConfig& c, int64_t T);

}  // namespace attnres::model
