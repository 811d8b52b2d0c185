#include "data/bpe.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_set>

#include "core/error.h"
#include "core/fileio.h"

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

BpeTokenizer::BpeTokenizer(std::vector<std::pair<int32_t, int32_t>> merges) : merges_(std::move(merges)) {
  token_bytes_.reserve(kByteTokens + merges_.size() + 1);
  for (int b = 0; b < kByteTokens; ++b) token_bytes_.emplace_back(1, static_cast<char>(b));
  merge_rank_.reserve(merges_.size() * 2);
  for (size_t r = 0; r < merges_.size(); ++r) {
    const auto [a, b] = merges_[r];
    token_bytes_.push_back(token_bytes_[a] + token_bytes_[b]);
    merge_rank_.emplace(pair_key(a, b), static_cast<int32_t>(r));
  }
  token_bytes_.emplace_back(kEotText);
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
  return BpeTokenizer(std::move(merges));
}

void BpeTokenizer::encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const {
  // Apply merges lowest rank first; equal ranks left to right. This reproduces
  // training exactly: when rank r is applied, every lower rank is done and no
  // new pair of rank <= r can appear (new pairs contain the new, higher id).
  // Symbols form a linked list; the heap holds (rank, position) candidates,
  // validated when popped. O(n log n), so long chunks stay cheap.
  const size_t n = chunk.size();
  if (n == 0) return;
  if (n == 1) {
    out.push_back(static_cast<unsigned char>(chunk[0]));
    return;
  }
  std::vector<int32_t> sym(n), next(n), prev(n);
  for (size_t i = 0; i < n; ++i) {
    sym[i] = static_cast<unsigned char>(chunk[i]);
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    prev[i] = static_cast<int32_t>(i) - 1;
  }
  auto rank_of = [&](int32_t x, int32_t y) -> int64_t {
    const auto it = merge_rank_.find(pair_key(x, y));
    return it == merge_rank_.end() ? -1 : it->second;
  };
  // (rank << 32 | position): a min-heap pops the lowest rank, then leftmost.
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<uint64_t>> heap;
  auto consider = [&](int32_t p) {
    if (p < 0 || next[p] < 0) return;
    const int64_t r = rank_of(sym[p], sym[next[p]]);
    if (r >= 0) heap.push((static_cast<uint64_t>(r) << 32) | static_cast<uint32_t>(p));
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const uint64_t e = heap.top();
    heap.pop();
    const int64_t r = static_cast<int64_t>(e >> 32);
    const int32_t p = static_cast<int32_t>(e & 0xffffffffu);
    if (sym[p] < 0) continue;  // merged away
    const int32_t q = next[p];
    if (q < 0 || rank_of(sym[p], sym[q]) != r) continue;  // pair changed since queued
    sym[p] = kByteTokens + static_cast<int32_t>(r);
    sym[q] = -1;
    next[p] = next[q];
    if (next[q] >= 0) prev[next[q]] = p;
    consider(prev[p]);
    consider(p);
  }
  for (int32_t p = 0; p >= 0; p = next[p]) out.push_back(sym[p]);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  // Chunks repeat heavily in natural text, so their encodings are cached.
  // Bounded: long chunks are not cached, and the cache restarts when large.
  constexpr size_t kMaxCachedChunk = 64;
  constexpr size_t kMaxCacheEntries = 1 << 19;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  for (std::string_view chunk : split_chunks(text)) {
    if (chunk.size() == 1) {
      out.push_back(static_cast<unsigned char>(chunk[0]));
      continue;
    }
    if (chunk.size() > kMaxCachedChunk) {
      encode_chunk(chunk, out);
      continue;
    }
    std::string key(chunk);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      if (cache_.size() >= kMaxCacheEntries) cache_.clear();
      std::vector<int32_t> ids;
      encode_chunk(chunk, ids);
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

void BpeTokenizer::save(const std::string& path) const {
  // Written by hand, one merge per line, so the file diffs and greps well.
  std::ostringstream os;
  os << "{\"type\": \"attnres-bpe\", \"version\": 1, \"vocab_size\": " << vocab_size()
     << ",\n \"special\": {\"" << kEotText << "\": " << eot() << "},\n \"merges\": [";
  for (size_t i = 0; i < merges_.size(); ++i)
    os << (i ? ",\n  " : "\n  ") << '[' << merges_[i].first << ", " << merges_[i].second << ']';
  os << "\n ]}\n";
  write_text_file_atomic(path, os.str());
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  using nlohmann::json;
  std::string text;
  try {
    text = read_text_file(path);
  } catch (const Error& e) {
    fail("tokenizer ", e.what());
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("tokenizer '", path, "': not valid JSON (", e.what(), ")");
  }
  auto bad = [&](const auto&... what) { fail("tokenizer '", path, "': ", what...); };
  if (!j.is_object()) bad("expected a JSON object");
  if (!j.contains("type") || j["type"] != "attnres-bpe")
    bad("\"type\" must be \"attnres-bpe\" (not an attnres BPE tokenizer file)");
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
  if (!j.contains("special") || !j["special"].is_object() || j["special"].size() != 1 ||
      !j["special"].contains(kEotText) || !j["special"][kEotText].is_number_integer() ||
      j["special"][kEotText].get<int64_t>() != expected_vocab - 1)
    bad("\"special\" must be {\"", kEotText, "\": ", expected_vocab - 1, "} (the last id)");
  return BpeTokenizer(std::move(merges));
}

}  // namespace attnres::data
