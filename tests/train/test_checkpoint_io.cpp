#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "temp_dir.h"
#include <nlohmann/json.hpp>

#include "core/fileio.h"
#include "core/safetensors.h"
#include "train/checkpoint_io.h"

using namespace attnres;
using namespace attnres::train;
namespace fs = std::filesystem;
using Catch::Contains;

using attnres::testing::TempDir;

namespace {


// Every name directly under `dir`, hidden ones included.
std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// A checkpoint with a binary file, a text file and one in a subdirectory.
std::string save(const std::string& root, int64_t step, const std::string& payload = "payload") {
  CheckpointWriter w(root, step);
  std::string blob(100'000, '\0');
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>(i * 31 + step);
  write_text_file_atomic(w.path_for("weights.bin"), blob);
  write_text_file_atomic(w.path_for("state.json"), "{\"step\": " + std::to_string(step) + "}\n");
  fs::create_directories(fs::path(w.temp_dir()) / "shards");
  write_text_file_atomic(w.path_for("shards/rank0.txt"), payload);
  return w.commit();
}

void flip_byte(const std::string& path, uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x01));
}

// The pid of a process that has exited and been reaped.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

}  // namespace

TEST_CASE("checkpoint names", "[train]") {
  CHECK(checkpoint_dir_name(42) == "step_00000042");
  CHECK(checkpoint_dir_name(123456789) == "step_123456789");
  CHECK(checkpoint_step("/a/b/step_00000042") == 42);
  CHECK(checkpoint_step("/a/b/step_00000042/") == 42);
  CHECK(checkpoint_step("step_123456789") == 123456789);
  REQUIRE_THROWS_WITH(checkpoint_step("/a/step_12"), Contains("/a/step_12") && Contains("not a checkpoint"));
  REQUIRE_THROWS_WITH(checkpoint_step("/a/step_0000001x"), Contains("not a checkpoint"));
  REQUIRE_THROWS_WITH(checkpoint_step("/a/.tmp_step_00000001_5"), Contains("not a checkpoint"));
}

