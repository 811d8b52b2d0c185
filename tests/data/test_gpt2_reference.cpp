// GPT-2's real vocabulary against the reference encoder: tiktoken's "gpt2"
// encoding (npm tiktoken 1.0.22, the WebAssembly build of the Rust core that
// Python's tiktoken runs, and with which llm.c makes its GPT-2 shards), run
// with node by tiktoken_reference.js.
//
// Needs data/gpt2/ with data/gpt2/tiktoken/ (scripts/fetch_gpt2.sh),
// data/brown/raw/ (scripts/fetch_brown.sh) and node; scripts/test.sh provides
// all three. Without them each test prints "skipped: ..." and CTest reports it
// skipped. The tests are hidden ([.gpt2_reference]) from the default run and
// registered as CTest tests of their own, one per case (tests/CMakeLists.txt).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "data/bpe.h"
#include "data/corpus.h"
#include "temp_dir.h"

using namespace attnres;
using namespace attnres::data;
using namespace attnres::testing;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kSource = ATTNRES_SOURCE_DIR;
const std::string kGpt2Dir = kSource + "/data/gpt2";
const std::string kBrownDir = kSource + "/data/brown/raw";
const std::string kTiktoken = kGpt2Dir + "/tiktoken";
const std::string kScript = kSource + "/tests/data/tiktoken_reference.js";

// Why the reference can't run here, or "" when it can.
std::string missing_reference(bool need_brown) {
  for (const char* f : {"encoder.json", "vocab.bpe", "tiktoken/tiktoken.cjs", "tiktoken/tiktoken_bg.wasm"})
    if (!fs::exists(kGpt2Dir + "/" + f))
      return kGpt2Dir + "/" + f + " is missing (scripts/fetch_gpt2.sh fetches it)";
  if (need_brown && !fs::exists(kBrownDir + "/ca01"))
    return "the Brown corpus is missing from " + kBrownDir + " (scripts/fetch_brown.sh fetches it)";
  if (std::system("node --version >/dev/null 2>&1") != 0) return "node is not installed";
  return "";
}

#define SKIP_WITHOUT_REFERENCE(need_brown)                      \
  do {                                                          \
    const std::string why = missing_reference(need_brown);      \
    if (!why.empty()) {                                         \
      std::cout << "skipped: " << why << std::endl;             \
      return;                                                   \
    }                                                           \
  } while (0)

const BpeTokenizer& gpt2() {
  static const BpeTokenizer tok = BpeTokenizer::load(kGpt2Dir);
  return tok;
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// Bytes as a JSON string for messages (a token may be part of a character).
std::string show(const std::string& bytes) {
  return json(bytes).dump(-1, ' ', false, json::error_handler_t::replace);
}

// tiktoken's ids for each text (valid UTF-8 only: it takes JavaScript
// strings).
// `mode` is tiktoken_reference.js's: "ordinary", "all" or "default" (where
// a refused text gives null, returned as std::nullopt).
std::vector<std::optional<std::vector<int32_t>>> reference_ids_in(const std::vector<std::string>& texts,
                                                                  const std::string& mode) {
  TempDir dir;
  write_bytes(dir.file("texts.json"), json(texts).dump());
  const std::string cmd = "node " + quoted(kScript) + " " + quoted(kTiktoken) + " " + mode + " < " +
                          quoted(dir.file("texts.json")) + " > " + quoted(dir.file("ids.json"));
  REQUIRE(std::system(cmd.c_str()) == 0);
  const json j = json::parse(read_bytes(dir.file("ids.json")));
  REQUIRE(j.size() == texts.size());
  std::vector<std::optional<std::vector<int32_t>>> ids;
  for (const json& x : j)
    ids.push_back(x.is_null() ? std::nullopt : std::optional(x.get<std::vector<int32_t>>()));
  return ids;
}

std::vector<std::vector<int32_t>> reference_ids(const std::vector<std::string>& texts) {
  std::vector<std::vector<int32_t>> out;
  for (auto& ids : reference_ids_in(texts, "ordinary")) {
    REQUIRE(ids.has_value());
    out.push_back(std::move(*ids));
  }
  return out;
}

// Compares our ids with the reference's for every text; reports the first
// few differences with the text around them. Returns how many texts differ.
size_t compare_with_reference(const std::vector<std::string>& texts, const std::vector<std::string>& names) {
  const auto want = reference_ids(texts);
  size_t differ = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<int32_t> got = gpt2().encode(texts[i]);
    if (got == want[i]) continue;
    if (++differ > 5) continue;
    size_t k = 0;
    while (k < got.size() && k < want[i].size() && got[k] == want[i][k]) ++k;
    auto around = [&](const std::vector<int32_t>& ids) {
      std::string s;
      for (size_t j = k >= 3 ? k - 3 : 0; j < std::min(ids.size(), k + 4); ++j)
        s += (j == k ? "[" : "") + std::to_string(ids[j]) + "=" + show(gpt2().token_bytes(ids[j])) +
             (j == k ? "] " : " ");
      return s;
    };
    UNSCOPED_INFO(names[i] << ": first difference at token " << k << "\n  ours:      " << around(got)
                           << "\n  reference: " << around(want[i]));
  }
  return differ;
}

