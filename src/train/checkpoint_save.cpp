#include "train/checkpoint_save.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/fileio.h"
#include "core/log.h"
#include "core/process_memory.h"
#include "data/bpe.h"
#include "train/checkpoint_io.h"

namespace attnres::train {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// config.json, state.json and the tokenizer: the files of a checkpoint that
// are not tensors (written by rank 0).
void write_run_files(const CheckpointWriter& w, const Config& cfg, int64_t optimizer_steps,
                     const TrainState& state) {
  write_text_file_atomic(w.path_for("config.json"), hf_config(cfg.model).dump(2) + "\n");
  const int64_t units = state.step * cfg.training.grad_accum * cfg.parallel.data;
  json st = {
      {"format", "attnres-train-state"},
      {"version", 1},
      {"step", state.step},
      {"tokens", state.tokens},
      {"optimizer_steps", optimizer_steps},
      // The loader is stateless: unit u of the run is a pure function of
      // (u, shuffle, seed), so the cursor is just the count of units consumed.
      {"data", {{"units_consumed", units}, {"shuffle", cfg.data.shuffle}, {"seed", cfg.training.seed}}},
      // All randomness is counter-based (core/rng.h): the seed is the whole state.
      {"rng", {{"kind", "counter-splitmix64"}, {"seed", cfg.training.seed}}},
      {"config", cfg.to_json()},
  };
  write_text_file_atomic(w.path_for("state.json"), st.dump(2) + "\n");
  // One file that `generate` reads with nothing else: GPT-2's two files
  // (encoder.json + vocab.bpe) become a Hugging Face tokenizer.json.
  if (!cfg.data.tokenizer.empty() && fs::exists(cfg.data.tokenizer))
    write_text_file_atomic(w.path_for("tokenizer.json"), data::self_contained_tokenizer(cfg.data.tokenizer));
}

// "model.safetensors", or "model-00002-of-00004.safetensors" for shard 1 of 4.
std::string shard_file(const std::string& stem, int shard, int n_shards) {
  if (n_shards == 1) return stem + ".safetensors";
  char b[64];
  std::snprintf(b, sizeof b, "-%05d-of-%05d.safetensors", shard + 1, n_shards);
  return stem + b;
}

// Test hooks (tests/mpi/checkpoint_shards.sh, tests/cli/checkpoint_async.sh),
// "RANK:STEP": ATTNRES_TEST_KILL_IN_SAVE makes that rank kill itself in the
// middle of that step's save, after its model shard and before its optimizer
// shard; ATTNRES_TEST_FAIL_IN_SAVE makes the write fail there as a full disk
// would.
bool test_hook(const char* name, int rank, int64_t step) {
  const char* spec = std::getenv(name);
  if (!spec) return false;
  int r = -1;
  long long s = -1;
  return std::sscanf(spec, "%d:%lld", &r, &s) == 2 && r == rank && s == step;
}

}  // namespace

// One save in flight.
struct CheckpointSaver::Save {
  int64_t step = 0;
  int rank = 0;
  SavePart parts[2];  // "model", "optimizer": this rank's staging copies
  int64_t optimizer_steps = 0;
  TrainState state;
  std::unique_ptr<CheckpointWriter> writer;  // rank 0: the temporary directory
  std::string temp;
  Clock::time_point t0;
  double stall_sec = 0, resident_mib = 0;
  bool publishing = false;  // the write phase is over everywhere
  std::thread thread;       // the phase running in the background, if any
  std::atomic<bool> written{false}, published{false};
  std::promise<void> staged_promise;  // the deferred sources copied (or none to copy)
  std::shared_future<void> staged = staged_promise.get_future().share();
  // Test hook ATTNRES_TEST_STAGE_AT_UPDATE: the deferred copies wait until the
  // training thread lets them (wait_staged, or a join), the latest moment
  // allowed, so that an update that does not wait for them changes what a
  // save writes every time, not only when the race is lost
  // (tests/cli/checkpoint_async.sh).
  bool copy_at_update = false;
  std::promise<void> copy_allowed;
  std::shared_future<void> may_copy = copy_allowed.get_future().share();
  bool copy_released = false;
  void release_copy() {
    if (copy_released) return;
    copy_released = true;
    copy_allowed.set_value();
  }
  std::string error;        // set by the phase's thread before its flag
  json mine;                // what this rank wrote (files, tensors, memory)
  // Rank 0, once published.
  std::string dir;
  int64_t bytes = 0;
  double max_resident_mib = 0, max_peak_mib = 0;
  std::vector<double> rank_peak_mib;

