#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace attnres::train {

double learning_rate(const ScheduleConfig& s, double lr, int64_t k, int64_t K) {
  const int64_t W = s.warmup_steps;
  if (k < W) return lr * static_cast<double>(k + 1) / static_cast<double>(W);
  const double lr_min = lr * s.min_lr_ratio;
  if (s.type == ScheduleType::Cosine) {
    double q = static_cast<double>(k - W) / static_cast<double>(std::max<int64_t>(1, K - W));
    return lr_min + (lr - lr_min) * (1.0 + std::cos(M_PI * q)) / 2.0;
  }
  if (s.type == ScheduleType::Wsd) {
    const int64_t D = static_cast<int64_t>(std::ceil(s.decay_ratio * static_cast<double>(K)));
    if (D <= 0 || k < K - D) return lr;
    double q = static_cast<double>(k - (K - D) + 1) / static_cast<double>(D);
    return lr + (lr_min - lr) * std::min(1.0, q);
  }
  return lr;  // constant
}

}  // namespace attnres::train
