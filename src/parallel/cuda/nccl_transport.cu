// NCCL transport (see parallel/nccl_transport.h).
//
// Ordering on the GPU, all without blocking the host:
//  - group_start(): record an event on the compute stream and make the
//    communication stream wait for it, so sends read finished outputs and
//    receives write buffers whose previous users (the stream-ordered caching
//    allocator reuses memory on the compute stream) are done;
//  - group_end(): ncclGroupEnd, then record an event on the communication
//    stream that every request of the group shares;
//  - Request::wait(): the compute stream waits for that event. After that a
//    received buffer may be read and a sent buffer freed or reused by compute.
#include "parallel/nccl_transport.h"

#if ATTNRES_HAVE_NCCL && ATTNRES_HAVE_MPI
#include <nccl.h>

#include <string>
#include <vector>

#include "core/cuda/runtime.cuh"
#include "core/error.h"
#include "kernels/reduce.h"

#define ATTNRES_NCCL_CHECK(call)                                                                   \
  do {                                                                                             \
    ncclResult_t res_ = (call);                                                                    \
    if (res_ != ncclSuccess)                                                                       \
      ::attnres::fail_internal(__FILE__, ":", __LINE__, ": ", #call, " failed: ", ncclGetErrorString(res_), \
                      " (", ncclGetLastError(nullptr), ")");                                       \
  } while (0)

namespace attnres::parallel {

bool nccl_compiled() { return true; }

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "?";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
    case DType::I32:
      return ncclInt32;
  }
  return ncclUint8;
}

// RAII for a CUDA event.
class Event {
 public:
  Event() { ATTNRES_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  ~Event() { cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// RAII for a communicator.
class NcclComm {
 public:
  NcclComm() = default;
  ~NcclComm() {
    if (c_) ncclCommDestroy(c_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  // Collective over the members of `group`: member 0 creates the unique id,
  // MPI broadcasts it, every member joins.
  void init(const Comm& group, const char* what) {
    ncclUniqueId id;
    if (group.rank() == 0) ATTNRES_NCCL_CHECK(ncclGetUniqueId(&id));
    group.bcast(&id, sizeof id, 0);
    ncclResult_t r = ncclCommInitRank(&c_, group.size(), id, group.rank());
    if (r != ncclSuccess)
      fail("NCCL: creating the ", what, " communicator (", group.size(),
           " ranks) failed: ", ncclGetErrorString(r), " (", ncclGetLastError(nullptr),
           "). Two ranks on one GPU are refused by NCCL < 2.30: use parallel.transport = \"mpi\"");
  }
  ncclComm_t get() const { return c_; }

 private:
  ncclComm_t c_ = nullptr;
};

class NcclRequest : public RequestImpl {
 public:
  explicit NcclRequest(Tensor buffer) : buffer_(std::move(buffer)) {}
  void set_event(std::shared_ptr<Event> e) { event_ = std::move(e); }
  void wait() override {
    ATTNRES_CHECK(event_, "NCCL request waited on before its group was ended");
    ATTNRES_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), event_->get(), 0));
  }
  void abandon() noexcept override {
    // Error path: make sure the buffer outlives the communication kernel.
    if (event_) cudaEventSynchronize(event_->get());
  }

 private:
  Tensor buffer_;  // kept alive until the compute stream has waited for the transfer
  std::shared_ptr<Event> event_;
};

// finish(): the compute stream waits for the all-reduce (the host does not).
struct NcclPendingSum : PendingSum {
  explicit NcclPendingSum(std::vector<Tensor> t) : tensors(std::move(t)) {}
  void finish() override {
    if (done) ATTNRES_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), done->get(), 0));
    done.reset();
  }
  std::vector<Tensor> tensors;  // kept alive while the all-reduce runs
  std::shared_ptr<Event> done;
};

class NcclTransport : public Transport {
 public:
  explicit NcclTransport(const ProcessGrid& grid) : Transport(grid.P()), grid_(grid) {
    cuda::compute_stream();  // selects the device before NCCL looks at it
    pipeline_.init(grid.pipeline(), "pipeline");
    data_.init(grid.data(), "data-parallel");
  }
  std::string name() const override { return "nccl"; }

  void group_start() override {
    ATTNRES_CHECK(!in_group_, "NCCL: nested group");
    in_group_ = true;
    ATTNRES_CUDA_CHECK(cudaEventRecord(ready_.get(), cuda::compute_stream()));
    ATTNRES_CUDA_CHECK(cudaStreamWaitEvent(cuda::comm_stream(), ready_.get(), 0));
    ATTNRES_NCCL_CHECK(ncclGroupStart());
  }

