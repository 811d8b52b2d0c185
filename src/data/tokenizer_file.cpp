#include "data/tokenizer_file.h"

#include <filesystem>

#include "core/error.h"

namespace attnres::data {

namespace fs = std::filesystem;

BpeTokenizer open_tokenizer(const std::string& path, const std::string& what) {
  if (path.empty()) fail(what, ": no tokenizer given");
  if (!fs::exists(path)) fail(what, ": tokenizer '", path, "' not found");
  return BpeTokenizer::load(path);
}

std::vector<std::string> checkpoint_tokenizer_files(const std::string& dir) {
  const fs::path p = fs::path(dir) / "tokenizer.json";
  if (fs::is_regular_file(p)) return {p.string()};
  return {};
}

std::string tokenizer_format(const std::string& path) {
  // Opening validates the whole file: a format name is only given for a file
  // that the binary itself can read.
  const BpeTokenizer t = open_tokenizer(path, "tokenizer_format");
  return t.pre_tokenizer() == PreTokenizer::Gpt2 ? "gpt2-byte-level-bpe" : "attnres-bpe";
}

}  // namespace attnres::data
