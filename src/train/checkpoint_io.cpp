#include "train/checkpoint_io.h"

#include <signal.h>
#include <stdio.h>  // renameat2 (glibc >= 2.28)
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/fileio.h"

namespace attnres::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kManifestFormat = "attnres-checkpoint-manifest";
constexpr const char* kStepPrefix = "step_";
// Hidden siblings of step dirs, each suffixed _<pid> of the process that made
// them: a save in progress, an old copy moved aside while replacing a step,
// and a pruned checkpoint on its way out. All are garbage once <pid> is gone.
constexpr const char* kTempPrefixes[] = {".tmp_step_", ".old_step_", ".del_step_"};

std::string os_error(int err) { return std::error_code(err, std::generic_category()).message(); }

// The step in "step_<digits>" (at least 8 digits, as we write them), or -1.
int64_t parse_step_name(const std::string& name) {
  const size_t p = std::char_traits<char>::length(kStepPrefix);
  if (name.size() < p + 8 || name.compare(0, p, kStepPrefix) != 0) return -1;
  int64_t step = -1;
  const char* first = name.data() + p;
  const char* last = name.data() + name.size();
  if (!std::all_of(first, last, [](char c) { return c >= '0' && c <= '9'; })) return -1;
  auto [ptr, ec] = std::from_chars(first, last, step);
  if (ec != std::errc() || ptr != last) return -1;
  return step;
}

// Last path component, tolerating a trailing slash ("a/step_1/").
std::string last_component(const std::string& dir) {
  fs::path p(dir);
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

// A relative path that stays inside the checkpoint directory.
bool is_safe_relative(const fs::path& rel) {
  if (rel.empty() || rel.is_absolute()) return false;
  for (const auto& part : rel)
    if (part == ".." || part == ".") return false;
  return true;
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) fail(path, ": cannot delete: ", ec.message());
}

// After a successful commit, failing to delete the superseded copy is not a
// reason to report the save as failed; the leftover is hidden and prunable.
void remove_tree_best_effort(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) spdlog::warn("cannot delete superseded checkpoint {}: {}", path, ec.message());
}

std::string read_proc(const std::string& path) {
  try {
    return read_text_file(path);
  } catch (const Error&) {
    return {};
  }
}

// Whether a temp dir made by `pid` can be deleted: the process is gone, or the
// pid now belongs to a different program (pids are reused, and a restarted
// container often hands out the very same small pids). Our own pid is never
// stale: a CheckpointWriter in this process may be using it. When we cannot
// tell (no /proc), we keep the directory.
bool temp_owner_is_gone(long pid) {
  if (pid == static_cast<long>(::getpid())) return false;
  if (pid <= 0) return true;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return true;
  // A zombie (exited, not yet reaped: e.g. the ranks of an aborted MPI job
  // whose launcher returned first) never writes again.
  const std::string stat = read_proc("/proc/" + std::to_string(pid) + "/stat");
  if (const size_t paren = stat.rfind(')'); paren != std::string::npos && paren + 2 < stat.size() &&
                                             stat[paren + 2] == 'Z')
    return true;
  std::error_code e1, e2;
  const fs::path mine = fs::read_symlink("/proc/self/exe", e1);
  const fs::path theirs = fs::read_symlink("/proc/" + std::to_string(pid) + "/exe", e2);
  if (!e1 && !e2) return mine != theirs;
  // Another user's process hides its exe link but not its name.
  const std::string my_comm = read_proc("/proc/self/comm");
  const std::string their_comm = read_proc("/proc/" + std::to_string(pid) + "/comm");
  if (!my_comm.empty() && !their_comm.empty()) return my_comm != their_comm;
  return false;
}

