// core/device.h for builds without the CUDA backend (compiled only then).
#include "core/device.h"
#include "core/error.h"

namespace attnres::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  fail(what, ": this build has no CUDA backend (nvcc was not found when it was configured); "
             "use training.device = \"cpu\" or rebuild on a machine with the CUDA toolkit");
}
}  // namespace

bool compiled() { return false; }
int device_count() { return 0; }
std::string device_description(int) { no_cuda("device_description"); }
double peak_dense_flops(int, bool) { return 0; }
void* alloc(size_t) { no_cuda("device memory"); }
void release(void*) {}
void copy(void*, Side, const void*, Side, size_t) { no_cuda("device copy"); }
void zero(void*, size_t) { no_cuda("device memset"); }
void fill_u32(void*, unsigned, size_t) { no_cuda("device fill"); }
void synchronize() {}
MemoryStats memory_stats() { return {}; }
void reset_peak_memory() {}
void profiler_start() {}
void profiler_stop() {}
size_t free_memory() { no_cuda("device memory"); }

}  // namespace attnres::cuda
