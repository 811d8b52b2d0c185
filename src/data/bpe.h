// Byte-level BPE tokenizer, GPT-2 style, written from scratch.
//
// Text is treated as bytes. It is first split into chunks (pre-tokenization,
// see split_chunks); BPE merges never cross a chunk boundary. Ids:
//   0 .. 255              the single bytes
//   256 .. 256+M-1        merge i creates id 256+i (its rank is i)
//   256+M                 <|endoftext|> (EOT), always the last id
// so vocab_size = 257 + M.
//
// File format (JSON):
//   {"type":"attnres-bpe","version":1,"vocab_size":N,"merges":[[a,b],...],
//    "special":{"<|endoftext|>":N-1}}
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/span.h"

namespace attnres::data {

// GPT-2-like pre-tokenization, by hand over bytes (bytes >= 0x80 count as
// letters, so UTF-8 words stay whole). Alternatives, tried in this order at
// each position:
//   's 't 're 've 'm 'll 'd                 contractions
//   optional ' ' + letters
//   optional ' ' + digits
//   optional ' ' + other non-space bytes
//   whitespace run, less its last byte when a non-space follows (so that the
//     last space can lead the next word), else the whole run
// The chunks concatenate back to `text` exactly.
std::vector<std::string_view> split_chunks(std::string_view text);

class BpeTokenizer {
 public:
  static constexpr const char* kEotText = "<|endoftext|>";
  // Called as progress(merges_done, merges_wanted) during training.
  using Progress = std::function<void(int, int)>;

  // Learns vocab_size - 257 merges from `documents` (vocab_size >= 257). If
  // the text runs out of pairs first, training stops early with a smaller
  // vocabulary (a warning is logged). Ties between equally frequent pairs go
  // to the smallest (left id, right id), so training is deterministic.
  static BpeTokenizer train(const std::vector<std::string>& documents, int vocab_size,
                            const Progress& progress = nullptr);
  static BpeTokenizer load(const std::string& path);
  // Atomically (re)writes `path`.
  void save(const std::string& path) const;

  // Plain text to ids. The text "<|endoftext|>" is NOT turned into EOT: only
  // callers add EOT (so that untrusted text can't inject document breaks).
  // Not thread-safe: encode() fills a chunk cache.
  std::vector<int32_t> encode(std::string_view text) const;
  // Concatenated bytes of the tokens (EOT decodes to "<|endoftext|>").
  std::string decode(Span<const int32_t> ids) const;

  int32_t eot() const { return static_cast<int32_t>(token_bytes_.size()) - 1; }
  int vocab_size() const { return static_cast<int>(token_bytes_.size()); }
  int num_merges() const { return static_cast<int>(merges_.size()); }
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }
  std::string token_bytes(int32_t id) const;

 private:
  explicit BpeTokenizer(std::vector<std::pair<int32_t, int32_t>> merges);
  void encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const;

  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::unordered_map<uint64_t, int32_t> merge_rank_;  // pair key -> rank
  std::vector<std::string> token_bytes_;              // id -> bytes (EOT: its text)
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace attnres::data
