#include "parallel/mpi_transport.h"

#include <cstring>

#include "core/device.h"
#include "core/error.h"
#include "kernels/reduce.h"
#include "parallel/mpi_internal.h"

namespace attnres::parallel {

#if ATTNRES_HAVE_MPI

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::BF16:
      return MPI_UINT16_T;  // moved, never summed by MPI
    case DType::I32:
      return MPI_INT32_T;
  }
  return MPI_BYTE;
}

int mpi_count(const Tensor& t) {
  if (t.numel() > 2147483647)
    fail("MPI transport: a message of ", t.numel(),
         " elements exceeds MPI's int count; use "
         "smaller microbatches or the NCCL transport");
  return static_cast<int>(t.numel());
}

class MpiRequest : public RequestImpl {
 public:
  // `user` is the caller's tensor; `host` the buffer MPI works on (the same
  // tensor for CPU tensors, a staging copy for CUDA ones).
  MpiRequest(bool is_recv, Tensor user, Tensor host, int peer)
      : recv_(is_recv), user_(std::move(user)), host_(std::move(host)), peer_(peer) {}

  MPI_Request* handle() { return &req_; }

  void wait() override {
    const std::string what = std::string(recv_ ? "a pipeline message from" : "a pipeline send to") +
                             " stage " + std::to_string(peer_) + " (" + host_.describe() + ")";
    MPI_Status status;
    wait_bounded(req_, what, &status);
    req_ = MPI_REQUEST_NULL;
    if (recv_) {
      int count = 0;
      MPI_Get_count(&status, mpi_type(host_.dtype()), &count);
      if (count != host_.numel())
        fail("pipeline message from stage ", peer_, " has ", count, " elements, expected ",
             host_.numel(), ": the two ranks disagree on the order or shape of their messages");
      if (!user_.is_cpu()) user_.copy_from(host_);
    }
  }

  bool test() override {
    if (recv_) return false;
    if (req_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    mpi_check(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), "testing a pipeline send");
    return done != 0;
  }

  void abandon() noexcept override {
    if (req_ == MPI_REQUEST_NULL) return;
    // Error path (the job is about to end): never block here. Cancel a
    // receive, detach the request, and deliberately keep the buffer alive in
    // case MPI still writes to or reads from it.
    int done = 0;
    MPI_Test(&req_, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (recv_) MPI_Cancel(&req_);
    MPI_Request_free(&req_);
    new Tensor(host_);  // intentional leak, see above
  }

 private:
  bool recv_;
  Tensor user_, host_;
  int peer_;
  MPI_Request req_ = MPI_REQUEST_NULL;
};

}  // namespace

MpiTransport::MpiTransport(const ProcessGrid& grid) : Transport(grid.P(), grid.stage()), grid_(grid) {}

Request MpiTransport::send_to(const Tensor& buffer, int peer) {
  Tensor host = buffer.is_cpu() ? buffer : buffer.to(Device::CPU);
  auto req = std::make_unique<MpiRequest>(false, buffer, host, peer);
  mpi_check(MPI_Isend(host.raw(), mpi_count(host), mpi_type(host.dtype()), peer, 0,
                      raw(grid_.pipeline()), req->handle()),
            "MPI_Isend (pipeline)");
  count_sent(peer, static_cast<int64_t>(buffer.nbytes()));
  return Request(std::move(req));
}

Request MpiTransport::recv_from(const Tensor& buffer, int peer) {
  Tensor host =
      buffer.is_cpu() ? buffer : Tensor::empty(buffer.shape(), buffer.dtype(), Device::CPU);
  auto req = std::make_unique<MpiRequest>(true, buffer, host, peer);
  mpi_check(MPI_Irecv(host.raw(), mpi_count(host), mpi_type(host.dtype()), peer, 0,
                      raw(grid_.pipeline()), req->handle()),
            "MPI_Irecv (pipeline)");
  count_received(peer, static_cast<int64_t>(buffer.nbytes()));
  return Request(std::move(req));
}

