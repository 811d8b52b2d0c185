// GPT-2-style tokenizers on small hand-made files: the byte alphabet, the
// regex pre-tokenizer, the three file forms (encoder.json + vocab.bpe, a
// directory, Hugging Face tokenizer.json), saving, and refused files. The
// real GPT-2 vocabulary against the reference encoder is in
// test_gpt2_reference.cpp.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "data/bpe.h"
#include "data/gpt2_files.h"
#include "data/gpt2_pretokenizer.h"
#include "temp_dir.h"

using namespace attnres;
using namespace attnres::data;
using namespace attnres::testing;
using Catch::Contains;
using nlohmann::json;

namespace {

std::vector<std::string> pieces(std::string_view text) {
  static const Gpt2PreTokenizer pre;
  std::vector<std::string_view> out;
  pre.split(text, out);
  return std::vector<std::string>(out.begin(), out.end());
}

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// A token's bytes as GPT-2's files spell them.
std::string spell(const std::string& bytes) {
  std::string s;
  for (unsigned char b : bytes) s += utf8(byte_char(b));
  return s;
}

// A small GPT-2-style vocabulary. Ids deliberately unlike ours: byte b has id
// (b + 100) % 256, <|endoftext|> is 256 (not the last id), merges follow.
constexpr int32_t kEot = 256;
int32_t byte_id(unsigned char b) { return (b + 100) % 256; }
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"},
    {"o", "r"}, {" w", "or"}, {" ", " "}, {"l", "d"}};
int32_t merge_id(size_t rank) { return 257 + static_cast<int32_t>(rank); }

json tiny_encoder() {
  json enc = json::object();
  for (int b = 0; b < 256; ++b) enc[spell(std::string(1, static_cast<char>(b)))] = byte_id(static_cast<unsigned char>(b));
  enc[BpeTokenizer::kEotText] = kEot;
  for (size_t r = 0; r < kMerges.size(); ++r) enc[spell(kMerges[r].first + kMerges[r].second)] = merge_id(r);
  return enc;
}

std::string tiny_vocab_bpe() {
  std::string s = "#version: 0.2\n";
  for (const auto& [a, b] : kMerges) s += spell(a) + " " + spell(b) + "\n";
  return s;
}

