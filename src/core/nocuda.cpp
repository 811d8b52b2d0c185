// core/device.h for builds without the CUDA backend (compiled only then).
#include <cstdlib>

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
void select_device(int) { no_cuda("select_device"); }
std::string pci_bus_id() { no_cuda("pci_bus_id"); }
std::string device_description() { no_cuda("device_description"); }
double peak_dense_flops(bool) { return 0; }
void* alloc(size_t) { no_cuda("device memory"); }
void release(void*) {}
void copy(void*, Side, const void*, Side, size_t) { no_cuda("device copy"); }
void copy_async(void*, Side, const void*, Side, size_t) { no_cuda("device copy"); }
void zero(void*, size_t) { no_cuda("device memset"); }
void fill_u32(void*, unsigned, size_t) { no_cuda("device fill"); }
void synchronize() {}
MemoryStats memory_stats() { return {}; }
void reset_peak_memory() {}
void profiler_start() {}
void profiler_stop() {}
size_t free_memory() { no_cuda("device memory"); }

HostBuffer::HostBuffer(size_t bytes, bool) : bytes_(bytes) {
  if (bytes == 0) return;
  data_ = std::malloc(bytes);  // nothing to pin for: no device
  if (!data_) fail("out of host memory allocating ", bytes, " bytes");
}
HostBuffer::~HostBuffer() { std::free(data_); }

struct StreamClock::Impl {};
StreamClock::StreamClock() { no_cuda("StreamClock"); }
StreamClock::~StreamClock() = default;
void StreamClock::reset() {}
int StreamClock::mark() { no_cuda("StreamClock"); }
double StreamClock::seconds(int, int) const { no_cuda("StreamClock"); }

struct DeferredChecks::Impl {};
DeferredChecks::DeferredChecks(size_t) { no_cuda("DeferredChecks"); }
DeferredChecks::~DeferredChecks() = default;
std::vector<double> DeferredChecks::collect() { no_cuda("DeferredChecks"); }
size_t DeferredChecks::claimed() const { return 0; }
DeferScope::DeferScope(DeferredChecks&) : previous_(nullptr) { no_cuda("DeferScope"); }
DeferScope::~DeferScope() = default;

struct StreamGraph::Impl {};
StreamGraph::StreamGraph() { no_cuda("CUDA graphs"); }
StreamGraph::~StreamGraph() = default;
void StreamGraph::capture(const std::function<void()>&) { no_cuda("CUDA graphs"); }
void StreamGraph::launch() { no_cuda("CUDA graphs"); }
void trim_memory_pool() {}

}  // namespace attnres::cuda