TEST_CASE("commit publishes a complete, verifiable checkpoint", "[train]") {
  TempDir root;
  const std::string dir = save(root.path(), 10);
  CHECK(dir == root / "step_00000010");
  CHECK(names_in(root.path()) == std::set<std::string>{"step_00000010"});  // no temp dir left
  CHECK(names_in(dir) == std::set<std::string>{"manifest.json", "shards", "state.json", "weights.bin"});

  const auto m = nlohmann::json::parse(read_text_file(dir + "/manifest.json"));
  CHECK(m.at("step") == 10);
  CHECK(m.at("checksum") == "xxh64");
  CHECK(m.at("files").size() == 3);
  CHECK(m.at("files").at("weights.bin").at("size") == 100'000);
  CHECK(m.at("files").at("shards/rank0.txt").at("xxh64") == hex64(xxh64("payload", 7)));

  REQUIRE_NOTHROW(verify_checkpoint(dir));
  CHECK(checkpoint_step(dir) == 10);
  CHECK(list_checkpoints(root.path()) == std::vector<std::string>{dir});
}

TEST_CASE("safetensors inside a checkpoint", "[train]") {
  TempDir root;
  std::string dir;
  {
    CheckpointWriter w(root.path(), 3);
    write_safetensors(w.path_for("model.safetensors"),
                      {{"w", Tensor::from_vector<float>({1, 2, 3}, {3})}});
    dir = w.commit();
  }
  verify_checkpoint(dir);
  const auto t = read_safetensors(dir + "/model.safetensors");
  REQUIRE(t.size() == 1);
  CHECK(t[0].tensor.data<float>()[2] == 3.0f);
}

TEST_CASE("verify_checkpoint detects damage and names the file", "[train]") {
  TempDir root;
  const std::string dir = save(root.path(), 7);
  const std::string weights = dir + "/weights.bin";

  SECTION("truncated file") {
    fs::resize_file(weights, 99'999);
    REQUIRE_THROWS_WITH(verify_checkpoint(dir), Contains(weights) && Contains("truncated"));
  }
  SECTION("one flipped byte") {
    flip_byte(weights, 54'321);
    REQUIRE_THROWS_WITH(verify_checkpoint(dir), Contains(weights) && Contains("damaged") &&
                                                    Contains("checksum"));
  }
  SECTION("flipped byte in a subdirectory") {
    flip_byte(dir + "/shards/rank0.txt", 0);
    REQUIRE_THROWS_WITH(verify_checkpoint(dir), Contains("shards/rank0.txt") && Contains("damaged"));
  }
  SECTION("grown file") {
    std::ofstream(weights, std::ios::app) << "x";
    REQUIRE_THROWS_WITH(verify_checkpoint(dir), Contains(weights) && Contains("damaged"));
  }
  SECTION("missing file") {
    fs::remove(dir + "/state.json");
    REQUIRE_THROWS_WITH(verify_checkpoint(dir), Contains(dir + "/state.json") && Contains("missing"));
  }
  SECTION("missing manifest") {
    fs::remove(dir + "/manifest.json");
    REQUIRE_THROWS_WITH(verify_checkpoint(dir), Contains(dir) && Contains("incomplete"));
  }
  SECTION("corrupt manifest") {
    write_text_file_atomic(dir + "/manifest.json", "{\"files\": ");
    REQUIRE_THROWS_WITH(verify_checkpoint(dir), Contains("manifest.json") && Contains("damaged"));
  }
  SECTION("no such directory") {
    REQUIRE_THROWS_WITH(verify_checkpoint(root / "step_00000099"),
                        Contains("step_00000099") && Contains("does not exist"));
  }
}

TEST_CASE("an uncommitted writer leaves nothing behind", "[train]") {
  TempDir root;
  std::string temp;
  try {
    CheckpointWriter w(root.path(), 5);
    temp = w.temp_dir();
    CHECK(fs::path(temp).filename().string() ==
          ".tmp_step_00000005_" + std::to_string(::getpid()));
    write_text_file_atomic(w.path_for("weights.bin"), "partial");
    throw std::runtime_error("simulated failure while saving");
  } catch (const std::runtime_error&) {
  }
  CHECK_FALSE(fs::exists(temp));
  CHECK(names_in(root.path()).empty());
  CHECK(list_checkpoints(root.path()).empty());
  CHECK_FALSE(find_latest_checkpoint(root.path()).has_value());
}

TEST_CASE("writer rejects reserved and escaping file names", "[train]") {
  TempDir root;
  CheckpointWriter w(root.path(), 1);
  REQUIRE_THROWS_WITH(w.path_for("manifest.json"), Contains("reserved"));
  REQUIRE_THROWS_WITH(w.path_for("../evil"), Contains("relative path inside"));
  REQUIRE_THROWS_WITH(w.path_for("/etc/passwd"), Contains("relative path inside"));
}

TEST_CASE("find_latest_checkpoint skips damaged and incomplete ones", "[train]") {
  TempDir root;
  CHECK_FALSE(find_latest_checkpoint(root / "does_not_exist").has_value());
  CHECK(list_checkpoints(root / "does_not_exist").empty());

  const std::string good = save(root.path(), 10);
  const std::string damaged = save(root.path(), 20);
  const std::string incomplete = save(root.path(), 30);
  flip_byte(damaged + "/weights.bin", 3);
  fs::remove(incomplete + "/manifest.json");
  // Names that are not checkpoints are ignored.
  fs::create_directories(root / ".tmp_step_00000040_1");
  fs::create_directories(root / "step_abc");
  fs::create_directories(root / "step_12");
  write_text_file_atomic(root / "step_00000050", "a file, not a dir");
  write_text_file_atomic(root / "notes.txt", "");

  CHECK(list_checkpoints(root.path()) == std::vector<std::string>{good, damaged, incomplete});
  const auto latest = find_latest_checkpoint(root.path());
  REQUIRE(latest.has_value());
  CHECK(*latest == good);
}

TEST_CASE("list_checkpoints sorts by step, not by name", "[train]") {
  TempDir root;
  const std::string big = save(root.path(), 100'000'000);  // 9 digits
  const std::string small = save(root.path(), 99'999'999);
  CHECK(list_checkpoints(root.path()) == std::vector<std::string>{small, big});
  CHECK(find_latest_checkpoint(root.path()) == big);
}

TEST_CASE("prune_checkpoints keeps the newest K", "[train]") {
  TempDir root;
  std::vector<std::string> dirs;
  for (int s : {1, 2, 3, 4, 5}) dirs.push_back(save(root.path(), s * 100));

  prune_checkpoints(root.path(), 0);  // keep all
  CHECK(list_checkpoints(root.path()).size() == 5);

  prune_checkpoints(root.path(), 2);
  CHECK(list_checkpoints(root.path()) == std::vector<std::string>{dirs[3], dirs[4]});
  CHECK(names_in(root.path()) == std::set<std::string>{"step_00000400", "step_00000500"});

  prune_checkpoints(root.path(), 2);  // idempotent
  CHECK(list_checkpoints(root.path()).size() == 2);
}

TEST_CASE("prune_checkpoints never deletes the newest valid checkpoint", "[train]") {
  TempDir root;
  const std::string a = save(root.path(), 1), b = save(root.path(), 2), c = save(root.path(), 3);
  flip_byte(b + "/weights.bin", 0);
  flip_byte(c + "/weights.bin", 0);
  prune_checkpoints(root.path(), 1);
  // c is kept (newest), a survives as the only intact one, damaged b goes.
  CHECK(list_checkpoints(root.path()) == std::vector<std::string>{a, c});
  CHECK(find_latest_checkpoint(root.path()) == a);
}

TEST_CASE("prune_checkpoints leaves incomplete step dirs alone", "[train]") {
  TempDir root;
  const std::string a = save(root.path(), 1), b = save(root.path(), 2), c = save(root.path(), 3);
  fs::remove(a + "/manifest.json");
  prune_checkpoints(root.path(), 1);
  CHECK(list_checkpoints(root.path()) == std::vector<std::string>{a, c});
}

TEST_CASE("prune_checkpoints removes temp dirs of dead processes only", "[train]") {
  TempDir root;
  save(root.path(), 1);
  const std::string stale = root / (".tmp_step_00000002_" + std::to_string(dead_pid()));
  const std::string stale_old = root / (".old_step_00000001_" + std::to_string(dead_pid()));
  const std::string mine = root / (".tmp_step_00000003_" + std::to_string(::getpid()));
  const std::string other = root / ".tmp_something_else";
  for (const auto& d : {stale, stale_old, mine, other}) {
    fs::create_directories(d);
    write_text_file_atomic(d + "/f", "x");
  }
  prune_checkpoints(root.path(), 0);
  CHECK_FALSE(fs::exists(stale));
  CHECK_FALSE(fs::exists(stale_old));
  CHECK(fs::exists(mine));   // a writer in this process may be using it
  CHECK(fs::exists(other));  // not a name we make
  CHECK(list_checkpoints(root.path()).size() == 1);
}

TEST_CASE("re-committing an existing step replaces it", "[train]") {
  TempDir root;
  const std::string first = save(root.path(), 8, "first");
  const std::string second = save(root.path(), 8, "second");
  CHECK(first == second);
  CHECK(read_text_file(second + "/shards/rank0.txt") == "second");
  REQUIRE_NOTHROW(verify_checkpoint(second));
  CHECK(names_in(root.path()) == std::set<std::string>{"step_00000008"});  // old copy deleted

  // Replacing a damaged copy also works (e.g. re-saving after resuming from an older one).
  flip_byte(second + "/weights.bin", 1);
  save(root.path(), 8, "third");
  REQUIRE_NOTHROW(verify_checkpoint(second));
  CHECK(read_text_file(second + "/shards/rank0.txt") == "third");
}

TEST_CASE("a leftover temp dir with our own name is cleared", "[train]") {
  TempDir root;
  const std::string leftover = root / (".tmp_step_00000004_" + std::to_string(::getpid()));
  fs::create_directories(leftover);
  write_text_file_atomic(leftover + "/junk.bin", "from a crashed process with our pid");
  const std::string dir = save(root.path(), 4);
  CHECK_FALSE(fs::exists(dir + "/junk.bin"));
  CHECK_FALSE(fs::exists(leftover));
  verify_checkpoint(dir);
}
