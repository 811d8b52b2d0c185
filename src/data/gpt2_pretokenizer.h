// GPT-2's pre-tokenizer: the regular expression that cuts text into the
// pieces BPE merges within,
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// matched with PCRE2 (UTF, JIT-compiled) so that \p{L} and \p{N} are the
// Unicode classes, not hand-written tables.
//
// Reference behaviour: tiktoken's "gpt2" encoding (Rust regex): \s is the
// Unicode White_Space property, which differs from PCRE's own \s (and from
// JavaScript's, which gpt-3-encoder uses): the pattern here spells that set
// out (see the .cpp).
//
// Text need not be valid UTF-8. Invalid sequences never match the pattern
// (PCRE2_MATCH_INVALID_UTF); each maximal run of bytes the matcher skips
// becomes a piece of its own, so the pieces always concatenate back to the
// input and any bytes round-trip through BPE.
#pragma once
#include <memory>
#include <string_view>
#include <vector>

namespace attnres::data {

class Gpt2PreTokenizer {
 public:
  Gpt2PreTokenizer();  // compiles the pattern (and JIT-compiles it where PCRE2 can)
  ~Gpt2PreTokenizer();
  Gpt2PreTokenizer(Gpt2PreTokenizer&&) noexcept;
  Gpt2PreTokenizer& operator=(Gpt2PreTokenizer&&) noexcept;
  Gpt2PreTokenizer(const Gpt2PreTokenizer&) = delete;
  Gpt2PreTokenizer& operator=(const Gpt2PreTokenizer&) = delete;

  // Appends the pieces of `text` to `out`; they are non-empty and concatenate
  // to `text`. Thread-safe (the compiled pattern is read-only; match state is
  // per call).
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Code;  // owns the compiled pcre2_code
  std::unique_ptr<Code> code_;
};

}  // namespace attnres::data
