// CUDA graphs and the device results they defer (core/device.h; StatusSlot:
// core/cuda/runtime.cuh). docs/cuda.md, "CUDA graphs", says what a captured
// training step may and may not do.
#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda/runtime.cuh"
#include "core/device.h"

namespace attnres::cuda {

struct DeferredChecks::Impl {
  DeviceStatus* slots = nullptr;  // device memory, `capacity` of them
  size_t capacity = 0;
  struct Claim {
    IdCheck check;
    bool value;
  };
  std::vector<Claim> claims;  // in claim order: the order the ops were called in
};

namespace {

// The DeferredChecks the ops of this thread report to (DeferScope), or none.
// Per thread, like the stream capture it serves (cudaStreamCaptureModeThreadLocal):
// ops queued by another thread meanwhile (none today) read back as usual.
thread_local DeferredChecks* t_active = nullptr;

[[noreturn]] void fail_bad_id(const IdCheck& c, unsigned long long pos) {
  int32_t id = 0;
  copy(&id, Side::Host, c.ids + pos, Side::Device, sizeof id);
  fail(c.op, ": ", c.noun, " id ", id, " at position ", pos, " is outside the vocabulary [0, ",
       c.vocab, ")");
}

// value 0, nothing flagged (all bits of `bad` set), on the compute stream.
__global__ void reset_status_kernel(DeviceStatus* s) {
  s->value = 0.0;
  s->bad = ULLONG_MAX;
}

}  // namespace

DeferredChecks::DeferredChecks(size_t capacity) : impl_(std::make_unique<Impl>()) {
  impl_->capacity = capacity;
  impl_->slots = static_cast<DeviceStatus*>(alloc(sizeof(DeviceStatus) * std::max<size_t>(capacity, 1)));
}

DeferredChecks::~DeferredChecks() { release(impl_->slots); }

size_t DeferredChecks::claimed() const { return impl_->claims.size(); }

std::vector<double> DeferredChecks::collect() {
  const size_t n = impl_->claims.size();
  if (n == 0) synchronize();  // (the copy below waits otherwise)
  std::vector<DeviceStatus> host(n);
  copy(host.data(), Side::Host, impl_->slots, Side::Device, sizeof(DeviceStatus) * n);  // waits
  std::vector<double> values;
  for (size_t i = 0; i < n; ++i) {
    const Impl::Claim& c = impl_->claims[i];
    if (host[i].bad != ULLONG_MAX) fail_bad_id(c.check, host[i].bad);
    if (c.value) values.push_back(host[i].value);
  }
  return values;
}

DeferScope::DeferScope(DeferredChecks& checks) : previous_(t_active) { t_active = &checks; }
DeferScope::~DeferScope() { t_active = previous_; }

StatusSlot::StatusSlot(const IdCheck& check, bool value) : check_(check) {
  if (DeferredChecks* d = t_active) {
    auto& impl = d->impl();
    ATTNRES_CHECK(impl.claims.size() < impl.capacity, check.op, ": deferred results full (",
                  impl.capacity, " slots): the captured work calls more ops than planned");
    slot_ = impl.slots + impl.claims.size();
    impl.claims.push_back({check, value});
  } else {
    slot_ = static_cast<DeviceStatus*>(alloc(sizeof(DeviceStatus)));
    owned_ = true;
  }
  // A kernel, not a memset of a pattern: the two words differ.
  reset_status_kernel<<<1, 1, 0, compute_stream()>>>(slot_);
  ATTNRES_CUDA_CHECK_LAUNCH();
}

StatusSlot::~StatusSlot() {
  if (owned_) release(slot_);
}

double StatusSlot::settle() const {
  if (!owned_) return 0.0;  // deferred: DeferredChecks::collect()
  DeviceStatus host{};
  copy(&host, Side::Host, slot_, Side::Device, sizeof host);  // waits for the kernels
  if (host.bad != ULLONG_MAX) fail_bad_id(check_, host.bad);
  return host.value;
}

struct StreamGraph::Impl {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Impl() {  // no throw: a destructor
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

StreamGraph::StreamGraph() : impl_(std::make_unique<Impl>()) {}
StreamGraph::~StreamGraph() = default;

void StreamGraph::capture(const std::function<void()>& work) {
  ATTNRES_CHECK(!impl_->exec, "StreamGraph: captured already");
  cudaStream_t s = compute_stream();
  // Thread-local mode: only this thread's calls that would break the capture
  // (a wait for the device, a synchronous copy) fail; another thread's (a
  // background checkpoint writer's) are not this capture's business.
  ATTNRES_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    work();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(s, &partial);  // the stream leaves capture mode either way
    if (partial) cudaGraphDestroy(partial);
    (void)cudaGetLastError();
    throw;
  }
  ATTNRES_CUDA_CHECK(cudaStreamEndCapture(s, &impl_->graph));
  ATTNRES_CUDA_CHECK(cudaGraphInstantiate(&impl_->exec, impl_->graph, 0));
}

void StreamGraph::launch() {
  ATTNRES_CHECK(impl_->exec, "StreamGraph: launch before capture");
  ATTNRES_CUDA_CHECK(cudaGraphLaunch(impl_->exec, compute_stream()));
}

}  // namespace attnres::cuda
