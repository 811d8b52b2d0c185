#include "kernels/mix_rows.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/common.h"

namespace attnres::kernels::mix_rows {

bool rows_from_env() {
  const char* e = std::getenv("ATTNRES_MIX_KERNELS");
  if (e == nullptr || *e == '\0' || std::strcmp(e, "rows") == 0) return true;
  if (std::strcmp(e, "warp") == 0) return false;
  fail("ATTNRES_MIX_KERNELS = '", e, "': expected rows or warp");
}

namespace {
// The conditions every rows kernel shares; sets plan.why when one fails.
bool applies(Plan& plan, bool bf16, bool aligned, int64_t d) {
  if (!rows_from_env()) plan.why = "ATTNRES_MIX_KERNELS=warp";
  else if (!bf16) plan.why = "not bf16";
  else if (d % kEpt != 0 || !aligned) plan.why = "d % 4 != 0 or a pointer not 8-byte aligned";
  else if (d > int64_t(kEpt) * kMaxThreads) plan.why = "d > 4096";
  else return true;
  return false;
}
}  // namespace

Plan plan_phase1(bool backward, bool bf16, bool aligned, int64_t d, int Q, int k) {
  Plan p;
  if (!applies(p, bf16, aligned, d)) return p;
  p.threads = threads(d);
  auto smem = [&](int q) {
    return backward ? backward_smem(q, k, p.threads) : forward_smem(q, k, p.threads);
  };
  int q = std::min(Q, kMaxQueries);
  while (q > 1 && smem(q) > kMaxSmem) --q;
  if (q < 1 || smem(q) > kMaxSmem) {
    p.why = "shared memory: " + std::to_string(smem(std::max(q, 1))) + " bytes for one query";
    return p;
  }
  p.rows = true;
  p.queries = q;
  return p;
}

Plan plan_merge(bool bf16, bool aligned, int64_t d, int m) {
  Plan p;
  if (!applies(p, bf16, aligned, d)) return p;
  if (m > kMaxRecent) {
    p.why = "more than " + std::to_string(kMaxRecent) + " recent sources";
    return p;
  }
  p.rows = true;
  p.threads = threads(d);
  return p;
}

}  // namespace attnres::kernels::mix_rows