json tiny_hf() {
  json merges = json::array();
  for (const auto& [a, b] : kMerges) merges.push_back(spell(a) + " " + spell(b));
  return {{"version", "1.0"},
          {"added_tokens", {{{"id", kEot}, {"content", BpeTokenizer::kEotText}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", tiny_encoder()}, {"merges", merges}}}};
}

// Writes encoder.json + vocab.bpe into `dir` (created).
void write_gpt2_pair(const std::string& dir, const json& encoder, const std::string& vocab_bpe) {
  std::filesystem::create_directories(dir);
  write_bytes(dir + "/encoder.json", encoder.dump());
  write_bytes(dir + "/vocab.bpe", vocab_bpe);
}

std::string random_bytes(uint64_t seed, size_t n) {
  std::string s(n, '\0');
  const char* alphabet = "hello world  \n\t'sll";
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = random_u64(seed, 5, i);
    s[i] = r & 1 ? alphabet[(r >> 8) % 19] : static_cast<char>(r >> 16);  // half arbitrary bytes
  }
  return s;
}

void check_tiny(const BpeTokenizer& tok) {
  using V = std::vector<int32_t>;
  CHECK(tok.pre_tokenizer() == PreTokenizer::Gpt2);
  CHECK(tok.vocab_size() == 257 + static_cast<int>(kMerges.size()));
  CHECK(tok.eot() == kEot);
  CHECK(tok.num_merges() == static_cast<int>(kMerges.size()));
  CHECK(tok.token_bytes(kEot) == "<|endoftext|>");
  CHECK(tok.token_bytes(byte_id(' ')) == " ");
  CHECK(tok.token_bytes(merge_id(6)) == " wor");
  // "hello" merges all the way; " world" is Ġw, or, Ġwor, then ld.
  CHECK(tok.encode("hello world") == V{merge_id(3), merge_id(6), merge_id(8)});
  // Equal ranks left to right, then the merges they enable: h e l l h e l l o.
  CHECK(tok.encode("hellhello") == V{merge_id(2), merge_id(3)});
  // Three spaces before a word: "  " (one merge) then " w...".
  CHECK(tok.encode("hello   world") == V{merge_id(3), merge_id(7), merge_id(6), merge_id(8)});
  CHECK(tok.encode("x") == V{byte_id('x')});
  CHECK(tok.encode("").empty());
  // The text <|endoftext|> is text; only callers insert EOT.
  const auto special = tok.encode("<|endoftext|>");
  CHECK(std::find(special.begin(), special.end(), kEot) == special.end());
  CHECK(tok.decode(V{merge_id(3), kEot, byte_id('!')}) == "hello<|endoftext|>!");
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::string s = random_bytes(seed, 1 + seed * 41);
    CHECK(tok.decode(tok.encode(s)) == s);
  }
}

}  // namespace

TEST_CASE("GPT-2's byte alphabet: printable bytes as themselves, the rest from U+0100 on", "[data]") {
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) seen.insert(byte_char(static_cast<unsigned char>(b)));
  CHECK(seen.size() == 256);  // a bijection
  CHECK(byte_char('!') == '!');
  CHECK(byte_char('~') == '~');
  CHECK(byte_char('a') == 'a');
  CHECK(byte_char(0xA1) == 0xA1);
  CHECK(byte_char(0xFF) == 0xFF);
  CHECK(byte_char(0x00) == 0x100);
  CHECK(byte_char('\n') == 0x10A);  // "Ċ"
  CHECK(byte_char(' ') == 0x120);   // "Ġ", as in "Ġthe"
  CHECK(byte_char(0x7F) == 0x121);
  CHECK(byte_char(0xA0) == 0x142);
  CHECK(byte_char(0xAD) == 0x143);  // the 68th and last
}

