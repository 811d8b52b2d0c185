#include "data/bpe.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_set>

#include "core/error.h"
#include "core/fileio.h"
#include "data/gpt2_files.h"
#include "data/gpt2_pretokenizer.h"

namespace attnres::data {
namespace {

constexpr int kByteTokens = 256;

// A pair of ids as one 64-bit key. Ids are non-negative, so the numeric order
// of keys is the lexicographic order of (left, right): ties in training use it.
inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
inline int32_t pair_left(uint64_t k) { return static_cast<int32_t>(k >> 32); }
inline int32_t pair_right(uint64_t k) { return static_cast<int32_t>(k & 0xffffffffu); }

enum class ByteClass { Letter, Digit, Space, Other };

inline ByteClass classify(unsigned char c) {
  // Bytes >= 0x80 (UTF-8 lead and continuation bytes) count as letters: a
  // cheap stand-in for \p{L} that keeps non-ASCII words in one chunk.
  if (c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return ByteClass::Letter;
  if (c >= '0' && c <= '9') return ByteClass::Digit;
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return ByteClass::Space;
  return ByteClass::Other;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) starting at s[i] == '\'', or 0.
inline size_t contraction_length(std::string_view s, size_t i) {
  if (i + 1 >= s.size()) return 0;
  const char c1 = s[i + 1];
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (i + 2 < s.size()) {
    const char c2 = s[i + 2];
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  }
  return 0;
}

// Max-heap order for training: higher count first, then the smaller pair.
struct Candidate {
  int64_t count;
  uint64_t key;
};
struct CandidateLess {
  bool operator()(const Candidate& x, const Candidate& y) const {
    if (x.count != y.count) return x.count < y.count;
    return x.key > y.key;
  }
};

// A unique chunk during training: its current symbols and how often it occurs.
struct Word {
  std::vector<int32_t> syms;
  int64_t count;
};

// Our numbering (see bpe.h): bytes, then one id per merge, then EOT.
BpeVocabulary attnres_vocabulary(const std::vector<std::pair<int32_t, int32_t>>& merges) {
  BpeVocabulary v;
  v.token_bytes.reserve(kByteTokens + merges.size() + 1);
  for (int b = 0; b < kByteTokens; ++b) v.token_bytes.emplace_back(1, static_cast<char>(b));
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto [a, b] = merges[r];
    v.token_bytes.push_back(v.token_bytes[a] + v.token_bytes[b]);
    v.merge_ids.push_back(kByteTokens + static_cast<int32_t>(r));
  }
  v.merges = merges;
  v.eot = static_cast<int32_t>(v.token_bytes.size());
  v.token_bytes.emplace_back(BpeTokenizer::kEotText);
  v.special.assign(v.token_bytes.size(), false);
  v.special.back() = true;
  return v;
}

}  // namespace

std::vector<std::string_view> split_chunks(std::string_view s) {
  std::vector<std::string_view> out;
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\'') {
      if (size_t len = contraction_length(s, i)) {
        out.push_back(s.substr(i, len));
        i += len;
        continue;
      }
    }
    // Optional leading space, then a run of one class.
    size_t j = i;
    if (c == ' ' && i + 1 < n && classify(static_cast<unsigned char>(s[i + 1])) != ByteClass::Space) j = i + 1;
    const ByteClass k = classify(static_cast<unsigned char>(s[j]));
    size_t e = j + 1;
    if (k != ByteClass::Space) {
      while (e < n && classify(static_cast<unsigned char>(s[e])) == k) ++e;
    } else {
      while (e < n && classify(static_cast<unsigned char>(s[e])) == ByteClass::Space) ++e;
      // Followed by a non-space: keep the last whitespace byte for the next
      // chunk (where a space becomes the word's leading space).
      if (e < n && e - i > 1) --e;
    }
    out.push_back(s.substr(i, e - i));
    i = e;
  }
  return out;
}

