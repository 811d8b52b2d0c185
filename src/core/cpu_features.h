// What this CPU can run: vendor, family / model and the vector instruction
// sets that both the CPU and the operating system support (CPUID and XGETBV
// on x86-64; nothing elsewhere). Read to choose the BLAS kernels
// (kernels/cpu/blas_cores.h) and to say in logs what a machine has.
#pragma once
#include <string>

namespace attnres {

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...; "" off x86-64
  int family = 0;      // display family and model, as /proc/cpuinfo shows them
  int model = 0;
  bool avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512cd = false, avx512bw = false, avx512dq = false, avx512vl = false;
  // The OS saves the registers across context switches (XCR0): without that a
  // CPU flag is not usable (a hypervisor may mask it either way).
  bool os_ymm = false, os_zmm = false;
};

// This CPU's (all false, vendor "" where there is no CPUID).
CpuFeatures read_cpu_features();

// The vector instruction-set classes that matter to GEMM kernels, in order.
enum class Isa { Unknown, Sse, Avx, Avx2, Avx512 };
const char* isa_name(Isa isa);  // "SSE", "AVX", "AVX2", "AVX-512"; "unknown"

// The best class both the CPU and the OS support: AVX-512 needs F, CD, BW, DQ
// and VL (what OpenBLAS's SkylakeX kernels use) and zmm state saved; AVX2
// needs FMA too. Unknown where there is no CPUID (not x86-64).
Isa best_isa(const CpuFeatures& cpu);

// "GenuineIntel family 6 model 207" (or "a CPU without CPUID").
std::string cpu_identity(const CpuFeatures& cpu);

}  // namespace attnres
