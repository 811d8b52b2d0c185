// Multiple-choice task files (data/multiple_choice.h): HellaSwag's jsonl read
// as written, and every malformed line refused with the file, line and field.
#include <catch2/catch.hpp>
#include <fstream>

#include "core/error.h"
#include "data/multiple_choice.h"
#include "temp_dir.h"

using namespace attnres;

namespace {
std::string write(const testing::TempDir& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir / name) << text;
  return dir / name;
}
std::string error_of(const std::string& path) {
  try {
    data::read_task("hellaswag", path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("HellaSwag's jsonl: ctx, endings, label, and other fields ignored", "[data]") {
  testing::TempDir dir;
  const std::string path = write(dir, "hs.jsonl",
      R"({"ind": 4, "activity_label": "Cooking", "ctx": "A man cracks an egg", "endings": [" into a bowl.", "at the moon.", "quietly.", "x"], "label": 0, "split": "val"})"
      "\n\n"
      R"({"ctx": "She opens the door", "endings": ["and walks in.", "and flies."], "label": "1"})"
      "\n"
      R"({"ctx": "Third", "endings": ["a", "b", "c"], "label": 2})"
      "\n");
  const auto items = data::read_task("hellaswag", path);
  REQUIRE(items.size() == 3);
  CHECK(items[0].context == "A man cracks an egg");
  CHECK(items[0].endings == std::vector<std::string>{" into a bowl.", "at the moon.", "quietly.", "x"});
  CHECK(items[0].label == 0);
  CHECK(items[0].line == 1);
  CHECK(items[1].label == 1);  // a string of digits, as some re-distributions write it
  CHECK(items[1].line == 3);   // the blank line is skipped, lines still counted
  CHECK(items[2].endings.size() == 3);
  CHECK(data::read_task("hellaswag", path, 2).size() == 2);
}

TEST_CASE("malformed task files are refused naming the line and the field", "[data]") {
  testing::TempDir dir;
  const std::string ok = R"({"ctx": "c", "endings": ["a", "b"], "label": 0})";
  CHECK_THAT(error_of(write(dir, "a.jsonl", ok + "\n{\"ctx\": \n")),
             Catch::Contains("a.jsonl:2") && Catch::Contains("not valid JSON"));
  CHECK_THAT(error_of(write(dir, "b.jsonl", R"({"endings": ["a", "b"], "label": 0})")),
             Catch::Contains("b.jsonl:1") && Catch::Contains("\"ctx\""));
  CHECK_THAT(error_of(write(dir, "c.jsonl", R"({"ctx": "c", "endings": ["a"], "label": 0})")),
             Catch::Contains("at least 2"));
  CHECK_THAT(error_of(write(dir, "d.jsonl", R"({"ctx": "c", "endings": ["a", ""], "label": 0})")),
             Catch::Contains("ending 1"));
  CHECK_THAT(error_of(write(dir, "e.jsonl", R"({"ctx": "c", "endings": ["a", "b"], "label": 2})")),
             Catch::Contains("\"label\" 2"));
  CHECK_THAT(error_of(write(dir, "f.jsonl", R"({"ctx": "c", "endings": ["a", "b"], "label": "b"})")),
             Catch::Contains("\"label\""));
  CHECK_THAT(error_of(write(dir, "g.jsonl", R"({"ctx": "c", "endings": ["a", "b"]})")),
             Catch::Contains("no \"label\""));
  CHECK_THAT(error_of(write(dir, "h.jsonl", "[1, 2]\n")), Catch::Contains("JSON object"));
  CHECK_THAT(error_of(write(dir, "i.jsonl", "\n\n")), Catch::Contains("no questions"));
  CHECK_THAT(error_of(dir / "missing.jsonl"), Catch::Contains("cannot open"));
  CHECK_THROWS_WITH(data::read_task("piqa", write(dir, "j.jsonl", ok)),
                    Catch::Contains("unknown task 'piqa'"));
}
