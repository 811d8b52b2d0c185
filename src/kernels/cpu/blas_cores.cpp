#include "kernels/cpu/blas_cores.h"

#include <cblas.h>
#include <strings.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace attnres::kernels::cpu {

namespace {

constexpr const char* kChoiceVar = "ATTNRES_BLAS_CHOICE";  // "CORE: reason", set with the core

struct NamedCore {
  const char* name;
  Isa isa;
};
// OpenBLAS's x86-64 core names (driver/others/dynamic.c's corename table) by
// the widest vector instructions their GEMM kernels use.
constexpr NamedCore kCores[] = {
    {"Katmai", Isa::Sse},         {"Coppermine", Isa::Sse},    {"Northwood", Isa::Sse},
    {"Prescott", Isa::Sse},       {"Banias", Isa::Sse},        {"Atom", Isa::Sse},
    {"Core2", Isa::Sse},          {"Penryn", Isa::Sse},        {"Dunnington", Isa::Sse},
    {"Nehalem", Isa::Sse},        {"Athlon", Isa::Sse},        {"Opteron", Isa::Sse},
    {"Opteron_SSE3", Isa::Sse},   {"Barcelona", Isa::Sse},     {"Nano", Isa::Sse},
    {"Bobcat", Isa::Sse},         {"Sandybridge", Isa::Avx},   {"Bulldozer", Isa::Avx},
    {"Piledriver", Isa::Avx},     {"Steamroller", Isa::Avx},   {"Excavator", Isa::Avx},
    {"Haswell", Isa::Avx2},       {"Zen", Isa::Avx2},          {"SkylakeX", Isa::Avx512},
    {"Cooperlake", Isa::Avx512},  {"SapphireRapids", Isa::Avx512},
};

// What the CPU has, as the log says it.
std::string flags_text(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return "AVX-512 (F, CD, BW, DQ, VL)";
    case Isa::Avx2: return "AVX2 and FMA";
    default: return isa_name(isa);
  }
}

// "Prescott (SSE)".
std::string core_with_isa(std::string_view core) {
  return std::string(core) + " (" + isa_name(blas_core_isa(core)) + ")";
}

// Why attnres set OPENBLAS_CORETYPE, when the variable still holds the core
// it set (ATTNRES_BLAS_CHOICE = "CORE: reason"); "" when the user set it, or
// nobody did.
std::string our_choice_reason() {
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  const char* ours = std::getenv(kChoiceVar);
  if (!forced || !ours) return "";
  const std::string choice = ours;
  const size_t colon = choice.find(": ");
  if (colon == std::string::npos || choice.compare(0, colon, forced) != 0) return "";
  return choice.substr(colon + 2);
}

bool dynamic_arch_library() {
  return std::strstr(openblas_get_config(), "DYNAMIC_ARCH") != nullptr;
}

}  // namespace

Isa blas_core_isa(std::string_view core) {
  for (const NamedCore& c : kCores)
    if (core.size() == std::strlen(c.name) &&
        strncasecmp(core.data(), c.name, core.size()) == 0)
      return c.isa;
  return Isa::Unknown;
}

std::string blas_core_name() { return openblas_get_corename(); }

BlasCoreChoice choose_blas_core(const CpuFeatures& cpu, std::string_view library_core,
                                bool dynamic_arch) {
  const Isa have = best_isa(cpu), got = blas_core_isa(library_core);
  if (!dynamic_arch || have == Isa::Unknown || got == Isa::Unknown || got >= have) return {};
  std::string core;
  switch (have) {
    case Isa::Avx512: core = "SkylakeX"; break;
    case Isa::Avx2:
      core = cpu.vendor == "AuthenticAMD" || cpu.vendor == "HygonGenuine" ? "Zen" : "Haswell";
      break;
    case Isa::Avx: core = "Sandybridge"; break;
    default: return {};
  }
  return {core, "OpenBLAS's own choice was " + core_with_isa(library_core) + " on " +
                    cpu_identity(cpu) + ", which has " + flags_text(have)};
}

void select_blas_kernels(char** argv) {
  // The user's choice, or ours in a program already started again (the
  // marker also stops a second re-run should the variable not have stuck).
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv(kChoiceVar)) return;
  const char* assumed = std::getenv("ATTNRES_BLAS_ASSUME_CORE");
  const BlasCoreChoice choice =
      choose_blas_core(read_cpu_features(), assumed ? assumed : openblas_get_corename(),
                       dynamic_arch_library());
  if (choice.coretype.empty()) return;
  setenv("OPENBLAS_CORETYPE", choice.coretype.c_str(), 1);
  setenv(kChoiceVar, (choice.coretype + ": " + choice.reason).c_str(), 1);
  execv("/proc/self/exe", argv);
  // Still here: the program could not be started again (no /proc, the binary
  // replaced since it started). Run on with the library's kernels.
  const int err = errno;
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kChoiceVar);
  std::fprintf(stderr,
               "warning: OpenBLAS runs %s kernels on a CPU with %s; re-running with "
               "OPENBLAS_CORETYPE=%s failed (%s): set it yourself for faster GEMMs\n",
               openblas_get_corename(), isa_name(best_isa(read_cpu_features())),
               choice.coretype.c_str(), std::strerror(err));
}

std::vector<std::pair<std::string, std::string>> user_blas_environment() {
  std::vector<std::pair<std::string, std::string>> env;
  if (const char* core = std::getenv("OPENBLAS_CORETYPE"); core && our_choice_reason().empty())
    env.emplace_back("OPENBLAS_CORETYPE", core);
  if (const char* l2 = std::getenv("OPENBLAS_L2_SIZE")) env.emplace_back("OPENBLAS_L2_SIZE", l2);
  return env;
}

std::string blas_kernels_description() {
  const std::string core = openblas_get_corename();
  if (const std::string why = our_choice_reason(); !why.empty())
    return core + " kernels (chosen by attnres from the CPU's flags: " + why +
           "; OPENBLAS_CORETYPE overrides)";
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE"))
    return core + " kernels (OPENBLAS_CORETYPE=" + forced + ")";
  return core + " kernels (OpenBLAS's own choice)";
}

std::string blas_kernels_warning() {
  const CpuFeatures cpu = read_cpu_features();
  const std::string core = openblas_get_corename();
  const Isa have = best_isa(cpu), got = blas_core_isa(core);
  if (have == Isa::Unknown || got == Isa::Unknown || got >= have) return "";
  std::string w = "OpenBLAS runs " + core_with_isa(core) + " kernels on " + cpu_identity(cpu) +
                  ", which has " + flags_text(have) + ": GEMMs run slower than this CPU can";
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE"))
    w += std::string(" (OPENBLAS_CORETYPE=") + forced +
         " is set; unset it to let attnres choose kernels from the CPU's flags)";
  else if (!dynamic_arch_library())
    w += " (this OpenBLAS is built for one CPU; Debian's libopenblas-openmp-dev carries all)";
  return w;
}

}  // namespace attnres::kernels::cpu
