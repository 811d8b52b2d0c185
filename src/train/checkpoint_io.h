// Checkpoint directories: atomic creation, integrity manifest, discovery and
// pruning. Generic mechanics only; what goes inside is train/checkpoint.h's job.
//
// Layout under a checkpoint root:
//   step_XXXXXXXX/            one checkpoint (step zero-padded to 8 digits; more
//                             digits past 99,999,999), holding the caller's files
//                             plus manifest.json, written last:
//       {"format": "attnres-checkpoint-manifest", "version": 1, "step": N,
//        "checksum": "xxh64",
//        "files": {"model.safetensors": {"size": 123, "xxh64": "<16 hex>"}, ...}}
//   .tmp_step_XXXXXXXX_<pid>  a checkpoint being written by process <pid>; hidden,
//                             never listed, removed by prune once <pid> is gone.
//
// A step directory only ever appears by rename() of a complete, fsync'd temp
// directory, so a crash mid-save leaves at most a hidden temp directory. The
// manifest additionally catches later damage (truncation, bit rot, a partial
// copy to another machine): verify_checkpoint() re-hashes every file.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace attnres::train {

class CheckpointWriter {
 public:
  // Creates <root> if needed and the temp dir <root>/.tmp_step_XXXXXXXX_<pid>.
  CheckpointWriter(std::string root, int64_t step);
  // Removes the temp dir unless commit() succeeded (e.g. an exception while
  // writing a file): a failed save leaves nothing behind.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Where to write `filename` (relative; may contain subdirectories, which
  // the caller creates). Every regular file in the temp dir at commit() time
  // becomes part of the checkpoint.
  std::string path_for(const std::string& filename) const;
  const std::string& temp_dir() const { return temp_dir_; }
  int64_t step() const { return step_; }

  // fsync every file, write manifest.json, fsync the directory tree, rename
  // it to <root>/step_XXXXXXXX, fsync <root>. An existing step directory (the
  // same step saved again after a resume) is replaced: atomically swapped via
  // renameat2(RENAME_EXCHANGE) where the file system supports it, otherwise
  // renamed aside first. Returns the final directory.
  // `expected`: size and checksum each named file's writer recorded (files
  // written by other processes, e.g. the ranks of a sharded save); a file
  // that differs on disk, or is missing, fails the commit (naming it) and
  // nothing is published.
  struct FileSum {
    uint64_t size = 0, xxh64 = 0;
  };
  std::string commit(const std::map<std::string, FileSum>& expected = {});

 private:
  std::string root_;
  int64_t step_;
  std::string temp_dir_;
  std::string final_dir_;
  bool committed_ = false;
};

// "step_00000042" for 42.
std::string checkpoint_dir_name(int64_t step);
// The step encoded in a checkpoint directory's name; throws if the last path
// component is not step_<8 or more digits>.
int64_t checkpoint_step(const std::string& dir);

// Throws attnres::Error naming the file and the reason if `dir` is not a
// complete, intact checkpoint: "incomplete" (no manifest.json), "missing",
// "truncated" (smaller than recorded), "damaged" (larger, or checksum differs).
// Reads every byte of every file (XXH64 runs at several GB/s).
void verify_checkpoint(const std::string& dir);

// step_* directories under `root` (full paths), sorted by step, complete or
// not; temp dirs and other names are ignored. Empty if `root` does not exist.
std::vector<std::string> list_checkpoints(const std::string& root);

// The newest checkpoint under `root` that verifies. Newer ones that don't are
// skipped with a warning naming them and the reason. nullopt if none.
std::optional<std::string> find_latest_checkpoint(const std::string& root);

// Keep the newest `keep_last` complete checkpoints (those with a manifest) and
// delete older complete ones; keep_last <= 0 keeps all. The newest checkpoint
// that verifies is never deleted, even if newer ones turn out damaged.
// Incomplete step dirs are left alone (find_latest_checkpoint reports them).
// Also removes temp dirs left by processes that no longer exist.
void prune_checkpoints(const std::string& root, int keep_last);

}  // namespace attnres::train