// Removes hidden leftovers of dead processes under `root`.
void remove_stale_temp_dirs(const std::string& root) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = std::any_of(std::begin(kTempPrefixes), std::end(kTempPrefixes),
                                  [&](const char* p) { return name.rfind(p, 0) == 0; });
    if (!ours) continue;
    const size_t us = name.rfind('_');
    long pid = 0;
    auto [ptr, perr] = std::from_chars(name.data() + us + 1, name.data() + name.size(), pid);
    if (perr != std::errc() || ptr != name.data() + name.size()) continue;  // not our format
    if (!temp_owner_is_gone(pid)) continue;
    std::error_code rec;
    fs::remove_all(entry.path(), rec);
    if (rec)
      spdlog::warn("cannot delete stale checkpoint temp dir {}: {}", entry.path().string(),
                   rec.message());
    else
      spdlog::info("deleted stale checkpoint temp dir {} (process {} is gone)",
                   entry.path().string(), pid);
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------

std::string checkpoint_dir_name(int64_t step) {
  ATTNRES_CHECK(step >= 0, "negative checkpoint step ", step);
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

int64_t checkpoint_step(const std::string& dir) {
  const int64_t step = parse_step_name(last_component(dir));
  if (step < 0)
    fail(dir, ": not a checkpoint directory name (expected step_ followed by 8 or more digits)");
  return step;
}

// ---------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------

CheckpointWriter::CheckpointWriter(std::string root, int64_t step)
    : root_(std::move(root)), step_(step) {
  if (root_.empty()) fail("checkpoint directory is empty: set checkpoint.dir");
  if (step_ < 0) fail(root_, ": cannot save a checkpoint for negative step ", step_);
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) fail(root_, ": cannot create checkpoint directory: ", ec.message());
  const std::string name = checkpoint_dir_name(step_);
  final_dir_ = (fs::path(root_) / name).string();
  temp_dir_ = (fs::path(root_) / (".tmp_" + name + "_" + std::to_string(::getpid()))).string();
  // A leftover under our exact name is from an earlier process that had our
  // pid (or an earlier failed writer here): never live, so start clean.
  remove_tree(temp_dir_);
  fs::create_directory(temp_dir_, ec);
  if (ec) fail(temp_dir_, ": cannot create checkpoint temp dir: ", ec.message());
}

CheckpointWriter::~CheckpointWriter() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(temp_dir_, ec);  // best effort: destructors must not throw
  if (ec) spdlog::warn("cannot delete unfinished checkpoint {}: {}", temp_dir_, ec.message());
}

std::string CheckpointWriter::path_for(const std::string& filename) const {
  const fs::path rel(filename);
  if (!is_safe_relative(rel))
    fail(temp_dir_, ": checkpoint file name '", filename, "' must be a relative path inside it");
  if (rel == kManifest) fail(temp_dir_, ": '", kManifest, "' is reserved for the checkpoint manifest");
  return (fs::path(temp_dir_) / rel).string();
}