namespace {

// The data-parallel sum: reduce at replica 0, then broadcast its bits (so
// replicas never drift apart), in buckets. The tensors, in order, are packed
// into host buffers of at most kBucketBytes each (one dtype per bucket; a
// larger tensor gets a bucket of its own): a few large collectives instead of
// hundreds of small ones. Device tensors go into pinned buffers with one
// asynchronous copy per tensor and one synchronisation per bucket, where
// copying each through pageable memory blocked on every tensor. Each
// bucket's reduce is posted as soon as it is packed; finish() waits for them
// in order, broadcasts, and copies back.
class MpiPendingSum : public PendingSum {
 public:
  static constexpr size_t kBucketBytes = size_t(64) << 20;

  MpiPendingSum(const Comm& comm, StagingPool& pool, std::vector<Tensor> tensors)
      : comm_(comm), pool_(pool), tensors_(std::move(tensors)) {
    for (const Tensor& t : tensors_)
      if (t.dtype() != DType::F32 && t.dtype() != DType::F64)
        fail("data-parallel sum: ", t.describe(), " is not F32 or F64");
    for (size_t i = 0; i < tensors_.size();) {
      Bucket b{tensors_[i].dtype(), i, i, nullptr, 0, MPI_REQUEST_NULL};
      bool device = false;
      for (; b.end < tensors_.size() && tensors_[b.end].dtype() == b.dtype &&
             (b.end == b.begin || b.bytes + tensors_[b.end].nbytes() <= kBucketBytes);
           ++b.end) {
        b.bytes += tensors_[b.end].nbytes();
        device = device || tensors_[b.end].is_cuda();
      }
      i = b.end;
      if (b.bytes / dtype_size(b.dtype) > 2147483647)
        fail("data-parallel sum of a ", tensors_[b.begin].describe(),
             " tensor exceeds MPI's int count");
      b.host = pool_.take(b.bytes, device);
      char* at = static_cast<char*>(b.host->data());
      for (size_t k = b.begin; k < b.end; at += tensors_[k].nbytes(), ++k) {
        const Tensor& t = tensors_[k];
        if (t.is_cuda()) cuda::copy_async(at, cuda::Side::Host, t.raw(), cuda::Side::Device, t.nbytes());
        else std::memcpy(at, t.raw(), t.nbytes());
      }
      if (device) cuda::synchronize();  // the copies (and the gradients they read) are done
      const bool root = comm_.rank() == 0;
      mpi_check(MPI_Ireduce(root ? MPI_IN_PLACE : b.host->data(), root ? b.host->data() : nullptr,
                            count(b), mpi_type(b.dtype), MPI_SUM, 0, raw(comm_), &b.req),
                "MPI_Ireduce (data-parallel gradients)");
      buckets_.push_back(std::move(b));
    }
  }
  ~MpiPendingSum() override {
    for (Bucket& b : buckets_)
      if (b.req != MPI_REQUEST_NULL) {  // error path: don't block, keep the buffer
        MPI_Request_free(&b.req);
        b.host.release();  // intentional leak: MPI may still use it
      }
  }
  void finish() override {
    for (Bucket& b : buckets_) {
      wait_bounded(b.req, "the data-parallel gradient sum");
      b.req = MPI_REQUEST_NULL;
      MPI_Request req;
      mpi_check(MPI_Ibcast(b.host->data(), count(b), mpi_type(b.dtype), 0, raw(comm_), &req),
                "MPI_Ibcast (data-parallel gradients)");
      wait_bounded(req, "the data-parallel gradient broadcast");
      const char* at = static_cast<const char*>(b.host->data());
      for (size_t k = b.begin; k < b.end; at += tensors_[k].nbytes(), ++k) {
        Tensor& t = tensors_[k];
        // Queued on the compute stream: later kernels read the sums, and the
        // buffer's next user queues its copies after these (StagingPool).
        if (t.is_cuda()) cuda::copy_async(t.raw(), cuda::Side::Device, at, cuda::Side::Host, t.nbytes());
        else std::memcpy(t.raw(), at, t.nbytes());
      }
      pool_.give(std::move(b.host));
    }
    buckets_.clear();
  }

