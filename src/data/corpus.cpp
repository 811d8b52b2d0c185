#include "data/corpus.h"

#include <omp.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <system_error>

#include "core/error.h"
#include "data/brown.h"
#include "core/fileio.h"
#include "data/shard.h"

namespace fs = std::filesystem;

namespace attnres::data {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool skip_in_directory(const std::string& name, CorpusFormat format) {
  if (name.empty() || name[0] == '.') return true;
  if (format == CorpusFormat::Brown)
    return name == "README" || name == "CONTENTS" || name == "cats.txt" || name == "package.json" ||
           ends_with(name, ".pickle");
  return false;
}

std::string shard_name(const std::string& dir, const std::string& name, const char* split, int index) {
  char num[16];
  std::snprintf(num, sizeof num, "%06d", index);
  return (fs::path(dir) / (name + "_" + split + "_" + num + ".bin")).string();
}

// Accumulates one split's tokens and cuts them into shards of shard_tokens.
class ShardSink {
 public:
  ShardSink(const EncodeOptions& opt, const char* split, int token_bytes, std::vector<std::string>& written)
      : opt_(opt), split_(split), token_bytes_(token_bytes), written_(written) {}

  void append(const std::vector<int32_t>& ids) {
    buffer_.insert(buffer_.end(), ids.begin(), ids.end());
    total_ += static_cast<int64_t>(ids.size());
    while (static_cast<int64_t>(buffer_.size()) >= opt_.shard_tokens) write(opt_.shard_tokens);
  }
  void finish() {
    if (!buffer_.empty()) write(static_cast<int64_t>(buffer_.size()));
  }
  int64_t total() const { return total_; }

 private:
  void write(int64_t n) {
    const std::string path = shard_name(opt_.output_dir, opt_.name, split_, static_cast<int>(written_.size()));
    write_shard(path, Span<const int32_t>(buffer_.data(), static_cast<size_t>(n)), token_bytes_);
    spdlog::info("wrote {} ({} tokens)", path, n);
    written_.push_back(path);
    buffer_.erase(buffer_.begin(), buffer_.begin() + n);
  }

  const EncodeOptions& opt_;
  const char* split_;
  int token_bytes_;
  std::vector<std::string>& written_;
  std::vector<int32_t> buffer_;
  int64_t total_ = 0;
};

}  // namespace

CorpusFormat parse_corpus_format(const std::string& name) {
  if (name == "text") return CorpusFormat::Text;
  if (name == "brown") return CorpusFormat::Brown;
  fail("unknown corpus format '", name, "' (expected text or brown)");
}

std::vector<std::string> list_corpus_files(const std::vector<std::string>& inputs, CorpusFormat format) {
  if (inputs.empty()) fail("no input paths given");
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(input, ec);
    if (ec || !fs::exists(st)) fail("input '", input, "': no such file or directory");
    if (fs::is_directory(st)) {
      std::vector<std::string> inside;
      for (const fs::directory_entry& e : fs::directory_iterator(input, ec)) {
        const std::string name = e.path().filename().string();
        if (skip_in_directory(name, format)) continue;
        std::error_code ec2;
        if (e.is_regular_file(ec2)) inside.push_back(e.path().string());
      }
      if (ec) fail("input '", input, "': cannot read directory: ", ec.message());
      if (inside.empty()) fail("input '", input, "': directory holds no document files");
      std::sort(inside.begin(), inside.end());
      files.insert(files.end(), inside.begin(), inside.end());
    } else if (fs::is_regular_file(st)) {
      files.push_back(input);
    } else {
      fail("input '", input, "': not a regular file or directory");
    }
  }
  return files;
}

std::string read_document(const std::string& path, CorpusFormat format) {
  std::string raw = read_text_file(path);
  return format == CorpusFormat::Brown ? brown_to_text(raw) : raw;
}