std::string CheckpointWriter::commit(const std::map<std::string, FileSum>& expected) {
  if (committed_) fail(final_dir_, ": checkpoint already committed");

  // 1. Inventory: every regular file the caller wrote, in a stable order.
  std::vector<std::string> files, dirs{temp_dir_};
  std::error_code ec;
  for (fs::recursive_directory_iterator it(temp_dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path rel = it->path().lexically_relative(temp_dir_);
    const auto st = it->symlink_status();
    if (fs::is_directory(st)) {
      dirs.push_back(it->path().string());
    } else if (fs::is_regular_file(st)) {
      if (rel == kManifest) fail(it->path().string(), ": '", kManifest, "' is reserved for the checkpoint manifest");
      files.push_back(rel.generic_string());
    } else {
      fail(it->path().string(), ": checkpoints may only hold regular files and directories");
    }
  }
  if (ec) fail(temp_dir_, ": cannot list checkpoint files: ", ec.message());
  std::sort(files.begin(), files.end());

  // 2. Make every file durable and record its size and checksum.
  nlohmann::ordered_json entries = nlohmann::ordered_json::object();
  for (const auto& rel : files) {
    const std::string path = (fs::path(temp_dir_) / rel).string();
    fsync_path(path);
    uint64_t size = 0;
    const uint64_t hash = xxh64_file(path, &size);
    if (auto it = expected.find(rel); it != expected.end() &&
                                      (it->second.size != size || it->second.xxh64 != hash))
      fail(path, ": differs from what its writer wrote (", size, " bytes, xxh64 ", hex64(hash),
           "; written: ", it->second.size, " bytes, xxh64 ", hex64(it->second.xxh64),
           "): the checkpoint is not published");
    entries[rel] = {{"size", size}, {"xxh64", hex64(hash)}};
  }
  for (const auto& [rel, sum] : expected)
    if (!entries.contains(rel))
      fail(temp_dir_, ": '", rel, "' (", sum.size, " bytes) was written but is not there: the "
           "checkpoint is not published (is the checkpoint directory on a file system every rank "
           "shares?)");
  const nlohmann::ordered_json manifest = {
      {"format", kManifestFormat}, {"version", 1},      {"step", step_},
      {"checksum", "xxh64"},       {"files", entries},
  };

  // 3. The manifest goes last: its presence is what marks the set complete.
  // write_text_file_atomic fsyncs it and the temp dir; then the subdirs.
  write_text_file_atomic((fs::path(temp_dir_) / kManifest).string(), manifest.dump(2) + "\n");
  for (const auto& d : dirs) fsync_path(d);

  // 4. Publish. rename() refuses to replace a non-empty directory, so a
  // re-save of an existing step swaps the two instead.
  if (::rename(temp_dir_.c_str(), final_dir_.c_str()) == 0) {
    committed_ = true;
    fsync_path(root_);
    return final_dir_;
  }
  if (errno != ENOTEMPTY && errno != EEXIST)
    fail(final_dir_, ": cannot rename '", temp_dir_, "' to it: ", os_error(errno));

  if (::renameat2(AT_FDCWD, temp_dir_.c_str(), AT_FDCWD, final_dir_.c_str(), RENAME_EXCHANGE) == 0) {
    // One atomic step: readers see the old complete checkpoint or the new one.
    committed_ = true;
    fsync_path(root_);
    remove_tree_best_effort(temp_dir_);  // now holds the old checkpoint
    return final_dir_;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
    fail(final_dir_, ": cannot replace it with '", temp_dir_, "': ", os_error(errno));

  // No RENAME_EXCHANGE (e.g. some network file systems): move the old one
  // aside, then the new one in. A crash in between leaves no step dir for this
  // step (older checkpoints still serve a resume) and two hidden dirs that
  // prune_checkpoints() cleans up.
  const std::string aside =
      (fs::path(root_) / (".old_" + checkpoint_dir_name(step_) + "_" + std::to_string(::getpid())))
          .string();
  remove_tree(aside);
  rename_durable(final_dir_, aside);
  try {
    rename_durable(temp_dir_, final_dir_);
  } catch (const Error&) {
    ::rename(aside.c_str(), final_dir_.c_str());  // put the old one back; best effort
    throw;
  }
  committed_ = true;
  remove_tree_best_effort(aside);
  return final_dir_;
}

// ---------------------------------------------------------------------------
// Verification, discovery, pruning
// ---------------------------------------------------------------------------

void verify_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir)) fail(dir, ": checkpoint directory does not exist");
  const std::string manifest_path = (fs::path(dir) / kManifest).string();
  if (!fs::exists(manifest_path))
    fail(dir, ": incomplete checkpoint: no ", kManifest, " (the save did not finish)");

  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(read_text_file(manifest_path));
  } catch (const nlohmann::json::exception& e) {
    fail(manifest_path, ": damaged: not valid JSON: ", e.what());
  }
  if (!manifest.is_object() || manifest.value("format", "") != kManifestFormat ||
      !manifest.contains("files") || !manifest["files"].is_object())
    fail(manifest_path, ": damaged: not an attnres checkpoint manifest");

  for (const auto& [rel, info] : manifest["files"].items()) {
    if (!is_safe_relative(fs::path(rel)) || !info.is_object() || !info.contains("size") ||
        !info["size"].is_number_unsigned() || !info.contains("xxh64") || !info["xxh64"].is_string())
      fail(manifest_path, ": damaged: bad entry for '", rel, "'");
    const std::string path = (fs::path(dir) / rel).string();
    const uint64_t want_size = info["size"].get<uint64_t>();
    const std::string want_hash = info["xxh64"].get<std::string>();

    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (!fs::exists(st)) fail(path, ": missing: listed in ", kManifest, " but not present");
    if (!fs::is_regular_file(st)) fail(path, ": damaged: not a regular file");
    uint64_t size = 0;
    const uint64_t hash = xxh64_file(path, &size);
    if (size < want_size)
      fail(path, ": truncated: ", size, " bytes, ", kManifest, " records ", want_size);
    if (size > want_size)
      fail(path, ": damaged: ", size, " bytes, ", kManifest, " records ", want_size);
    if (hex64(hash) != want_hash)
      fail(path, ": damaged: xxh64 checksum ", hex64(hash), " differs from ", want_hash,
           " recorded in ", kManifest);
  }
}

