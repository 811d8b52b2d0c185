// NCCL transport (see parallel/nccl_transport.h).
//
// Point-to-point: every directed link between two pipeline ranks (a -> b)
// has its own two-rank communicator and, on both sides, its own stream. A
// send or receive is one NCCL operation on its link's stream, so operations
// of different links never wait for each other: a receive posted early for a
// busy peer holds up nothing but later messages of the same link, which
// arrive in that order anyway (parallel/simulator.h, CommModel::Nccl; with
// one stream per rank the same lists deadlock). This relies on the GPU
// running a few small NCCL kernels of different streams concurrently, as
// PyTorch's per-pair communicators do.
//
// Ordering on the GPU, all without blocking the host:
//  - before an operation its link stream waits for an event recorded on the
//    compute stream, so a send reads a finished output and a receive writes
//    a buffer whose previous users (the stream-ordered caching allocator
//    reuses memory on the compute stream) are done;
//  - after it an event is recorded on the link stream; Request::wait() makes
//    the compute stream wait for it. After that a received buffer may be
//    read and a sent buffer freed or reused by compute.
#include "parallel/nccl_transport.h"

#include "core/build_config.h"
#if ATTNRES_HAVE_NCCL && ATTNRES_HAVE_MPI
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>
#include <map>
#include <memory>
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

// Waits (bounded: comm_timeout_seconds()) until everything queued on
// `stream` has run; throws naming `what` when it does not finish in time (a
// peer that never makes its side of an exchange).
void wait_stream_bounded(cudaStream_t stream, const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const double limit = comm_timeout_seconds();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) ATTNRES_CUDA_CHECK(e);
    (void)cudaGetLastError();  // "not ready" is an answer, not an error to report later
    if (std::chrono::duration<double>(Clock::now() - start).count() > limit)
      fail("timed out after ", limit, " s waiting for ", what,
           " (a peer did not make its side; ATTNRES_COMM_TIMEOUT_S sets the limit)");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// RAII for a communicator. Destroying one can wait for its peers; while an
// exception unwinds (a peer may never answer) it is aborted instead, which
// ends this member's operations on the device without waiting.
class NcclComm {
 public:
  NcclComm() = default;
  ~NcclComm() {
    if (!c_) return;
    if (std::uncaught_exceptions() > 0) ncclCommAbort(c_);
    else ncclCommDestroy(c_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  // Collective over the members of `group`: member 0 creates the unique id,
  // MPI broadcasts it, every member joins.
  void init(const Comm& group, const std::string& what) {
    ncclUniqueId id;
    if (group.rank() == 0) ATTNRES_NCCL_CHECK(ncclGetUniqueId(&id));
    group.bcast(&id, sizeof id, 0);
    join(id, group.size(), group.rank(), what);
  }
  // Collective over the `size` processes that were given `id`.
  void join(const ncclUniqueId& id, int size, int rank, const std::string& what) {
    const ncclResult_t r = ncclCommInitRank(&c_, size, id, rank);
    if (r != ncclSuccess)
      fail("NCCL: creating the ", what, " communicator (", size, " ranks) failed: ",
           ncclGetErrorString(r), " (", ncclGetLastError(nullptr),
           "). Two ranks on one GPU are refused by NCCL < 2.30: use parallel.transport = \"mpi\"");
  }
  ncclComm_t get() const { return c_; }

 private:
  ncclComm_t c_ = nullptr;
};

class NcclRequest : public RequestImpl {
 public:
  NcclRequest(Tensor buffer, cudaStream_t link, bool recv) : buffer_(std::move(buffer)), recv_(recv) {
    ATTNRES_CUDA_CHECK(cudaEventRecord(done_.get(), link));
  }
  void wait() override {
    ATTNRES_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), done_.get(), 0));
  }
  bool test() override {
    // A send is done once the link stream passed the transfer: the buffer's
    // release (ordered on the compute stream) can no longer overtake it. A
    // receive answers false (transport.h): only wait() orders the compute
    // stream after it.
    // While a CUDA graph captures the step nothing has run yet (and querying
    // a captured event would break the capture): the executor then completes
    // every send at the step's end, which joins the link streams back into
    // the captured compute stream.
    if (recv_ || cuda::compute_stream_capturing()) return false;
    const cudaError_t e = cudaEventQuery(done_.get());
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();  // "not ready" is an answer, not an error to report later
      return false;
    }
    ATTNRES_CUDA_CHECK(e);
    return true;
  }
  void abandon() noexcept override {
    // Error path (the job is about to end): never block here, since the peer
    // may never send. Unless the transfer is done, deliberately keep the
    // buffer alive in case the communication kernel still uses it.
    const cudaError_t e = cudaEventQuery(done_.get());
    if (e == cudaSuccess) return;
    (void)cudaGetLastError();
    new Tensor(buffer_);  // intentional leak, see above
  }

 private:
  Tensor buffer_;  // kept alive until the compute stream has waited for the transfer
  bool recv_;
  Event done_;
};

