// Which OpenBLAS kernels run, and choosing them when OpenBLAS's own choice
// falls short of the CPU.
//
// A DYNAMIC_ARCH OpenBLAS (Debian's) carries kernels for many CPUs and picks
// one set when it loads, from a table of CPU family / model numbers, unless
// OPENBLAS_CORETYPE names one. A CPU newer than the library (or a hypervisor
// that masks the model number) is not in the table, and the library falls back
// to its SSE3 "Prescott" kernels: seen on an Intel Xeon of family 6 model 207
// with AVX-512 under OpenBLAS 0.3.21, training 3.3x slower than with its
// SkylakeX kernels. The choice is made in OpenBLAS's constructor, before our
// main() runs, and cannot be changed afterwards; so when it falls short of the
// CPU's own flags (and the user did not set OPENBLAS_CORETYPE),
// select_blas_kernels() sets OPENBLAS_CORETYPE from the flags and starts the
// same program again (execv of /proc/self/exe with the same arguments and pid),
// first thing in main(), before MPI or any thread. Children (sweep runs,
// supervised restarts) inherit the variable and do not re-run; mpirun ranks
// and Slurm tasks each decide for themselves, alike.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/cpu_features.h"

namespace attnres::kernels::cpu {

// The instruction-set class of an OpenBLAS core name (openblas_get_corename(),
// any case: "Prescott" -> SSE, "Sandybridge" -> AVX, "Haswell" / "Zen" ->
// AVX2, "SkylakeX" / "Cooperlake" / "SapphireRapids" -> AVX-512); Unknown
// for a name not listed here (a newer library's: then we trust it).
Isa blas_core_isa(std::string_view core);

struct BlasCoreChoice {
  std::string coretype;  // the OPENBLAS_CORETYPE to set; "" = keep the library's choice
  std::string reason;    // why, for the log ("" when kept)
};

// The running kernels' name, as OpenBLAS says it ("Haswell").
std::string blas_core_name();

// The decision, from the CPU's features and the library's own choice: a core
// of the CPU's best class (AVX-512 -> SkylakeX; AVX2 -> Zen on AMD / Hygon,
// Haswell otherwise; AVX -> Sandybridge) when the library's is of a lower
// known class and the library can switch (a DYNAMIC_ARCH build).
BlasCoreChoice choose_blas_core(const CpuFeatures& cpu, std::string_view library_core,
                                bool dynamic_arch);

// First thing in main(): when OPENBLAS_CORETYPE is unset and choose_blas_core
// says so, set it (and ATTNRES_BLAS_CHOICE, the reason, for the log) and
// re-run this program; returns only when it keeps the kernels (or the re-run
// could not start: then with a warning on stderr).
// ATTNRES_BLAS_ASSUME_CORE=NAME (for tests) stands for the library's own
// choice, to exercise the re-run on a CPU that the library knows.
void select_blas_kernels(char** argv);

// The OpenBLAS variables the user set (OPENBLAS_CORETYPE unless attnres set
// it, OPENBLAS_L2_SIZE), as name / value pairs: what a process started
// elsewhere (a Slurm task, whose environment is written out) needs to run the
// same kernels with the same blocking, hence the same bits, as this one.
std::vector<std::pair<std::string, std::string>> user_blas_environment();

// "SkylakeX kernels (chosen by attnres: ...)", "Haswell kernels
// (OPENBLAS_CORETYPE=Haswell)" or "Cooperlake kernels (OpenBLAS's own
// choice)": which kernels run and who chose them.
std::string blas_kernels_description();

// A warning for the log and the benchmark when the running kernels are of a
// lower class than the CPU supports (e.g. a user's OPENBLAS_CORETYPE=Haswell on
// an AVX-512 CPU); "" otherwise.
std::string blas_kernels_warning();

}  // namespace attnres::kernels::cpu
