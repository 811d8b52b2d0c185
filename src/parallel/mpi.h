// MPI for the rest of the program: the session (init/finalize), communicators,
// the P x D process grid, and the host-side collectives the trainer needs
// (scalars, small vectors, byte blobs). No MPI header here: builds without
// MPI compile the same interface, where creating a session throws.
//
// Rank order (documented in docs/parallel.md): world rank = d * P + p, for
// pipeline stage p < P and data-parallel replica d < D. The P stages of one
// replica are contiguous, so with mpirun's default by-slot mapping a replica
// fills consecutive slots of a node (pipeline traffic stays local), and
// world rank 0 is stage 0 of replica 0, which prints progress and writes
// metrics and checkpoints.
//
// Every blocking wait (point-to-point and collectives) polls with a bound
// (comm_timeout_seconds()): a peer that stopped answering turns into an
// attnres::Error naming the operation instead of a silent hang. A peer that
// died is detected by the launcher, which ends the whole job.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace attnres::parallel {

// True when this build has MPI.
bool mpi_compiled();

// Processes the launcher started for this job, read from its environment
// (OMPI_COMM_WORLD_SIZE for Open MPI, PMI_SIZE for MPICH's hydra,
// MV2_COMM_WORLD_SIZE for MVAPICH, SLURM_STEP_NUM_TASKS for srun, which sets
// it in a job step's processes but not in the batch script); 1 when not
// started by such a launcher.
int launcher_world_size();

// This process's rank among those the launcher started (OMPI_COMM_WORLD_RANK,
// PMI_RANK, MV2_COMM_WORLD_RANK, SLURM_PROCID); 0 when not started by one.
int launcher_world_rank();

// Call before reporting bad input (exit code 2) from rank `rank` of a job:
// ranks other than 0 pause a few seconds first. When every rank meets the
// same error (a config key), rank 0's report ends the job and the message is
// printed once; an error of one rank alone is still reported, a moment later.
void let_rank0_report_first(int rank);

// Seconds a wait may block before it is an error: ATTNRES_COMM_TIMEOUT_S,
// default 1800 (long enough for rank 0 writing a large checkpoint while the
// others wait).
double comm_timeout_seconds();

// This process's local rank (its place among the job's processes on its
// node) as the launcher's environment gives it before MPI_Init:
// OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), SLURM_LOCALID (srun), MPI_LOCALRANKID
// (MPICH's hydra, Intel MPI), MV2_COMM_WORLD_LOCAL_RANK (MVAPICH); -1 when none
// is set.
int launcher_local_rank();

// Which GPU a process of the job uses, and whether the node's processes
// share GPUs.
struct GpuPin {
  int local_rank = 0;   // this process's place on its node
  int index = -1;       // the CUDA device index among the GPUs this process sees
  std::string bus_id;   // that GPU's PCI bus id
  int sharing = 1;      // this node's processes on that GPU (> 1: ranks share it)
  std::string warning;  // for the node's log when its GPUs are shared, else ""
};

// The choice, as pure functions (tests/parallel/test_gpu_pin.cpp runs them
// on the common launch set-ups):
// - before MPI_Init, local rank r of a process that sees `visible` GPUs takes
//   device r mod visible (-1 when it sees none). With one GPU per rank (Slurm's
//   --gpus-per-task, many Kubernetes set-ups) that is device 0 of each rank's
//   own; with all GPUs visible, GPU r;
// - after it, the node's ranks compare the PCI bus ids of the GPUs they took:
//   ranks with the same id share one physical GPU, whatever each one was
//   shown. Sharing works (each rank has its own CUDA context) but is slower,
//   and NCCL refuses it, so it comes with a warning.
int gpu_index_for(int local_rank, int visible);
// `node_bus_ids[r]`: the bus id of local rank r's GPU. Fills bus_id, sharing
// and warning (the same text on every rank of the node) and local_rank; not
// index.
GpuPin gpu_sharing(int local_rank, const std::vector<std::string>& node_bus_ids);
// Both steps for a whole node: every local rank's visible GPUs by bus id, in
// its device order; returns every local rank's pin.
std::vector<GpuPin> plan_node_gpus(const std::vector<std::vector<std::string>>& visible_bus_ids);

// What a process of a multi-rank CUDA job does, in two calls around
// MPI_Init. Before (pin_gpu_before_mpi): with `nccl` (the job may talk over
// NCCL) CUDA_MODULE_LOADING=EAGER unless set, since under CUDA's lazy loading
// the first launch of a kernel may wait for the device's running work (CUDA
// programming guide, "Lazy Loading", potential hazards), and that work can be
// an NCCL receive spinning until a peer sends what it computes after this
// very launch; then, when the launcher names the local rank, the device is
// selected by index (cuda::select_device), so a CUDA-aware MPI that
// initialises CUDA inside MPI_Init (UCX, HPC-X) finds it current. Returns the
// index chosen, or -1. After (pin_gpu): the index from the session's local
// rank if none was chosen before, then the node's bus ids gathered.
int pin_gpu_before_mpi(bool nccl);
class MpiSession;
GpuPin pin_gpu(const MpiSession& session, int chosen_before_mpi);

// This process's share of the node's cores for OpenMP: with local_size
// processes of the job on this node, the online CPUs divided among them (at
// least 1, and no more than this process may run on), so that ranks do not
// each start a thread per core and fight over them. OMP_NUM_THREADS, when
// set, wins. Sets the OpenMP thread count and returns a line for the log,
// e.g. "2 OpenMP threads per process (8 CPUs / 4 processes on this node)".
std::string share_node_cores(int local_size);