// RAII for a non-blocking CUDA stream.
class Stream {
 public:
  Stream() { ATTNRES_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// One direction between two pipeline ranks: a two-rank communicator (the
// sender is its rank 0) and this side's stream for it (destroyed after the
// communicator: members go in reverse order).
struct Link {
  Stream stream;
  NcclComm comm;
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
  // NCCL connects lazily: the first operation on a communicator blocks the
  // host until its peers make theirs. Left to training step 1, that happens
  // inside the pipeline schedule, where a set-up step that synchronises the
  // device while another link's kernel spins can hang. So every
  // communicator makes one 1-element exchange right after it is created, in
  // the same global order on every rank, and waits for it (bounded): after
  // the constructor every connection is up, and step 1's time is compute.
  explicit NcclTransport(const ProcessGrid& grid)
      : Transport(grid.P(), grid.stage()),
        grid_(grid),
        probe_(Tensor::zeros({1}, DType::F32, Device::CUDA)) {
    pipeline_.init(grid.pipeline(), "pipeline");
    connect_collective(pipeline_, "the pipeline communicator");
    data_.init(grid.data(), "data-parallel");
    connect_collective(data_, "the data-parallel communicator");
    if (grid.EP() > 1) {  // expert parallelism: the all-to-all and the experts' sums
      experts_.init(grid.experts(), "expert-parallel");
      connect_collective(experts_, "the expert-parallel communicator");
      expert_data_.init(grid.expert_data(), "expert data-parallel");
      connect_collective(expert_data_, "the expert data-parallel communicator");
    }
    init_links();
  }
  // Destroying a communicator can wait for its peer to destroy it too, so
  // every rank destroys its links in the reverse of the global order they
  // were made in (the last link not yet destroyed has both members waiting
  // in it, as in init_links), then the data and pipeline communicators (the
  // same order on every rank, by member order; a std::vector's own
  // destructor does not promise an order). On an error path (an exception
  // unwinding the engine) NcclComm aborts instead of destroying, so that the
  // job reaches MpiSession::abort.
  ~NcclTransport() override {
    while (!links_.empty()) links_.pop_back();
  }
  std::string name() const override { return "nccl"; }
  // Stream-ordered throughout (see the top of this file); NCCL's operations
  // can be captured into CUDA graphs (NCCL >= 2.9, one GPU per process).
  bool graph_capturable() const override { return true; }

  Request send_to(const Tensor& buffer, int peer) override {
    check(buffer, "send");
    Link& l = link(out_, peer, "send to");
    after_compute(l.stream.get());
    ATTNRES_NCCL_CHECK(ncclSend(buffer.raw(), static_cast<size_t>(buffer.numel()),
                                nccl_type(buffer.dtype()), 1, l.comm.get(), l.stream.get()));
    count_sent(peer, static_cast<int64_t>(buffer.nbytes()));
    return Request(std::make_unique<NcclRequest>(buffer, l.stream.get(), /*recv=*/false));
  }

  Request recv_from(const Tensor& buffer, int peer) override {
    check(buffer, "receive");
    Link& l = link(in_, peer, "receive from");
    after_compute(l.stream.get());
    ATTNRES_NCCL_CHECK(ncclRecv(buffer.raw(), static_cast<size_t>(buffer.numel()),
                                nccl_type(buffer.dtype()), 0, l.comm.get(), l.stream.get()));
    count_received(peer, static_cast<int64_t>(buffer.nbytes()));
    return Request(std::make_unique<NcclRequest>(buffer, l.stream.get(), /*recv=*/true));
  }

  std::unique_ptr<PendingSum> start_sum_across_replicas(std::vector<Tensor> tensors,
                                                        Replicas group) override {
    // (The runtime does not call this with one replica; the one-GPU NCCL
    // test does, to run the same NCCL calls as D > 1.)
    auto pending = std::make_unique<NcclPendingSum>(std::move(tensors));
    if (pending->tensors.empty()) return pending;
    // Enqueued on the communication stream now (after the gradients are
    // computed); runs while the compute stream goes on with other chunks.
    ATTNRES_CUDA_CHECK(cudaEventRecord(ready_.get(), cuda::compute_stream()));
    ATTNRES_CUDA_CHECK(cudaStreamWaitEvent(cuda::comm_stream(), ready_.get(), 0));
    ATTNRES_NCCL_CHECK(ncclGroupStart());
    for (Tensor& t : pending->tensors) {
      ATTNRES_CHECK(t.is_cuda(), "NCCL data-parallel sum of a host tensor: ", t.describe());
      ATTNRES_NCCL_CHECK(ncclAllReduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()),
                                       nccl_type(t.dtype()), ncclSum, replicas(group),
                                       cuda::comm_stream()));
    }
    ATTNRES_NCCL_CHECK(ncclGroupEnd());
    pending->done = std::make_shared<Event>();
    ATTNRES_CUDA_CHECK(cudaEventRecord(pending->done->get(), cuda::comm_stream()));
    return pending;
  }

