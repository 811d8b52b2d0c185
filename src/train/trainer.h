// The single-process training loop: data -> microbatches -> AdamW, with
// evaluation, checkpoints, metrics, progress, and clean stops.
#pragma once
#include <cstdint>
#include <string>

#include "data/loader.h"
#include "model/model.h"
#include "train/config.h"

namespace attnres::train {

// Exit codes of `attnres train` besides 0 (done) and 1/2 (errors).
constexpr int kExitNonFinite = 3;  // NaN/inf loss or gradient: stopped, last good checkpoint kept

// Mean token loss over units [0, batches) of `loader` (fewer if it has fewer).
// Returns {mean loss, tokens evaluated}.
std::pair<double, int64_t> evaluate(model::Model& model, data::TokenLoader& loader, int64_t batches,
                                    int64_t B, int64_t T);

// Runs the configured training. Returns the process exit code: 0 when all
// steps ran, 128+signal after SIGINT/SIGTERM (a checkpoint is written first),
// kExitNonFinite on a NaN/inf. Configuration and I/O problems throw Error.
int train(const Config& cfg);

}  // namespace attnres::train