  ~Save() {
    release_copy();
    if (thread.joinable()) thread.join();
  }
};

CheckpointSaver::CheckpointSaver(const Config& cfg, const parallel::Comm& world, bool async)
    : cfg_(cfg), world_(world), async_(async) {}

CheckpointSaver::~CheckpointSaver() = default;

std::optional<SaveRecord> CheckpointSaver::start(SavePart model, SavePart optimizer,
                                                 int64_t optimizer_steps, const TrainState& state,
                                                 const Prepared& prepared) {
  const double stall_sec = prepared.sec;
  std::optional<SaveRecord> previous;
  if (save_) previous = wait();  // at most one save in flight
  const auto t0 = Clock::now();
  auto s = std::make_unique<Save>();
  s->copy_at_update = async_ && std::getenv("ATTNRES_TEST_STAGE_AT_UPDATE") != nullptr;
  s->step = state.step;
  s->rank = world_.rank();
  s->parts[0] = std::move(model);
  s->parts[1] = std::move(optimizer);
  s->optimizer_steps = optimizer_steps;
  s->state = state;
  // The save began when the caller began preparing its tensors.
  s->t0 = t0 - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(stall_sec));
  s->resident_mib = prepared.resident_mib;
  if (world_.rank() == 0) {
    s->writer = std::make_unique<CheckpointWriter>(cfg_.checkpoint.dir, state.step);
    s->temp = s->writer->temp_dir();
  }
  world_.bcast(s->temp, 0);
  Save* p = s.get();
  save_ = std::move(s);
  if (async_)
    p->thread = std::thread([this, p] { run_write(*p); });
  else
    run_write(*p);
  p->stall_sec = stall_sec + seconds_since(t0);
  if (async_) return previous;
  return wait();  // a synchronous save: all of it is stall (wait() adds its time)
}

// Phase 2, on this rank (its own thread when async): its deferred staging
// copies first (what the training thread waits for before its next update),
// then its files.
void CheckpointSaver::run_write(Save& s) {
  if (s.copy_at_update) s.may_copy.wait();
  try {
    for (SavePart& part : s.parts) {
      for (size_t i = 0; i < part.sources.size(); ++i)
        if (part.sources[i].defined()) part.tensors[i].tensor.copy_from(part.sources[i]);
      part.sources.clear();
    }
  } catch (const std::exception& e) {
    s.error = e.what();
  }
  s.staged_promise.set_value();
  if (!s.error.empty()) {
    s.written.store(true, std::memory_order_release);
    return;
  }
  try {
    s.mine = {{"files", json::object()}, {"model", json::object()}, {"optimizer", json::object()}};
    for (int k = 0; k < 2; ++k) {
      const char* stem = k == 0 ? "model" : "optimizer";
      SavePart& part = s.parts[k];
      if (part.index < 0) continue;
      const std::string name = shard_file(stem, part.index, part.count);
      const std::string path = (fs::path(s.temp) / name).string();
      if (k == 1 && test_hook("ATTNRES_TEST_FAIL_IN_SAVE", s.rank, s.step))
        throw std::runtime_error(path + ": No space left on device (ATTNRES_TEST_FAIL_IN_SAVE)");
      write_safetensors(path, part.tensors, {{"format", "pt"}});
      fsync_path(path);
      uint64_t size = 0;
      const uint64_t hash = xxh64_file(path, &size);
      s.mine["files"][name] = {{"size", size}, {"xxh64", hex64(hash)}};
      for (const auto& t : part.tensors) {
        json info = {{"file", name}, {"bytes", t.tensor.nbytes()}};
        if (auto it = part.slices.find(t.name); it != part.slices.end())
          info["slice_of"] = {{"tensor", it->second.tensor},
                              {"offset", it->second.offset},
                              {"length", t.tensor.numel()},
                              {"shape", it->second.shape}};
        s.mine[stem][t.name] = info;
      }
      if (k == 0 && test_hook("ATTNRES_TEST_KILL_IN_SAVE", s.rank, s.step)) std::raise(SIGKILL);
    }
  } catch (const std::exception& e) {
    s.error = e.what();
  }
  s.written.store(true, std::memory_order_release);
}

