// CUDA AdamW (see kernels/adamw.h): p, g, m, v F32 (the fp32 master weights
// in a bf16 run), the bf16 copy of p written in the same pass when asked.
#pragma once
#include "core/span.h"
#include "kernels/adamw.h"

namespace attnres::kernels::cuda {
void adamw_update_each(Span<const AdamWTensors> params, const AdamWStep& step,
                       const AdamWScalars& scalars);
}  // namespace attnres::kernels::cuda
