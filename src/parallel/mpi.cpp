#include "parallel/mpi.h"

#include <omp.h>
#include <spdlog/fmt/fmt.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/device.h"
#include "core/error.h"
#include "parallel/mpi_internal.h"

namespace attnres::parallel {

int launcher_world_size() {
  // Variables the common launchers set in every process they start.
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE",
                          "SLURM_STEP_NUM_TASKS"}) {
    const char* v = std::getenv(var);
    if (v && *v && std::atoi(v) >= 1) return std::atoi(v);
  }
  return 1;
}

int launcher_world_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(var);
    if (v && *v) return std::atoi(v);
  }
  return 0;
}

void let_rank0_report_first(int rank) {
  if (rank != 0) std::this_thread::sleep_for(std::chrono::seconds(3));
}

double comm_timeout_seconds() {
  if (const char* v = std::getenv("ATTNRES_COMM_TIMEOUT_S")) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (end != v && s > 0) return s;
  }
  return 1800.0;
}

int launcher_local_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID",
                          "MV2_COMM_WORLD_LOCAL_RANK"}) {
    const char* v = std::getenv(var);
    char* end = nullptr;
    if (!v || !*v) continue;
    const long r = std::strtol(v, &end, 10);
    if (*end == '\0' && r >= 0 && r < INT_MAX) return static_cast<int>(r);
  }
  return -1;
}

int gpu_index_for(int local_rank, int visible) {
  if (visible <= 0) return -1;
  return local_rank % visible;
}

GpuPin gpu_sharing(int local_rank, const std::vector<std::string>& node_bus_ids) {
  GpuPin pin;
  pin.local_rank = local_rank;
  pin.bus_id = node_bus_ids.at(static_cast<size_t>(local_rank));
  pin.sharing = static_cast<int>(std::count(node_bus_ids.begin(), node_bus_ids.end(), pin.bus_id));
  std::vector<std::string> gpus = node_bus_ids;
  std::sort(gpus.begin(), gpus.end());
  gpus.erase(std::unique(gpus.begin(), gpus.end()), gpus.end());
  const int n = static_cast<int>(gpus.size()), ranks = static_cast<int>(node_bus_ids.size());
  if (n < ranks) {
    int most = 0;
    for (const std::string& g : gpus)
      most = std::max(most, static_cast<int>(std::count(node_bus_ids.begin(), node_bus_ids.end(), g)));
    pin.warning = fmt::format(
        "{} processes of this job on this node share {} GPU{} (up to {} per GPU, by their PCI "
        "bus ids): each has its own CUDA context, which works but is slower than a GPU per "
        "process, and NCCL refuses it (the MPI transport is used)",
        ranks, n, n == 1 ? "" : "s", most);
  }
  return pin;
}

std::vector<GpuPin> plan_node_gpus(const std::vector<std::vector<std::string>>& visible_bus_ids) {
  const int ranks = static_cast<int>(visible_bus_ids.size());
  std::vector<int> index(static_cast<size_t>(ranks));
  std::vector<std::string> chosen(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const auto& visible = visible_bus_ids[static_cast<size_t>(r)];
    index[static_cast<size_t>(r)] = gpu_index_for(r, static_cast<int>(visible.size()));
    if (index[static_cast<size_t>(r)] >= 0)
      chosen[static_cast<size_t>(r)] = visible[static_cast<size_t>(index[static_cast<size_t>(r)])];
  }
  std::vector<GpuPin> pins;
  for (int r = 0; r < ranks; ++r) {
    GpuPin pin = gpu_sharing(r, chosen);
    pin.index = index[static_cast<size_t>(r)];
    pins.push_back(pin);
  }
  return pins;
}

int pin_gpu_before_mpi(bool nccl) {
  if (nccl) setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  const int local = launcher_local_rank();
  if (local < 0) return -1;
  const int index = gpu_index_for(local, cuda::device_count());
  if (index >= 0) cuda::select_device(index);
  return index;
}