// Text pieces that stress the pre-tokenizer and BPE: every kind of space
// (each engine's \s and near misses), contractions, letters and numbers of
// many scripts, combining marks, emoji sequences, punctuation, controls.
const std::vector<std::string> kPool = {
    "a", "e", "t", "s", "T", "I", "x", "the", " the", "The", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d",
    "'S", "'", "''", "\"", " ", " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", "\r", "\v", "\f",
    "\u00a0", "\u1680", "\u2000", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000",
    "\ufeff", "\u0085", "\u200b", "\u180e", "\u2060", "0", "7", "42", "1999", "3.14", "1,000",
    "\u0663\u0664", "\u00b2", "\u00bd", "\u216b", "\u0967", "\U0001d7d8", "\u2460", "\u00e9", "\u00df",
    "\u0416", "\u03c9", "\u65e5\u672c", "\u30a2", "\ud55c", "\u0639\u0631\u0628", "\u0939\u093f",
    "\u0301", "\U0001d400", "\U00010330", "!", ".", ",", "-", "(", ")", "$", "_", "@", "#", "...",
    "\u2026", "\u2014", "\u00ab", "\u201e", "\u3002", "\uff0c", "\U0001f600", "\U0001f44d",
    "\U0001f3fd", "\u200d", "\U0001f1eb\U0001f1f7", "\x01", "\x1f", "\x7f", std::string(1, '\0'),
    "<|endoftext|>", "caf\u00e9", "na\u00efve", "\u041c\u043e\u0441\u043a\u0432\u0430",
    "\u4e2d\u6587", "e\u0301", "http://x.org/a?b=c&d", "C++", "},\"", "\",\"", "[\"a\",", "\\n"};

// Every character some engine calls a space (Unicode White_Space, which
// tiktoken's \s is; JavaScript's \s, which adds U+FEFF; Python re's, which
// adds U+001C..U+001F) and near misses (format characters that are not), each
// after and before every kind of neighbour: the place where engines' \s
// disagree shows as a different split.
std::vector<std::string> space_contexts() {
  const std::vector<std::string> spaces = {
      "\t", "\n", "\v", "\f", "\r", " ", "\u0085", "\u00a0", "\u1680", "\u2000", "\u2001", "\u2002",
      "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a", "\u2028", "\u2029",
      "\u202f", "\u205f", "\u3000", "\ufeff", "\x1c", "\x1d", "\x1e", "\x1f", "\u180e", "\u200b",
      "\u200c", "\u200d", "\u2060", "\r\n"};
  const std::vector<std::string> before = {"", "a", " ", "  ", "7", ".", "\n", "\u00e9", "\u65e5", "'"};
  const std::vector<std::string> after = {"", "b", " ", "  ", "8", ",", "\n", "\u00e9", "\u65e5", "'s", "\U0001f600"};
  std::vector<std::string> t;
  for (const auto& sp : spaces)
    for (const auto& b : before)
      for (const auto& a : after) {
        t.push_back(b + sp + a);
        t.push_back(b + sp + sp + a);
        t.push_back(b + " " + sp + a);  // a space right after an ASCII space
        t.push_back(b + sp + " " + a);
      }
  return t;
}

