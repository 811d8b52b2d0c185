#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "temp_dir.h"
#include <nlohmann/json.hpp>

#include "core/fileio.h"
#include "core/safetensors.h"
#include "testing.h"

using namespace attnres;
namespace fs = std::filesystem;
using Catch::Contains;

using attnres::testing::TempDir;

namespace {


std::string file_bytes(const std::string& path) { return read_text_file(path); }

uint64_t le64(const std::string& b, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}

// A hand-made file: 8-byte length (the header's own, unless `len` overrides),
// the header text, then `data`.
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               int64_t len = -1) {
  const uint64_t n = len >= 0 ? static_cast<uint64_t>(len) : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  out += header;
  out += data;
  write_text_file_atomic(path, out);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

std::vector<NamedTensor> sample_tensors() {
  std::vector<NamedTensor> v;
  v.push_back({"model.embed_tokens.weight", testing::randn({5, 3}, 1, DType::F32)});
  v.push_back({"f64.vector", testing::randn({7}, 2, DType::F64)});
  v.push_back({"ids", testing::random_tokens(6, 1000, 3).reshape({3, 1, 2})});
  Tensor scalar = Tensor::from_vector<float>({3.25f}, {});
  v.push_back({"scalar", scalar});
  v.push_back({"empty", Tensor::zeros({0, 4}, DType::F32)});
  Tensor bf = Tensor::empty({3}, DType::BF16);
  const uint16_t bits[3] = {0x3F80, 0xC000, 0x7FC0};  // 1.0, -2.0, NaN
  std::memcpy(bf.raw(), bits, sizeof bits);
  v.push_back({"bf16", bf});
  v.push_back({"odd.size", testing::randn({1, 1, 3}, 4, DType::F32)});  // 12 bytes: breaks 8-alignment
  return v;
}

}  // namespace

TEST_CASE("safetensors round trip is bit exact", "[core]") {
  TempDir dir;
  const std::string f = dir / "t.safetensors";
  const auto tensors = sample_tensors();
  write_safetensors(f, tensors, {{"note", "hello"}});

  const auto back = read_safetensors(f);
  REQUIRE(back.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    INFO(tensors[i].name);
    CHECK(back[i].name == tensors[i].name);  // written order is preserved
    CHECK(back[i].tensor.is_cpu());
    CHECK(same_bytes(back[i].tensor, tensors[i].tensor));
  }
  CHECK(back[3].tensor.ndim() == 0);
  CHECK(back[3].tensor.numel() == 1);
  CHECK(back[4].tensor.numel() == 0);

  const auto meta = read_safetensors_metadata(f);
  CHECK(meta.at("format") == "pt");
  CHECK(meta.at("note") == "hello");

  const auto header = read_safetensors_header(f);
  REQUIRE(header.size() == tensors.size());
  CHECK(header.at("ids").dtype == DType::I32);
  CHECK(header.at("ids").shape == Shape{3, 1, 2});
  CHECK(header.at("scalar").shape.empty());

  // Only the final file remains: the temporary was renamed onto it.
  CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 1);
}

TEST_CASE("safetensors file follows the format byte for byte", "[core]") {
  TempDir dir;
  const std::string f = dir / "t.safetensors";
  const auto tensors = sample_tensors();
  write_safetensors(f, tensors);
  const std::string b = file_bytes(f);

  REQUIRE(b.size() >= 8);
  const uint64_t n = le64(b, 0);
  CHECK(n % 8 == 0);  // data buffer starts 8-aligned
  REQUIRE(8 + n <= b.size());
  CHECK(b[8] == '{');
  const std::string text = b.substr(8, n);
  const size_t last = text.find_last_not_of(' ');
  CHECK(text[last] == '}');  // padding is spaces only

  const auto h = nlohmann::json::parse(text);
  CHECK(h.at("__metadata__") == nlohmann::json{{"format", "pt"}});
  uint64_t expect_begin = 0;
  for (const auto& t : tensors) {
    INFO(t.name);
    const auto& e = h.at(t.name);
    CHECK(e.at("dtype") == dtype_name(t.tensor.dtype()));
    CHECK(e.at("shape").get<Shape>() == t.tensor.shape());
    const uint64_t begin = e.at("data_offsets")[0], end = e.at("data_offsets")[1];
    CHECK(begin == expect_begin);  // contiguous, in the given order, no holes
    CHECK(end - begin == t.tensor.nbytes());
    if (t.tensor.nbytes() > 0)
      CHECK(std::memcmp(b.data() + 8 + n + begin, t.tensor.raw(), t.tensor.nbytes()) == 0);
    expect_begin = end;
  }
  CHECK(b.size() == 8 + n + expect_begin);
}

TEST_CASE("safetensors with no tensors", "[core]") {
  TempDir dir;
  write_safetensors(dir / "e.safetensors", {});
  CHECK(read_safetensors(dir / "e.safetensors").empty());
  // A minimal foreign file without metadata is valid too.
  write_raw(dir / "m.safetensors", "{}      ", "");
  CHECK(read_safetensors(dir / "m.safetensors").empty());
  CHECK(read_safetensors_metadata(dir / "m.safetensors").empty());
}

TEST_CASE("safetensors reader accepts a foreign writer's ordering", "[core]") {
  // The header order need not match the buffer order (it is a JSON object).
  TempDir dir;
  const std::string f = dir / "f.safetensors";
  std::string data(12, '\0');
  const float a[2] = {1.5f, -2.0f};
  const int32_t b = 42;
  std::memcpy(&data[4], a, 8);
  std::memcpy(&data[0], &b, 4);
  write_raw(f,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
            R"("b":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})",
            data);
  const auto t = read_safetensors(f);
  REQUIRE(t.size() == 2);
  CHECK(t[0].name == "b");
  CHECK(t[0].tensor.data<int32_t>()[0] == 42);
  CHECK(t[1].tensor.data<float>()[1] == -2.0f);
}