// Phase 3, on rank 0 (its own thread when async): every shard checked, then
// the directory published.
void CheckpointSaver::run_publish(Save& s, const std::vector<std::string>& shards) {
  try {
    std::map<std::string, CheckpointWriter::FileSum> expected;
    json maps = {{"model", json::object()}, {"optimizer", json::object()}};
    json slices = {{"model", json::object()}, {"optimizer", json::object()}};
    int64_t total[2] = {0, 0};
    int files[2] = {0, 0};
    for (const std::string& blob : shards) {
      const json r = json::parse(blob);
      for (const auto& [name, f] : r["files"].items()) {
        expected[name] = {f["size"].get<uint64_t>(),
                          std::stoull(f["xxh64"].get<std::string>(), nullptr, 16)};
        ++files[name.rfind("model", 0) == 0 ? 0 : 1];
      }
      for (int k = 0; k < 2; ++k) {
        const char* stem = k == 0 ? "model" : "optimizer";
        for (const auto& [t, info] : r[stem].items()) {
          ATTNRES_CHECK(!maps[stem].contains(t), "tensor ", t, " saved by two ranks");
          maps[stem][t] = info["file"];
          total[k] += info["bytes"].get<int64_t>();
          if (info.contains("slice_of")) {
            const json& of = info["slice_of"];
            json& whole = slices[stem][of["tensor"].get<std::string>()];
            whole["shape"] = of["shape"];
            whole["parts"].push_back({{"name", t}, {"offset", of["offset"]}, {"length", of["length"]}});
          }
        }
      }
      s.max_resident_mib = std::max(s.max_resident_mib, r["resident_mib"].get<double>());
      s.max_peak_mib = std::max(s.max_peak_mib, r["peak_rss_mib"].get<double>());
      s.rank_peak_mib.push_back(r["peak_rss_mib"].get<double>());
    }
    for (int k = 0; k < 2; ++k) {
      const char* stem = k == 0 ? "model" : "optimizer";
      if (files[k] <= 1 && slices[stem].empty()) continue;  // the single file stem.safetensors
      json index = {{"metadata", {{"total_size", total[k]}}}, {"weight_map", maps[stem]}};
      // Not Hugging Face's: tensors stored in parts (ZeRO-1 slices), which
      // read_checkpoint_tensors puts together.
      if (!slices[stem].empty()) index["slices"] = slices[stem];
      write_text_file_atomic(s.writer->path_for(checkpoint_index_file(stem)), index.dump(2) + "\n");
    }
    write_run_files(*s.writer, cfg_, s.optimizer_steps, s.state);
    s.dir = s.writer->commit(expected);
    s.bytes = total[0] + total[1];
    prune_checkpoints(cfg_.checkpoint.dir, static_cast<int>(cfg_.checkpoint.keep_last));
  } catch (const std::exception& e) {
    s.error = e.what();
  }
  s.published.store(true, std::memory_order_release);
}

// Collective: when any rank's phase failed, every rank drops the save (its
// temporary directory removed) and throws, naming the ranks and reasons.
// `rank0_only`: only rank 0 runs the current phase (publish).
void CheckpointSaver::check_errors(bool rank0_only) {
  Save& s = *save_;
  const bool mine = !s.error.empty() && (!rank0_only || world_.rank() == 0);
  int64_t failed = mine ? 1 : 0;
  world_.allreduce_max(&failed, 1);
  if (failed == 0) return;
  const auto errors = world_.allgather(mine ? s.error : std::string());
  std::string what;
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) what += (what.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + errors[r]);
  const int64_t step = s.step;
  save_.reset();  // joins the thread; the writer removes the temporary directory
  throw SaveError("checkpoint of step " + std::to_string(step) +
                  " failed, nothing of it was published (the previous checkpoint is the newest): " +
                  what);
}

void CheckpointSaver::prefault_staging(const std::vector<Tensor>& like) {
  std::vector<std::pair<int64_t, DType>> sizes;
  for (const Tensor& t : like) sizes.emplace_back(t.numel(), t.dtype());
  prefaulted_ = std::async(std::launch::async, [sizes] {
    std::vector<Tensor> buffers;
    for (const auto& [numel, dtype] : sizes) buffers.push_back(Tensor::zeros({numel}, dtype));
    return buffers;
  });
}

int64_t CheckpointSaver::staging_ready() {
  if (!prefaulted_.valid()) return 0;
  int64_t bytes = 0;
  for (Tensor& b : prefaulted_.get()) {
    bytes += static_cast<int64_t>(b.nbytes());
    free_buffers_.push_back(std::move(b));
  }
  return bytes;
}