std::vector<std::string> tricky_texts() {
  std::vector<std::string> t = {
      "Hello world", "Hello, world!", "it's I'm we'll they're you've he'd don't DON'T It'S rock 'n' roll",
      "  leading", "trailing   ", "a  b   c    d", "\n\n\nx", "x\n\n", "a\r\nb\r\n\r\nc", "\t\tindent",
      " \t \n x", "x \u00a0y", "\u00a0\u00a0x", "a\u2028b", "\u3000\u3000\u65e5\u672c", "a\ufeffb",
      "\ufeff\ufeff x", "a\u0085b", "a\u200bb", "\u2000\u2001\u200a x",
      "caf\u00e9 na\u00efve r\u00e9sum\u00e9", "\u00c6r\u00f8sk\u00f8bing Z\u00fcrich",
      "\u041c\u043e\u0441\u043a\u0432\u0430 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac",
      "\u05e2\u05d1\u05e8\u05d9\u05ea \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0661\u0662\u0663",
      "\u0939\u093f\u0928\u094d\u0926\u0940", "e\u0301te\u0301", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
      "\u4e2d\u6587\uff0c\u6807\u70b9\u3002", "\ud55c\uad6d\uc5b4", "\u0e44\u0e17\u0e22",
      "1234567890 3.14159 1,000,000", "x\u00b2 + y\u00b3 = \u00bd", "\u216b \u2460\u2461 \U0001d7d8\U0001d7d9",
      "\u0967\u0968\u0969", "\U0001f600\U0001f603 smile", "\U0001f44d\U0001f3fd",
      "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\U0001f1eb\U0001f1f7", "emoji\U0001f600word",
      "$100 #hashtag @user a---b ... !!! C++ & C# foo_bar x=y+z*2", "\"quoted\" (parens) [1,2,3] {\"a\": 1}",
      "<|endoftext|>", "\x01\x02\x1f", "a\x7f" "b", "tab\there", "\v\f", std::string("nul\0byte", 8),
      "\U0001d400\U0001d401 \U00010330\U00010331", std::string(1000, ' ') + "x", std::string(300, '\n'),
      std::string(2000, 'a'), "\",\" },\" ],\" ),\" \"],\" ',\" .\",\" ,\" .,\" ],[ ','",
  };
  for (auto& c : space_contexts()) t.push_back(std::move(c));
  for (uint64_t seed = 0; seed < 400; ++seed) {
    std::string s;
    const uint64_t n = 1 + random_u64(seed, 1, 0) % 40;
    for (uint64_t i = 0; i < n; ++i) s += kPool[random_u64(seed, 2, i) % kPool.size()];
    t.push_back(s);
  }
  return t;
}

}  // namespace

TEST_CASE("GPT-2 ids equal tiktoken's on every Brown document", "[.gpt2_reference]") {
  SKIP_WITHOUT_REFERENCE(true);
  const auto files = list_corpus_files({kBrownDir}, CorpusFormat::Brown);
  REQUIRE(files.size() == 500);  // the whole corpus, so that this can't pass on a part
  std::vector<std::string> docs, names;
  size_t bytes = 0;
  for (const auto& f : files) {
    docs.push_back(read_document(f, CorpusFormat::Brown));
    names.push_back(fs::path(f).filename().string());
    bytes += docs.back().size();
  }
  CHECK(bytes > 5'000'000);
  CHECK(compare_with_reference(docs, names) == 0);
  for (const auto& d : docs) CHECK(gpt2().decode(gpt2().encode(d)) == d);
}

TEST_CASE("GPT-2 ids equal tiktoken's on texts with every kind of space, letter and digit",
          "[.gpt2_reference]") {
  SKIP_WITHOUT_REFERENCE(false);
  const auto texts = tricky_texts();
  std::vector<std::string> names;
  for (size_t i = 0; i < texts.size(); ++i) names.push_back("text " + std::to_string(i) + " " + show(texts[i]));
  CHECK(compare_with_reference(texts, names) == 0);
  for (const auto& t : texts) CHECK(gpt2().decode(gpt2().encode(t)) == t);
  // A few ids anyone can check against tiktoken's "gpt2" encoding.
  CHECK(gpt2().eot() == 50256);
  CHECK(gpt2().vocab_size() == 50257);
  CHECK(gpt2().encode("Hello world") == std::vector<int32_t>{15496, 995});
}

