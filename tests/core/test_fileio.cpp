#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "temp_dir.h"

#include "core/fileio.h"
#include "core/rng.h"

using namespace attnres;
namespace fs = std::filesystem;

using attnres::testing::TempDir;

namespace {


std::vector<unsigned char> random_bytes(size_t n, uint64_t seed) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(random_u64(seed, 3, i));
  return v;
}

}  // namespace

TEST_CASE("xxh64 matches the reference test vectors", "[core]") {
  auto h = [](const std::string& s, uint64_t seed = 0) { return xxh64(s.data(), s.size(), seed); };
  CHECK(h("") == 0xEF46DB3751D8E999ull);
  CHECK(h("abc") == 0x44BC2CF5AD770999ull);
  // 39 bytes: one full 32-byte stripe plus an 8-, 4- and 1-byte tail.
  CHECK(h("Nobody inspects the spammish repetition") == 0xFBCEA83C8A378BF1ull);
  CHECK(h("The quick brown fox jumps over the lazy dog") == 0x0B242D361FDA71BCull);
  CHECK(h(std::string(32, 'a')) == 0x856E843298F99AD7ull);  // exactly one stripe
  CHECK(h("abc", 1) != h("abc", 0));
  CHECK(hex64(0xEF46DB3751D8E999ull) == "ef46db3751d8e999");
  CHECK(hex64(0x1ull) == "0000000000000001");
}

TEST_CASE("xxh64 streaming equals one-shot for any split", "[core]") {
  const auto data = random_bytes(1000, 1);
  const uint64_t want = xxh64(data.data(), data.size());
  for (size_t chunk : {1, 3, 7, 31, 32, 33, 64, 100, 999}) {
    Xxh64 s;
    for (size_t i = 0; i < data.size(); i += chunk) s.update(data.data() + i, std::min(chunk, data.size() - i));
    CHECK(s.digest() == want);
  }
  // digest() does not disturb the state.
  Xxh64 s;
  s.update(data.data(), 500);
  (void)s.digest();
  s.update(data.data() + 500, 500);
  CHECK(s.digest() == want);
}

TEST_CASE("xxh64_file hashes the file's bytes", "[core]") {
  TempDir dir;
  // Larger than the 4 MiB read block, so several reads feed the hash.
  const auto data = random_bytes((size_t{9} << 20) + 13, 2);
  write_file_atomic(dir / "blob", data.data(), data.size());
  uint64_t size = 0;
  CHECK(xxh64_file(dir / "blob", &size) == xxh64(data.data(), data.size()));
  CHECK(size == data.size());
  CHECK(file_size(dir / "blob") == data.size());
  REQUIRE_THROWS_WITH(xxh64_file(dir / "nope"),
                      Catch::Contains(dir / "nope") && Catch::Contains("No such file"));
}

TEST_CASE("atomic text writes replace the file and leave no temporaries", "[core]") {
  TempDir dir;
  const std::string f = dir / "a.json";
  write_text_file_atomic(f, "first\n");
  CHECK(read_text_file(f) == "first\n");
  write_text_file_atomic(f, std::string("sec\0ond", 7));
  CHECK(read_text_file(f) == std::string("sec\0ond", 7));
  write_text_file_atomic(f, "");
  CHECK(read_text_file(f).empty());
  CHECK(dir.entries() == 1);  // only a.json: the hidden temp file was renamed away
}

TEST_CASE("AtomicFileWriter without commit leaves nothing", "[core]") {
  TempDir dir;
  const std::string f = dir / "x.bin";
  write_text_file_atomic(f, "old");
  try {
    AtomicFileWriter w(f);
    w.write("new content");
    CHECK(fs::exists(w.temp_path()));
    throw std::runtime_error("simulated failure mid-write");
  } catch (const std::runtime_error&) {
  }
  CHECK(read_text_file(f) == "old");  // the final name never saw a partial write
  CHECK(dir.entries() == 1);
}

TEST_CASE("file helpers name the file in their errors", "[core]") {
  TempDir dir;
  REQUIRE_THROWS_WITH(read_text_file(dir / "missing.txt"),
                      Catch::Contains(dir / "missing.txt") && Catch::Contains("No such file"));
  REQUIRE_THROWS_WITH(read_text_file(dir.path()), Catch::Contains(dir.path()) && Catch::Contains("directory"));
  REQUIRE_THROWS_WITH(write_text_file_atomic(dir / "no/such/dir/f.txt", "x"),
                      Catch::Contains(dir / "no/such/dir/f.txt"));
  REQUIRE_THROWS_WITH(file_size(dir / "missing.bin"), Catch::Contains(dir / "missing.bin"));
}

TEST_CASE("parent_dir", "[core]") {
  CHECK(parent_dir("a/b/c.txt") == "a/b");
  CHECK(parent_dir("/x/y/") == "/x");
  CHECK(parent_dir("c.txt") == ".");
  CHECK(parent_dir("/c.txt") == "/");
}

// Not run by default ([.]): `./tests/test_core "[.bench]"` prints throughput.
TEST_CASE("xxh64 throughput", "[.bench]") {
  const auto data = random_bytes(size_t{512} << 20, 4);
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t h = xxh64(data.data(), data.size());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN("xxh64: " << data.size() / s / 1e9 << " GB/s (hash " << hex64(h) << ")");
}
