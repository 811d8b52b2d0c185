// Rank-to-GPU pinning (parallel/mpi.h): a GPU per local rank when there are
// enough, local rank modulo the visible GPUs (with a warning) when there are not.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "parallel/mpi.h"

using attnres::parallel::choose_local_gpu;
using attnres::parallel::pin_local_gpu;
using attnres::parallel::visible_gpus;

namespace {
// Puts an environment variable back as it was when the scope ends.
class SavedEnv {
 public:
  explicit SavedEnv(const char* name) : name_(name) {
    const char* v = std::getenv(name);
    had_ = v != nullptr;
    if (had_) value_ = v;
  }
  ~SavedEnv() {
    if (had_) setenv(name_, value_.c_str(), 1);
    else unsetenv(name_);
  }
  SavedEnv(const SavedEnv&) = delete;
  SavedEnv& operator=(const SavedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string value_;
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "(unset)";
}
}  // namespace

TEST_CASE("GPU pinning: one GPU per local rank when there are enough", "[gpu_pin]") {
  const std::vector<std::string> visible = {"3", "5", "6", "7"};
  for (int r = 0; r < 4; ++r) {
    const auto pin = choose_local_gpu(r, 4, visible);
    CHECK(pin.device == visible[static_cast<size_t>(r)]);
    CHECK(pin.sharing == 1);
    CHECK(pin.warning.empty());
  }
  // Fewer ranks than GPUs: the first ones.
  CHECK(choose_local_gpu(1, 2, visible).device == "5");
}

TEST_CASE("GPU pinning: more ranks than GPUs share them modulo the count", "[gpu_pin]") {
  const std::vector<std::string> one = {"0"};
  for (int r = 0; r < 4; ++r) {
    const auto pin = choose_local_gpu(r, 4, one);
    CHECK(pin.device == "0");
    CHECK(pin.sharing == 4);
    CHECK(pin.warning.find("4 processes of this job on this node share 1 GPU ") !=
          std::string::npos);
    CHECK(pin.warning.find("NCCL refuses") != std::string::npos);
  }
  // 3 ranks on 2 GPUs: ranks 0 and 2 on the first, rank 1 alone on the second;
  // every rank warns (the node shares), with the same text.
  const std::vector<std::string> two = {"1", "0"};
  const auto p0 = choose_local_gpu(0, 3, two), p1 = choose_local_gpu(1, 3, two),
             p2 = choose_local_gpu(2, 3, two);
  CHECK(p0.device == "1");
  CHECK(p1.device == "0");
  CHECK(p2.device == "1");
  CHECK(p0.sharing == 2);
  CHECK(p1.sharing == 1);
  CHECK(p2.sharing == 2);
  CHECK(!p1.warning.empty());
  CHECK(p0.warning == p1.warning);
  CHECK(p1.warning.find("up to 2 per GPU") != std::string::npos);
}

TEST_CASE("GPU pinning: one process, or no GPU, changes nothing", "[gpu_pin]") {
  CHECK(choose_local_gpu(0, 1, {"0", "1"}).device.empty());
  const auto none = choose_local_gpu(2, 4, {});
  CHECK(none.device.empty());
  CHECK(none.sharing == 1);
  CHECK(none.warning.empty());
}

TEST_CASE("GPU pinning: CUDA_VISIBLE_DEVICES lists the visible GPUs", "[gpu_pin]") {
  SavedEnv saved("CUDA_VISIBLE_DEVICES");
  setenv("CUDA_VISIBLE_DEVICES", "2, 4,,GPU-1f2e", 1);
  CHECK(visible_gpus() == std::vector<std::string>{"2", "4", "GPU-1f2e"});
  setenv("CUDA_VISIBLE_DEVICES", "", 1);  // set but empty: no GPU visible
  CHECK(visible_gpus().empty());
}

TEST_CASE("GPU pinning: without CUDA_VISIBLE_DEVICES, the driver's GPUs", "[gpu_pin]") {
  namespace fs = std::filesystem;
  SavedEnv saved("CUDA_VISIBLE_DEVICES");
  unsetenv("CUDA_VISIBLE_DEVICES");
  const fs::path root = fs::temp_directory_path() / "attnres_gpu_pin_test";
  fs::remove_all(root);
  const fs::path driver = root / "gpus", dev = root / "dev";
  fs::create_directories(driver / "0000:18:00.0");
  fs::create_directories(driver / "0000:2a:00.0");
  fs::create_directories(dev);
  for (const char* f : {"nvidia0", "nvidia3", "nvidia7", "nvidiactl", "nvidia-uvm", "nvidia-modeset",
                        "null"})
    std::ofstream(dev / f).put('x');
  // A folder per GPU in the driver's list: two GPUs, CUDA's ordinals 0 and 1.
  CHECK(visible_gpus(driver.string(), dev.string()) == std::vector<std::string>{"0", "1"});
  // No driver list (a container): the device files nvidiaN, three here.
  CHECK(visible_gpus((root / "missing").string(), dev.string()) ==
        std::vector<std::string>{"0", "1", "2"});
  // Neither: no GPU.
  CHECK(visible_gpus((root / "missing").string(), (root / "missing").string()).empty());
  fs::remove_all(root);
}

TEST_CASE("GPU pinning: eager kernel loading where NCCL may run", "[gpu_pin]") {
  SavedEnv devices("CUDA_VISIBLE_DEVICES"), loading("CUDA_MODULE_LOADING");
  setenv("CUDA_VISIBLE_DEVICES", "3,5", 1);
  unsetenv("CUDA_MODULE_LOADING");
  // The MPI transport (or one rank): lazy loading, CUDA's default, stays.
  CHECK(pin_local_gpu(1, 2, /*nccl=*/false).device == "5");
  CHECK(env("CUDA_VISIBLE_DEVICES") == "5");
  CHECK(env("CUDA_MODULE_LOADING") == "(unset)");
  // Several ranks, a GPU each, NCCL possible: every kernel loaded up front.
  setenv("CUDA_VISIBLE_DEVICES", "3,5", 1);
  CHECK(pin_local_gpu(0, 2, /*nccl=*/true).device == "3");
  CHECK(env("CUDA_MODULE_LOADING") == "EAGER");
  // A user's own setting wins.
  setenv("CUDA_VISIBLE_DEVICES", "3,5", 1);
  setenv("CUDA_MODULE_LOADING", "LAZY", 1);
  pin_local_gpu(0, 2, /*nccl=*/true);
  CHECK(env("CUDA_MODULE_LOADING") == "LAZY");
  // Ranks sharing a GPU cannot use NCCL: nothing to guard against.
  setenv("CUDA_VISIBLE_DEVICES", "3", 1);
  unsetenv("CUDA_MODULE_LOADING");
  CHECK(pin_local_gpu(0, 2, /*nccl=*/true).sharing == 2);
  CHECK(env("CUDA_MODULE_LOADING") == "(unset)");
}
