// UTF-8 where text meets tokens: a token of a byte-level BPE may end inside a
// character, so its bytes alone need not be valid UTF-8.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace attnres::data {

// Length of the valid UTF-8 sequence at the start of `s` (1 to 4), or 0 when
// it does not start with one: a stray continuation byte, a sequence cut
// short, an overlong form, a surrogate or a code point past U+10FFFF.
size_t utf8_sequence_length(std::string_view s);

// Appends code point `cp` (at most U+10FFFF) to `out` as UTF-8.
void append_utf8(uint32_t cp, std::string& out);

// `bytes` as printable text: each valid character as it is, each byte that is
// not part of one as "<0xHH>" (upper-case hex; the notation of byte tokens in
// Llama's and SentencePiece's vocabularies). `partial`, when given, is set to
// whether any byte was marked.
std::string mark_partial_utf8(std::string_view bytes, bool* partial = nullptr);

}  // namespace attnres::data
