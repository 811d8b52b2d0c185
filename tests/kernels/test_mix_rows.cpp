// The CUDA Mix kernels' choice and launch shape (kernels/mix_rows.h), host
// arithmetic checked on the CPU against hand counts: which calls take the rows
// kernels, their threads, queries per launch and shared memory; the setting
// ATTNRES_MIX_KERNELS. (The kernels themselves: tests/gpu/test_mix.cpp.)
#include <catch2/catch.hpp>

#include "core/scoped_env.h"
#include "kernels/mix_rows.h"

using namespace attnres;
using namespace attnres::kernels::mix_rows;

TEST_CASE("Mix rows kernels: threads are ceil(d / 4) in whole warps", "[mix_rows]") {
  CHECK(threads(768) == 192);   // 124M: 6 warps
  CHECK(threads(772) == 224);   // 193 slots -> 7 warps
  CHECK(threads(36) == 32);
  CHECK(threads(1024) == 256);  // 350M
  CHECK(threads(4096) == 1024);
}

TEST_CASE("Mix rows kernels: shared memory by hand", "[mix_rows]") {
  // Block AttnRes N = 8 at 124M, the last block: Q = 3 queries over k = 8
  // sources, G = 192 threads (W = 6 warps).
  // forward: w slots 3 x 192 x 8 = 4608; partial dots 8 x 6 x 3 floats = 576
  // bytes; logits 3 x 8 floats = 96 bytes.
  CHECK(forward_smem(3, 8, 192) == 4608 + 576 + 96);
  // backward: w and dout slots 2 x 4608; partial dots 8 x 6 x 6 floats = 1152
  // bytes; three [3][8] tables = 288 bytes; r [8] = 32; s [3] = 12.
  CHECK(backward_smem(3, 8, 192) == 9216 + 1152 + 288 + 32 + 12);
}

TEST_CASE("Mix rows kernels: which calls take them", "[mix_rows]") {
  ScopedEnv env("ATTNRES_MIX_KERNELS");
  unsetenv("ATTNRES_MIX_KERNELS");
  {
    const Plan p = plan_phase1(true, true, true, 768, 3, 8);
    CHECK(p.rows);
    CHECK(p.threads == 192);
    CHECK(p.queries == 3);
    CHECK(p.why.empty());
  }
  // More queries than a launch takes: launches of 8.
  CHECK(plan_phase1(false, true, true, 768, 11, 8).queries == 8);
  // Full AttnRes at 350M, its last group: Q = 7 over k = 43 at d = 1024 fits
  // (2 x 7 x 256 x 8 + (43 x 8 x 14 + 3 x 7 x 43 + 43 + 7) x 4 = 51,748 bytes).
  CHECK(backward_smem(7, 43, 256) == 51748);
  CHECK(plan_phase1(true, true, true, 1024, 7, 43).queries == 7);
  // d = 4096, k = 64: 3 queries fit in 100 KiB (100,876 bytes), 4 do not
  // (134,416), so launches of 3.
  CHECK(backward_smem(3, 64, 1024) == 100876);
  CHECK(backward_smem(4, 64, 1024) == 134416);
  CHECK(plan_phase1(true, true, true, 4096, 8, 64).queries == 3);
  // The warp kernels: fp32, d % 4 != 0 or misaligned, d > 4096.
  CHECK(plan_phase1(true, false, true, 768, 3, 8).why == "not bf16");
  CHECK_FALSE(plan_phase1(false, true, true, 770, 3, 8).rows);
  CHECK_FALSE(plan_phase1(false, true, false, 768, 3, 8).rows);
  CHECK(plan_phase1(false, true, true, 4100, 3, 8).why == "d > 4096");
  // The merge: up to 8 recent sources.
  CHECK(plan_merge(true, true, 768, 8).rows);
  CHECK(plan_merge(true, true, 768, 8).threads == 192);
  CHECK(plan_merge(true, true, 768, 9).why == "more than 8 recent sources");
  CHECK_FALSE(plan_merge(false, true, 768, 1).rows);
}

TEST_CASE("Mix rows kernels: ATTNRES_MIX_KERNELS", "[mix_rows]") {
  {
    ScopedEnv env("ATTNRES_MIX_KERNELS", "rows");
    CHECK(plan_merge(true, true, 768, 1).rows);
  }
  {
    ScopedEnv env("ATTNRES_MIX_KERNELS", "");
    CHECK(plan_merge(true, true, 768, 1).rows);
  }
  {
    ScopedEnv env("ATTNRES_MIX_KERNELS", "warp");
    const Plan p = plan_phase1(true, true, true, 768, 3, 8);
    CHECK_FALSE(p.rows);
    CHECK(p.why == "ATTNRES_MIX_KERNELS=warp");
    CHECK_FALSE(plan_merge(true, true, 768, 1).rows);
  }
  {
    ScopedEnv env("ATTNRES_MIX_KERNELS", "fast");
    CHECK_THROWS_WITH(plan_merge(true, true, 768, 1),
                      Catch::Contains("ATTNRES_MIX_KERNELS = 'fast': expected rows or warp"));
  }
}