std::vector<std::string> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (root.empty() || !fs::is_directory(root, ec)) return {};
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const int64_t step = parse_step_name(entry.path().filename().string());
    std::error_code dec;
    if (step >= 0 && entry.is_directory(dec)) found.emplace_back(step, entry.path().string());
  }
  if (ec) fail(root, ": cannot list checkpoints: ", ec.message());
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  out.reserve(found.size());
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::optional<std::string> find_latest_checkpoint(const std::string& root) {
  const auto all = list_checkpoints(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      verify_checkpoint(*it);
      return *it;
    } catch (const Error& e) {
      spdlog::warn("skipping checkpoint {}: {}", last_component(*it), e.what());
    }
  }
  return std::nullopt;
}

void prune_checkpoints(const std::string& root, int keep_last) {
  std::error_code ec;
  if (root.empty() || !fs::is_directory(root, ec)) return;
  remove_stale_temp_dirs(root);
  if (keep_last <= 0) return;

  std::vector<std::string> complete;
  for (const auto& dir : list_checkpoints(root))
    if (fs::exists(fs::path(dir) / kManifest)) complete.push_back(dir);
  if (complete.size() <= static_cast<size_t>(keep_last)) return;

  const size_t n_old = complete.size() - static_cast<size_t>(keep_last);
  std::vector<std::string> doomed(complete.begin(), complete.begin() + n_old);

  // Having a manifest is not the same as being intact. Find the newest
  // checkpoint that verifies (normally the one just written, so this costs one
  // re-read) and make sure it survives even if every newer one is damaged.
  for (auto it = complete.rbegin(); it != complete.rend(); ++it) {
    try {
      verify_checkpoint(*it);
    } catch (const Error& e) {
      spdlog::warn("checkpoint {} does not verify ({}); keeping an older intact one", *it, e.what());
      continue;
    }
    doomed.erase(std::remove(doomed.begin(), doomed.end(), *it), doomed.end());
    break;
  }

  for (const auto& dir : doomed) {
    // Rename out of sight first: a crash mid-delete must not leave a
    // half-deleted step dir that looks like a (damaged) checkpoint.
    const std::string gone =
        (fs::path(root) / (".del_" + last_component(dir) + "_" + std::to_string(::getpid())))
            .string();
    remove_tree(gone);
    if (::rename(dir.c_str(), gone.c_str()) != 0)
      fail(dir, ": cannot move aside for deletion: ", os_error(errno));
    remove_tree(gone);
    spdlog::info("pruned checkpoint {}", dir);
  }
  if (!doomed.empty()) fsync_path(root);
}

}  // namespace attnres::train
