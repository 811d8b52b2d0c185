#include "data/gpt2_files.h"

#include <algorithm>
#include <array>
#include <functional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/fileio.h"
#include "data/utf8.h"

namespace attnres::data {
namespace {

using nlohmann::json;

// Code points 0 .. kAlphabetEnd-1 cover the whole byte alphabet (256 + 68).
constexpr uint32_t kAlphabetEnd = 256 + 68;

struct ByteAlphabet {
  std::array<uint32_t, 256> char_of{};           // byte -> code point
  std::array<int16_t, kAlphabetEnd> byte_of{};   // code point -> byte, or -1
};

// Built once from the definition in byte_char's comment; read-only after.
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a = [] {
    ByteAlphabet t;
    t.byte_of.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t.char_of[b] = printable ? b : next++;
      t.byte_of[t.char_of[b]] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return a;
}

// A token as spelled in the files -> its bytes; false if a character is not
// in the byte alphabet. The spelling is valid UTF-8 (it came out of a JSON
// parser), and the alphabet has only 1- and 2-byte characters.
bool spelled_to_bytes(const std::string& s, std::string& out) {
  const auto& a = alphabet();
  out.clear();
  for (size_t i = 0; i < s.size();) {
    const auto c0 = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    if (c0 < 0x80) {
      cp = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = ((c0 & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;
    }
    if (cp >= kAlphabetEnd || a.byte_of[cp] < 0) return false;
    out += static_cast<char>(a.byte_of[cp]);
  }
  return true;
}

std::string bytes_to_spelled(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) append_utf8(alphabet().char_of[b], out);
  return out;
}

// A merge as the files spell it.
struct SpelledMerge {
  std::string left, right;
};

// The ids and merges of a vocabulary spelled as in GPT-2's / HF's files.
//   vocab       token spelling -> id (an object)
//   added       extra (id, content) tokens, spelled literally (HF's added_tokens)
//   where(i)    names merge i in errors (file, line)
BpeVocabulary build_vocabulary(const json& vocab, const std::string& vocab_file,
                               const std::vector<std::pair<int64_t, std::string>>& added,
                               const std::vector<SpelledMerge>& merges,
                               const std::function<std::string(size_t)>& where) {
  auto bad = [&](const auto&... what) { fail("tokenizer '", vocab_file, "': ", what...); };
  // id -> spelling; -1-sized slots are filled below.
  std::vector<std::string> spelled;
  std::vector<char> present, special;
  std::unordered_map<std::string, int32_t> id_of;
  id_of.reserve(vocab.size() * 2);
  auto put = [&](int64_t id, const std::string& s, bool is_special) {
    if (id < 0 || id >= INT32_MAX) bad("token ", json(s).dump(), " has id ", id, ", outside [0, 2^31 - 1)");
    const auto i = static_cast<size_t>(id);
    if (i >= spelled.size()) {
      spelled.resize(i + 1);
      present.resize(i + 1, 0);
      special.resize(i + 1, 0);
    }
    if (present[i]) {
      if (spelled[i] == s && is_special) {  // an added token that is also in the vocabulary
        special[i] = 1;
        return;
      }
      bad("id ", id, " is given to both ", json(spelled[i]).dump(), " and ", json(s).dump());
    }
    spelled[i] = s;
    present[i] = 1;
    special[i] = is_special;
    id_of.emplace(s, static_cast<int32_t>(id));
  };
  for (const auto& [s, id] : vocab.items()) {
    if (!id.is_number_integer()) bad("token ", json(s).dump(), " has id ", id.dump(), ", not an integer");
    put(id.get<int64_t>(), s, false);
  }
  for (const auto& [id, s] : added) put(id, s, true);
  for (size_t i = 0; i < present.size(); ++i)
    if (!present[i]) bad("no token has id ", i, " (ids must be 0 .. ", present.size() - 1, " without gaps)");

  BpeVocabulary v;
  const char* eot = BpeTokenizer::kEotText;
  if (const auto it = id_of.find(eot); it != id_of.end()) {
    v.eot = it->second;
    special[static_cast<size_t>(v.eot)] = 1;  // GPT-2's encoder.json lists it as an ordinary entry
  } else {
    bad("the vocabulary has no ", eot, " token (needed to separate documents)");
  }
  v.token_bytes.resize(spelled.size());
  v.special.resize(spelled.size());
  for (size_t i = 0; i < spelled.size(); ++i) {
    v.special[i] = special[i] != 0;
    if (special[i]) {
      v.token_bytes[i] = spelled[i];
    } else if (!spelled_to_bytes(spelled[i], v.token_bytes[i])) {
      bad("token ", json(spelled[i]).dump(), " (id ", i, ") has a character outside GPT-2's byte "
          "alphabet: not a byte-level BPE vocabulary");
    }
  }
  v.merges.reserve(merges.size());
  v.merge_ids.reserve(merges.size());
  auto id_or_fail = [&](size_t i, const std::string& s) {
    const auto it = id_of.find(s);
    if (it == id_of.end())
      fail("tokenizer ", where(i), ": ", json(s).dump(), " is not in the vocabulary ('", vocab_file, "')");
    return it->second;
  };
  std::unordered_set<uint64_t> seen;
  seen.reserve(merges.size() * 2);
  for (size_t i = 0; i < merges.size(); ++i) {
    const int32_t a = id_or_fail(i, merges[i].left), b = id_or_fail(i, merges[i].right);
    const int32_t c = id_or_fail(i, merges[i].left + merges[i].right);
    if (!seen.insert(static_cast<uint64_t>(a) << 32 | static_cast<uint32_t>(b)).second)
      fail("tokenizer ", where(i), ": repeats an earlier merge");
    v.merges.emplace_back(a, b);
    v.merge_ids.push_back(c);
  }
  return v;
}

// "left right" -> the two spellings (neither contains U+0020: the alphabet
// spells the space byte as U+0120).
bool split_merge(const std::string& line, SpelledMerge& m) {
  const size_t sp = line.find(' ');
  if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() || line.find(' ', sp + 1) != std::string::npos)
    return false;
  m.left = line.substr(0, sp);
  m.right = line.substr(sp + 1);
  return true;
}

// GPT-2's encoder.json holds exactly the 256 bytes, one token per merge of
// vocab.bpe (its result) and the special tokens. A vocab.bpe cut short, or
// empty, would otherwise load: the tokens of the missing merges are never
// made, and text that needs them gets other ids.
void check_gpt2_pair(const BpeVocabulary& v, const std::string& encoder_path,
                     const std::string& vocab_bpe_path, const std::function<std::string(size_t)>& where) {
  const size_t n = v.token_bytes.size();
  const auto n_special = static_cast<size_t>(std::count(v.special.begin(), v.special.end(), true));
  const size_t want = 256 + v.merges.size() + n_special;
  if (n != want)
    fail("tokenizer '", vocab_bpe_path, "' has ", v.merges.size(), " merges and '", encoder_path, "' ", n,
         " tokens, but GPT-2's pair has one token per byte, one per merge and the ", n_special,
         " special: 256 + ", v.merges.size(), " + ", n_special, " = ", want,
         ". The two files do not belong together (a vocab.bpe cut short, or another model's?)");
  std::vector<char> made(n, 0);
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const auto c = static_cast<size_t>(v.merge_ids[r]);
    if (made[c])
      fail("tokenizer ", where(r), ": makes ", json(bytes_to_spelled(v.token_bytes[c])).dump(),
           ", which an earlier merge made");
    made[c] = 1;
  }
  for (size_t i = 0; i < n; ++i)
    if (!v.special[i] && v.token_bytes[i].size() > 1 && !made[i])
      fail("tokenizer '", encoder_path, "': token ", json(bytes_to_spelled(v.token_bytes[i])).dump(), " (id ", i,
           ") is made by no merge of '", vocab_bpe_path, "'");
}

}  // namespace