  std::unique_ptr<PendingSum> start_reduce_scatter(Tensor flat, Tensor mine,
                                                   Replicas group) override {
    check(flat, "ZeRO-1 reduce-scatter");
    check(mine, "ZeRO-1 reduce-scatter");
    ATTNRES_CHECK(flat.numel() == mine.numel() * members(group), "reduce-scatter of ", flat.describe(),
                  " into ", mine.describe());
    auto pending = std::make_unique<NcclPendingSum>(std::vector<Tensor>{flat, mine});
    ATTNRES_CUDA_CHECK(cudaEventRecord(ready_.get(), cuda::compute_stream()));
    ATTNRES_CUDA_CHECK(cudaStreamWaitEvent(cuda::comm_stream(), ready_.get(), 0));
    ATTNRES_NCCL_CHECK(ncclReduceScatter(flat.raw(), mine.raw(), static_cast<size_t>(mine.numel()),
                                         nccl_type(mine.dtype()), ncclSum, replicas(group),
                                         cuda::comm_stream()));
    pending->done = std::make_shared<Event>();
    ATTNRES_CUDA_CHECK(cudaEventRecord(pending->done->get(), cuda::comm_stream()));
    return pending;
  }

  void all_gather(const Tensor& mine, Tensor& flat, Replicas group) override {
    check(flat, "ZeRO-1 all-gather");
    check(mine, "ZeRO-1 all-gather");
    ATTNRES_CHECK(flat.numel() == mine.numel() * members(group), "all-gather of ", mine.describe(),
                  " into ", flat.describe());
    ATTNRES_CUDA_CHECK(cudaEventRecord(ready_.get(), cuda::compute_stream()));
    ATTNRES_CUDA_CHECK(cudaStreamWaitEvent(cuda::comm_stream(), ready_.get(), 0));
    ATTNRES_NCCL_CHECK(ncclAllGather(mine.raw(), flat.raw(), static_cast<size_t>(mine.numel()),
                                     nccl_type(mine.dtype()), replicas(group), cuda::comm_stream()));
    join_comm_stream();
  }