 private:
  struct Bucket {
    DType dtype;
    size_t begin, end;  // tensors_[begin, end)
    std::unique_ptr<cuda::HostBuffer> host;
    size_t bytes;
    MPI_Request req;
  };
  static int count(const Bucket& b) { return static_cast<int>(b.bytes / dtype_size(b.dtype)); }
  const Comm& comm_;
  StagingPool& pool_;
  std::vector<Tensor> tensors_;
  std::vector<Bucket> buckets_;
};

class DonePendingSum : public PendingSum {
 public:
  void finish() override {}
};

// ZeRO-1's reduce-scatter on host buffers (device tensors are staged).
class MpiPendingScatter : public PendingSum {
 public:
  MpiPendingScatter(const Comm& comm, const Tensor& flat, Tensor mine)
      : mine_(std::move(mine)),
        flat_(flat.is_cpu() ? flat : flat.to(Device::CPU)),
        host_(mine_.is_cpu() ? mine_ : Tensor::empty(mine_.shape(), mine_.dtype(), Device::CPU)) {
    ATTNRES_CHECK(flat_.dtype() == DType::F32 && host_.dtype() == DType::F32 &&
                      flat_.numel() == host_.numel() * comm.size(),
                  "reduce-scatter of ", flat_.describe(), " into ", host_.describe(), " over ",
                  comm.size(), " replicas");
    mpi_check(MPI_Ireduce_scatter_block(flat_.raw(), host_.raw(), mpi_count(host_), MPI_FLOAT,
                                        MPI_SUM, raw(comm), &req_),
              "MPI_Ireduce_scatter_block (ZeRO-1 gradients)");
  }
  ~MpiPendingScatter() override {
    if (req_ != MPI_REQUEST_NULL) {  // error path: don't block, keep the buffers
      MPI_Request_free(&req_);
      new Tensor(flat_);  // intentional leaks: MPI may still use them
      new Tensor(host_);
    }
  }
  void finish() override {
    if (req_ == MPI_REQUEST_NULL) return;
    wait_bounded(req_, "the ZeRO-1 gradient reduce-scatter");
    req_ = MPI_REQUEST_NULL;
    if (!mine_.is_cpu()) mine_.copy_from(host_);
  }

 private:
  Tensor mine_, flat_, host_;
  MPI_Request req_ = MPI_REQUEST_NULL;
};

}  // namespace

std::unique_ptr<PendingSum> MpiTransport::start_sum_across_replicas(std::vector<Tensor> tensors,
                                                                    Replicas group) {
  const Comm& comm = grid_.replicas(group);
  if (comm.size() == 1 || tensors.empty()) return std::make_unique<DonePendingSum>();
  return std::make_unique<MpiPendingSum>(comm, staging_, std::move(tensors));
}

std::unique_ptr<cuda::HostBuffer> StagingPool::take(size_t bytes, bool pinned) {
  // The smallest free buffer that is large enough; step after step the same
  // sizes come back, so after the first step nothing new is allocated.
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if ((*it)->pinned() == pinned && (*it)->bytes() >= bytes &&
        (best == free_.end() || (*it)->bytes() < (*best)->bytes()))
      best = it;
  if (best == free_.end()) return std::make_unique<cuda::HostBuffer>(bytes, pinned);
  std::unique_ptr<cuda::HostBuffer> b = std::move(*best);
  free_.erase(best);
  return b;
}

void StagingPool::give(std::unique_ptr<cuda::HostBuffer> buffer) {
  free_.push_back(std::move(buffer));
}

std::unique_ptr<PendingSum> MpiTransport::start_reduce_scatter(Tensor flat, Tensor mine,
                                                               Replicas group) {
  return std::make_unique<MpiPendingScatter>(grid_.replicas(group), flat, std::move(mine));
}

