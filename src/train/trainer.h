// The training loop of every layout: a single process or one rank of an
// mpirun job of P pipeline stages x D data-parallel replicas (docs/parallel.md)
// runs the same engine: data -> microbatches -> AdamW, with evaluation,
// checkpoints, metrics, progress, and clean stops.
#pragma once
#include "train/config.h"

namespace attnres::train {

// Exit codes of `attnres train` besides 0 (done) and 1/2 (errors).
constexpr int kExitNonFinite = 3;  // NaN/inf loss or gradient: stopped, last good checkpoint kept

// Runs the configured training (under mpirun, this rank's share of the job).
// Returns the process exit code: 0 when all steps ran, 128+signal after
// SIGINT/SIGTERM (a checkpoint is written first), kExitNonFinite on a
// NaN/inf. Configuration and I/O problems throw Error.
int train(const Config& cfg);

}  // namespace attnres::train