TEST_CASE("safetensors reader rejects malformed files, naming the file", "[core]") {
  TempDir dir;
  const std::string f = dir / "bad.safetensors";
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string eight(8, 'x');
  auto rejects = [&](const std::string& reason) {
    INFO("expected: " << reason);
    REQUIRE_THROWS_WITH(read_safetensors(f), Contains(f) && Contains(reason));
    REQUIRE_THROWS_WITH(read_safetensors_header(f), Contains(f) && Contains(reason));
  };

  SECTION("missing file") {
    REQUIRE_THROWS_WITH(read_safetensors(f), Contains(f) && Contains("No such file"));
  }
  SECTION("shorter than 8 bytes") {
    write_text_file_atomic(f, "abc");
    rejects("shorter than the 8-byte");
  }
  SECTION("header length over the limit") {
    write_raw(f, "{}", "", 100'000'001);
    rejects("exceeds the limit of 100000000");
  }
  SECTION("header length beyond the file") {
    write_raw(f, "{}", "", 64);
    rejects("runs past the end");
  }
  SECTION("header does not start with '{'") {
    write_raw(f, " {}     ", "");
    rejects("does not start with '{'");
  }
  SECTION("header is not JSON") {
    write_raw(f, "{\"a\": [1, 2}   ", "");
    rejects("not valid JSON");
  }
  SECTION("garbage after the JSON object") {
    write_raw(f, "{}xx", "");
    rejects("not valid JSON");
  }
  SECTION("unknown dtype") {
    write_raw(f, R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", "1234");
    rejects("tensor 'a': unsupported dtype 'F16'");
  }
  SECTION("entry not an object") {
    write_raw(f, R"({"a":[1,2]})", "");
    rejects("tensor 'a': header entry is not an object");
  }
  SECTION("missing shape") {
    write_raw(f, R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", "1234");
    rejects("tensor 'a': missing or non-array \"shape\"");
  }
  SECTION("negative dimension") {
    write_raw(f, R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "1234");
    rejects("non-negative integers");
  }
  SECTION("bad data_offsets") {
    write_raw(f, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "1234");
    rejects("\"data_offsets\" must be [begin, end]");
  }
  SECTION("shape and offsets disagree") {
    write_raw(f, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight);
    rejects("data_offsets [0, 8] span 8 bytes but F32[3] needs 12");
  }
  SECTION("offsets end before they begin") {
    write_raw(f, R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", eight);
    rejects("end before they begin");
  }
  SECTION("overlapping tensors") {
    write_raw(f,
              "{" + ok_entry + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
              eight);
    rejects("overlap");
  }
  SECTION("hole in the buffer") {
    write_raw(f, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight);
    rejects("hole in the data buffer: bytes [0, 4)");
  }
  SECTION("truncated data") {
    write_raw(f, "{" + ok_entry + "}", "1234");
    rejects("truncated");
  }
  SECTION("trailing bytes") {
    write_raw(f, "{" + ok_entry + "}", eight + "zz");
    rejects("2 trailing bytes");
  }
  SECTION("duplicate tensor names") {
    write_raw(f,
              "{" + ok_entry + R"(,"a":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})",
              eight);
    rejects("duplicate tensor name 'a'");
  }
  SECTION("duplicate field inside an entry") {
    write_raw(f, R"({"a":{"dtype":"F32","dtype":"F64","shape":[2],"data_offsets":[0,8]}})", eight);
    rejects("duplicate header key 'dtype'");
  }
  SECTION("metadata must be strings") {
    write_raw(f, R"({"__metadata__":{"format":"pt","n":3}})", "");
    rejects("\"__metadata__\" value of 'n' must be a string");
  }
  SECTION("a real file cut short") {
    write_safetensors(f, sample_tensors());
    fs::resize_file(f, fs::file_size(f) - 1);
    rejects("truncated");
  }
}

TEST_CASE("safetensors writer rejects bad input and leaves the old file", "[core]") {
  TempDir dir;
  const std::string f = dir / "w.safetensors";
  const Tensor t = Tensor::zeros({2});
  write_safetensors(f, {{"keep", t}});

  REQUIRE_THROWS_WITH(write_safetensors(f, {{"a", t}, {"b", t}, {"a", t}}),
                      Contains(f) && Contains("duplicate tensor name 'a'"));
  REQUIRE_THROWS_WITH(write_safetensors(f, {{"__metadata__", t}}),
                      Contains(f) && Contains("reserved"));
  REQUIRE_THROWS_WITH(write_safetensors(f, {{"u", Tensor()}}), Contains(f) && Contains("undefined"));
  REQUIRE_THROWS_WITH(write_safetensors(dir / "nodir/x.safetensors", {{"a", t}}),
                      Contains(dir / "nodir/x.safetensors"));

  const auto back = read_safetensors(f);
  REQUIRE(back.size() == 1);
  CHECK(back[0].name == "keep");
  CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 1);
}

TEST_CASE("safetensors metadata can override format", "[core]") {
  TempDir dir;
  write_safetensors(dir / "m.safetensors", {}, {{"format", "mlx"}, {"k", "v"}});
  const auto m = read_safetensors_metadata(dir / "m.safetensors");
  CHECK(m.at("format") == "mlx");
  CHECK(m.at("k") == "v");
}