GpuPin pin_gpu(const MpiSession& session, int chosen_before_mpi) {
  int index = chosen_before_mpi;
  if (index < 0) {
    index = gpu_index_for(session.local_rank(), cuda::device_count());
    if (index >= 0) cuda::select_device(index);
  }
  // A rank without a GPU still takes part in the gather (the others wait for it).
  const std::string mine = index >= 0 ? cuda::pci_bus_id() : "(none)";
  GpuPin pin = gpu_sharing(session.local_rank(), session.node().allgather(mine));
  pin.index = index;
  return pin;
}

std::string share_node_cores(int local_size) {
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (env && *env)
    return fmt::format("{} OpenMP threads per process (OMP_NUM_THREADS={})", omp_get_max_threads(),
                       env);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const int cpus = static_cast<int>(std::max(1L, online));
  const int share = std::max(1, cpus / std::max(1, local_size));
  // omp_get_num_procs(): the CPUs this process may run on (the launcher may
  // have bound it to fewer than its share).
  const int threads = std::min(share, std::max(1, omp_get_num_procs()));
  omp_set_num_threads(threads);
  return fmt::format("{} OpenMP thread{} per process ({} CPUs / {} process{} on this node{}; "
                     "OMP_NUM_THREADS overrides)", threads, threads == 1 ? "" : "s", cpus,
                     local_size, local_size == 1 ? "" : "es",
                     threads < share ? ", bound to fewer" : "");
}

#if ATTNRES_HAVE_MPI

bool mpi_compiled() { return true; }

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail_internal(__FILE__, ":", __LINE__, ": MPI error in ", what, ": ", std::string(msg, static_cast<size_t>(len)));
}

void wait_bounded(MPI_Request& req, const std::string& what, MPI_Status* status) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const double limit = comm_timeout_seconds();
  for (long spins = 0;; ++spins) {
    int done = 0;
    mpi_check(MPI_Test(&req, &done, status ? status : MPI_STATUS_IGNORE), what.c_str());
    if (done) return;
    // Poll hot for a short while (latency), then back off: with more ranks
    // than cores (CI), a spinning waiter steals the core its peer computes on.
    if (spins > 200)
      std::this_thread::sleep_for(std::chrono::microseconds(spins > 20000 ? 500 : 20));
    if ((spins & 63) == 0 && std::chrono::duration<double>(Clock::now() - start).count() > limit)
      fail("timed out after ", limit, " s waiting for ", what,
           " (a peer stopped answering; ATTNRES_COMM_TIMEOUT_S sets the limit)");
  }
}

MpiSession::MpiSession() {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      fail("MPI_Init_thread failed (was the job started by mpirun?)");
    owner_ = true;
  }
  // Errors come back as return codes, which we turn into exceptions with context.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  auto local = std::make_unique<Comm::Impl>();
  mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL,
                                &local->comm),
            "MPI_Comm_split_type");
  local->owned = true;
  node_ = Comm(std::move(local));
  local_rank_ = node_.rank();
  local_size_ = node_.size();
}

