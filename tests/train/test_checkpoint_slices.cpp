// Tensors stored in parts (ZeRO-1: each replica writes the slices it owns):
// read_checkpoint_tensors puts each back together from the index's "slices",
// in the place of its first part, and refuses parts that leave a gap,
// overlap, do not fit, or are missing, naming the index and the tensor.
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "core/fileio.h"
#include "core/safetensors.h"
#include "temp_dir.h"
#include "testing.h"
#include "train/checkpoint.h"

using namespace attnres;
namespace fs = std::filesystem;
using nlohmann::json;
using Catch::Contains;

namespace {

// A flat F32 tensor holding values [from, from + n).
Tensor iota(int64_t from, int64_t n) {
  Tensor t = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = static_cast<float>(from + i);
  return t;
}

// A "optimizer" file set: "a" [2, 3] in slices (offsets, lengths) over two
// files, and "b" whole in the second; `parts` lists (offset, length, file).
std::string make(const std::string& root, const std::vector<std::tuple<int64_t, int64_t, int>>& parts) {
  const std::string dir = root + "/ck";
  fs::create_directories(dir);
  std::vector<NamedTensor> files[2];
  json weight_map = json::object(), list = json::array();
  for (const auto& [offset, length, file] : parts) {
    const std::string stored = "a@" + std::to_string(offset);
    files[file].push_back({stored, iota(offset, length)});
    weight_map[stored] = "optimizer-0000" + std::to_string(file + 1) + "-of-00002.safetensors";
    list.push_back({{"name", stored}, {"offset", offset}, {"length", length}});
  }
  files[1].push_back({"b", iota(100, 4)});
  weight_map["b"] = "optimizer-00002-of-00002.safetensors";
  for (int f = 0; f < 2; ++f)
    write_safetensors(dir + "/optimizer-0000" + std::to_string(f + 1) + "-of-00002.safetensors", files[f], {});
  const json index = {{"metadata", {{"total_size", 0}}},
                      {"weight_map", weight_map},
                      {"slices", {{"a", {{"shape", {2, 3}}, {"parts", list}}}}}};
  write_text_file_atomic(dir + "/optimizer.safetensors.index.json", index.dump());
  return dir;
}

}  // namespace

TEST_CASE("sliced checkpoint tensors are put back together, exactly covered", "[train][checkpoint]") {
  testing::TempDir root;
  // Out of order and across files: [3, 6) in file 0, [0, 3) in file 1.
  const auto tensors = train::read_checkpoint_tensors(make(root.path(), {{3, 3, 0}, {0, 3, 1}}), "optimizer");
  REQUIRE(tensors.size() == 2);
  const NamedTensor* a = nullptr;
  for (const auto& t : tensors) if (t.name == "a") a = &t;
  REQUIRE(a != nullptr);
  CHECK(a->tensor.shape() == Shape{2, 3});
  for (int64_t i = 0; i < 6; ++i) CHECK(a->tensor.data<float>()[i] == static_cast<float>(i));
  CHECK(train::checkpoint_weight_map(make(root.path() + "/x", {{0, 6, 0}}), "optimizer").size() == 2);
}

TEST_CASE("sliced checkpoint tensors with a gap, an overlap or a misfit are refused", "[train][checkpoint]") {
  testing::TempDir root;
  auto refused = [&](const std::vector<std::tuple<int64_t, int64_t, int>>& parts, const std::string& why) {
    static int n = 0;
    const std::string dir = make(root.path() + "/" + std::to_string(n++), parts);
    CHECK_THROWS_WITH(train::read_checkpoint_tensors(dir, "optimizer"),
                      Contains("optimizer.safetensors.index.json") && Contains("'a'") && Contains(why));
  };
  refused({{0, 2, 0}, {3, 3, 1}}, "leave a gap at element 2");
  refused({{0, 4, 0}, {3, 3, 1}}, "overlap at element 3");
  refused({{0, 3, 0}}, "cover 3 of its 6 elements");
  refused({{0, 3, 0}, {4, 3, 1}}, "does not fit");
}