BpeTokenizer BpeTokenizer::train(const std::vector<std::string>& documents, int vocab_size,
                                 const Progress& progress) {
  if (vocab_size < kByteTokens + 1)
    fail("BPE vocab_size must be at least ", kByteTokens + 1, " (256 bytes + <|endoftext|>), got ",
         vocab_size);
  const int wanted = vocab_size - kByteTokens - 1;

  // 1. Unique chunks with their frequencies. Keys view into `documents`.
  std::unordered_map<std::string_view, int64_t> chunk_counts;
  for (const std::string& doc : documents)
    for (std::string_view chunk : split_chunks(doc)) ++chunk_counts[chunk];

  // 2. Chunks as symbol sequences. One-byte chunks hold no pair: drop them.
  std::vector<Word> words;
  words.reserve(chunk_counts.size());
  for (const auto& [chunk, count] : chunk_counts) {
    if (chunk.size() < 2) continue;
    Word w{std::vector<int32_t>(chunk.size()), count};
    for (size_t i = 0; i < chunk.size(); ++i) w.syms[i] = static_cast<unsigned char>(chunk[i]);
    words.push_back(std::move(w));
  }
  chunk_counts.clear();

  // 3. Pair counts, and for each pair the words that (may) contain it. The
  // index may hold stale entries (a word that lost the pair); they are skipped.
  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;
  for (size_t wi = 0; wi < words.size(); ++wi) {
    const auto& s = words[wi].syms;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t k = pair_key(s[i], s[i + 1]);
      pair_counts[k] += words[wi].count;
      auto& list = where[k];
      if (list.empty() || list.back() != static_cast<int32_t>(wi)) list.push_back(static_cast<int32_t>(wi));
    }
  }

  // 4. Candidates in a heap with lazy invalidation: an entry is trusted only if
  // its count equals the pair's current count. Counts that grow get a fresh
  // entry when they change; counts that shrink are re-queued when their stale
  // entry surfaces. So every live pair has an entry >= its count, and a
  // matching top entry is the true maximum.
  std::priority_queue<Candidate, std::vector<Candidate>, CandidateLess> heap;
  for (const auto& [k, c] : pair_counts) heap.push({c, k});

  std::vector<std::pair<int32_t, int32_t>> merges;
  merges.reserve(static_cast<size_t>(wanted));
  std::vector<int32_t> seen_at(words.size(), -1);  // last merge that processed each word
  std::unordered_map<uint64_t, int64_t> delta;
  std::vector<int32_t> merged;

  while (static_cast<int>(merges.size()) < wanted) {
    // Pop to the best valid candidate.
    bool found = false;
    Candidate best{};
    while (!heap.empty()) {
      const Candidate top = heap.top();
      heap.pop();
      const auto it = pair_counts.find(top.key);
      const int64_t current = it == pair_counts.end() ? 0 : it->second;
      if (current == top.count) {
        best = top;
        found = true;
        break;
      }
      if (current > 0 && current < top.count) heap.push({current, top.key});
    }
    if (!found || best.count <= 0) break;

    const int32_t merge_index = static_cast<int32_t>(merges.size());
    const int32_t a = pair_left(best.key), b = pair_right(best.key);
    const int32_t t = kByteTokens + merge_index;
    merges.emplace_back(a, b);

    std::vector<int32_t> affected = std::move(where[best.key]);
    where.erase(best.key);
    delta.clear();
    for (int32_t wi : affected) {
      if (seen_at[wi] == merge_index) continue;
      seen_at[wi] = merge_index;
      Word& w = words[wi];
      auto& s = w.syms;
      bool has = false;
      for (size_t i = 0; i + 1 < s.size() && !has; ++i) has = s[i] == a && s[i + 1] == b;
      if (!has) continue;  // stale index entry

      // Replace the word's pairs wholesale: subtract the old ones, add the new
      // ones. Pairs away from the merge cancel out in `delta`. Words are short
      // chunks, so this is cheap and obviously right.
      for (size_t i = 0; i + 1 < s.size(); ++i) delta[pair_key(s[i], s[i + 1])] -= w.count;
      merged.clear();
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          merged.push_back(t);
          i += 2;
        } else {
          merged.push_back(s[i]);
          i += 1;
        }
      }
      s.assign(merged.begin(), merged.end());
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const uint64_t k = pair_key(s[i], s[i + 1]);
        delta[k] += w.count;
        if (s[i] == t || s[i + 1] == t) {  // a pair that did not exist before this merge
          auto& list = where[k];
          if (list.empty() || list.back() != wi) list.push_back(wi);
        }
      }
    }
    for (const auto& [k, d] : delta) {
      if (d == 0) continue;
      int64_t& c = pair_counts[k];
      c += d;
      if (c <= 0) {
        pair_counts.erase(k);
      } else if (d > 0) {
        heap.push({c, k});
      }
    }
    if (progress) progress(static_cast<int>(merges.size()), wanted);
  }

  if (static_cast<int>(merges.size()) < wanted)
    spdlog::warn("BPE training: the text has no pairs left after {} merges; vocabulary is {} instead of {}",
                 merges.size(), kByteTokens + merges.size() + 1, vocab_size);
  return from_vocabulary(attnres_vocabulary(merges), PreTokenizer::Attnres, "BPE training");
}