void MpiTransport::all_gather(const Tensor& mine, Tensor& flat, Replicas group) {
  const Comm& comm = grid_.replicas(group);
  const Tensor in = mine.is_cpu() ? mine : mine.to(Device::CPU);
  Tensor out = flat.is_cpu() ? flat : Tensor::empty(flat.shape(), flat.dtype(), Device::CPU);
  ATTNRES_CHECK(in.dtype() == out.dtype() && out.numel() == in.numel() * comm.size(),
                "all-gather of ", in.describe(), " into ", out.describe());
  MPI_Request req;
  const MPI_Datatype type = mpi_type(in.dtype());
  mpi_check(MPI_Iallgather(in.raw(), mpi_count(in), type, out.raw(), mpi_count(in), type,
                           raw(comm), &req),
            "MPI_Iallgather (ZeRO-1 weights)");
  wait_bounded(req, "the ZeRO-1 weight all-gather");
  if (!flat.is_cpu()) flat.copy_from(out);
}

void MpiTransport::all_to_all(const Tensor& send, const std::vector<int64_t>& send_rows,
                              Tensor& recv, const std::vector<int64_t>& recv_rows) {
  // Host memory: device rows are staged (the CUDA runs' path is NCCL's).
  const Tensor in = send.is_cpu() ? send : send.to(Device::CPU);
  Tensor out = recv.is_cpu() ? recv : Tensor::empty(recv.shape(), recv.dtype(), Device::CPU);
  const int64_t row_bytes = in.ndim() == 2 ? in.dim(1) * static_cast<int64_t>(dtype_size(in.dtype())) : 0;
  ATTNRES_CHECK(in.ndim() == 2 && out.ndim() == 2 && in.dim(1) == out.dim(1) &&
                    in.dtype() == out.dtype(),
                "all-to-all of ", in.describe(), " into ", out.describe());
  std::vector<int64_t> sb, rb;
  for (int64_t n : send_rows) sb.push_back(n * row_bytes);
  for (int64_t n : recv_rows) rb.push_back(n * row_bytes);
  grid_.experts().alltoallv_bytes(in.raw(), sb, out.raw(), rb);
  if (!recv.is_cpu()) recv.copy_from(out);
}

void MpiTransport::sum_with_peer(Tensor& t, int peer) {
  Tensor mine = t.is_cpu() ? t : t.to(Device::CPU);
  Tensor theirs = Tensor::empty(mine.shape(), mine.dtype(), Device::CPU);
  MPI_Request reqs[2];
  MPI_Comm comm = raw(grid_.pipeline());
  mpi_check(
      MPI_Irecv(theirs.raw(), mpi_count(theirs), mpi_type(theirs.dtype()), peer, 2, comm, &reqs[0]),
      "MPI_Irecv (tied embedding)");
  mpi_check(MPI_Isend(mine.raw(), mpi_count(mine), mpi_type(mine.dtype()), peer, 2, comm, &reqs[1]),
            "MPI_Isend (tied embedding)");
  wait_bounded(reqs[0], "the tied-embedding gradient from stage " + std::to_string(peer));
  wait_bounded(reqs[1], "sending the tied-embedding gradient to stage " + std::to_string(peer));
  // a + b == b + a in IEEE arithmetic: both ranks get the same bits.
  kernels::add_(mine, theirs);
  if (!t.is_cpu()) t.copy_from(mine);
}

#else

MpiTransport::MpiTransport(const ProcessGrid& grid) : Transport(grid.P(), grid.stage()), grid_(grid) {
  fail("this build has no MPI: the MPI transport is unavailable");
}
Request MpiTransport::send_to(const Tensor&, int) { fail("no MPI in this build"); }
Request MpiTransport::recv_from(const Tensor&, int) { fail("no MPI in this build"); }
std::unique_ptr<PendingSum> MpiTransport::start_sum_across_replicas(std::vector<Tensor>, Replicas) {
  fail("no MPI in this build");
}
std::unique_ptr<PendingSum> MpiTransport::start_reduce_scatter(Tensor, Tensor, Replicas) {
  fail("no MPI in this build");
}
void MpiTransport::all_gather(const Tensor&, Tensor&, Replicas) { fail("no MPI in this build"); }
void MpiTransport::all_to_all(const Tensor&, const std::vector<int64_t>&, Tensor&,
                              const std::vector<int64_t>&) {
  fail("no MPI in this build");
}
void MpiTransport::sum_with_peer(Tensor&, int) { fail("no MPI in this build"); }

#endif

}  // namespace attnres::parallel