TEST_CASE("GPT-2's pre-tokenizer follows tiktoken's regex", "[data]") {
  using V = std::vector<std::string>;
  CHECK(pieces("Hello world") == V{"Hello", " world"});
  CHECK(pieces("it's they'll we're I'd DON'T") ==
        V{"it", "'s", " they", "'ll", " we", "'re", " I", "'d", " DON", "'", "T"});
  CHECK(pieces("a  b") == V{"a", " ", " b"});
  CHECK(pieces("x   ") == V{"x", "   "});
  CHECK(pieces("a\n\nb") == V{"a", "\n", "\n", "b"});
  CHECK(pieces("a\n\n") == V{"a", "\n\n"});
  CHECK(pieces("a \n b") == V{"a", " \n", " b"});
  CHECK(pieces("a\r\n\tb") == V{"a", "\r\n", "\t", "b"});  // only ' ' leads a word
  CHECK(pieces("in 1999, $5!") == V{"in", " 1999", ",", " $", "5", "!"});
  CHECK(pieces("?!'s") == V{"?!'", "s"});
  // Unicode letters and numbers: accents, Cyrillic, CJK, superscripts,
  // Arabic-Indic digits; a combining mark is neither.
  CHECK(pieces("caf\xc3\xa9 \xd0\x9c\xd0\xbe\xd1\x81\xd0\xba\xd0\xb2\xd0\xb0") ==
        V{"caf\xc3\xa9", " \xd0\x9c\xd0\xbe\xd1\x81\xd0\xba\xd0\xb2\xd0\xb0"});
  CHECK(pieces("\xe4\xb8\xad\xe6\x96\x87\xef\xbc\x8c\xe6\xa0\x87") ==
        V{"\xe4\xb8\xad\xe6\x96\x87", "\xef\xbc\x8c", "\xe6\xa0\x87"});  // 中文，标
  CHECK(pieces("x\xc2\xb2\xc2\xb3 \xd9\xa3\xd9\xa4") == V{"x", "\xc2\xb2\xc2\xb3", " \xd9\xa3\xd9\xa4"});
  CHECK(pieces("e\xcc\x81t") == V{"e", "\xcc\x81", "t"});
  // tiktoken's \s, Unicode White_Space: no-break space and NEL (U+0085) are
  // spaces; U+FEFF is not (JavaScript's \s has it the other way round), nor
  // U+001F (Python re's \s has it).
  CHECK(pieces("a\xc2\xa0!") == V{"a", "\xc2\xa0", "!"});
  CHECK(pieces("a\xc2\x85!") == V{"a", "\xc2\x85", "!"});
  CHECK(pieces("a \xc2\x85" "b") == V{"a", " ", "\xc2\x85", "b"});
  CHECK(pieces("a\xef\xbb\xbf!") == V{"a", "\xef\xbb\xbf!"});
  CHECK(pieces("a \xef\xbb\xbf") == V{"a", " \xef\xbb\xbf"});
  CHECK(pieces("a\x1f b") == V{"a", "\x1f", " b"});
  CHECK(pieces("a\xe3\x80\x80\xe3\x80\x80 b") == V{"a", "\xe3\x80\x80\xe3\x80\x80", " b"});  // U+3000
  // Invalid UTF-8: the skipped bytes are a piece of their own.
  CHECK(pieces("ab\xff" "cd") == V{"ab", "\xff", "cd"});
  CHECK(pieces("\xff\xfe") == V{"\xff\xfe"});
  CHECK(pieces("a \xff") == V{"a", " ", "\xff"});
  CHECK(pieces("x\xe2\x80") == V{"x", "\xe2\x80"});             // truncated sequence
  CHECK(pieces("\xed\xa0\x80z") == V{"\xed\xa0\x80", "z"});     // a UTF-16 surrogate
  CHECK(pieces("\xc0\xaf!") == V{"\xc0\xaf", "!"});             // overlong '/'
  CHECK(pieces(std::string("a\0b", 3)) == V{"a", std::string(1, '\0'), "b"});
  CHECK(pieces("").empty());
  // Pieces always concatenate back to the input.
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const std::string s = random_bytes(seed, 500);
    std::string joined;
    for (const auto& p : pieces(s)) {
      CHECK_FALSE(p.empty());
      joined += p;
    }
    CHECK(joined == s);
  }
  // Long runs (the JIT's backtracking over them) stay single pieces.
  const size_t big = 4 << 20;
  CHECK(pieces(std::string(big, 'a')).size() == 1);
  CHECK(pieces(std::string(big, ' ') + "x") == V{std::string(big - 1, ' '), " x"});
  CHECK(pieces(std::string(big, '!')).size() == 1);
  CHECK(pieces(std::string(big, '\xff')).size() == 1);
}

TEST_CASE("GPT-2's encoder.json + vocab.bpe load by either file or their directory", "[data]") {
  TempDir dir;
  write_gpt2_pair(dir.file("gpt2"), tiny_encoder(), tiny_vocab_bpe());
  for (const char* path : {"gpt2", "gpt2/encoder.json", "gpt2/vocab.bpe"}) {
    INFO(path);
    check_tiny(BpeTokenizer::load(dir.file(path)));
  }
  // Without the final newline, and with CRLF lines, the merges are the same.
  std::string no_newline = tiny_vocab_bpe();
  no_newline.pop_back();
  write_gpt2_pair(dir.file("b"), tiny_encoder(), no_newline);
  check_tiny(BpeTokenizer::load(dir.file("b")));
  std::string crlf;
  for (char c : tiny_vocab_bpe()) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  write_gpt2_pair(dir.file("c"), tiny_encoder(), crlf);
  check_tiny(BpeTokenizer::load(dir.file("c")));
}

