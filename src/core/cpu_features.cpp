#include "core/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define ATTNRES_HAVE_CPUID 1
#endif

#include <cstdint>
#include <cstring>

namespace attnres {

CpuFeatures read_cpu_features() {
  CpuFeatures f;
#ifdef ATTNRES_HAVE_CPUID
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;
  if (max_leaf < 1) return f;
  __get_cpuid(1, &a, &b, &c, &d);
  // Display family / model (Intel SDM, CPUID leaf 1): the extended fields
  // count only for family 15 (both) and family 6 (model).
  const int base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
  f.family = base_family == 0xf ? base_family + static_cast<int>((a >> 20) & 0xff) : base_family;
  f.model = (base_family == 0x6 || base_family == 0xf)
                ? base_model | static_cast<int>(((a >> 16) & 0xf) << 4)
                : base_model;
  f.fma = (c >> 12) & 1;
  f.avx = (c >> 28) & 1;
  const bool osxsave = (c >> 27) & 1;
  if (osxsave) {
    // XCR0: bit 1 SSE, bit 2 AVX (ymm upper halves), bits 5-7 opmask and zmm.
    uint32_t xcr0_lo = 0, xcr0_hi = 0;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    f.os_ymm = (xcr0_lo & 0x6) == 0x6;
    f.os_zmm = f.os_ymm && (xcr0_lo & 0xe0) == 0xe0;
  }
  if (max_leaf >= 7) {
    __get_cpuid_count(7, 0, &a, &b, &c, &d);
    f.avx2 = (b >> 5) & 1;
    f.avx512f = (b >> 16) & 1;
    f.avx512dq = (b >> 17) & 1;
    f.avx512cd = (b >> 28) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
  }
#endif
  return f;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Sse: return "SSE";
    case Isa::Avx: return "AVX";
    case Isa::Avx2: return "AVX2";
    case Isa::Avx512: return "AVX-512";
    case Isa::Unknown: break;
  }
  return "unknown";
}

Isa best_isa(const CpuFeatures& cpu) {
  if (cpu.vendor.empty()) return Isa::Unknown;
  if (cpu.os_zmm && cpu.avx512f && cpu.avx512cd && cpu.avx512bw && cpu.avx512dq && cpu.avx512vl)
    return Isa::Avx512;
  if (cpu.os_ymm && cpu.avx2 && cpu.fma) return Isa::Avx2;
  if (cpu.os_ymm && cpu.avx) return Isa::Avx;
  return Isa::Sse;
}

std::string cpu_identity(const CpuFeatures& cpu) {
  if (cpu.vendor.empty()) return "a CPU without CPUID";
  return cpu.vendor + " family " + std::to_string(cpu.family) + " model " +
         std::to_string(cpu.model);
}

}  // namespace attnres