BpeTokenizer BpeTokenizer::from_vocabulary(BpeVocabulary v, PreTokenizer pre, const std::string& source) {
  auto bad = [&](const auto&... what) { fail("tokenizer '", source, "': ", what...); };
  const int64_t n = static_cast<int64_t>(v.token_bytes.size());
  if (static_cast<int64_t>(v.special.size()) != n)
    fail_internal("from_vocabulary: ", v.special.size(), " special flags for ", n, " tokens");
  if (v.merge_ids.size() != v.merges.size())
    fail_internal("from_vocabulary: ", v.merge_ids.size(), " merge ids for ", v.merges.size(), " merges");
  if (n > INT32_MAX) bad("more than 2^31 - 1 tokens");
  if (v.eot < 0 || v.eot >= n) bad("the <|endoftext|> id ", v.eot, " is outside the vocabulary [0, ", n, ")");

  BpeTokenizer t;
  std::fill(std::begin(t.byte_id_), std::end(t.byte_id_), -1);
  for (int64_t id = 0; id < n; ++id) {
    const std::string& b = v.token_bytes[static_cast<size_t>(id)];
    if (b.size() == 1 && !v.special[static_cast<size_t>(id)]) {
      int32_t& slot = t.byte_id_[static_cast<unsigned char>(b[0])];
      if (slot >= 0) bad("ids ", slot, " and ", id, " are both the byte 0x", std::hex, +static_cast<unsigned char>(b[0]));
      slot = static_cast<int32_t>(id);
    }
  }
  for (int b = 0; b < 256; ++b)
    if (t.byte_id_[b] < 0)
      bad("no token for the byte 0x", std::hex, b, " (a byte-level BPE has one for each of the 256 bytes)");

  t.merge_table_.reserve(v.merges.size() * 2);
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const auto [a, b] = v.merges[r];
    const int32_t c = v.merge_ids[r];
    for (int32_t id : {a, b, c})
      if (id < 0 || id >= n || v.special[static_cast<size_t>(id)])
        bad("merge ", r, " uses id ", id, ", not an ordinary token of the vocabulary");
    if (v.token_bytes[c] != v.token_bytes[a] + v.token_bytes[b])
      bad("merge ", r, " creates id ", c, ", which is not the concatenation of ids ", a, " and ", b);
    if (!t.merge_table_.emplace(pair_key(a, b), Merge{static_cast<int32_t>(r), c}).second)
      bad("merge ", r, " repeats the merge of ids ", a, " and ", b);
  }
  t.pre_ = pre;
  if (pre == PreTokenizer::Gpt2) t.gpt2_ = std::make_shared<const Gpt2PreTokenizer>();
  t.token_bytes_ = std::move(v.token_bytes);
  t.special_ = std::move(v.special);
  for (size_t i = 0; i < t.special_.size(); ++i)
    if (t.special_[i]) t.special_ids_.push_back(static_cast<int32_t>(i));
  t.merges_ = std::move(v.merges);
  t.merge_ids_ = std::move(v.merge_ids);
  t.eot_ = v.eot;
  return t;
}