TEST_CASE("GPT-2's vocabulary round-trips any bytes, invalid UTF-8 included", "[.gpt2_reference]") {
  SKIP_WITHOUT_REFERENCE(false);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const size_t n = 1 + random_u64(seed, 3, 0) % 300;
    std::string s(n, '\0');
    for (size_t i = 0; i < n; ++i) {
      const uint64_t r = random_u64(seed, 4, i);
      // Mix arbitrary bytes with UTF-8 lead/continuation bytes and text.
      s[i] = r % 3 == 0 ? static_cast<char>(0x80 | (r >> 8) % 0x80) : r % 3 == 1 ? static_cast<char>(r >> 16)
                                                                                    : "a b\n'e"[(r >> 24) % 6];
    }
    const auto ids = gpt2().encode(s);
    CHECK(gpt2().decode(ids) == s);
    for (int32_t id : ids) CHECK(id != gpt2().eot());
  }
}

TEST_CASE("GPT-2's files written as one tokenizer.json encode identically", "[.gpt2_reference]") {
  SKIP_WITHOUT_REFERENCE(false);
  TempDir dir;
  write_bytes(dir.file("tokenizer.json"), self_contained_tokenizer(kGpt2Dir + "/encoder.json"));
  const BpeTokenizer one = BpeTokenizer::load(dir.file("tokenizer.json"));
  REQUIRE(one.vocab_size() == gpt2().vocab_size());
  CHECK(one.eot() == gpt2().eot());
  CHECK(one.merges() == gpt2().merges());
  for (int32_t id = 0; id < one.vocab_size(); ++id) REQUIRE(one.token_bytes(id) == gpt2().token_bytes(id));
  for (const auto& t : tricky_texts()) CHECK(one.encode(t) == gpt2().encode(t));
  // The JSON is Hugging Face's: the vocabulary spelled in GPT-2's alphabet.
  const json j = json::parse(read_bytes(dir.file("tokenizer.json")));
  CHECK(j["model"]["vocab"]["\u0120the"] == 262);
  CHECK(j["model"]["merges"][0] == "\u0120 t");
}

TEST_CASE("<|endoftext|> in text as tiktoken treats it: as text, allowed, or refused", "[.gpt2_reference]") {
  SKIP_WITHOUT_REFERENCE(false);
  const std::string eot = "<|endoftext|>";
  const std::vector<std::string> texts = {
      eot, "a" + eot, eot + "b", "Hello" + eot + " world", " " + eot + " ", eot + eot, "x" + eot + "\n" + eot + "y",
      "<|endoftext|", "<|endoftext", "|>" + eot + "<|", "no special here", "caf\u00e9" + eot + "\u65e5\u672c"};
  const auto allowed = reference_ids_in(texts, "all");
  const auto refused = reference_ids_in(texts, "default");
  const auto ordinary = reference_ids_in(texts, "ordinary");
  for (size_t i = 0; i < texts.size(); ++i) {
    INFO("text " << show(texts[i]));
    REQUIRE(allowed[i].has_value());
    CHECK(gpt2().encode(texts[i], Specials::Allow) == *allowed[i]);
    CHECK(gpt2().encode(texts[i], Specials::Text) == *ordinary[i]);
    if (refused[i]) {
      CHECK(gpt2().encode(texts[i], Specials::Refuse) == *refused[i]);
    } else {
      CHECK_THROWS_WITH(gpt2().encode(texts[i], Specials::Refuse), Catch::Contains("special token <|endoftext|>"));
    }
  }
}

// The texts above (tricky_texts(): about 16,300) for a test outside this
// binary: tests/cli/hf_tokenizer.sh (ATTNRES_TEST_PART=tokenizers) compares
// Hugging Face's tokenizers library on an export's tokenizer.json with
// `attnres tokenize encode` on them. Writes them as one JSON array of strings
// (all valid UTF-8) to the file $ATTNRES_GPT2_TEXTS_OUT. Hidden ([.gpt2_texts]):
// not a test of its own; run by that script as `test_data "[.gpt2_texts]"`.
TEST_CASE("GPT-2's hard texts written out for other tests", "[.gpt2_texts]") {
  const char* out = std::getenv("ATTNRES_GPT2_TEXTS_OUT");
  REQUIRE(out != nullptr);
  const auto texts = tricky_texts();
  write_bytes(out, json(texts).dump());
  std::cout << texts.size() << " texts written to " << out << std::endl;
}