MpiSession::~MpiSession() {
  node_ = Comm();  // freed while MPI is still up
  if (!owner_) return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

void MpiSession::abort(int code, const std::string& message) {
  int init = 0, fin = 0, rank = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (code == 2) let_rank0_report_first(rank);
  std::fprintf(stderr, "error: rank %d: %s\n", rank, message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

// ---------------------------------------------------------------------------
// Comm
// ---------------------------------------------------------------------------

Comm::Comm() = default;
Comm::Comm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Comm::Comm(Comm&&) noexcept = default;
Comm& Comm::operator=(Comm&& o) noexcept {
  if (this != &o) {
    if (impl_ && impl_->owned && impl_->comm != MPI_COMM_NULL) MPI_Comm_free(&impl_->comm);
    impl_ = std::move(o.impl_);
    solo_ = o.solo_;
  }
  return *this;
}
Comm::~Comm() {
  if (!impl_ || !impl_->owned || impl_->comm == MPI_COMM_NULL) return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Comm_free(&impl_->comm);
}

Comm Comm::world() {
  auto impl = std::make_unique<Impl>();
  impl->comm = MPI_COMM_WORLD;
  impl->owned = false;
  return Comm(std::move(impl));
}

int Comm::rank() const {
  if (solo_) return 0;
  int r = 0;
  mpi_check(MPI_Comm_rank(raw(*this), &r), "MPI_Comm_rank");
  return r;
}
int Comm::size() const {
  if (solo_) return 1;
  int s = 0;
  mpi_check(MPI_Comm_size(raw(*this), &s), "MPI_Comm_size");
  return s;
}

Comm Comm::split(int color, int key) const {
  if (solo_) return solo();
  auto impl = std::make_unique<Impl>();
  mpi_check(MPI_Comm_split(raw(*this), color, key, &impl->comm), "MPI_Comm_split");
  impl->owned = true;
  return Comm(std::move(impl));
}

void Comm::barrier() const {
  if (solo_) return;
  MPI_Request req;
  mpi_check(MPI_Ibarrier(raw(*this), &req), "MPI_Ibarrier");
  wait_bounded(req, "a barrier");
}

void Comm::bcast(void* data, size_t bytes, int root) const {
  if (solo_) return;
  // MPI counts are int: large buffers go in pieces.
  char* p = static_cast<char*>(data);
  for (size_t at = 0; at < bytes; at += size_t(1) << 30) {
    const int n = static_cast<int>(std::min(bytes - at, size_t(1) << 30));
    MPI_Request req;
    mpi_check(MPI_Ibcast(p + at, n, MPI_BYTE, root, raw(*this), &req), "MPI_Ibcast");
    wait_bounded(req, "a broadcast");
  }
}

void Comm::bcast(std::string& s, int root) const {
  int64_t n = static_cast<int64_t>(s.size());
  bcast(&n, sizeof n, root);
  s.resize(static_cast<size_t>(n));
  if (n > 0) bcast(s.data(), s.size(), root);
}

namespace {
template <typename T>
void allreduce(const Comm& c, T* x, int n, MPI_Datatype type, MPI_Op op, const char* what) {
  if (c.is_solo()) return;
  MPI_Request req;
  mpi_check(MPI_Iallreduce(MPI_IN_PLACE, x, n, type, op, raw(c), &req), "MPI_Iallreduce");
  wait_bounded(req, what);
}
}  // namespace

void Comm::allreduce_sum(double* x, int n) const {
  allreduce(*this, x, n, MPI_DOUBLE, MPI_SUM, "a sum over ranks");
}
void Comm::allreduce_sum(int64_t* x, int n) const {
  allreduce(*this, x, n, MPI_INT64_T, MPI_SUM, "a sum over ranks");
}
void Comm::allreduce_max(double* x, int n) const {
  allreduce(*this, x, n, MPI_DOUBLE, MPI_MAX, "a maximum over ranks");
}
void Comm::allreduce_max(int64_t* x, int n) const {
  allreduce(*this, x, n, MPI_INT64_T, MPI_MAX, "a maximum over ranks");
}

namespace {
// Every member's `count` elements of `type` (counts may differ), concatenated
// in member order, with each member's count.
template <typename T>
std::vector<T> allgather_v(const Comm& c, const T* mine, int count, MPI_Datatype type,
                           std::vector<int>& counts) {
  const int n = c.size();
  counts.assign(static_cast<size_t>(n), 0);
  std::vector<int> displs(static_cast<size_t>(n));
  MPI_Request req;
  mpi_check(MPI_Iallgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, raw(c), &req),
            "MPI_Iallgather");
  wait_bounded(req, "an allgather of sizes");
  int total = 0;
  for (int i = 0; i < n; ++i) displs[i] = total, total += counts[i];
  std::vector<T> all(static_cast<size_t>(total));
  mpi_check(MPI_Iallgatherv(mine, count, type, all.data(), counts.data(), displs.data(), type,
                            raw(c), &req),
            "MPI_Iallgatherv");
  wait_bounded(req, "an allgather");
  return all;
}
}  // namespace

std::vector<std::vector<double>> Comm::allgather(const std::vector<double>& mine) const {
  if (solo_) return {mine};
  std::vector<int> counts;
  const auto all = allgather_v(*this, mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, counts);
  std::vector<std::vector<double>> out;
  size_t at = 0;
  for (int k : counts) {
    out.emplace_back(all.begin() + at, all.begin() + at + k);
    at += static_cast<size_t>(k);
  }
  return out;
}

std::vector<std::string> Comm::allgather(const std::string& mine) const {
  if (solo_) return {mine};
  std::vector<int> counts;
  const auto all = allgather_v(*this, mine.data(), static_cast<int>(mine.size()), MPI_CHAR, counts);
  std::vector<std::string> out;
  size_t at = 0;
  for (int k : counts) {
    out.emplace_back(all.data() + at, static_cast<size_t>(k));
    at += static_cast<size_t>(k);
  }
  return out;
}

void Comm::allgather_bytes(const void* mine, size_t bytes, void* all) const {
  if (solo_) {
    std::memcpy(all, mine, bytes);
    return;
  }
  // Pieces of at most 64 MiB per member: MPI counts are int, and each piece
  // lands in a temporary [size() * piece] before going to its place.
  constexpr size_t kPiece = size_t(64) << 20;
  const size_t n = static_cast<size_t>(size());
  std::vector<char> tmp(n * std::min(bytes, kPiece));
  for (size_t at = 0; at < bytes; at += kPiece) {
    const size_t k = std::min(kPiece, bytes - at);
    MPI_Request req;
    mpi_check(MPI_Iallgather(static_cast<const char*>(mine) + at, static_cast<int>(k), MPI_BYTE,
                             tmp.data(), static_cast<int>(k), MPI_BYTE, raw(*this), &req),
              "MPI_Iallgather");
    wait_bounded(req, "an allgather");
    for (size_t d = 0; d < n; ++d)
      std::memcpy(static_cast<char*>(all) + d * bytes + at, tmp.data() + d * k, k);
  }
}

std::vector<int64_t> Comm::alltoall(const std::vector<int64_t>& mine) const {
  if (solo_) return mine;
  const int n = size();
  ATTNRES_CHECK(mine.size() % static_cast<size_t>(n) == 0, "alltoall of ", mine.size(),
                " values over ", n, " members");
  const int k = static_cast<int>(mine.size() / static_cast<size_t>(n));
  std::vector<int64_t> out(mine.size());
  MPI_Request req;
  mpi_check(MPI_Ialltoall(mine.data(), k, MPI_INT64_T, out.data(), k, MPI_INT64_T, raw(*this), &req),
            "MPI_Ialltoall");
  wait_bounded(req, "an all-to-all of counts");
  return out;
}

void Comm::alltoallv_bytes(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                           const std::vector<int64_t>& recv_bytes) const {
  const size_t n = static_cast<size_t>(size());
  ATTNRES_CHECK(send_bytes.size() == n && recv_bytes.size() == n, "alltoallv over ", n,
                " members with ", send_bytes.size(), " and ", recv_bytes.size(), " counts");
  if (solo_) {
    ATTNRES_CHECK(send_bytes[0] == recv_bytes[0], "alltoallv to itself: ", send_bytes[0],
                  " bytes sent, ", recv_bytes[0], " expected");
    if (send_bytes[0] > 0) std::memcpy(recv, send, static_cast<size_t>(send_bytes[0]));
    return;
  }
  std::vector<int> sc(n), sd(n), rc(n), rd(n);
  int64_t s_at = 0, r_at = 0;
  for (size_t q = 0; q < n; ++q) {
    ATTNRES_CHECK(s_at + send_bytes[q] < (int64_t(1) << 31) && r_at + recv_bytes[q] < (int64_t(1) << 31),
                  "alltoallv: more than 2 GiB in one exchange");
    sc[q] = static_cast<int>(send_bytes[q]), sd[q] = static_cast<int>(s_at);
    rc[q] = static_cast<int>(recv_bytes[q]), rd[q] = static_cast<int>(r_at);
    s_at += send_bytes[q], r_at += recv_bytes[q];
  }
  MPI_Request req;
  mpi_check(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(),
                           MPI_BYTE, raw(*this), &req),
            "MPI_Ialltoallv");
  wait_bounded(req, "an all-to-all of token rows (expert parallelism)");
}

std::vector<std::string> Comm::gather(const std::string& mine, int root) const {
  // Point-to-point in 1 GiB pieces: a rank's share of a large checkpoint can
  // exceed MPI's int counts. Tag 1 keeps it apart from anything else.
  constexpr size_t kPiece = size_t(1) << 30;
  if (solo_) return {mine};
  const int me = rank(), n = size();
  auto send_all = [&](const std::string& s) {
    int64_t len = static_cast<int64_t>(s.size());
    MPI_Request req;
    mpi_check(MPI_Isend(&len, 1, MPI_INT64_T, root, 1, raw(*this), &req), "MPI_Isend");
    wait_bounded(req, "sending a gather size to rank " + std::to_string(root));
    for (size_t at = 0; at < s.size(); at += kPiece) {
      const int k = static_cast<int>(std::min(kPiece, s.size() - at));
      mpi_check(MPI_Isend(s.data() + at, k, MPI_BYTE, root, 1, raw(*this), &req), "MPI_Isend");
      wait_bounded(req, "sending gathered data to rank " + std::to_string(root));
    }
  };
  if (me != root) {
    send_all(mine);
    return {};
  }
  std::vector<std::string> out(n);
  out[root] = mine;
  for (int src = 0; src < n; ++src) {
    if (src == root) continue;
    int64_t len = 0;
    MPI_Request req;
    mpi_check(MPI_Irecv(&len, 1, MPI_INT64_T, src, 1, raw(*this), &req), "MPI_Irecv");
    wait_bounded(req, "a gather size from rank " + std::to_string(src));
    out[src].resize(static_cast<size_t>(len));
    for (size_t at = 0; at < out[src].size(); at += kPiece) {
      const int k = static_cast<int>(std::min(kPiece, out[src].size() - at));
      mpi_check(MPI_Irecv(out[src].data() + at, k, MPI_BYTE, src, 1, raw(*this), &req),
                "MPI_Irecv");
      wait_bounded(req, "gathered data from rank " + std::to_string(src));
    }
  }
  return out;
}

namespace {
template <typename T>
void sum_identical_impl(const Comm& c, T* x, int64_t n, MPI_Datatype type) {
  if (c.is_solo()) return;
  // Reduce at member 0, then broadcast its bits: every member ends with the
  // same values, so data-parallel replicas never drift apart.
  constexpr int64_t kPiece = int64_t(1) << 28;
  const bool root = c.rank() == 0;
  for (int64_t at = 0; at < n; at += kPiece) {
    const int k = static_cast<int>(std::min(kPiece, n - at));
    MPI_Request req;
    mpi_check(MPI_Ireduce(root ? MPI_IN_PLACE : x + at, root ? x + at : nullptr, k, type, MPI_SUM,
                          0, raw(c), &req),
              "MPI_Ireduce");
    wait_bounded(req, "the data-parallel gradient sum");
    mpi_check(MPI_Ibcast(x + at, k, type, 0, raw(c), &req), "MPI_Ibcast");
    wait_bounded(req, "the data-parallel gradient broadcast");
  }
}
}  // namespace

void Comm::sum_identical(float* x, int64_t n) const { sum_identical_impl(*this, x, n, MPI_FLOAT); }
void Comm::sum_identical(double* x, int64_t n) const {
  sum_identical_impl(*this, x, n, MPI_DOUBLE);
}

#else  // no MPI in this build

bool mpi_compiled() { return false; }

namespace {
[[noreturn]] void no_mpi() {
  fail(
      "this build has no MPI (libopenmpi-dev was not found when it was configured): "
      "parallel.pipeline * parallel.data must be 1");
}
}  // namespace

struct Comm::Impl {};
MpiSession::MpiSession() { no_mpi(); }
MpiSession::~MpiSession() = default;
void MpiSession::abort(int code, const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::_Exit(code);
}
Comm::Comm() = default;
Comm::Comm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Comm::Comm(Comm&&) noexcept = default;
Comm& Comm::operator=(Comm&&) noexcept = default;
Comm::~Comm() = default;
// Only the solo communicator exists without MPI.
Comm Comm::world() { no_mpi(); }
int Comm::rank() const { return solo_ ? 0 : (no_mpi(), 0); }
int Comm::size() const { return solo_ ? 1 : (no_mpi(), 0); }
Comm Comm::split(int, int) const { return solo_ ? solo() : (no_mpi(), Comm()); }
void Comm::barrier() const { if (!solo_) no_mpi(); }
void Comm::bcast(void*, size_t, int) const { if (!solo_) no_mpi(); }
void Comm::bcast(std::string&, int) const { if (!solo_) no_mpi(); }
void Comm::allreduce_sum(double*, int) const { if (!solo_) no_mpi(); }
void Comm::allreduce_sum(int64_t*, int) const { if (!solo_) no_mpi(); }
void Comm::allreduce_max(double*, int) const { if (!solo_) no_mpi(); }
void Comm::allreduce_max(int64_t*, int) const { if (!solo_) no_mpi(); }
std::vector<std::vector<double>> Comm::allgather(const std::vector<double>& mine) const {
  if (!solo_) no_mpi();
  return {mine};
}
std::vector<std::string> Comm::allgather(const std::string& mine) const {
  if (!solo_) no_mpi();
  return {mine};
}
void Comm::allgather_bytes(const void* mine, size_t bytes, void* all) const {
  if (!solo_) no_mpi();
  std::memcpy(all, mine, bytes);
}
std::vector<int64_t> Comm::alltoall(const std::vector<int64_t>& mine) const {
  if (!solo_) no_mpi();
  return mine;
}
void Comm::alltoallv_bytes(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                           const std::vector<int64_t>&) const {
  if (!solo_) no_mpi();
  if (!send_bytes.empty() && send_bytes[0] > 0)
    std::memcpy(recv, send, static_cast<size_t>(send_bytes[0]));
}
std::vector<std::string> Comm::gather(const std::string& mine, int) const {
  if (!solo_) no_mpi();
  return {mine};
}
void Comm::sum_identical(float*, int64_t) const { if (!solo_) no_mpi(); }
void Comm::sum_identical(double*, int64_t) const { if (!solo_) no_mpi(); }

#endif

Comm Comm::solo() {
  Comm c;
  c.solo_ = true;
  return c;
}

// ---------------------------------------------------------------------------
// ProcessGrid
// ---------------------------------------------------------------------------

ProcessGrid::ProcessGrid(const Comm& world, int P, int D, int EP)
    : world_(&world), P_(P), D_(D), EP_(EP) {
  if (P < 1 || D < 1) fail("parallel.pipeline and parallel.data must be >= 1, got ", P, " and ", D);
  if (EP < 1 || D % EP != 0)
    fail("config key parallel.expert: ", EP, " does not divide parallel.data = ", D);
  const int n = world.size();
  if (n != P * D)
    fail("config keys parallel.pipeline * parallel.data = ", P, " * ", D, " = ", P * D,
         " processes, but the job has ", n,
         P * D == 1 ? std::string(" (a single-process run needs no mpirun)")
                    : " (start it with mpirun -np " + std::to_string(P * D) + ")");
  rank_ = world.rank();
  pipeline_ = world.split(/*color=*/replica(), /*key=*/stage());
  data_ = world.split(/*color=*/stage(), /*key=*/replica());
  experts_ = world.split(/*color=*/stage() + P * (replica() / EP), /*key=*/expert_rank());
  expert_data_ = world.split(/*color=*/stage() + P * expert_rank(), /*key=*/replica() / EP);
}

}  // namespace attnres::parallel
