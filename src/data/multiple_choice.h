// Multiple-choice task files, read as text: HellaSwag's jsonl (one question
// per line: {"ctx": context, "endings": [4 strings], "label": index of the
// right ending, and "activity_label", "ctx_a", "ctx_b", which lm-eval's
// rendering needs}, other fields ignored), as the HellaSwag repository ships
// it and llm.c and lm-eval read it. Scoring is in train/multiple_choice.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace attnres::data {

struct ChoiceItem {
  std::string context;  // "ctx"
  // "activity_label", "ctx_a", "ctx_b" (lm-eval builds its query from them);
  // has_parts is false when the line lacks one of them.
  std::string activity_label, ctx_a, ctx_b;
  bool has_parts = false;
  std::vector<std::string> endings;
  int64_t label = 0;  // index into endings
  int64_t line = 0;   // 1-based line of the file, for messages
};

// The task names `read_task` knows, for messages ("hellaswag").
const char* known_tasks();
bool is_known_task(const std::string& name);

// The first `limit` questions (0 = all) of task `name`'s file at `path`.
// Errors name the file, the line and the field: a line that is not a JSON
// object, a missing or empty "ctx" or ending, fewer than 2 endings, a label
// outside the endings (an integer, or a string of digits as in some dumps).
std::vector<ChoiceItem> read_task(const std::string& name, const std::string& path,
                                  int64_t limit = 0);

}  // namespace attnres::data