EncodeSummary encode_corpus(const BpeTokenizer& tokenizer, const std::vector<std::string>& files,
                            CorpusFormat format, const EncodeOptions& opt) {
  if (opt.output_dir.empty()) fail("tokenize encode: no output directory given");
  if (opt.name.empty() || opt.name.find('/') != std::string::npos)
    fail("tokenize encode: bad corpus name '", opt.name, "' (must be non-empty, without '/')");
  if (!(opt.val_fraction >= 0.0 && opt.val_fraction < 1.0))
    fail("tokenize encode: val fraction must be in [0, 1), got ", opt.val_fraction);
  if (opt.shard_tokens < 1 || opt.shard_tokens > 2147483647)
    fail("tokenize encode: shard size must be in [1, 2147483647] tokens (llm.c's int32 count), got ",
         opt.shard_tokens);
  if (files.empty()) fail("tokenize encode: no documents");

  std::error_code ec;
  fs::create_directories(opt.output_dir, ec);
  if (ec) fail("output directory '", opt.output_dir, "': cannot create: ", ec.message());

  // Remember shards of this name already there: those not rewritten below are
  // stale (from a bigger earlier run) and would be picked up by a glob.
  std::set<std::string> old_shards;
  for (const fs::directory_entry& e : fs::directory_iterator(opt.output_dir, ec)) {
    const std::string fname = e.path().filename().string();
    if (ends_with(fname, ".bin") && (fname.rfind(opt.name + "_train_", 0) == 0 || fname.rfind(opt.name + "_val_", 0) == 0))
      old_shards.insert(e.path().string());
  }

  EncodeSummary s;
  s.documents = static_cast<int64_t>(files.size());
  int64_t n_val = static_cast<int64_t>(std::llround(opt.val_fraction * static_cast<double>(s.documents)));
  if (opt.val_fraction > 0 && n_val == 0 && s.documents >= 2) n_val = 1;
  n_val = std::min(n_val, s.documents - 1);  // keep at least one training document
  s.val_documents = n_val;
  s.train_documents = s.documents - n_val;
  s.token_bytes = tokenizer.vocab_size() <= 65536 ? 2 : 4;

  ShardSink train(opt, "train", s.token_bytes, s.train_shards);
  ShardSink val(opt, "val", s.token_bytes, s.val_shards);
  // Documents are read in batches (in order, up to kBatchBytes of text),
  // encoded on every thread, then written in order: the shards do not depend
  // on the thread count. A tokenizer's piece cache is not thread-safe, so
  // each thread encodes with its own copy.
  constexpr int64_t kBatchBytes = int64_t{64} << 20;
  s.threads = omp_get_max_threads();
  std::vector<BpeTokenizer> per_thread(static_cast<size_t>(s.threads), tokenizer);
  std::vector<std::string> docs;
  std::vector<std::vector<int32_t>> bodies;
  for (int64_t first = 0; first < s.documents;) {
    docs.clear();
    int64_t bytes = 0;
    while (first + static_cast<int64_t>(docs.size()) < s.documents && (docs.empty() || bytes < kBatchBytes)) {
      docs.push_back(read_document(files[static_cast<size_t>(first) + docs.size()], format));
      bytes += static_cast<int64_t>(docs.back().size());
    }
    bodies.assign(docs.size(), {});
    const auto t0 = std::chrono::steady_clock::now();
    const auto n = static_cast<int64_t>(docs.size());
    // An exception must not leave an OpenMP region: each document's error is
    // kept and the first (in document order) rethrown after it.
    std::vector<std::string> errors(docs.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<size_t>(i);
      try {
        bodies[k] = per_thread[static_cast<size_t>(omp_get_thread_num())].encode(docs[k], opt.specials);
      } catch (const std::exception& e) {
        errors[k] = e.what();
      }
    }
    for (size_t k = 0; k < errors.size(); ++k)
      if (!errors[k].empty()) fail("tokenize encode: ", files[static_cast<size_t>(first) + k], ": ", errors[k]);
    s.encode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.text_bytes += bytes;
    for (int64_t i = 0; i < n; ++i) {
      std::vector<int32_t> ids{tokenizer.eot()};
      ids.insert(ids.end(), bodies[static_cast<size_t>(i)].begin(), bodies[static_cast<size_t>(i)].end());
      (first + i < s.train_documents ? train : val).append(ids);
    }
    first += n;
  }
  train.finish();
  val.finish();
  s.train_tokens = train.total();
  s.val_tokens = val.total();

  for (const auto& p : s.train_shards) old_shards.erase(p);
  for (const auto& p : s.val_shards) old_shards.erase(p);
  for (const auto& p : old_shards) {
    spdlog::info("removing stale shard {}", p);
    fs::remove(p, ec);
  }
  return s;
}

}  // namespace attnres::data
