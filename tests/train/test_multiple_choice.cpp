// Multiple-choice scoring (train/multiple_choice.h): acc / acc_norm from
// summed log-probabilities, the rendering of questions into tokens, the
// eval.tasks list, and the runtime's batched, padded rows against each row
// scored alone.
#include <catch2/catch.hpp>
#include <numeric>

#include "core/error.h"
#include "model/model_testing.h"
#include "parallel/runtime.h"
#include "train/multiple_choice.h"

using namespace attnres;
using train::ChoiceQuestion;

namespace {

ChoiceQuestion question(std::vector<double> norm, int64_t label) {
  ChoiceQuestion q;
  q.context = {0};
  q.endings.assign(norm.size(), {1});
  q.norm = std::move(norm);
  q.label = label;
  return q;
}

// Bytes as token ids (EOT = 256): an encoder that needs no tokenizer file.
std::vector<int32_t> byte_ids(const std::string& s) { return std::vector<int32_t>(s.begin(), s.end()); }

}  // namespace

TEST_CASE("acc takes the largest sum, acc_norm the largest sum per unit of length", "[train]") {
  // q0: sums -4, -6 over lengths 2 and 6: acc picks 0, acc_norm picks 1 (-1 > -2).
  // q1: a tie (-3, -3): the first wins, as numpy's argmax.
  // q2: both pick ending 2.
  const std::vector<ChoiceQuestion> qs = {question({2, 6}, 1), question({3, 3}, 0),
                                          question({1, 1, 1}, 2)};
  const auto s = train::choice_scores(qs, {{-4, -6}, {-3, -3}, {-9, -8, -1}});
  CHECK(s.examples == 3);
  CHECK(s.acc == Approx(2.0 / 3));       // q1, q2
  CHECK(s.acc_norm == Approx(3.0 / 3));  // q0, q1, q2
  CHECK(train::choice_scores({question({2, 6}, 0)}, {{-4, -6}}).acc_norm == 0);
}

TEST_CASE("questions as llm.c renders them: ctx as it is, each ending after a space, per token", "[train]") {
  data::ChoiceItem it;
  it.context = "A man";
  it.endings = {"runs.", "sits down."};
  it.label = 1;
  it.line = 7;
  const auto qs = train::tokenize_questions({it}, train::Scoring::LlmC, byte_ids, 16, "t.jsonl", "T");
  REQUIRE(qs.size() == 1);
  CHECK(qs[0].context == byte_ids("A man"));  // no <|endoftext|> before it, as llm.c
  CHECK(qs[0].endings[0] == byte_ids(" runs."));
  CHECK(qs[0].norm == std::vector<double>{6, 11});  // tokens of " runs." and " sits down."
  CHECK(qs[0].label == 1);
  CHECK_THROWS_WITH(train::tokenize_questions({it}, train::Scoring::LlmC, byte_ids, 8, "t.jsonl", "the seq_len"),
                    Catch::Contains("t.jsonl:7: ending 1 is 11 tokens, more than the 8 positions") &&
                        Catch::Contains("the seq_len"));
}

TEST_CASE("questions as lm-eval renders them: its query, preprocessed endings, per character", "[train]") {
  data::ChoiceItem it;
  it.context = "unused by lm-eval";
  it.activity_label = "Removing ice from car";
  it.ctx_a = "Then, the man writes over the snow covering the window of a car, and a woman wearing winter clothes smiles.";
  it.ctx_b = "then";
  it.has_parts = true;
  it.endings = {", the man adds wax to the windshield and cuts it.", " [title] caf\u00e9  [header] cr\u00e8me",
                "How to x [title] Step one [step] go"};
  it.label = 0;
  it.line = 3;
  const auto qs = train::tokenize_questions({it}, train::Scoring::LmEval, byte_ids, 256, "t.jsonl", "T");
  REQUIRE(qs.size() == 1);
  const std::string query =
      "Removing ice from car: Then, the man writes over the snow covering the window of a car, and a "
      "woman wearing winter clothes smiles. Then";
  CHECK(qs[0].context_text == query);
  CHECK(qs[0].context == byte_ids(query));
  // Python's own results for these endings (lm-eval's preprocess run by
  // python3): strip, " [title]" -> ". ", "[...]" removed, "  " -> " " once.
  CHECK(qs[0].ending_texts == std::vector<std::string>{" , the man adds wax to the windshield and cuts it.",
                                                       "  caf\u00e9  cr\u00e8me", " How to x. Step one go"});
  CHECK(qs[0].endings[1] == byte_ids("  caf\u00e9  cr\u00e8me"));
  // Python's len() of each preprocessed ending: characters, not bytes.
  CHECK(qs[0].norm == std::vector<double>{49, 12, 21});

  data::ChoiceItem bare = it;
  bare.has_parts = false;
  CHECK_THROWS_WITH(train::tokenize_questions({bare}, train::Scoring::LmEval, byte_ids, 256, "t.jsonl", "T"),
                    Catch::Contains("t.jsonl:3") && Catch::Contains("ctx_a"));
  CHECK(train::parse_scoring("llm.c", "x") == train::Scoring::LlmC);
  CHECK_THROWS_WITH(train::parse_scoring("helm", "eval: --scoring"),
                    Catch::Contains("eval: --scoring") && Catch::Contains("lm-eval, llm.c"));
}

