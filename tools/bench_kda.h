// attnres bench --kda: the KDA core's chunkwise forward and backward and its
// token-by-token recurrence on the CPU, timed against their floors.
#pragma once
#include <cstdint>

namespace attnres::tools {

// B sequences of T tokens, H heads of K = V channels; the median of `steps` runs.
void bench_kda(int64_t B, int64_t T, int64_t H, int64_t K, int steps);

}  // namespace attnres::tools
