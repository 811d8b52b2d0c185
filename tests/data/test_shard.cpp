#include <catch2/catch.hpp>
#include <cstring>

#include "data/shard.h"
#include "temp_dir.h"

using namespace attnres;
using namespace attnres::data;
using namespace attnres::testing;
using Catch::Contains;

namespace {

// A raw shard image with an arbitrary header, for the rejection tests.
std::string raw_shard(int32_t magic, int32_t version, int32_t count, size_t payload_bytes) {
  std::string s(1024 + payload_bytes, '\0');
  int32_t h[3] = {magic, version, count};
  std::memcpy(s.data(), h, sizeof h);
  return s;
}

std::vector<int32_t> read_all(const MappedShard& m) {
  std::vector<int32_t> out(static_cast<size_t>(m.size()));
  m.read(0, Span<int32_t>(out.data(), out.size()));
  return out;
}

}  // namespace

TEST_CASE("shard round trip with uint16 tokens", "[data]") {
  TempDir dir;
  const std::string path = dir.file("a.bin");
  std::vector<int32_t> tokens = {0, 1, 65535, 50256, 7, 12345};
  write_shard(path, tokens, 2);

  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() == 1024 + tokens.size() * 2);
  int32_t header[256];
  std::memcpy(header, bytes.data(), 1024);
  CHECK(header[0] == 20240520);
  CHECK(header[1] == 1);
  CHECK(header[2] == 6);
  for (int i = 3; i < 256; ++i) CHECK(header[i] == 0);

  ShardInfo info = validate_shard(path);
  CHECK(info.path == path);
  CHECK(info.count == 6);
  CHECK(info.token_bytes == 2);

  MappedShard m(path);
  CHECK(read_all(m) == tokens);
  std::vector<int32_t> mid(3);
  m.read(2, Span<int32_t>(mid.data(), mid.size()));
  CHECK(mid == std::vector<int32_t>{65535, 50256, 7});
  REQUIRE_THROWS_WITH(m.read(4, Span<int32_t>(mid.data(), mid.size())), Contains("outside the shard"));

  // No temporary files are left behind.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) (void)e, ++files;
  CHECK(files == 1);
}

TEST_CASE("shard round trip with uint32 tokens", "[data]") {
  TempDir dir;
  const std::string path = dir.file("b.bin");
  std::vector<int32_t> tokens = {0, 65536, 100000, 2147483647, 3};
  write_shard(path, tokens, 4);
  ShardInfo info = validate_shard(path);
  CHECK(info.count == 5);
  CHECK(info.token_bytes == 4);
  const std::string bytes = read_bytes(path);
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof header);
  CHECK(header[0] == 20240801);
  CHECK(header[1] == 7);
  CHECK(bytes.size() == 1024 + 5 * 4);
  MappedShard m(path);
  CHECK(read_all(m) == tokens);

  // Moving a mapping keeps the data valid.
  MappedShard moved(std::move(m));
  CHECK(read_all(moved) == tokens);

  // An empty shard is legal.
  write_shard(dir.file("empty.bin"), std::vector<int32_t>{}, 4);
  CHECK(validate_shard(dir.file("empty.bin")).count == 0);
}

