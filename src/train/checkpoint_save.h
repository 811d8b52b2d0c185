// Writing a checkpoint (the files of train/checkpoint.h) beside training.
//
// A save has three phases:
//   begin   (collective, the training thread) rank 0 makes the step's hidden
//           temporary directory; every rank hands over host copies of the
//           tensors it writes (its staging copy: training may change the
//           originals from the next step on);
//   write   (this rank, a background thread when async) its shard files,
//           fsync'd and hashed;
//   publish (rank 0, a background thread when async, once every rank has
//           written) the index and run files, a check of every shard against
//           the size and checksum its writer recorded, the manifest and the
//           rename that makes step_XXXXXXXX appear (checkpoint_io.h), then
//           pruning.
// Between phases the ranks agree through cheap collectives in poll(), which
// the training loop calls once a step; wait() finishes a save at once. At
// most one save is in flight: start() waits for the previous one first. A
// synchronous save is start() + wait() (the same code, no thread).
//
// Atomicity is checkpoint_io's: until the rename nothing named step_* exists,
// so a process killed mid-save leaves the previous checkpoint the newest. A
// failure in any phase on any rank (disk full, a shard that does not check)
// throws SaveError on every rank from poll() / wait(), naming the rank and
// the reason; the temporary directory is removed and nothing is published.
#pragma once
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "parallel/mpi.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace attnres::train {

// A save that failed after training went on (exit status 1, not a bad input).
class SaveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What one rank writes of one file set ("model" or "optimizer"): file
// `index` of `count` (-1: none; count 1: the single file stem.safetensors),
// holding `tensors`. A tensor may be a slice of a larger one (ZeRO-1: each
// replica writes the part of the moments and fp32 masters it owns): its
// stored name is then unique ("exp_avg.<param>@<offset>", flat) and
// `slices` says which tensor, where and of what shape; the set's index lists
// the parts under "slices", and read_checkpoint_tensors reassembles them.
struct SliceOf {
  std::string tensor;  // the whole tensor's name
  int64_t offset = 0;  // first element of the slice in the flattened whole
  Shape shape;         // the whole tensor's shape
};
struct SavePart {
  int index = -1, count = 1;
  std::vector<NamedTensor> tensors;
  std::map<std::string, SliceOf> slices;  // by stored name; empty: whole tensors only
  bool staged = false;  // the tensors are CheckpointSaver staging buffers, reused once written
  // Deferred staging (checkpoint.async on the CPU): where sources[i] is
  // defined, tensors[i] is a staging buffer the save's background thread
  // fills from it (a live training tensor) before writing; until
  // CheckpointSaver::wait_staged() the training thread must not change it.
  std::vector<Tensor> sources;
};

// What one completed save cost (metrics.jsonl's "checkpoint" record).
struct SaveRecord {
  int64_t step = 0;
  std::string dir;          // the published step directory
  double stall_sec = 0;     // time the training loop stood still for it (begin, and waits)
  double write_sec = 0;     // from the caller's preparation to the published directory
  int64_t bytes = 0;        // tensor bytes written, all ranks
  double resident_mib = 0;  // largest resident size of any rank when the save began
  double peak_rss_mib = 0;  // largest peak resident size of any rank during the save
  std::vector<double> rank_peak_rss_mib;  // each rank's, in rank order
};

class CheckpointSaver {
 public:
  // `world`: the ranks that save together (every rank calls every collective
  // below; it must outlive the saver); `async`: write and publish in
  // background threads.
  CheckpointSaver(const Config& cfg, const parallel::Comm& world, bool async);
  // A save still in flight is abandoned (its thread joined, its temporary
  // directory left hidden for prune_checkpoints): the caller is unwinding.
  ~CheckpointSaver();
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // How the caller prepared a save: the time it took (counted as stall) and
  // this process's resident memory before it began (it resets the peak
  // there, so the record's peak covers the staging copies too).
  struct Prepared {
    double sec = 0;
    double resident_mib = 0;
  };
  // Begins the save of `state.step` (collective). This rank writes its part
  // of the weights ("model") and of the AdamW state ("optimizer"), whose
  // tensors must not alias live training state when async (pass copies: the
  // staging copy). Returns a record when a previous save had to be finished
  // first.
  std::optional<SaveRecord> start(SavePart model, SavePart optimizer, int64_t optimizer_steps,
                                   const TrainState& state, const Prepared& prepared);
  // Advances the save in flight without blocking (collective; nothing when
  // none is in flight, which every rank agrees on). A record when it completed.
  std::optional<SaveRecord> poll();
  // Finishes the save in flight, blocking (collective).
  std::optional<SaveRecord> wait();
  bool in_flight() const { return save_ != nullptr; }

  // A host copy of `t` for an asynchronous save (the staging copy), in a
  // buffer of an earlier save when one of its size and dtype is free: after
  // the first save, staging reuses the same memory (no new pages to fault
  // in, nothing to return to the system), at most one copy of what this
  // rank writes. The buffers come back when their save's files are written.
  // Training thread only.
  Tensor staging_copy(const Tensor& t);
  // A staging buffer shaped like t, not filled: for SavePart::sources.
  Tensor staging_buffer(const Tensor& t);
  // Waits until the save in flight has copied its deferred sources, so that
  // training may change them (the optimizer's update); the wait counts as
  // the save's stall. Nothing to wait for without one. Training thread only.
  void wait_staged();
  // Staging buffers for tensors like `like` (their sizes and dtypes: what
  // this rank writes), made and touched in a background thread from now on,
  // so that the first save finds them in the pool as later saves do. The
  // first touch of fresh memory (a page fault per 4 KiB page, each zeroed by
  // the kernel) was most of a first save's stall: about 0.45 s for 329 MB on
  // a 2-core machine, where copying into touched pages takes 0.07 s.
  // staging_ready() waits for them and puts them in the pool; returns their
  // bytes (0 when none were asked for). Training thread only.
  void prefault_staging(const std::vector<Tensor>& like);
  int64_t staging_ready();

 private:
  struct Save;
  void run_write(Save& s);
  void run_publish(Save& s, const std::vector<std::string>& shards);
  void check_errors(bool rank0_only);
  void gather_and_publish(bool block);
  SaveRecord complete();

  void recycle(Save& s);  // the written part's buffers back to the pool
  void join_thread(Save& s);

  Config cfg_;
  const parallel::Comm& world_;
  bool async_;
  std::unique_ptr<Save> save_;
  std::vector<Tensor> free_buffers_;  // staging buffers not in use (flat, host)
  std::future<std::vector<Tensor>> prefaulted_;  // prefault_staging's, until the first staging_copy
};

}  // namespace attnres::train