const BpeTokenizer::Merge* BpeTokenizer::find_merge(int32_t left, int32_t right) const {
  const auto it = merge_table_.find(pair_key(left, right));
  return it == merge_table_.end() ? nullptr : &it->second;
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  // Merge the lowest-ranked adjacent pair, equal ranks left to right, until
  // none is left. Our training does exactly this, and so does GPT-2's bpe()
  // (which merges every occurrence of the best pair in one pass): a merge's
  // new pairs all contain its new id, and in GPT-2's vocabulary, as in ours,
  // every merge that uses an id ranks after the merge that creates it (checked
  // for GPT-2's 50000 merges), so no pass is ever interrupted by a better pair.
  // Symbols form a linked list; the heap holds (rank, position) candidates,
  // validated when popped. O(n log n), so long pieces stay cheap.
  const size_t n = piece.size();
  if (n == 0) return;
  if (n == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  std::vector<int32_t> sym(n), next(n), prev(n);
  for (size_t i = 0; i < n; ++i) {
    sym[i] = byte_id_[static_cast<unsigned char>(piece[i])];
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    prev[i] = static_cast<int32_t>(i) - 1;
  }
  // (rank << 32 | position): a min-heap pops the lowest rank, then leftmost.
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<uint64_t>> heap;
  auto consider = [&](int32_t p) {
    if (p < 0 || next[p] < 0) return;
    if (const Merge* m = find_merge(sym[p], sym[next[p]]))
      heap.push((static_cast<uint64_t>(m->rank) << 32) | static_cast<uint32_t>(p));
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const uint64_t e = heap.top();
    heap.pop();
    const int32_t r = static_cast<int32_t>(e >> 32);
    const int32_t p = static_cast<int32_t>(e & 0xffffffffu);
    if (sym[p] < 0) continue;  // merged away
    const int32_t q = next[p];
    if (q < 0) continue;
    const Merge* m = find_merge(sym[p], sym[q]);
    if (!m || m->rank != r) continue;  // pair changed since queued
    sym[p] = m->id;
    sym[q] = -1;
    next[p] = next[q];
    if (next[q] >= 0) prev[next[q]] = p;
    consider(prev[p]);
    consider(p);
  }
  for (int32_t p = 0; p >= 0; p = next[p]) out.push_back(sym[p]);
}

std::vector<std::string_view> BpeTokenizer::split(std::string_view text) const {
  if (pre_ == PreTokenizer::Attnres) return split_chunks(text);
  std::vector<std::string_view> pieces;
  pieces.reserve(text.size() / 4 + 1);
  gpt2_->split(text, pieces);
  return pieces;
}

Specials parse_specials(const std::string& name, const std::string& where) {
  if (name == "text") return Specials::Text;
  if (name == "allow") return Specials::Allow;
  if (name == "refuse") return Specials::Refuse;
  fail(where, ": '", name, "' is not text, allow or refuse");
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, Specials mode) const {
  if (mode == Specials::Text) return encode(text);
  std::vector<int32_t> out;
  for (size_t at = 0;;) {
    // The earliest special token's text from `at` (the longest where two start together).
    size_t best = std::string_view::npos;
    int32_t id = -1;
    for (const int32_t i : special_ids_) {
      const size_t p = text.find(token_bytes_[i], at);
      if (p < best || (p == best && p != std::string_view::npos && token_bytes_[i].size() > token_bytes_[id].size())) {
        best = p;
        id = i;
      }
    }
    if (best == std::string_view::npos) {
      const auto rest = encode(text.substr(at));
      out.insert(out.end(), rest.begin(), rest.end());
      return out;
    }
    if (mode == Specials::Refuse)
      fail("the text holds the special token ", token_bytes_[id], " at byte ", best,
           " (allow it to encode it as that token, or encode it as text)");
    const auto part = encode(text.substr(at, best - at));
    out.insert(out.end(), part.begin(), part.end());
    out.push_back(id);
    at = best + token_bytes_[id].size();
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  // Pieces repeat heavily in natural text, so their encodings are cached.
  // Bounded: long pieces are not cached, and the cache restarts when large.
  constexpr size_t kMaxCachedPiece = 64;
  constexpr size_t kMaxCacheEntries = 1 << 19;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  for (std::string_view piece : split(text)) {
    if (piece.size() == 1) {
      out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
      continue;
    }
    if (piece.size() > kMaxCachedPiece) {
      encode_piece(piece, out);
      continue;
    }
    std::string key(piece);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      if (cache_.size() >= kMaxCacheEntries) cache_.clear();
      std::vector<int32_t> ids;
      encode_piece(piece, ids);
      it = cache_.emplace(std::move(key), std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

std::string BpeTokenizer::decode(Span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size())
      fail("BPE decode: token ", i, " has id ", id, ", outside the vocabulary [0, ", vocab_size(), ")");
    out += token_bytes_[id];
  }
  return out;
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail("BPE token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")");
  return token_bytes_[id];
}

std::string BpeTokenizer::file_text() const {
  if (pre_ == PreTokenizer::Gpt2) {
    BpeVocabulary v{token_bytes_, special_, merges_, merge_ids_, eot_};
    return hf_tokenizer_json(v);
  }
  // Written by hand, one merge per line, so the file diffs and greps well.
  std::ostringstream os;
  os << "{\"type\": \"attnres-bpe\", \"version\": 1, \"vocab_size\": " << vocab_size()
     << ",\n \"special\": {\"" << kEotText << "\": " << eot() << "},\n \"merges\": [";
  for (size_t i = 0; i < merges_.size(); ++i)
    os << (i ? ",\n  " : "\n  ") << '[' << merges_[i].first << ", " << merges_[i].second << ']';
  os << "\n ]}\n";
  return os.str();
}

void BpeTokenizer::save(const std::string& path) const { write_text_file_atomic(path, file_text()); }

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json parse_json_file(const std::string& path) {
  std::string text;
  try {
    text = read_text_file(path);
  } catch (const Error& e) {
    fail("tokenizer ", e.what());
  }
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("tokenizer '", path, "': not valid JSON (", e.what(), ")");
  }
}

// Our own file, parsed (see the format in bpe.h).
BpeVocabulary read_attnres_vocabulary(const json& j, const std::string& path) {
  auto bad = [&](const auto&... what) { fail("tokenizer '", path, "': ", what...); };
  if (j["type"] != "attnres-bpe") bad("\"type\" must be \"attnres-bpe\" (not an attnres BPE tokenizer file)");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int64_t>() != 1)
    bad("unsupported \"version\" (this build reads version 1)");
  if (!j.contains("merges") || !j["merges"].is_array()) bad("\"merges\" must be an array");

  std::vector<std::pair<int32_t, int32_t>> merges;
  std::unordered_set<uint64_t> seen;
  const json& jm = j["merges"];
  merges.reserve(jm.size());
  for (size_t i = 0; i < jm.size(); ++i) {
    const json& m = jm[i];
    if (!m.is_array() || m.size() != 2 || !m[0].is_number_integer() || !m[1].is_number_integer())
      bad("merge ", i, " must be a pair of integer ids [a, b]");
    // A merge may only use ids that exist before it: the bytes and earlier merges.
    const int64_t limit = kByteTokens + static_cast<int64_t>(i);
    const int64_t a = m[0].get<int64_t>(), b = m[1].get<int64_t>();
    if (a < 0 || a >= limit || b < 0 || b >= limit)
      bad("merge ", i, " = [", a, ", ", b, "] uses an id outside [0, ", limit, ")");
    if (!seen.insert(pair_key(static_cast<int32_t>(a), static_cast<int32_t>(b))).second)
      bad("merge ", i, " = [", a, ", ", b, "] repeats an earlier merge");
    merges.emplace_back(static_cast<int32_t>(a), static_cast<int32_t>(b));
  }
  const int64_t expected_vocab = kByteTokens + static_cast<int64_t>(merges.size()) + 1;
  if (!j.contains("vocab_size") || !j["vocab_size"].is_number_integer() ||
      j["vocab_size"].get<int64_t>() != expected_vocab)
    bad("\"vocab_size\" must be 256 + merges + 1 = ", expected_vocab);
  const char* eot = BpeTokenizer::kEotText;
  if (!j.contains("special") || !j["special"].is_object() || j["special"].size() != 1 ||
      !j["special"].contains(eot) || !j["special"][eot].is_number_integer() ||
      j["special"][eot].get<int64_t>() != expected_vocab - 1)
    bad("\"special\" must be {\"", eot, "\": ", expected_vocab - 1, "} (the last id)");
  return attnres_vocabulary(merges);
}

// Where a tokenizer lives and in which form.
struct TokenizerSource {
  enum Kind { Attnres, HuggingFace, Gpt2Pair } kind;
  std::string file;       // the JSON file (encoder.json for GPT-2's pair)
  std::string vocab_bpe;  // GPT-2's pair only
  json parsed;            // `file`, parsed
};

std::string beside(const std::string& path, const char* name) {
  return (fs::path(path).parent_path() / name).string();
}

TokenizerSource gpt2_pair(const std::string& encoder, const std::string& vocab_bpe) {
  return {TokenizerSource::Gpt2Pair, encoder, vocab_bpe, parse_json_file(encoder)};
}

TokenizerSource locate(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("tokenizer '", path, "': no such file or directory");
  if (fs::is_directory(path, ec)) {
    const fs::path d(path);
    if (fs::exists(d / "encoder.json", ec) && fs::exists(d / "vocab.bpe", ec))
      return gpt2_pair((d / "encoder.json").string(), (d / "vocab.bpe").string());
    if (fs::exists(d / "tokenizer.json", ec)) return locate((d / "tokenizer.json").string());
    fail("tokenizer '", path, "': a directory without GPT-2's encoder.json + vocab.bpe, or a tokenizer.json");
  }
  if (fs::path(path).extension() == ".bpe") {
    const std::string encoder = beside(path, "encoder.json");
    if (!fs::exists(encoder, ec))
      fail("tokenizer '", path, "': GPT-2's vocab.bpe needs its encoder.json beside it, and '", encoder,
           "' does not exist");
    return gpt2_pair(encoder, path);
  }
  json j = parse_json_file(path);
  if (!j.is_object()) fail("tokenizer '", path, "': expected a JSON object");
  // By the types of the keys, since GPT-2's vocabulary has tokens "type" and
  // "model" too (with integer ids).
  if (j.contains("type") && j["type"].is_string()) return {TokenizerSource::Attnres, path, "", std::move(j)};
  if (j.contains("model") && j["model"].is_object())
    return {TokenizerSource::HuggingFace, path, "", std::move(j)};
  if (!j.empty() && j.begin()->is_number_integer()) {
    const std::string vocab_bpe = beside(path, "vocab.bpe");
    if (!fs::exists(vocab_bpe, ec))
      fail("tokenizer '", path, "': looks like GPT-2's encoder.json (token -> id), which needs its "
           "vocab.bpe beside it, and '", vocab_bpe, "' does not exist");
    return {TokenizerSource::Gpt2Pair, path, vocab_bpe, std::move(j)};
  }
  fail("tokenizer '", path, "': not a tokenizer file this build reads: expected an attnres-bpe file "
       "(with \"type\"), a Hugging Face tokenizer.json (with \"model\") or GPT-2's encoder.json "
       "(token -> id)");
}

BpeTokenizer load_from(const TokenizerSource& s) {
  switch (s.kind) {
    case TokenizerSource::Attnres:
      return BpeTokenizer::from_vocabulary(read_attnres_vocabulary(s.parsed, s.file), PreTokenizer::Attnres, s.file);
    case TokenizerSource::HuggingFace:
      return BpeTokenizer::from_vocabulary(read_hf_vocabulary(s.parsed, s.file), PreTokenizer::Gpt2, s.file);
    case TokenizerSource::Gpt2Pair:
      return BpeTokenizer::from_vocabulary(read_gpt2_vocabulary(s.parsed, s.file, s.vocab_bpe),
                                           PreTokenizer::Gpt2, s.file);
  }
  fail_internal("unknown tokenizer source kind ", static_cast<int>(s.kind));
}

}  // namespace

BpeTokenizer BpeTokenizer::load(const std::string& path) { return load_from(locate(path)); }

std::string self_contained_tokenizer(const std::string& path) {
  const TokenizerSource s = locate(path);
  const BpeTokenizer tok = load_from(s);  // a checkpoint never carries a file generate can't read
  return s.kind == TokenizerSource::Gpt2Pair ? tok.file_text() : read_text_file(s.file);
}

}  // namespace attnres::data
