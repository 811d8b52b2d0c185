// Learning-rate schedules (docs/model.md section 4).
#pragma once
#include <cstdint>

#include "train/config.h"

namespace attnres::train {

// Learning rate at 0-based step k of K total steps.
//   warmup (k < W):  lr * (k+1) / W
//   constant:        lr
//   cosine:          lr_min + (lr - lr_min) (1 + cos(pi q)) / 2,  q = (k-W) / max(1, K-W)
//   wsd:             lr until the last D = ceil(decay_ratio K) steps, then linear to
//                    lr_min: lr + (lr_min - lr) (k - (K-D) + 1) / D, reaching lr_min
//                    on the final step.
double learning_rate(const ScheduleConfig& s, double lr, int64_t k, int64_t K);

}  // namespace attnres::train
