// FLOP accounting for throughput and MFU reports.
#pragma once
#include "model/config.h"

namespace attnres::model {

// Parameters that take part in matmuls per token (every weight matrix
// including the LM head; norms, queries and the embedding lookup excluded).
double matmul_params(const ModelConfig& c);

// Training FLOPs per token (forward + backward = 3x forward): 6 * matmul
// params + causal attention 6 * L * T * d (QK^T and PV, half the T x T under
// the mask), the usual PaLM-style estimate. The AttnRes Mix adds O(sources*d)
// per sublayer and token, which this counts too (negligible, but honest).
double training_flops_per_token(const ModelConfig& c, int64_t T);

}  // namespace attnres::model