uint32_t byte_char(unsigned char b) { return alphabet().char_of[b]; }

BpeVocabulary read_gpt2_vocabulary(const json& encoder, const std::string& encoder_path,
                                   const std::string& vocab_bpe_path) {
  if (!encoder.is_object())
    fail("tokenizer '", encoder_path, "': GPT-2's encoder.json must be a JSON object (token -> id)");
  std::string text;
  try {
    text = read_text_file(vocab_bpe_path);
  } catch (const Error& e) {
    fail("tokenizer ", e.what());
  }
  // One merge per line after an optional "#version" line; a final newline
  // (or a CR of a converted file) ends a line, it is not a merge.
  std::vector<SpelledMerge> merges;
  std::vector<size_t> line_of;
  std::istringstream is(text);
  std::string line;
  for (size_t n = 1; std::getline(is, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (n == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) {
      if (is.peek() == std::char_traits<char>::eof()) break;
      fail("tokenizer '", vocab_bpe_path, "': line ", n, " is empty (expected a merge \"left right\")");
    }
    SpelledMerge m;
    if (!split_merge(line, m))
      fail("tokenizer '", vocab_bpe_path, "': line ", n, " is not a merge \"left right\": ", json(line).dump());
    merges.push_back(std::move(m));
    line_of.push_back(n);
  }
  auto where = [&](size_t i) { return "'" + vocab_bpe_path + "': line " + std::to_string(line_of[i]); };
  BpeVocabulary v = build_vocabulary(encoder, encoder_path, {}, merges, where);
  check_gpt2_pair(v, encoder_path, vocab_bpe_path, where);
  return v;
}

BpeVocabulary read_hf_vocabulary(const json& j, const std::string& path) {
  auto bad = [&](const auto&... what) { fail("tokenizer '", path, "': ", what...); };
  const json& model = j["model"];
  if (!model.is_object()) bad("\"model\" must be an object");
  if (model.contains("type") && model["type"] != "BPE")
    bad("model.type is ", model["type"].dump(), ": only byte-level BPE is supported");
  if (!model.contains("vocab") || !model["vocab"].is_object()) bad("model.vocab must be an object (token -> id)");
  if (!model.contains("merges") || !model["merges"].is_array()) bad("model.merges must be an array");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model[key].is_null() && model[key] != "")
      bad("model.", key, " = ", model[key].dump(), " is not supported (GPT-2's BPE has none)");
  if (model.value("ignore_merges", false) == true)
    bad("model.ignore_merges = true is not supported (GPT-2's BPE always applies the merges)");
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0)
    bad("model.dropout = ", model["dropout"].dump(), " is not supported (encoding must be deterministic)");
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    bad("a normalizer (", j["normalizer"].dump(), ") is not supported: GPT-2 encodes the text as it is");
  const json pre = j.value("pre_tokenizer", json());
  if (!pre.is_object() || pre.value("type", "") != "ByteLevel" || pre.value("add_prefix_space", false) != false ||
      pre.value("use_regex", true) != true)
    bad("pre_tokenizer must be GPT-2's (ByteLevel, use_regex, no add_prefix_space); this file has ",
        pre.dump());

  std::vector<std::pair<int64_t, std::string>> added;
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array()) bad("added_tokens must be an array");
    for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
      const json& t = j["added_tokens"][i];
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
          !t["content"].is_string())
        bad("added_tokens[", i, "] must have an integer \"id\" and a string \"content\"");
      added.emplace_back(t["id"].get<int64_t>(), t["content"].get<std::string>());
    }
  }
  const json& jm = model["merges"];
  std::vector<SpelledMerge> merges(jm.size());
  for (size_t i = 0; i < jm.size(); ++i) {
    const json& m = jm[i];
    // Older files spell a merge "left right", newer ones ["left", "right"].
    const bool ok = m.is_string() ? split_merge(m.get<std::string>(), merges[i])
                                  : m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string();
    if (!ok) bad("model.merges[", i, "] is not a merge \"left right\" or [\"left\", \"right\"]: ", m.dump());
    if (m.is_array()) merges[i] = {m[0].get<std::string>(), m[1].get<std::string>()};
  }
  return build_vocabulary(model["vocab"], path, added, merges, [&](size_t i) {
    return "'" + path + "': model.merges[" + std::to_string(i) + "]";
  });
}

