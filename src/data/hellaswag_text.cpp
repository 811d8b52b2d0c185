#include "data/hellaswag_text.h"

#include <locale.h>
#include <wctype.h>

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "data/utf8.h"

namespace attnres::data {
namespace {

// UTF-8 -> code points; a byte that starts no valid sequence becomes
// 0x80000000 | byte, which no mapping or class touches and which encodes back
// to that byte.
std::vector<uint32_t> to_code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(std::string_view(s).substr(i));
    const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
    if (n == 0) {
      out.push_back(0x80000000u | b(0));
      i += 1;
      continue;
    }
    uint32_t cp = n == 1 ? b(0) : n == 2 ? b(0) & 0x1F : n == 3 ? b(0) & 0x0F : b(0) & 0x07;
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (b(k) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string to_utf8(const std::vector<uint32_t>& cps) {
  std::string out;
  for (uint32_t c : cps) {
    if (c & 0x80000000u) {
      out += static_cast<char>(c & 0xFF);  // a stray byte, as it was
    } else {
      append_utf8(c, out);
    }
  }
  return out;
}

// Python's str.isspace(): bidirectional class WS, B or S, or category Zs.
bool python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// The C.UTF-8 locale's case tables (glibc: Unicode's simple mappings).
// Created once, read-only after; freed at exit by the OS.
locale_t unicode_ctype() {
  static const locale_t loc = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
    if (!l) fail_internal("the C.UTF-8 locale is missing (lm-eval's capitalize() needs its case tables)");
    return l;
  }();
  return loc;
}

uint32_t map_case(uint32_t c, bool upper) {
  if (c & 0x80000000u) return c;
  const wint_t w = upper ? towupper_l(static_cast<wint_t>(c), unicode_ctype())
                         : towlower_l(static_cast<wint_t>(c), unicode_ctype());
  return static_cast<uint32_t>(w);
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = s.find(from, at)) != std::string::npos; at = hit + from.size())
    out.append(s, at, hit - at).append(to);
  out.append(s, at, std::string::npos);
  s = std::move(out);
}

}  // namespace

namespace {
std::string strip_ends(const std::string& s, bool left) {
  const auto cps = to_code_points(s);
  size_t a = 0, b = cps.size();
  while (left && a < b && python_space(cps[a])) ++a;
  while (b > a && python_space(cps[b - 1])) --b;
  return to_utf8(std::vector<uint32_t>(cps.begin() + static_cast<std::ptrdiff_t>(a),
                                       cps.begin() + static_cast<std::ptrdiff_t>(b)));
}
}  // namespace

std::string python_strip(const std::string& s) { return strip_ends(s, true); }
std::string python_rstrip(const std::string& s) { return strip_ends(s, false); }

std::string python_capitalize(const std::string& s) {
  auto cps = to_code_points(s);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = map_case(cps[i], i == 0);
  return to_utf8(cps);
}

std::string lm_eval_preprocess(const std::string& text) {
  std::string t = python_strip(text);
  replace_all(t, " [title]", ". ");
  // re.sub("\\[.*?\\]", "", t): '.' is any character but a newline; '[', ']'
  // and '\n' are ASCII, which UTF-8 never uses inside a character, so bytes do.
  std::string out;
  for (size_t i = 0; i < t.size();) {
    if (t[i] == '[') {
      size_t j = i + 1;
      while (j < t.size() && t[j] != ']' && t[j] != '\n') ++j;
      if (j < t.size() && t[j] == ']') {
        i = j + 1;
        continue;
      }
    }
    out += t[i++];
  }
  replace_all(out, "  ", " ");
  return out;
}

}  // namespace attnres::data
