#include "data/utf8.h"

#include <cstdio>

namespace attnres::data {

size_t utf8_sequence_length(std::string_view s) {
  if (s.empty()) return 0;
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  // The lead byte fixes the length and the range of the second byte (which
  // rules out overlong forms, surrogates and code points past U+10FFFF).
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < n || b(1) < lo || b(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i)
    if (b(i) < 0x80 || b(i) > 0xBF) return 0;
  return n;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string mark_partial_utf8(std::string_view bytes, bool* partial) {
  std::string out;
  out.reserve(bytes.size());
  bool marked = false;
  for (size_t i = 0; i < bytes.size();) {
    if (const size_t n = utf8_sequence_length(bytes.substr(i))) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", static_cast<unsigned char>(bytes[i]));
      out += hex;
      marked = true;
      ++i;
    }
  }
  if (partial) *partial = marked;
  return out;
}

}  // namespace attnres::data