  // Grouped ncclSend/ncclRecv on the expert group's communicator (NCCL's
  // all-to-all pattern), on the communication stream after the compute so
  // far; the compute stream waits for it.
  void all_to_all(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                  const std::vector<int64_t>& recv_rows) override {
    check(send, "all-to-all");
    check(recv, "all-to-all");
    const int n = grid_.EP();
    ATTNRES_CHECK(send.ndim() == 2 && recv.ndim() == 2 && send.dim(1) == recv.dim(1) &&
                      send.dtype() == recv.dtype() && static_cast<int>(send_rows.size()) == n &&
                      static_cast<int>(recv_rows.size()) == n,
                  "all-to-all of ", send.describe(), " into ", recv.describe());
    const int64_t c = send.dim(1);
    after_compute(cuda::comm_stream());
    ATTNRES_NCCL_CHECK(ncclGroupStart());
    int64_t s_at = 0, r_at = 0;
    for (int q = 0; q < n; ++q) {
      if (send_rows[q] > 0)
        ATTNRES_NCCL_CHECK(ncclSend(send.rows(s_at, send_rows[q]).raw(),
                                    static_cast<size_t>(send_rows[q] * c), nccl_type(send.dtype()), q,
                                    experts_comm(), cuda::comm_stream()));
      if (recv_rows[q] > 0)
        ATTNRES_NCCL_CHECK(ncclRecv(recv.rows(r_at, recv_rows[q]).raw(),
                                    static_cast<size_t>(recv_rows[q] * c), nccl_type(recv.dtype()), q,
                                    experts_comm(), cuda::comm_stream()));
      s_at += send_rows[q];
      r_at += recv_rows[q];
    }
    ATTNRES_NCCL_CHECK(ncclGroupEnd());
    join_comm_stream();
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
  // `stream` runs what comes next only after the compute issued so far.
  void after_compute(cudaStream_t stream) {
    ATTNRES_CUDA_CHECK(cudaEventRecord(ready_.get(), cuda::compute_stream()));
    ATTNRES_CUDA_CHECK(cudaStreamWaitEvent(stream, ready_.get(), 0));
  }

  // Links with the neighbours of the pipeline ring (chunk c -> c+1 runs from
  // stage p to p+1 mod P, gradients back). Stage 0 of the pipeline creates
  // one unique id per directed link and broadcasts them; every rank then
  // joins its links in the same global order (by sender, then receiver), so
  // the two members of the first link not yet made are always both waiting
  // in it: no rank can block the others.
  void init_links() {
    const int P = grid_.P();
    if (P == 1) return;
    std::vector<std::pair<int, int>> links;  // (from, to)
    for (int a = 0; a < P; ++a)
      for (int b : {(a + 1) % P, (a + P - 1) % P})
        if (b != a && std::find(links.begin(), links.end(), std::make_pair(a, b)) == links.end())
          links.emplace_back(a, b);
    std::sort(links.begin(), links.end());
    std::vector<ncclUniqueId> ids(links.size());
    if (grid_.stage() == 0)
      for (auto& id : ids) ATTNRES_NCCL_CHECK(ncclGetUniqueId(&id));
    grid_.pipeline().bcast(ids.data(), ids.size() * sizeof(ncclUniqueId), 0);
    const int me = grid_.stage();
    for (size_t i = 0; i < links.size(); ++i) {
      const auto [from, to] = links[i];
      if (from != me && to != me) continue;
      auto& table = from == me ? out_ : in_;
      auto l = std::make_unique<Link>();
      const std::string name = "link " + std::to_string(from) + " -> " + std::to_string(to);
      l->comm.join(ids[i], 2, from == me ? 0 : 1, name);
      // Connected now, while both members are here (see the constructor).
      after_compute(l->stream.get());  // probe_ was allocated on the compute stream
      if (from == me)
        ATTNRES_NCCL_CHECK(ncclSend(probe_.raw(), 1, ncclFloat32, 1, l->comm.get(), l->stream.get()));
      else
        ATTNRES_NCCL_CHECK(ncclRecv(probe_.raw(), 1, ncclFloat32, 0, l->comm.get(), l->stream.get()));
      wait_stream_bounded(l->stream.get(), "NCCL to connect pipeline " + name);
      table[from == me ? to : from] = l.get();
      links_.push_back(std::move(l));
    }
  }

  // One 1-element all-reduce on `c`, waited for (bounded).
  void connect_collective(const NcclComm& c, const std::string& what) {
    after_compute(cuda::comm_stream());
    ATTNRES_NCCL_CHECK(ncclAllReduce(probe_.raw(), probe_.raw(), 1, ncclFloat32, ncclSum, c.get(),
                                     cuda::comm_stream()));
    wait_stream_bounded(cuda::comm_stream(), "NCCL to connect " + what);
  }

  static Link& link(const std::map<int, Link*>& table, int peer, const char* what) {
    auto it = table.find(peer);
    ATTNRES_CHECK(it != table.end(), "NCCL: no link to ", what, " pipeline rank ", peer);
    return *it->second;
  }

  // The compute stream continues only after everything issued on the
  // communication stream so far.
  void join_comm_stream() {
    ATTNRES_CUDA_CHECK(cudaEventRecord(joined_.get(), cuda::comm_stream()));
    ATTNRES_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), joined_.get(), 0));
  }

  ncclComm_t replicas(Replicas group) const {
    return group == Replicas::SameExperts && grid_.EP() > 1 ? expert_data_.get() : data_.get();
  }
  int members(Replicas group) const {
    return group == Replicas::SameExperts ? grid_.D() / grid_.EP() : grid_.D();
  }
  // With EP = 1 the expert group is this rank alone: the model never
  // exchanges then, but the all-to-all is still the same NCCL code on a
  // one-member communicator (a self-send), made on first use (it has no
  // peer to wait for), so one GPU can test it.
  ncclComm_t experts_comm() {
    if (!experts_.get()) {
      ATTNRES_CHECK(grid_.EP() == 1 && grid_.experts().size() == 1,
                    "NCCL all-to-all: no expert-parallel communicator");
      experts_.init(grid_.experts(), "one-member expert");
    }
    return experts_.get();
  }

  const ProcessGrid& grid_;
  Tensor probe_;  // one float on the device: the connecting exchanges' buffer
  NcclComm pipeline_, data_, experts_, expert_data_;
  std::vector<std::unique_ptr<Link>> links_;  // this rank's links, in the global order made
  std::map<int, Link*> out_, in_;             // by peer: links this rank sends / receives on
  Event ready_, joined_;
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport(const ProcessGrid& grid) {
  return std::make_unique<NcclTransport>(grid);
}

}  // namespace attnres::parallel
#endif
