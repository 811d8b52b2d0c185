#include "data/multiple_choice.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace attnres::data {

using nlohmann::json;

const char* known_tasks() { return "hellaswag"; }
bool is_known_task(const std::string& name) { return name == "hellaswag"; }

namespace {

// HellaSwag's label is an integer in the original files and a string of
// digits in some re-distributions; both mean the same index.
int64_t read_label(const json& v, const std::string& where) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (!s.empty() && s.size() < 10 && s.find_first_not_of("0123456789") == std::string::npos)
      return std::stoll(s);
  }
  fail(where, ": \"label\" must be the index of the right ending, got ", v.dump());
}

ChoiceItem read_hellaswag_line(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(where, ": not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) fail(where, ": expected a JSON object with \"ctx\", \"endings\", \"label\"");
  ChoiceItem q;
  if (!j.contains("ctx") || !j["ctx"].is_string() || j["ctx"].get<std::string>().empty())
    fail(where, ": \"ctx\" must be a non-empty string");
  q.context = j["ctx"].get<std::string>();
  q.has_parts = true;
  for (auto [key, field] : {std::pair{"activity_label", &q.activity_label}, std::pair{"ctx_a", &q.ctx_a},
                            std::pair{"ctx_b", &q.ctx_b}}) {
    if (!j.contains(key)) {
      q.has_parts = false;
      continue;
    }
    if (!j[key].is_string()) fail(where, ": \"", key, "\" must be a string, got ", j[key].dump());
    *field = j[key].get<std::string>();
  }
  if (!j.contains("endings") || !j["endings"].is_array() || j["endings"].size() < 2)
    fail(where, ": \"endings\" must be an array of at least 2 strings");
  for (const json& e : j["endings"]) {
    if (!e.is_string() || e.get<std::string>().empty())
      fail(where, ": ending ", q.endings.size(), " must be a non-empty string, got ", e.dump());
    q.endings.push_back(e.get<std::string>());
  }
  if (!j.contains("label")) fail(where, ": has no \"label\"");
  q.label = read_label(j["label"], where);
  if (q.label < 0 || q.label >= static_cast<int64_t>(q.endings.size()))
    fail(where, ": \"label\" ", q.label, " is not the index of one of its ", q.endings.size(),
         " endings");
  return q;
}

}  // namespace

std::vector<ChoiceItem> read_task(const std::string& name, const std::string& path,
                                  int64_t limit) {
  if (!is_known_task(name))
    fail("unknown task '", name, "' (known: ", known_tasks(), ")");
  std::ifstream f(path);
  if (!f) fail(name, " file '", path, "': cannot open");
  std::vector<ChoiceItem> out;
  std::string line;
  for (int64_t n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
    ChoiceItem q = read_hellaswag_line(line, path + ":" + std::to_string(n));
    q.line = n;
    out.push_back(std::move(q));
    if (limit > 0 && static_cast<int64_t>(out.size()) >= limit) break;
  }
  if (f.bad()) fail(name, " file '", path, "': read error");
  if (out.empty()) fail(name, " file '", path, "': holds no questions");
  return out;
}

}  // namespace attnres::data