TEST_CASE("A Hugging Face tokenizer.json of byte-level BPE loads, saves and loads back", "[data]") {
  TempDir dir;
  write_bytes(dir.file("tokenizer.json"), tiny_hf().dump(1));
  const BpeTokenizer tok = BpeTokenizer::load(dir.file("tokenizer.json"));
  check_tiny(tok);
  check_tiny(BpeTokenizer::load(dir.path()));  // a directory holding tokenizer.json
  // Merges spelled as pairs (newer files) read the same.
  json pairs = tiny_hf();
  for (auto& m : pairs["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    m = json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  write_bytes(dir.file("pairs.json"), pairs.dump());
  check_tiny(BpeTokenizer::load(dir.file("pairs.json")));

  // save() writes a tokenizer.json: valid JSON that loads back identically.
  tok.save(dir.file("saved.json"));
  const json saved = json::parse(read_bytes(dir.file("saved.json")));
  CHECK(saved["model"]["type"] == "BPE");
  CHECK(saved["model"]["vocab"][spell(" wor")] == merge_id(6));
  CHECK(saved["model"]["merges"][6] == spell(" w") + " " + spell("or"));
  CHECK(saved["added_tokens"][0]["content"] == "<|endoftext|>");
  const BpeTokenizer again = BpeTokenizer::load(dir.file("saved.json"));
  check_tiny(again);
  CHECK(again.merges() == tok.merges());
  for (int32_t id = 0; id < tok.vocab_size(); ++id) CHECK(again.token_bytes(id) == tok.token_bytes(id));
  CHECK(again.file_text() == tok.file_text());
}

TEST_CASE("self_contained_tokenizer: one file as it is, GPT-2's pair as tokenizer.json", "[data]") {
  TempDir dir;
  write_gpt2_pair(dir.file("gpt2"), tiny_encoder(), tiny_vocab_bpe());
  const std::string text = self_contained_tokenizer(dir.file("gpt2/encoder.json"));
  CHECK(text == BpeTokenizer::load(dir.file("gpt2")).file_text());
  write_bytes(dir.file("one.json"), text);
  check_tiny(BpeTokenizer::load(dir.file("one.json")));
  // A one-file tokenizer is carried byte for byte (whatever else it holds).
  const std::string hf = tiny_hf().dump(2);
  write_bytes(dir.file("hf.json"), hf);
  CHECK(self_contained_tokenizer(dir.file("hf.json")) == hf);
  const BpeTokenizer ours = BpeTokenizer::train({"hello hello world"}, 260);
  ours.save(dir.file("ours.json"));
  CHECK(self_contained_tokenizer(dir.file("ours.json")) == read_bytes(dir.file("ours.json")));
  // It validates what it carries.
  write_bytes(dir.file("broken.json"), "{\"type\": \"attnres-bpe\"}");
  REQUIRE_THROWS_WITH(self_contained_tokenizer(dir.file("broken.json")), Contains("broken.json"));
}

TEST_CASE("Bad GPT-2 and Hugging Face files are refused with the file and the reason", "[data]") {
  TempDir dir;
  auto rejects = [&](const std::string& path, const std::string& what) {
    INFO(path << " / " << what);
    REQUIRE_THROWS_WITH(BpeTokenizer::load(path), Contains(path) && Contains(what));
  };
  // GPT-2's pair.
  std::filesystem::create_directories(dir.file("alone"));
  write_bytes(dir.file("alone/encoder.json"), tiny_encoder().dump());
  rejects(dir.file("alone/encoder.json"), "vocab.bpe");
  std::filesystem::create_directories(dir.file("bpe_only"));
  write_bytes(dir.file("bpe_only/vocab.bpe"), tiny_vocab_bpe());
  rejects(dir.file("bpe_only/vocab.bpe"), "encoder.json");
  std::filesystem::create_directories(dir.file("empty"));
  rejects(dir.file("empty"), "a directory without");

  write_gpt2_pair(dir.file("badline"), tiny_encoder(), "#version: 0.2\nh e\nnot-a-merge\n");
  rejects(dir.file("badline/vocab.bpe"), "line 3");
  write_gpt2_pair(dir.file("blank"), tiny_encoder(), "#version: 0.2\nh e\n\nl l\n");
  rejects(dir.file("blank/vocab.bpe"), "line 3 is empty");
  write_gpt2_pair(dir.file("unknown"), tiny_encoder(), "#version: 0.2\nh e\nq z\n");
  rejects(dir.file("unknown/vocab.bpe"), "line 3: \"qz\" is not in the vocabulary");
  write_gpt2_pair(dir.file("twice"), tiny_encoder(), "#version: 0.2\nh e\nh e\n");
  rejects(dir.file("twice/vocab.bpe"), "line 3: repeats an earlier merge");

  json gap = tiny_encoder();
  gap.erase(spell("or"));
  write_gpt2_pair(dir.file("gap"), gap, "#version: 0.2\n");
  rejects(dir.file("gap/encoder.json"), "no token has id 262");
  json dup = tiny_encoder();
  dup[spell("zz")] = 3;
  write_gpt2_pair(dir.file("dup"), dup, "#version: 0.2\n");
  rejects(dir.file("dup/encoder.json"), "id 3 is given to both");
  json no_eot = tiny_encoder();
  no_eot.erase(BpeTokenizer::kEotText);
  no_eot[spell("zz")] = kEot;
  write_gpt2_pair(dir.file("noeot"), no_eot, "#version: 0.2\n");
  rejects(dir.file("noeot/encoder.json"), "no <|endoftext|>");
  json alien = tiny_encoder();
  alien.erase(spell("ld"));
  alien["\xe2\x82\xac"] = merge_id(8);  // the euro sign is not in the byte alphabet
  write_gpt2_pair(dir.file("alien"), alien, "#version: 0.2\n");
  rejects(dir.file("alien/encoder.json"), "byte alphabet");
  json no_byte = tiny_encoder();
  no_byte.erase("q");
  no_byte["qq"] = byte_id('q');
  write_gpt2_pair(dir.file("nobyte"), no_byte, tiny_vocab_bpe());
  rejects(dir.file("nobyte/encoder.json"), "token \"qq\" (id " + std::to_string(byte_id('q')) +
                                               ") is made by no merge of");
  // encoder.json against vocab.bpe: 256 bytes + a token per merge + the special.
  write_gpt2_pair(dir.file("nomerges"), tiny_encoder(), "");
  rejects(dir.file("nomerges/vocab.bpe"), "has 0 merges and");
  write_gpt2_pair(dir.file("versiononly"), tiny_encoder(), "#version: 0.2\n");
  rejects(dir.file("versiononly/vocab.bpe"), "256 + 0 + 1 = 257");
  std::string cut = "#version: 0.2\n";
  for (size_t r = 0; r < 5; ++r) cut += spell(kMerges[r].first) + " " + spell(kMerges[r].second) + "\n";
  write_gpt2_pair(dir.file("cut"), tiny_encoder(), cut);
  rejects(dir.file("cut/vocab.bpe"), "has 5 merges and");
  rejects(dir.file("cut/vocab.bpe"), "do not belong together");
  json made_twice = tiny_encoder();
  made_twice["wor"] = 266;
  made_twice["zz"] = 267;  // keeps the count right: the repeat itself is refused
  write_gpt2_pair(dir.file("twicemade"), made_twice, tiny_vocab_bpe() + "w or\n" + spell(" ") + " wor\n");
  rejects(dir.file("twicemade/vocab.bpe"), "line 12: makes \"" + spell(" wor") + "\", which an earlier merge made");
  json negative = tiny_encoder();
  negative[spell("zz")] = -5;
  write_gpt2_pair(dir.file("neg"), negative, "#version: 0.2\n");
  rejects(dir.file("neg/encoder.json"), "has id -5");

  // Hugging Face tokenizer.json: what it would do differently from GPT-2.
  auto hf_rejects = [&](const std::string& name, const std::function<void(json&)>& edit, const std::string& what) {
    json j = tiny_hf();
    edit(j);
    write_bytes(dir.file(name), j.dump());
    rejects(dir.file(name), what);
  };
  hf_rejects("wordpiece.json", [](json& j) { j["model"]["type"] = "WordPiece"; }, "only byte-level BPE");
  hf_rejects("nfc.json", [](json& j) { j["normalizer"] = {{"type", "NFC"}}; }, "normalizer");
  hf_rejects("ws.json", [](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "pre_tokenizer");
  hf_rejects("prefix.json", [](json& j) { j["pre_tokenizer"]["add_prefix_space"] = true; }, "pre_tokenizer");
  hf_rejects("nopre.json", [](json& j) { j.erase("pre_tokenizer"); }, "pre_tokenizer");
  hf_rejects("suffix.json", [](json& j) { j["model"]["end_of_word_suffix"] = "</w>"; }, "end_of_word_suffix");
  hf_rejects("ignore.json", [](json& j) { j["model"]["ignore_merges"] = true; }, "ignore_merges");
  hf_rejects("dropout.json", [](json& j) { j["model"]["dropout"] = 0.1; }, "dropout");
  hf_rejects("merge.json", [](json& j) { j["model"]["merges"][2] = 5; }, "model.merges[2]");
  hf_rejects("merge3.json", [](json& j) { j["model"]["merges"][1] = "a b c"; }, "model.merges[1]");
  hf_rejects("unknown.json", [](json& j) { j["model"]["merges"].push_back("q z"); },
             "model.merges[9]: \"qz\" is not in the vocabulary");
  hf_rejects("added.json", [](json& j) { j["added_tokens"][0]["id"] = "x"; }, "added_tokens[0]");
  hf_rejects("vocab.json", [](json& j) { j["model"]["vocab"] = json::array(); }, "model.vocab");
  hf_rejects("nobyte.json", [](json& j) {
    j["model"]["vocab"].erase("q");
    j["model"]["vocab"]["qq"] = byte_id('q');
  }, "no token for the byte 0x71");
  // Neither form.
  write_bytes(dir.file("other.json"), R"({"foo": "bar"})");
  rejects(dir.file("other.json"), "not a tokenizer file");
}

TEST_CASE("<|endoftext|> in the text: encoded as text, as the token, or refused", "[data]") {
  TempDir dir;
  write_gpt2_pair(dir.file("gpt2"), tiny_encoder(), tiny_vocab_bpe());
  const BpeTokenizer tok = BpeTokenizer::load(dir.file("gpt2"));
  using V = std::vector<int32_t>;
  const std::string text = "hello<|endoftext|> world<|endoftext|>";
  V want = tok.encode("hello");
  want.push_back(kEot);
  for (int32_t id : tok.encode(" world")) want.push_back(id);
  want.push_back(kEot);
  CHECK(tok.encode(text, Specials::Allow) == want);
  CHECK(tok.encode(text, Specials::Text) == tok.encode(text));
  const V as_text = tok.encode(text);
  CHECK(std::count(as_text.begin(), as_text.end(), kEot) == 0);
  CHECK_THROWS_WITH(tok.encode(text, Specials::Refuse),
                    Contains("special token <|endoftext|> at byte 5"));
  CHECK(tok.encode("hello <|endoftext", Specials::Refuse) == tok.encode("hello <|endoftext"));
  CHECK(parse_specials("allow", "x") == Specials::Allow);
  CHECK_THROWS_WITH(parse_specials("all", "generate: --special"),
                    Contains("generate: --special") && Contains("text, allow or refuse"));
}
