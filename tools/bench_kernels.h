// attnres bench --kernels: each CUDA op at a model's shapes, timed, with its
// two floors (bytes moved / measured bandwidth, FLOPs / measured GEMM peak).
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "model/config.h"

namespace attnres::tools {

// B sequences of T tokens; Mix ops are timed with the number of sources a
// Block AttnRes model with n_blocks blocks has at its last block. Only the
// rows whose name contains `only` are timed (all when it is empty): one row
// re-measured, or profiled (ncu) without the others' launches.
void bench_kernels(const model::ModelConfig& cfg, int64_t B, int64_t T, DType dtype,
                   int64_t n_blocks, const std::string& only = "");

}  // namespace attnres::tools
