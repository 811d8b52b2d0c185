// Byte-level BPE tokenizers: our own (trained here) and GPT-2's, one code path.
//
// Text is treated as bytes. It is first split into pieces (pre-tokenization);
// BPE merges never cross a piece boundary. Within a piece every byte starts as
// its byte token, then the adjacent pair of lowest merge rank is merged, again
// and again, until no adjacent pair has a merge. That is both GPT-2's and our
// rule; what differs between vocabularies is data:
//   - the ids: which id each byte has and which id each merge creates;
//   - the pre-tokenizer: ours (split_chunks, below) or GPT-2's regular
//     expression (data/gpt2_pretokenizer.h);
//   - the id of <|endoftext|> (EOT), taken from the vocabulary.
//
// Our own vocabularies (BpeTokenizer::train) number their ids
//   0 .. 255              the single bytes
//   256 .. 256+M-1        merge i creates id 256+i (its rank is i)
//   256+M                 <|endoftext|> (EOT), always the last id
// so vocab_size = 257 + M, and are saved as (JSON)
//   {"type":"attnres-bpe","version":1,"vocab_size":N,"merges":[[a,b],...],
//    "special":{"<|endoftext|>":N-1}}
// GPT-2's (and Hugging Face byte-level BPE) vocabularies come from their own
// files (data/gpt2_files.h) and are saved as a Hugging Face tokenizer.json.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/span.h"

namespace attnres::data {

class Gpt2PreTokenizer;

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

// How text is cut into pieces before BPE.
enum class PreTokenizer {
  Attnres,  // split_chunks: our own vocabularies
  Gpt2,     // GPT-2's regular expression: GPT-2 / Hugging Face byte-level vocabularies
};

// A vocabulary in ids, whatever file it came from.
struct BpeVocabulary {
  std::vector<std::string> token_bytes;               // id -> its bytes (specials: their text)
  std::vector<bool> special;                          // id -> spelled literally, never produced by encode
  std::vector<std::pair<int32_t, int32_t>> merges;    // rank -> (left id, right id)
  std::vector<int32_t> merge_ids;                     // rank -> the id the merge creates
  int32_t eot = -1;                                   // <|endoftext|>
};

// What encode() does with the text of a special token (<|endoftext|>) in
// its input, as tiktoken's allowed_special / disallowed_special choose:
//   Text    encode it as ordinary text (tiktoken's encode_ordinary; what
//           llm.c's shards do, and our default: text cannot forge a document
//           break)
//   Allow   turn it into the token's id (Hugging Face's tokenizers by
//           default; tiktoken's allowed_special="all")
//   Refuse  fail, naming the token and where it is (tiktoken's encode() by
//           default)
enum class Specials { Text, Allow, Refuse };
Specials parse_specials(const std::string& name, const std::string& where);

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

  // Reads any of:
  //   - our attnres-bpe file;
  //   - a Hugging Face tokenizer.json of byte-level BPE (GPT-2's regex);
  //   - GPT-2's encoder.json or vocab.bpe, with the other file beside it;
  //   - a directory holding encoder.json + vocab.bpe, or tokenizer.json.
  // The format is recognised from the content of a JSON file, not its name.
  // Errors name the file and the reason.
  static BpeTokenizer load(const std::string& path);
  // A tokenizer from ids; `source` names it in errors. Checks that every byte
  // has a token (so any text can be encoded) and that each merge creates the
  // concatenation of its parts.
  static BpeTokenizer from_vocabulary(BpeVocabulary vocab, PreTokenizer pre, const std::string& source);

  // The file content save() writes: attnres-bpe for our own vocabularies, a
  // Hugging Face tokenizer.json for GPT-2-style ones.
  std::string file_text() const;
  // Atomically (re)writes `path` with file_text().
  void save(const std::string& path) const;

  // Plain text (any bytes) to ids. The text "<|endoftext|>" is NOT turned
  // into EOT: only callers add EOT (so that untrusted text can't inject
  // document breaks). Not thread-safe: encode() fills a piece cache.
  std::vector<int32_t> encode(std::string_view text) const;
  // The same with the special tokens' text (<|endoftext|>) handled by
  // `mode` (see Specials).
  std::vector<int32_t> encode(std::string_view text, Specials mode) const;
  // Concatenated bytes of the tokens (EOT decodes to "<|endoftext|>").
  std::string decode(Span<const int32_t> ids) const;
  // The pieces BPE works within (the pre-tokenizer's output).
  std::vector<std::string_view> split(std::string_view text) const;

  PreTokenizer pre_tokenizer() const { return pre_; }
  int32_t eot() const { return eot_; }
  int vocab_size() const { return static_cast<int>(token_bytes_.size()); }
  int num_merges() const { return static_cast<int>(merges_.size()); }
  // rank -> (left id, right id)
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }
  std::string token_bytes(int32_t id) const;

 private:
  // What a mergeable pair becomes.
  struct Merge {
    int32_t rank;
    int32_t id;
  };

  BpeTokenizer() = default;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  const Merge* find_merge(int32_t left, int32_t right) const;

  PreTokenizer pre_ = PreTokenizer::Attnres;
  std::shared_ptr<const Gpt2PreTokenizer> gpt2_;       // the compiled regex, for PreTokenizer::Gpt2
  std::vector<std::string> token_bytes_;              // id -> bytes (specials: their text)
  std::vector<bool> special_;
  std::vector<int32_t> special_ids_;                  // the ids whose special_ is set
  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::vector<int32_t> merge_ids_;
  std::unordered_map<uint64_t, Merge> merge_table_;   // pair key -> merge
  int32_t byte_id_[256] = {};                         // byte -> its token
  int32_t eot_ = -1;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// One file equivalent to the tokenizer at `path` (any form load() reads), for
// a checkpoint to carry: a one-file form (attnres-bpe, tokenizer.json) byte for
// byte, GPT-2's two files converted to a Hugging Face tokenizer.json.
std::string self_contained_tokenizer(const std::string& path);

}  // namespace attnres::data