// An MPI communicator (freed on destruction, except MPI_COMM_WORLD).
class Comm {
 public:
  Comm();  // no communicator
  ~Comm();
  Comm(Comm&&) noexcept;
  Comm& operator=(Comm&&) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  static Comm world();
  // This process alone, without MPI: rank 0 of 1, where every collective is
  // the identity. A single-process run is the P = D = 1 job on it.
  static Comm solo();
  bool is_solo() const { return solo_; }
  bool valid() const { return impl_ != nullptr || solo_; }
  int rank() const;
  int size() const;
  // Processes with the same color form a new communicator, ordered by key.
  Comm split(int color, int key) const;

  void barrier() const;
  void bcast(void* data, size_t bytes, int root) const;
  void bcast(std::string& s, int root) const;
  // In-place element-wise sums / maxima over all members.
  void allreduce_sum(double* x, int n) const;
  void allreduce_sum(int64_t* x, int n) const;
  void allreduce_max(double* x, int n) const;
  void allreduce_max(int64_t* x, int n) const;
  // Every member's vector (string), indexed by member rank, on every member.
  std::vector<std::vector<double>> allgather(const std::vector<double>& mine) const;
  std::vector<std::string> allgather(const std::string& mine) const;
  // Every member's `bytes` bytes (the same count on every member) into `all`
  // [size() * bytes], in member order; any size (moved in pieces).
  void allgather_bytes(const void* mine, size_t bytes, void* all) const;
  // All-to-all: member q receives mine[q * k, (q + 1) * k) of every member
  // p at out[p * k, (p + 1) * k) (mine.size() = size() * k).
  std::vector<int64_t> alltoall(const std::vector<int64_t>& mine) const;
  // All-to-all of byte ranges: send_bytes[q] consecutive bytes of `send` go
  // to member q (in member order), and recv_bytes[p] bytes from member p land
  // in `recv`, in member order (each count below 2 GiB).
  void alltoallv_bytes(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                       const std::vector<int64_t>& recv_bytes) const;
  // Every member's blob on `root` (empty vector elsewhere).
  std::vector<std::string> gather(const std::string& mine, int root) const;
  // In-place sum of float/double buffers over all members, with bit-identical
  // results on every member (reduced at member 0, then broadcast).
  void sum_identical(float* x, int64_t n) const;
  void sum_identical(double* x, int64_t n) const;

  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  friend class MpiSession;  // makes the node communicator
  explicit Comm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  bool solo_ = false;
};

// MPI_Init_thread (FUNNELED: only the main thread calls MPI; OpenMP threads
// don't) for the lifetime of the object; MPI_Finalize at the end. If MPI is
// already initialised (a test harness did it), the session adopts it and
// leaves finalisation to the owner.
class MpiSession {
 public:
  MpiSession();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  // Rank and count of the processes of this job on this node (for picking a GPU).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // The job's processes on this node (MPI_COMM_TYPE_SHARED), by local rank.
  const Comm& node() const { return node_; }

  // Report `message` as this rank's error on stderr and end the whole job
  // with exit code `code` (MPI_Abort): the other ranks may be blocked waiting
  // for this one, so unwinding normally would hang them.
  [[noreturn]] static void abort(int code, const std::string& message);

 private:
  bool owner_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  Comm node_;
};

// Which of this stage's replicas a data-parallel operation spans: all D
// (every parameter but the routed experts), or, with expert parallelism
// (parallel.expert = EP), the D / EP replicas that hold the same routed
// experts (ProcessGrid::expert_data; all D when EP = 1).
enum class Replicas { All, SameExperts };

// The P x D grid over a communicator of P*D processes (normally the world),
// with expert parallelism EP (dividing D): the replicas of a stage form D / EP
// expert groups of EP consecutive replicas; replica d is member d mod EP of
// group d div EP and holds that share of each MoE layer's routed experts.
class ProcessGrid {
 public:
  // Throws attnres::Error (naming parallel.pipeline / parallel.data /
  // parallel.expert) when world.size() != P*D or EP does not divide D.
  ProcessGrid(const Comm& world, int P, int D, int EP = 1);

  int rank() const { return rank_; }  // in `world`
  int P() const { return P_; }
  int D() const { return D_; }
  int stage() const { return rank_ % P_; }    // p
  int replica() const { return rank_ / P_; }  // d
  static int rank_of(int stage, int replica, int P) { return replica * P + stage; }

  const Comm& world() const { return *world_; }
  const Comm& pipeline() const { return pipeline_; }  // this replica's P stages; rank = stage
  const Comm& data() const { return data_; }          // this stage's D replicas; rank = replica
  int EP() const { return EP_; }
  int expert_rank() const { return replica() % EP_; }  // member of its expert group
  // This stage's expert group (EP replicas: the all-to-all; rank =
  // expert_rank()) and the D / EP replicas of this stage holding the same
  // experts (their gradient sums; rank = replica() / EP).
  const Comm& experts() const { return experts_; }
  const Comm& expert_data() const { return expert_data_; }
  const Comm& replicas(Replicas group) const {
    return group == Replicas::All ? data_ : expert_data_;
  }

 private:
  const Comm* world_;
  int rank_, P_, D_, EP_;
  Comm pipeline_, data_, experts_, expert_data_;
};

}  // namespace attnres::parallel
