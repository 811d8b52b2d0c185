// Choosing OpenBLAS's kernels from the CPU's flags (kernels/cpu/blas_cores.h):
// the CPU's instruction-set class from its feature flags, the class of each
// OpenBLAS core name, and the decision from the two. The re-run itself (a
// process started again with OPENBLAS_CORETYPE) is tested end to end by
// tests/cli/blas_kernels.sh.
#include <catch2/catch.hpp>
#include <string>

#include "core/cpu_features.h"
#include "kernels/cpu/blas_cores.h"

using namespace attnres;
namespace cpu = attnres::kernels::cpu;

namespace {

// The machine of the report: an Intel Xeon, family 6 model 207 (Emerald
// Rapids), AVX-512 on and saved by the OS.
CpuFeatures xeon_avx512() {
  CpuFeatures f;
  f.vendor = "GenuineIntel";
  f.family = 6;
  f.model = 207;
  f.avx = f.avx2 = f.fma = true;
  f.avx512f = f.avx512cd = f.avx512bw = f.avx512dq = f.avx512vl = true;
  f.os_ymm = f.os_zmm = true;
  return f;
}

CpuFeatures avx2_only(const char* vendor, int family, int model) {
  CpuFeatures f;
  f.vendor = vendor;
  f.family = family;
  f.model = model;
  f.avx = f.avx2 = f.fma = true;
  f.os_ymm = true;
  return f;
}

}  // namespace

TEST_CASE("the CPU's instruction-set class needs the flags and the OS's register state",
          "[kernels][blas_cores]") {
  CHECK(best_isa(xeon_avx512()) == Isa::Avx512);
  CHECK(best_isa(avx2_only("AuthenticAMD", 25, 1)) == Isa::Avx2);

  // The OS does not save zmm registers (XCR0): AVX-512 is not usable.
  CpuFeatures no_zmm = xeon_avx512();
  no_zmm.os_zmm = false;
  CHECK(best_isa(no_zmm) == Isa::Avx2);
  // AVX-512F and CD without BW / DQ / VL (Knights Landing): not SkylakeX's set.
  CpuFeatures knl = xeon_avx512();
  knl.avx512bw = knl.avx512dq = knl.avx512vl = false;
  CHECK(best_isa(knl) == Isa::Avx2);
  // Any one of the five missing is enough.
  CpuFeatures no_vl = xeon_avx512();
  no_vl.avx512vl = false;
  CHECK(best_isa(no_vl) == Isa::Avx2);
  // AVX2 without FMA: only AVX (OpenBLAS's Haswell kernels use FMA).
  CpuFeatures no_fma = avx2_only("GenuineIntel", 6, 60);
  no_fma.fma = false;
  CHECK(best_isa(no_fma) == Isa::Avx);
  // AVX masked from the OS (ymm state not saved): SSE only.
  CpuFeatures no_ymm = avx2_only("GenuineIntel", 6, 60);
  no_ymm.os_ymm = false;
  CHECK(best_isa(no_ymm) == Isa::Sse);
  // No CPUID (not x86-64): unknown, so nothing is chosen for it.
  CHECK(best_isa(CpuFeatures{}) == Isa::Unknown);
}

TEST_CASE("OpenBLAS core names map to their kernels' instruction sets", "[kernels][blas_cores]") {
  CHECK(cpu::blas_core_isa("Prescott") == Isa::Sse);
  CHECK(cpu::blas_core_isa("Nehalem") == Isa::Sse);
  CHECK(cpu::blas_core_isa("Sandybridge") == Isa::Avx);
  CHECK(cpu::blas_core_isa("Haswell") == Isa::Avx2);
  CHECK(cpu::blas_core_isa("Zen") == Isa::Avx2);
  CHECK(cpu::blas_core_isa("SkylakeX") == Isa::Avx512);
  CHECK(cpu::blas_core_isa("Cooperlake") == Isa::Avx512);
  CHECK(cpu::blas_core_isa("SapphireRapids") == Isa::Avx512);
  // OPENBLAS_CORETYPE is read case-blind; single-target builds name cores in capitals.
  CHECK(cpu::blas_core_isa("HASWELL") == Isa::Avx2);
  CHECK(cpu::blas_core_isa("skylakex") == Isa::Avx512);
  // Names we do not know (a newer library's, another architecture's): unknown.
  CHECK(cpu::blas_core_isa("Zen5") == Isa::Unknown);
  CHECK(cpu::blas_core_isa("NEOVERSEN1") == Isa::Unknown);
  CHECK(cpu::blas_core_isa("") == Isa::Unknown);
  CHECK(cpu::blas_core_isa("Prescot") == Isa::Unknown);
}

