// lm-eval's HellaSwag text rules (data/hellaswag_text.h) against Python's own
// results: every expected value below was printed by python3 (3.11) running
// str.capitalize(), str.strip() and lm-eval's preprocess() on the input.
#include <catch2/catch.hpp>

#include "data/hellaswag_text.h"

using namespace attnres::data;

TEST_CASE("python_capitalize and python_strip give Python's results", "[hellaswag_text]") {
  CHECK(python_capitalize("hello World") == "Hello world");
  CHECK(python_capitalize("hELLO wORLD") == "Hello world");
  CHECK(python_capitalize("\u00e9lection \u00c9t\u00e9") == "\u00c9lection \u00e9t\u00e9");
  CHECK(python_capitalize("\u00f1and\u00fa \u00d1U") == "\u00d1and\u00fa \u00f1u");
  CHECK(python_capitalize("\"quoted start") == "\"quoted start");
  CHECK(python_capitalize("  lead") == "  lead");
  CHECK(python_capitalize("\u00fcber \u00c4\u00d6\u00dc") == "\u00dcber \u00e4\u00f6\u00fc");
  CHECK(python_capitalize("\u043c\u043e\u0441\u043a\u0432\u0430 \u041c\u041e\u0421\u041a\u0412\u0410") ==
        "\u041c\u043e\u0441\u043a\u0432\u0430 \u043c\u043e\u0441\u043a\u0432\u0430");
  CHECK(python_capitalize("1st Place") == "1st place");
  CHECK(python_capitalize("").empty());
  CHECK(python_capitalize("ok\xff" "AB") == "Ok\xff" "ab");  // a stray byte passes through

  CHECK(python_strip("  a b \t\n") == "a b");
  CHECK(python_strip("\x1fx\x1c") == "x");
  CHECK(python_strip("\u3000x\u00a0") == "x");
  CHECK(python_strip("\u200bx\u200b") == "\u200bx\u200b");  // zero-width space is not space
  CHECK(python_strip("\u0085y\u2028") == "y");
}

TEST_CASE("lm_eval_preprocess gives Python's results", "[hellaswag_text]") {
  CHECK(lm_eval_preprocess(" [title] caf\u00e9  [header] cr\u00e8me") == " caf\u00e9  cr\u00e8me");
  CHECK(lm_eval_preprocess("How to x [title] Step one [step] go") == "How to x. Step one go");
  CHECK(lm_eval_preprocess("a [b\nc] d") == "a [b\nc] d");  // '.' stops at a newline
  CHECK(lm_eval_preprocess("a [x[y] z]") == "a z]");        // the shortest match from the first '['
  CHECK(lm_eval_preprocess("a    b") == "a  b");            // one pass of "  " -> " "
}

TEST_CASE("python_rstrip strips the right end only", "[hellaswag_text]") {
  CHECK(python_rstrip("  a b \t\u00a0") == "  a b");
  CHECK(python_rstrip("x") == "x");
  CHECK(python_rstrip(" \u3000").empty());
}