Tensor CheckpointSaver::staging_buffer(const Tensor& t) {
  staging_ready();
  for (size_t i = 0; i < free_buffers_.size(); ++i) {
    if (free_buffers_[i].numel() != t.numel() || free_buffers_[i].dtype() != t.dtype()) continue;
    Tensor buf = std::move(free_buffers_[i]);
    free_buffers_.erase(free_buffers_.begin() + static_cast<long>(i));
    return buf.reshape(t.shape());
  }
  return Tensor::empty(t.shape(), t.dtype(), Device::CPU);
}

Tensor CheckpointSaver::staging_copy(const Tensor& t) {
  Tensor buf = staging_buffer(t);
  buf.copy_from(t);
  return buf;
}

void CheckpointSaver::wait_staged() {
  if (!save_) return;
  const auto t0 = Clock::now();
  save_->release_copy();
  save_->staged.wait();
  save_->stall_sec += seconds_since(t0);
}

void CheckpointSaver::recycle(Save& s) {
  for (SavePart& part : s.parts) {
    if (part.staged)
      for (NamedTensor& t : part.tensors) free_buffers_.push_back(t.tensor.reshape({t.tensor.numel()}));
    part.tensors.clear();
  }
}

// Collective, once every rank has written: rank 0 learns what each wrote and
// publishes (in the background when async and not `block`).
void CheckpointSaver::gather_and_publish(bool block) {
  Save& s = *save_;
  join_thread(s);
  recycle(s);  // written: the staging buffers serve the next save
  s.mine["resident_mib"] = s.resident_mib;
  s.mine["peak_rss_mib"] = peak_rss_mib();
  const auto shards = world_.gather(s.mine.dump(), 0);
  s.publishing = true;
  if (world_.rank() != 0) return;
  if (async_ && !block)
    s.thread = std::thread([this, &s, shards] { run_publish(s, shards); });
  else
    run_publish(s, shards);
}

// Joins the save's background phase (a held-back staging copy let go first).
void CheckpointSaver::join_thread(Save& s) {
  s.release_copy();
  if (s.thread.joinable()) s.thread.join();
}

std::optional<SaveRecord> CheckpointSaver::poll() {
  if (!save_) return std::nullopt;
  Save& s = *save_;
  const bool root = world_.rank() == 0;
  // [still running here, failed here], the largest over the ranks.
  int64_t flags[2];
  if (!s.publishing) {
    const bool done = s.written.load(std::memory_order_acquire);
    flags[0] = done ? 0 : 1;
    flags[1] = done && !s.error.empty() ? 1 : 0;
  } else {
    const bool done = !root || s.published.load(std::memory_order_acquire);
    flags[0] = done ? 0 : 1;
    flags[1] = root && done && !s.error.empty() ? 1 : 0;
  }
  world_.allreduce_max(flags, 2);
  if (flags[1] != 0) {
    join_thread(s);
    check_errors(s.publishing);
  }
  if (flags[0] != 0) return std::nullopt;
  if (!s.publishing) {
    gather_and_publish(/*block=*/false);
    return std::nullopt;  // the next poll sees the publishing done
  }
  join_thread(s);
  return complete();
}

std::optional<SaveRecord> CheckpointSaver::wait() {
  if (!save_) return std::nullopt;
  const auto t0 = Clock::now();
  Save& s = *save_;
  if (!s.publishing) {
    join_thread(s);
    check_errors(false);
    gather_and_publish(/*block=*/true);
  }
  join_thread(s);
  check_errors(true);
  s.stall_sec += seconds_since(t0);
  return complete();
}

// Collective: rank 0's results to every rank, the record, the save over.
SaveRecord CheckpointSaver::complete() {
  Save& s = *save_;
  SaveRecord r;
  r.step = s.step;
  r.dir = s.dir;
  world_.bcast(r.dir, 0);
  r.stall_sec = s.stall_sec;
  r.write_sec = seconds_since(s.t0);
  r.bytes = s.bytes;
  r.resident_mib = s.max_resident_mib;
  r.peak_rss_mib = std::max(s.max_peak_mib, world_.rank() == 0 ? peak_rss_mib() : 0.0);
  r.rank_peak_rss_mib = s.rank_peak_mib;
  save_.reset();
  return r;
}

}  // namespace attnres::train
