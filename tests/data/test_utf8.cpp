// UTF-8 validation and the marking of bytes that are not part of a character
// (data/utf8.h), against the Unicode Standard's table of well-formed
// sequences (Table 3-7) written out case by case.
#include <catch2/catch.hpp>

#include "data/utf8.h"

using attnres::data::mark_partial_utf8;
using attnres::data::utf8_sequence_length;

TEST_CASE("utf8_sequence_length follows the table of well-formed UTF-8", "[utf8]") {
  // Well-formed: each row's first and last code points.
  CHECK(utf8_sequence_length("A") == 1);
  CHECK(utf8_sequence_length(std::string(1, '\0')) == 1);
  CHECK(utf8_sequence_length("\x7f") == 1);
  CHECK(utf8_sequence_length("\xc2\x80") == 2);          // U+0080
  CHECK(utf8_sequence_length("\xdf\xbf") == 2);          // U+07FF
  CHECK(utf8_sequence_length("\xe0\xa0\x80") == 3);      // U+0800
  CHECK(utf8_sequence_length("\xed\x9f\xbf") == 3);      // U+D7FF
  CHECK(utf8_sequence_length("\xee\x80\x80") == 3);      // U+E000
  CHECK(utf8_sequence_length("\xef\xbf\xbf") == 3);      // U+FFFF
  CHECK(utf8_sequence_length("\xf0\x90\x80\x80") == 4);  // U+10000
  CHECK(utf8_sequence_length("\xf4\x8f\xbf\xbf") == 4);  // U+10FFFF
  CHECK(utf8_sequence_length("\xc3\xa9tail") == 2);      // only the first character counts
  // Ill-formed.
  CHECK(utf8_sequence_length("") == 0);
  CHECK(utf8_sequence_length("\x80") == 0);              // a continuation byte alone
  CHECK(utf8_sequence_length("\xc0\xaf") == 0);          // overlong '/'
  CHECK(utf8_sequence_length("\xc1\xbf") == 0);
  CHECK(utf8_sequence_length("\xe0\x9f\xbf") == 0);      // overlong U+07FF
  CHECK(utf8_sequence_length("\xed\xa0\x80") == 0);      // surrogate U+D800
  CHECK(utf8_sequence_length("\xf0\x8f\xbf\xbf") == 0);  // overlong U+FFFF
  CHECK(utf8_sequence_length("\xf4\x90\x80\x80") == 0);  // U+110000
  CHECK(utf8_sequence_length("\xf5\x80\x80\x80") == 0);
  CHECK(utf8_sequence_length("\xff") == 0);
  CHECK(utf8_sequence_length("\xe2\x82") == 0);          // cut short
  CHECK(utf8_sequence_length("\xe2\x82z") == 0);
  CHECK(utf8_sequence_length("\xf0\x9f\x98") == 0);
}

TEST_CASE("mark_partial_utf8 keeps characters and marks stray bytes as <0xHH>", "[utf8]") {
  bool partial = true;
  CHECK(mark_partial_utf8("caf\xc3\xa9 \xe2\x82\xac", &partial) == "caf\xc3\xa9 \xe2\x82\xac");
  CHECK_FALSE(partial);
  // A token ending inside the euro sign, and the one holding its last byte.
  CHECK(mark_partial_utf8(" \xe2\x82", &partial) == " <0xE2><0x82>");
  CHECK(partial);
  CHECK(mark_partial_utf8("\xac!", &partial) == "<0xAC>!");
  CHECK(partial);
  CHECK(mark_partial_utf8("\xf0\x9f\x98\x80\xf0\x9f", &partial) == "\xf0\x9f\x98\x80<0xF0><0x9F>");
  CHECK(mark_partial_utf8("", &partial).empty());
  CHECK_FALSE(partial);
}

TEST_CASE("append_utf8 writes each row of the table's first and last code points", "[utf8]") {
  auto enc = [](uint32_t cp) {
    std::string s;
    attnres::data::append_utf8(cp, s);
    return s;
  };
  CHECK(enc(0x41) == "A");
  CHECK(enc(0x7F) == "\x7f");
  CHECK(enc(0x80) == "\xc2\x80");
  CHECK(enc(0x7FF) == "\xdf\xbf");
  CHECK(enc(0x800) == "\xe0\xa0\x80");
  CHECK(enc(0xFFFF) == "\xef\xbf\xbf");
  CHECK(enc(0x10000) == "\xf0\x90\x80\x80");
  CHECK(enc(0x10FFFF) == "\xf4\x8f\xbf\xbf");
  for (uint32_t cp : {0x41u, 0x80u, 0x800u, 0x10000u, 0x10FFFFu}) CHECK(utf8_sequence_length(enc(cp)) == enc(cp).size());
}