  void group_end() override {
    ATTNRES_CHECK(in_group_, "NCCL: group_end without group_start");
    in_group_ = false;
    ATTNRES_NCCL_CHECK(ncclGroupEnd());
    auto done = std::make_shared<Event>();
    ATTNRES_CUDA_CHECK(cudaEventRecord(done->get(), cuda::comm_stream()));
    for (NcclRequest* r : group_) r->set_event(done);
    group_.clear();
  }

  Request isend(const Tensor& buffer, int peer) override {
    check(buffer, "send");
    ATTNRES_NCCL_CHECK(ncclSend(buffer.raw(), static_cast<size_t>(buffer.numel()),
                                nccl_type(buffer.dtype()), peer, pipeline_.get(),
                                cuda::comm_stream()));
    count_sent(peer, static_cast<int64_t>(buffer.nbytes()));
    return track(buffer);
  }

  Request irecv(const Tensor& buffer, int peer) override {
    check(buffer, "receive");
    ATTNRES_NCCL_CHECK(ncclRecv(buffer.raw(), static_cast<size_t>(buffer.numel()),
                                nccl_type(buffer.dtype()), peer, pipeline_.get(),
                                cuda::comm_stream()));
    count_received(peer, static_cast<int64_t>(buffer.nbytes()));
    return track(buffer);
  }

  std::unique_ptr<PendingSum> start_sum_across_replicas(std::vector<Tensor> tensors) override {
    auto pending = std::make_unique<NcclPendingSum>(std::move(tensors));
    if (grid_.D() == 1 || pending->tensors.empty()) return pending;
    // Enqueued on the communication stream now (after the gradients are
    // computed); runs while the compute stream goes on with other chunks.
    ATTNRES_CUDA_CHECK(cudaEventRecord(ready_.get(), cuda::compute_stream()));
    ATTNRES_CUDA_CHECK(cudaStreamWaitEvent(cuda::comm_stream(), ready_.get(), 0));
    ATTNRES_NCCL_CHECK(ncclGroupStart());
    for (Tensor& t : pending->tensors) {
      ATTNRES_CHECK(t.is_cuda(), "NCCL data-parallel sum of a host tensor: ", t.describe());
      ATTNRES_NCCL_CHECK(ncclAllReduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()),
                                       nccl_type(t.dtype()), ncclSum, data_.get(),
                                       cuda::comm_stream()));
    }
    ATTNRES_NCCL_CHECK(ncclGroupEnd());
    pending->done = std::make_shared<Event>();
    ATTNRES_CUDA_CHECK(cudaEventRecord(pending->done->get(), cuda::comm_stream()));
    return pending;
  }

  void sum_with_peer(Tensor& t, int peer) override {
    check(t, "tied-embedding exchange");
    Tensor theirs = Tensor::empty(t.shape(), t.dtype(), t.device());
    ATTNRES_CUDA_CHECK(cudaEventRecord(ready_.get(), cuda::compute_stream()));
    ATTNRES_CUDA_CHECK(cudaStreamWaitEvent(cuda::comm_stream(), ready_.get(), 0));
    ATTNRES_NCCL_CHECK(ncclGroupStart());
    ATTNRES_NCCL_CHECK(ncclSend(t.raw(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), peer,
                                pipeline_.get(), cuda::comm_stream()));
    ATTNRES_NCCL_CHECK(ncclRecv(theirs.raw(), static_cast<size_t>(theirs.numel()),
                                nccl_type(theirs.dtype()), peer, pipeline_.get(),
                                cuda::comm_stream()));
    ATTNRES_NCCL_CHECK(ncclGroupEnd());
    join_comm_stream();
    kernels::add_(t, theirs);  // on the compute stream, after the exchange
  }

 private:
  void check(const Tensor& t, const char* what) const {
    ATTNRES_CHECK(t.is_cuda(), "NCCL ", what, " of a host tensor (", t.describe(),
                  "): the NCCL transport moves device memory");
  }
  Request track(const Tensor& buffer) {
    ATTNRES_CHECK(in_group_, "NCCL point-to-point outside a group");
    auto req = std::make_unique<NcclRequest>(buffer);
    group_.push_back(req.get());
    return Request(std::move(req));
  }
  // The compute stream continues only after everything issued on the
  // communication stream so far.
  void join_comm_stream() {
    ATTNRES_CUDA_CHECK(cudaEventRecord(joined_.get(), cuda::comm_stream()));
    ATTNRES_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), joined_.get(), 0));
  }

  const ProcessGrid& grid_;
  NcclComm pipeline_, data_;
  Event ready_, joined_;
  bool in_group_ = false;
  std::vector<NcclRequest*> group_;  // requests of the open group (owned by their Request)
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport(const ProcessGrid& grid) {
  return std::make_unique<NcclTransport>(grid);
}

}  // namespace attnres::parallel
#endif