std::string hf_tokenizer_json(const BpeVocabulary& v) {
  // Written by hand rather than through an ordered JSON object (whose inserts
  // are linear: quadratic for 50k tokens); json(s).dump() escapes a string.
  const size_t n = v.token_bytes.size();
  std::vector<std::string> spelled(n);
  for (size_t i = 0; i < n; ++i) spelled[i] = v.special[i] ? v.token_bytes[i] : bytes_to_spelled(v.token_bytes[i]);
  std::ostringstream os;
  os << "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [";
  bool first = true;
  for (size_t i = 0; i < n; ++i) {
    if (!v.special[i]) continue;
    os << (first ? "\n" : ",\n") << "    {\"id\": " << i << ", \"content\": " << json(spelled[i]).dump()
       << ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": true, "
          "\"special\": true}";
    first = false;
  }
  const char* byte_level = R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})";
  os << "\n  ],\n  \"normalizer\": null,\n  \"pre_tokenizer\": " << byte_level
     << ",\n  \"post_processor\": " << byte_level << ",\n  \"decoder\": " << byte_level
     << ",\n  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
        "    \"continuing_subword_prefix\": \"\",\n    \"end_of_word_suffix\": \"\",\n"
        "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"vocab\": {";
  for (size_t i = 0; i < n; ++i) os << (i ? ",\n      " : "\n      ") << json(spelled[i]).dump() << ": " << i;
  os << "\n    },\n    \"merges\": [";
  for (size_t r = 0; r < v.merges.size(); ++r)
    os << (r ? ",\n      " : "\n      ")
       << json(spelled[static_cast<size_t>(v.merges[r].first)] + " " + spelled[static_cast<size_t>(v.merges[r].second)]).dump();
  os << "\n    ]\n  }\n}\n";
  return os.str();
}

}  // namespace attnres::data
