#include "data/brown.h"

#include <cctype>
#include <vector>

namespace attnres::data {
namespace {

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }

bool equals_lower(std::string_view word, std::string_view lower) {
  if (word.size() != lower.size()) return false;
  for (size_t i = 0; i < word.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(word[i])) != lower[i]) return false;
  return true;
}

// Words printed without a space before them: closing punctuation and the
// clitics that the tagged corpus may give as separate tokens.
bool attaches_left(std::string_view w) {
  static constexpr std::string_view kClosers[] = {",", ".", ";", ":", "?", "!", ")", "]", "}", "''", "..."};
  for (auto c : kClosers)
    if (w == c) return true;
  static constexpr std::string_view kClitics[] = {"'s", "'re", "'ve", "'ll", "'d", "'m", "n't"};
  for (auto c : kClitics)
    if (equals_lower(w, c)) return true;
  return false;
}

// Words printed without a space after them.
bool attaches_right(std::string_view w) { return w == "``" || w == "(" || w == "[" || w == "{"; }

// The word of a `word/tag` token: everything before the last '/'. A leading
// '/' can't start a tag (the token "//in" is the word "/").
std::string_view strip_tag(std::string_view token) {
  const size_t slash = token.rfind('/');
  if (slash == std::string_view::npos || slash == 0) return token;
  return token.substr(0, slash);
}

// Joins one paragraph's tokens into text.
std::string join_paragraph(const std::vector<std::string_view>& tokens) {
  std::string out;
  bool glue_next = true;         // no space before the next word (paragraph start, after an opener)
  bool single_quote_open = false;  // a lone ' alternates between opening and closing
  std::string_view previous;
  bool after_closing_quote = false;
  for (std::string_view token : tokens) {
    const std::string_view word = strip_tag(token);
    if (word.empty()) continue;
    // This edition of the corpus doubles every ; ? and ! token ("living ;/. ;/."),
    // which is not in the printed text: keep one.
    if (word == previous && (word == ";" || word == "?" || word == "!")) continue;
    previous = word;
    bool left = attaches_left(word);
    bool right = attaches_right(word);
    if (word == "'") {
      left = single_quote_open;
      right = !single_quote_open;
      single_quote_open = !single_quote_open;
    }
    // The tagged text puts a sentence's final mark after its closing quote
    // (`drink '' ?`); printed American English has it inside: drink?"
    const bool inside_quote = after_closing_quote && (word == "." || word == "," || word == "?" || word == "!");
    after_closing_quote = word == "''";
    if (inside_quote) {
      out.insert(out.size() - 1, word);
      continue;
    }
    if (!out.empty() && !glue_next && !left) out += ' ';
    if (word == "``" || word == "''") {
      out += '"';
    } else {
      out.append(word.data(), word.size());
    }
    glue_next = right;
  }
  return out;
}

}  // namespace

std::string brown_to_text(std::string_view raw) {
  std::string text;
  std::vector<std::string_view> tokens;  // of the current paragraph
  auto flush = [&] {
    if (tokens.empty()) return;
    std::string para = join_paragraph(tokens);
    tokens.clear();
    if (para.empty()) return;
    if (!text.empty()) text += "\n\n";
    text += para;
  };
  size_t pos = 0;
  while (pos <= raw.size()) {
    size_t end = raw.find('\n', pos);
    if (end == std::string_view::npos) end = raw.size();
    const std::string_view line = raw.substr(pos, end - pos);
    bool blank = true;
    for (size_t i = 0; i < line.size();) {
      if (is_blank(line[i])) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < line.size() && !is_blank(line[j])) ++j;
      tokens.push_back(line.substr(i, j - i));
      blank = false;
      i = j;
    }
    if (blank) flush();  // a blank line ends the paragraph
    pos = end + 1;
  }
  flush();
  return text;
}

}  // namespace attnres::data
