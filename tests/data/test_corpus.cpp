#include <catch2/catch.hpp>
#include <filesystem>

#include <omp.h>

#include "data/corpus.h"
#include "data/shard.h"
#include "temp_dir.h"

using namespace attnres;
using namespace attnres::data;
using attnres::testing::TempDir;
using attnres::testing::write_bytes;
using Catch::Contains;

namespace {

std::vector<int32_t> read_shard(const std::string& path) {
  MappedShard m(path);
  std::vector<int32_t> out(static_cast<size_t>(m.size()));
  m.read(0, Span<int32_t>(out.data(), out.size()));
  return out;
}

}  // namespace

TEST_CASE("list_corpus_files expands directories and skips non-documents", "[data]") {
  TempDir dir;
  std::filesystem::create_directory(dir.file("brown"));
  for (const char* name : {"cb02", "ca01", "README", "CONTENTS", "cats.txt", "x.pickle", "package.json", ".hidden"})
    write_bytes(dir.file("brown/") + name, "w/t");
  std::filesystem::create_directory(dir.file("brown/subdir"));
  write_bytes(dir.file("single.txt"), "hello");

  CHECK(list_corpus_files({dir.file("brown")}, CorpusFormat::Brown) ==
        std::vector<std::string>{dir.file("brown/ca01"), dir.file("brown/cb02")});
  const auto text_files = list_corpus_files({dir.file("single.txt"), dir.file("brown")}, CorpusFormat::Text);
  CHECK(text_files.size() == 8);  // single.txt + 7 non-hidden files
  CHECK(text_files.front() == dir.file("single.txt"));

  REQUIRE_THROWS_WITH(list_corpus_files({dir.file("nope")}, CorpusFormat::Text), Contains("nope"));
  std::filesystem::create_directory(dir.file("empty"));
  REQUIRE_THROWS_WITH(list_corpus_files({dir.file("empty")}, CorpusFormat::Text), Contains("empty"));
  CHECK(parse_corpus_format("brown") == CorpusFormat::Brown);
  REQUIRE_THROWS_WITH(parse_corpus_format("xml"), Contains("xml"));
}

TEST_CASE("encode_corpus writes EOT-separated shards with a validation tail", "[data]") {
  TempDir dir;
  std::vector<std::string> docs, files;
  for (int i = 0; i < 10; ++i) {
    docs.push_back("Document number " + std::to_string(i) + " says hello to the world, again and again.");
    files.push_back(dir.file("doc" + std::to_string(i) + ".txt"));
    write_bytes(files.back(), docs.back());
  }
  const BpeTokenizer tok = BpeTokenizer::train(docs, 300);
  EncodeOptions opt;
  opt.output_dir = dir.file("out");
  opt.name = "tiny";
  opt.val_fraction = 0.2;
  opt.shard_tokens = 50;
  // A stale shard from an earlier, bigger run must disappear.
  std::filesystem::create_directories(opt.output_dir);
  write_shard(dir.file("out/tiny_train_000099.bin"), std::vector<int32_t>{1}, 2);

  const EncodeSummary s = encode_corpus(tok, files, CorpusFormat::Text, opt);
  CHECK(s.documents == 10);
  CHECK(s.train_documents == 8);
  CHECK(s.val_documents == 2);
  CHECK(s.token_bytes == 2);
  CHECK_FALSE(std::filesystem::exists(dir.file("out/tiny_train_000099.bin")));
  REQUIRE(s.val_shards.front() == dir.file("out/tiny_val_000000.bin"));
  REQUIRE(s.train_shards.front() == dir.file("out/tiny_train_000000.bin"));

  auto gather = [&](const std::vector<std::string>& shards, int64_t expected_total) {
    std::vector<int32_t> all;
    for (size_t i = 0; i < shards.size(); ++i) {
      auto t = read_shard(shards[i]);
      if (i + 1 < shards.size()) CHECK(t.size() == 50);  // full shards, remainder last
      CHECK(t.size() <= 50);
      all.insert(all.end(), t.begin(), t.end());
    }
    CHECK(static_cast<int64_t>(all.size()) == expected_total);
    return all;
  };
  const auto train = gather(s.train_shards, s.train_tokens);
  const auto val = gather(s.val_shards, s.val_tokens);
  CHECK(resolve_data_spec(dir.file("out/tiny_train_*.bin"), "data.train") == s.train_shards);

  auto expected = [&](int from, int to) {
    std::string text;
    for (int i = from; i < to; ++i) text += "<|endoftext|>" + docs[i];
    return text;
  };
  CHECK(train.front() == tok.eot());
  CHECK(tok.decode(train) == expected(0, 8));
  CHECK(tok.decode(val) == expected(8, 10));

  opt.val_fraction = 1.0;
  REQUIRE_THROWS_WITH(encode_corpus(tok, files, CorpusFormat::Text, opt), Contains("val fraction"));
}

