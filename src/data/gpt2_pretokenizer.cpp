#include "data/gpt2_pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string>

#include "core/error.h"

namespace attnres::data {
namespace {

// tiktoken's \s: Rust regex's, the Unicode White_Space property (tab, LF,
// VT, FF, CR, space, U+0085 NEL, U+00A0, U+1680, U+2000..U+200A, U+2028,
// U+2029, U+202F, U+205F, U+3000), spelled out because engines disagree:
// PCRE's \s (with UCP) lacks U+0085, JavaScript's (gpt-3-encoder) lacks U+0085
// and adds U+FEFF, Python re's adds U+001C..U+001F.
constexpr const char* kSpace =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

std::string gpt2_pattern() {
  const std::string s = kSpace;
  // (?!\S), "not followed by a non-space", is (?![^S]): it also holds at the
  // end of the text and before an invalid UTF-8 sequence.
  return "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + s + "\\p{L}\\p{N}]+|[" + s +
         "]+(?![^" + s + "])|[" + s + "]+";
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof buf);
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<char*>(buf));
}

// Per-call match state (two offsets), freed on every exit path.
class MatchData {
 public:
  explicit MatchData(const pcre2_code* code) : md_(pcre2_match_data_create_from_pattern(code, nullptr)) {
    if (!md_) fail_internal("GPT-2 pre-tokenizer: out of memory for PCRE2 match data");
  }
  ~MatchData() { pcre2_match_data_free(md_); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
  pcre2_match_data* get() const { return md_; }

 private:
  pcre2_match_data* md_;
};

}  // namespace

struct Gpt2PreTokenizer::Code {
  pcre2_code* re = nullptr;
  ~Code() { pcre2_code_free(re); }
};

Gpt2PreTokenizer::Gpt2PreTokenizer() : code_(std::make_unique<Code>()) {
  const std::string pattern = gpt2_pattern();
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // MATCH_INVALID_UTF implies UTF and lets arbitrary bytes be matched: invalid
  // sequences act as barriers instead of making pcre2_match fail. UCP makes
  // any class shorthand Unicode-aware (the pattern spells its classes out).
  code_->re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                            PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
  if (!code_->re)
    fail_internal("GPT-2 pre-tokenizer: the pattern does not compile at offset ", err_offset, ": ",
                  pcre2_message(err));
  // The JIT is ~10x faster; without it (a platform PCRE2's JIT does not
  // support) pcre2_match interprets the same pattern with the same results.
  pcre2_jit_compile(code_->re, PCRE2_JIT_COMPLETE);
}

Gpt2PreTokenizer::~Gpt2PreTokenizer() = default;
Gpt2PreTokenizer::Gpt2PreTokenizer(Gpt2PreTokenizer&&) noexcept = default;
Gpt2PreTokenizer& Gpt2PreTokenizer::operator=(Gpt2PreTokenizer&&) noexcept = default;

void Gpt2PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  const MatchData md(code_->re);
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0;
  while (pos < n) {
    const int rc = pcre2_match(code_->re, subject, n, pos, 0, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {  // only invalid UTF-8 is left: one piece
      out.push_back(text.substr(pos));
      break;
    }
    if (rc < 0) fail_internal("GPT-2 pre-tokenizer: pcre2_match failed: ", pcre2_message(rc));
    const size_t start = ov[0], end = ov[1];
    // Every valid character starts a match, so what the matcher skipped is
    // invalid UTF-8: it becomes a piece of its own.
    if (start > pos) out.push_back(text.substr(pos, start - pos));
    ATTNRES_CHECK(end > start, "empty GPT-2 pre-token at byte ", start);
    out.push_back(text.substr(start, end - start));
    pos = end;
  }
}

}  // namespace attnres::data