TEST_CASE("OpenBLAS's kernels are replaced exactly when its own choice falls short of the CPU",
          "[kernels][blas_cores]") {
  // The report: OpenBLAS 0.3.21 does not know family 6 model 207 and falls
  // back to Prescott; the CPU has AVX-512 -> SkylakeX, and the reason says why.
  const cpu::BlasCoreChoice xeon = cpu::choose_blas_core(xeon_avx512(), "Prescott", true);
  CHECK(xeon.coretype == "SkylakeX");
  CHECK_THAT(xeon.reason, Catch::Contains("Prescott (SSE)"));
  CHECK_THAT(xeon.reason, Catch::Contains("GenuineIntel family 6 model 207"));
  CHECK_THAT(xeon.reason, Catch::Contains("AVX-512"));
  // AVX2-class kernels on an AVX-512 CPU fall short too.
  CHECK(cpu::choose_blas_core(xeon_avx512(), "Haswell", true).coretype == "SkylakeX");
  CHECK(cpu::choose_blas_core(xeon_avx512(), "Zen", true).coretype == "SkylakeX");
  // The library's own AVX-512 choices are kept, whichever of them.
  for (const char* core : {"SkylakeX", "Cooperlake", "SapphireRapids"}) {
    const cpu::BlasCoreChoice kept = cpu::choose_blas_core(xeon_avx512(), core, true);
    CHECK(kept.coretype.empty());
    CHECK(kept.reason.empty());
  }

  // AVX2 + FMA: Zen on AMD and Hygon, Haswell on Intel and others.
  CHECK(cpu::choose_blas_core(avx2_only("AuthenticAMD", 26, 2), "Prescott", true).coretype ==
        "Zen");
  CHECK(cpu::choose_blas_core(avx2_only("HygonGenuine", 24, 0), "Barcelona", true).coretype ==
        "Zen");
  CHECK(cpu::choose_blas_core(avx2_only("GenuineIntel", 6, 191), "Sandybridge", true).coretype ==
        "Haswell");
  CHECK(cpu::choose_blas_core(avx2_only("CentaurHauls", 7, 27), "Nano", true).coretype ==
        "Haswell");
  CHECK(cpu::choose_blas_core(avx2_only("GenuineIntel", 6, 191), "Haswell", true).coretype.empty());
  CHECK(cpu::choose_blas_core(avx2_only("AuthenticAMD", 25, 1), "Zen", true).coretype.empty());
  // A library choice above the CPU's class is not ours to correct.
  CHECK(cpu::choose_blas_core(avx2_only("GenuineIntel", 6, 60), "SkylakeX", true).coretype.empty());

  // AVX only -> Sandybridge.
  CpuFeatures avx = avx2_only("GenuineIntel", 6, 42);
  avx.avx2 = avx.fma = false;
  CHECK(cpu::choose_blas_core(avx, "Prescott", true).coretype == "Sandybridge");
  CHECK(cpu::choose_blas_core(avx, "Sandybridge", true).coretype.empty());

  // Nothing to choose: a library built for one CPU (OPENBLAS_CORETYPE would be
  // ignored), a core name we do not know, a CPU without CPUID.
  CHECK(cpu::choose_blas_core(xeon_avx512(), "Prescott", false).coretype.empty());
  CHECK(cpu::choose_blas_core(xeon_avx512(), "Zen5", true).coretype.empty());
  CHECK(cpu::choose_blas_core(CpuFeatures{}, "Prescott", true).coretype.empty());
}

TEST_CASE("this machine's CPU is read: a vendor, and flags consistent with /proc/cpuinfo",
          "[kernels][blas_cores]") {
  const CpuFeatures f = read_cpu_features();
#if defined(__x86_64__)
  REQUIRE_FALSE(f.vendor.empty());
  REQUIRE(f.family > 0);
  // The compiler runtime's own reading of CPUID and XCR0, an independent path
  // (it counts a flag only where the OS saves the registers, as best_isa does).
  __builtin_cpu_init();
  CHECK((f.avx2 && f.os_ymm) == static_cast<bool>(__builtin_cpu_supports("avx2")));
  CHECK((f.fma && f.os_ymm) == static_cast<bool>(__builtin_cpu_supports("fma")));
  CHECK((f.avx512f && f.os_zmm) == static_cast<bool>(__builtin_cpu_supports("avx512f")));
  CHECK((f.avx512bw && f.os_zmm) == static_cast<bool>(__builtin_cpu_supports("avx512bw")));
  CHECK((f.avx512vl && f.os_zmm) == static_cast<bool>(__builtin_cpu_supports("avx512vl")));
#else
  CHECK(best_isa(f) == Isa::Unknown);
#endif
}
