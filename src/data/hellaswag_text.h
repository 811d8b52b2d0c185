// HellaSwag's text as lm-evaluation-harness renders it (its hellaswag task's
// utils.py), transcribed rule by rule so that scores compare with published
// lm-eval numbers:
//   query   = preprocess(activity_label + ": " + ctx_a + " " + capitalize(ctx_b))
//   choice  = preprocess(ending), scored as the continuation " " + choice
//   preprocess(t) = t.strip(), then " [title]" -> ". ", then every "[...]"
//                   (shortest, within a line) removed, then "  " -> " " (one pass)
// Python's str methods are the reference: strip() removes what isspace()
// calls space, capitalize() upper-cases the first character and lower-cases
// the rest. Case mapping here is the C library's simple (one character to
// one character) Unicode mapping; Python's full mappings differ on a few
// characters (ß and ŉ as first character, İ, final sigma, the titlecase
// digraphs), none of which HellaSwag's English text holds (docs/ecosystem.md).
#pragma once
#include <string>

namespace attnres::data {

// Python's str.strip() and str.rstrip() with no argument, on UTF-8.
std::string python_strip(const std::string& s);
std::string python_rstrip(const std::string& s);

// Python's str.capitalize(), on UTF-8 (simple case mapping; see above).
std::string python_capitalize(const std::string& s);

// lm-eval's hellaswag preprocess().
std::string lm_eval_preprocess(const std::string& text);

}  // namespace attnres::data
