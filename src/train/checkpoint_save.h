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
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
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

// What one completed save cost (metrics.jsonl's "checkpoint" record).
struct SaveRecord {
  int64_t step = 0;
  std::string dir;          // the published step directory
  double stall_sec = 0;     // time the training loop stood still for it (begin, and waits)
  double write_sec = 0;     // from the caller's preparation to the published directory
  int64_t bytes = 0;        // tensor bytes written, all ranks
  double resident_mib = 0;  // largest resident size of any rank when the save began
  double peak_rss_mib = 0;  // largest peak resident size of any rank during the save
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

  // Begins the save of `state.step` (collective). This rank writes shard
  // `shard` of `n_shards` (-1: no tensors) from `weights` and
  // `optimizer_state`, which must not alias live training state when async
  // (pass copies: the staging copy). `stall_sec`: the time the caller already
  // spent preparing them (counted in the record). Returns a record when a
  // previous save had to be finished first.
  std::optional<SaveRecord> start(int shard, int n_shards, std::vector<NamedTensor> weights,
                                   std::vector<NamedTensor> optimizer_state,
                                   int64_t optimizer_steps, const TrainState& state,
                                   double stall_sec);
  // Advances the save in flight without blocking (collective; nothing when
  // none is in flight, which every rank agrees on). A record when it completed.
  std::optional<SaveRecord> poll();
  // Finishes the save in flight, blocking (collective).
  std::optional<SaveRecord> wait();
  bool in_flight() const { return save_ != nullptr; }

 private:
  struct Save;
  void run_write(Save& s);
  void run_publish(Save& s, const std::vector<std::string>& shards);
  void check_errors(bool rank0_only);
  void gather_and_publish(bool block);
  SaveRecord complete();

  Config cfg_;
  const parallel::Comm& world_;
  bool async_;
  std::unique_ptr<Save> save_;
};

}  // namespace attnres::train