TEST_CASE("eval.tasks lists TASK:FILE entries", "[train]") {
  const auto t = train::parse_task_list("hellaswag:a.jsonl,hellaswag:dir/b:c.jsonl", "eval.tasks");
  REQUIRE(t.size() == 2);
  CHECK(t[1].name == "hellaswag");
  CHECK(t[1].path == "dir/b:c.jsonl");
  for (const char* bad : {"hellaswag", "hellaswag:", ":a.jsonl", "hellaswag:a.jsonl,", "piqa:a"})
    CHECK_THROWS_WITH(train::parse_task_list(bad, "eval.tasks"), Catch::Contains("eval.tasks"));
}

TEST_CASE("the runtime's padded rows score each ending as the model alone does", "[train]") {
  using model::ResidualMode;
  const auto cfg = testing::tiny(ResidualMode::Block, 3, 0, false, 3);  // uneven blocks
  const int64_t B = 3, T = 6;
  const parallel::Comm solo = parallel::Comm::solo();
  const parallel::ProcessGrid grid(solo, 1, 1);
  parallel::Runtime rt(grid, cfg, DType::F64, Device::CPU, parallel::RuntimeOptions{}, B, T);
  testing::randomize(rt.model().chunk(0).params(), 23);
  model::Model alone(cfg, DType::F64);
  for (auto& p : alone.params().all()) p.value.copy_from(rt.model().chunk(0).params().get(p.name).value);

  // 4 questions, 11 rows: microbatches of 3 rows, the last one padded; one
  // context longer than T + 1 tokens (truncated from the left).
  std::vector<ChoiceQuestion> qs;
  uint64_t seed = 1;
  for (int64_t n_ctx : {2, 9, 1, 4}) {
    ChoiceQuestion q;
    q.context = {10};  // EOT
    for (int64_t i = 0; i < n_ctx; ++i) q.context.push_back(static_cast<int32_t>(seed++ * 7 % 10));
    for (int64_t j = 0, n_end = n_ctx == 1 ? 2 : 3; j < n_end; ++j) {
      std::vector<int32_t> e;
      for (int64_t k = 0; k <= (j + n_ctx) % 4; ++k) e.push_back(static_cast<int32_t>(seed++ * 3 % 10));
      q.endings.push_back(e);
      q.norm.push_back(static_cast<double>(e.size() + j));
    }
    q.label = n_ctx % 2;
    qs.push_back(q);
  }
  const auto scores = train::score_questions(rt, qs, B, T, /*pad=*/10);
  for (size_t i = 0; i < qs.size(); ++i)
    for (size_t j = 0; j < qs[i].endings.size(); ++j) {
      std::vector<int32_t> seq = qs[i].context;
      seq.insert(seq.end(), qs[i].endings[j].begin(), qs[i].endings[j].end());
      if (seq.size() > static_cast<size_t>(T + 1)) seq.erase(seq.begin(), seq.end() - (T + 1));
      const int64_t n = static_cast<int64_t>(seq.size()) - 1, m = qs[i].endings[j].size();
      std::vector<int64_t> rows(static_cast<size_t>(m));
      std::iota(rows.begin(), rows.end(), n - m);
      const std::vector<int32_t> inputs(seq.begin(), seq.end() - 1);
      const std::vector<int32_t> targets(seq.end() - m, seq.end());
      double want = 0;
      for (double x : alone.forward_logprobs(Tensor::from_vector(inputs, {n}), 1, n, rows, targets))
        want += x;
      CHECK(scores.logprobs[i][j] == Approx(want).epsilon(1e-12));
    }
  CHECK(scores.examples == 4);
  const auto again = train::choice_scores(qs, scores.logprobs);
  CHECK(scores.acc == again.acc);
  CHECK(scores.acc_norm == again.acc_norm);
}

TEST_CASE("eval.tasks config: needs data.tokenizer, and evaluation without data.val", "[train]") {
  auto error_of = [](const train::json& j) -> std::string {
    try {
      train::Config::from_json(j, "cfg.json").validate();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  train::json j = train::json::parse(R"({
    "model": {"vocab_size": 97, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 80},
    "training": {"steps": 8, "micro_batch_size": 2, "seq_len": 16},
    "data": {"train": "train.bin", "tokenizer": "tok.json"},
    "eval": {"every": 4, "tasks": "hellaswag:hs.jsonl", "task_examples": 100}})");
  CHECK(error_of(j).empty());  // tasks alone are something to evaluate
  const train::Config c = train::Config::from_json(j, "cfg.json");
  CHECK(c.eval.tasks == "hellaswag:hs.jsonl");
  CHECK(c.eval.task_examples == 100);
  CHECK(train::Config::from_json(c.to_json(), "again").to_json() == c.to_json());
  train::json k = j;
  k["data"].erase("tokenizer");
  CHECK_THAT(error_of(k), Catch::Contains("data.tokenizer") && Catch::Contains("eval.tasks"));
  k = j;
  k["eval"]["tasks"] = "piqa:x.jsonl";
  CHECK_THAT(error_of(k), Catch::Contains("eval.tasks") && Catch::Contains("unknown task 'piqa'"));
  k = j;
  k["eval"].erase("tasks");
  CHECK_THAT(error_of(k), Catch::Contains("data.val"));
  k = j;
  k["eval"]["task_examples"] = -1;
  CHECK_THAT(error_of(k), Catch::Contains("eval.task_examples"));
}