TEST_CASE("encode_corpus's validation split is round(val_fraction x documents), at least one", "[data]") {
  // Each case is one where another rounding gives another count: truncation
  // (1.9 -> 1), the ceiling (1.4 -> 2), no minimum (0.19 -> 0), no cap (the
  // last document always trains).
  TempDir dir;
  auto val_documents = [&](int documents, double fraction) {
    std::vector<std::string> docs, files;
    for (int i = 0; i < documents; ++i) {
      docs.push_back("Document " + std::to_string(i) + " of " + std::to_string(documents) + ".");
      files.push_back(dir.file("d" + std::to_string(documents) + "_" + std::to_string(i) + ".txt"));
      write_bytes(files.back(), docs.back());
    }
    EncodeOptions opt;
    opt.output_dir = dir.file("out");
    opt.val_fraction = fraction;
    const EncodeSummary s = encode_corpus(BpeTokenizer::train(docs, 300), files, CorpusFormat::Text, opt);
    CHECK(s.train_documents + s.val_documents == documents);
    return s.val_documents;
  };
  CHECK(val_documents(19, 0.1) == 2);   // 1.9
  CHECK(val_documents(10, 0.14) == 1);  // 1.4
  CHECK(val_documents(19, 0.01) == 1);  // 0.19: at least one
  CHECK(val_documents(2, 0.9) == 1);    // 1.8, but one document must train
  CHECK(val_documents(1, 0.5) == 0);    // a single document trains
}

TEST_CASE("encode_corpus writes the same shards on any number of threads", "[data]") {
  TempDir dir;
  std::vector<std::string> docs, files;
  for (int i = 0; i < 40; ++i) {  // documents of unequal lengths, so threads finish out of order
    std::string d;
    for (int k = 0; k <= (i * 7) % 23; ++k) d += "word" + std::to_string(i * k) + " and more text. ";
    docs.push_back(d);
    files.push_back(dir.file("doc" + std::to_string(i) + ".txt"));
    write_bytes(files.back(), d);
  }
  const BpeTokenizer tok = BpeTokenizer::train(docs, 400);
  auto shards_with = [&](int threads) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    EncodeOptions opt;
    opt.output_dir = dir.file("out" + std::to_string(threads));
    opt.val_fraction = 0.1;
    opt.shard_tokens = 300;
    const EncodeSummary s = encode_corpus(tok, files, CorpusFormat::Text, opt);
    omp_set_num_threads(before);
    CHECK(s.threads == threads);
    std::vector<std::vector<int32_t>> out;
    for (const auto& p : s.train_shards) out.push_back(read_shard(p));
    for (const auto& p : s.val_shards) out.push_back(read_shard(p));
    return out;
  };
  const auto one = shards_with(1);
  REQUIRE(one.size() > 2);
  CHECK(shards_with(2) == one);
  CHECK(shards_with(5) == one);
}