TEST_CASE("write_shard rejects ids that do not fit", "[data]") {
  TempDir dir;
  const std::string path = dir.file("c.bin");
  REQUIRE_THROWS_WITH(write_shard(path, std::vector<int32_t>{1, 65536}, 2),
                      Contains(path) && Contains("token 1") && Contains("uint16"));
  REQUIRE_THROWS_WITH(write_shard(path, std::vector<int32_t>{-1}, 4), Contains("id -1"));
  REQUIRE_THROWS_WITH(write_shard(path, std::vector<int32_t>{1}, 3), Contains("2 or 4"));
  CHECK_FALSE(std::filesystem::exists(path));
  // A failed write leaves no temporary file either.
  CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("malformed shards are rejected with the file and the problem", "[data]") {
  TempDir dir;
  const std::string p = dir.file("bad.bin");

  SECTION("missing file") {
    REQUIRE_THROWS_WITH(validate_shard(dir.file("nope.bin")), Contains("nope.bin") && Contains("cannot open"));
    REQUIRE_THROWS_WITH(MappedShard(dir.file("nope.bin")), Contains("nope.bin"));
  }
  SECTION("too short for a header") {
    write_bytes(p, std::string(100, '\0'));
    REQUIRE_THROWS_WITH(validate_shard(p), Contains(p) && Contains("too short"));
    write_bytes(p, "");
    REQUIRE_THROWS_WITH(validate_shard(p), Contains(p) && Contains("too short"));
  }
  SECTION("bad magic") {
    write_bytes(p, raw_shard(12345, 1, 0, 0));
    REQUIRE_THROWS_WITH(validate_shard(p), Contains(p) && Contains("bad magic"));
  }
  SECTION("bad version") {
    write_bytes(p, raw_shard(20240520, 7, 0, 0));
    REQUIRE_THROWS_WITH(validate_shard(p), Contains(p) && Contains("bad version"));
    write_bytes(p, raw_shard(20240801, 1, 0, 0));
    REQUIRE_THROWS_WITH(validate_shard(p), Contains(p) && Contains("bad version"));
  }
  SECTION("truncated") {
    write_bytes(p, raw_shard(20240520, 1, 10, 19));
    REQUIRE_THROWS_WITH(validate_shard(p), Contains(p) && Contains("truncated"));
    REQUIRE_THROWS_WITH(MappedShard(p), Contains(p) && Contains("truncated"));
  }
  SECTION("trailing garbage") {
    write_bytes(p, raw_shard(20240801, 7, 10, 41));
    REQUIRE_THROWS_WITH(validate_shard(p), Contains(p) && Contains("size mismatch") && Contains("trailing"));
  }
  SECTION("negative count") {
    write_bytes(p, raw_shard(20240520, 1, -4, 0));
    REQUIRE_THROWS_WITH(validate_shard(p), Contains(p) && Contains("negative"));
  }
  SECTION("a directory") {
    REQUIRE_THROWS_WITH(validate_shard(dir.path()), Contains(dir.path()));
  }
  SECTION("uint32 token beyond int32") {
    std::string s = raw_shard(20240801, 7, 2, 8);
    uint32_t big[2] = {5, 0x80000000u};
    std::memcpy(s.data() + 1024, big, sizeof big);
    write_bytes(p, s);
    MappedShard m(p);
    std::vector<int32_t> out(2);
    REQUIRE_THROWS_WITH(m.read(0, Span<int32_t>(out.data(), 2)), Contains(p) && Contains("too large"));
  }
}

TEST_CASE("resolve_data_spec: file, directory, glob, nothing", "[data]") {
  TempDir dir;
  std::filesystem::create_directory(dir.file("shards"));
  for (const char* name : {"shards/b_001.bin", "shards/a_000.bin", "shards/b_000.bin", "shards/notes.txt",
                           "shards/.hidden.bin"})
    write_shard(dir.file(name), std::vector<int32_t>{1, 2, 3}, 2);
  std::filesystem::create_directory(dir.file("shards/sub.bin"));  // a directory named *.bin is no shard

  const std::string a = dir.file("shards/a_000.bin");
  const std::string b0 = dir.file("shards/b_000.bin");
  const std::string b1 = dir.file("shards/b_001.bin");

  CHECK(resolve_data_spec(a, "data.train") == std::vector<std::string>{a});
  CHECK(resolve_data_spec(dir.file("shards"), "data.train") == std::vector<std::string>{a, b0, b1});
  CHECK(resolve_data_spec(dir.file("shards/"), "data.train") == std::vector<std::string>{a, b0, b1});
  CHECK(resolve_data_spec(dir.file("shards/b_*.bin"), "data.train") == std::vector<std::string>{b0, b1});
  CHECK(resolve_data_spec(dir.file("shards/*_00[0].bin"), "data.val") == std::vector<std::string>{a, b0});

  REQUIRE_THROWS_WITH(resolve_data_spec(dir.file("shards/c_*.bin"), "data.val"),
                      Contains("data.val") && Contains("c_*.bin") && Contains("matches no files"));
  REQUIRE_THROWS_WITH(resolve_data_spec(dir.file("missing.bin"), "data.train"),
                      Contains("data.train") && Contains("missing.bin") && Contains("no such file"));
  REQUIRE_THROWS_WITH(resolve_data_spec("", "data.train"), Contains("data.train"));
  std::filesystem::create_directory(dir.file("empty"));
  REQUIRE_THROWS_WITH(resolve_data_spec(dir.file("empty"), "data.train"),
                      Contains("data.train") && Contains("empty") && Contains("no *.bin"));
}
