// attnres bench --kernels: each CUDA op at a model's shapes, timed, with its
// two floors (bytes moved / measured bandwidth, FLOPs / measured GEMM peak).
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "model/config.h"

namespace attnres::tools {

// B sequences of T tokens. The Mix rows and Block AttnRes's phase-1 and merge
// rows are timed with the sources a Block model with n_blocks blocks has at
// its last block; Full AttnRes's rows with its last Mix group's (the merge's
// recent sources capped at n_blocks + 1). Only the rows whose name contains
// `only` are timed (all when it is empty): one row re-measured, or profiled
// (ncu) without the others' launches.
void bench_kernels(const model::ModelConfig& cfg, int64_t B, int64_t T, DType dtype,
                   int64_t n_blocks, const std::string& only = "");

}  // namespace attnres::tools
