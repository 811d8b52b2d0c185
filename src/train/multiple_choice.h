// Multiple-choice evaluation as lm-evaluation-harness or llm.c scores
// HellaSwag (a named Scoring; lm-eval's is the default): each ending is scored
// by the sum of its tokens' log-probabilities given the context; `acc` counts
// the questions whose right ending scores highest, `acc_norm` the same with
// each sum divided by a length: lm-eval's, the ending's characters; llm.c's,
// its tokens. Used by `attnres eval --task` and by the trainer's eval.tasks,
// both through the pipeline runtime, so a single process and any P x D layout
// score the same rows the same way.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/multiple_choice.h"
#include "parallel/runtime.h"
#include "train/config.h"

namespace attnres::train {

// How a task's text becomes rows and how acc_norm normalises:
//   LmEval  lm-evaluation-harness's hellaswag task: context = its preprocessed
//           query (activity_label, ctx_a and ctx_b capitalized:
//           data/hellaswag_text.h), continuation " " + preprocessed ending,
//           the continuation's tokens = those of context + continuation past
//           the context's (its _encode_pair); acc_norm divides by the
//           preprocessed ending's length in characters (code points).
//   LlmC    llm.c's dev/data/hellaswag.py: context = "ctx" as it is, the
//           ending's tokens = those of " " + ending; acc_norm divides by the
//           ending's number of tokens (its lowest mean loss).
// Neither puts <|endoftext|> before the context.
enum class Scoring { LmEval, LlmC };
Scoring parse_scoring(const std::string& name, const std::string& where);
const char* scoring_name(Scoring s);

// One question as text and in tokens.
struct ChoiceQuestion {
  std::string context_text;
  std::vector<std::string> ending_texts;      // the continuations, " " + ending
  std::vector<int32_t> context;               // the context's tokens
  std::vector<std::vector<int32_t>> endings;  // each continuation's tokens
  std::vector<double> norm;                   // acc_norm's divisor of each ending
  int64_t label = 0;
};

using Encoder = std::function<std::vector<int32_t>(const std::string&)>;

// Questions rendered and tokenized by `scoring`. A sequence longer than T + 1
// tokens loses context from the left; an ending of more than T tokens cannot
// be scored in T positions: an error naming `source`, the line and T
// (`what_T` names where T comes from); so is a line that lacks the fields the
// scoring needs.
std::vector<ChoiceQuestion> tokenize_questions(const std::vector<data::ChoiceItem>& items,
                                               Scoring scoring, const Encoder& encode, int64_t T,
                                               const std::string& source,
                                               const std::string& what_T);

struct ChoiceScores {
  int64_t examples = 0;
  double acc = 0, acc_norm = 0;
  std::vector<std::vector<double>> logprobs;  // [question][ending]: summed log-probability
};

// acc and acc_norm of summed log-probabilities (the first maximum wins ties,
// as numpy's argmax).
ChoiceScores choice_scores(const std::vector<ChoiceQuestion>& questions,
                           std::vector<std::vector<double>> logprobs);

// Scores `questions` with the runtime's model. Every (question, ending) is
// one row of the B x T microbatches (padded with EOT after its tokens, which
// the causal model never lets earlier positions see), rows in question
// order; microbatch g goes to data-parallel replica g mod D, so each row is
// computed the same way whatever D is. The rank holding the last chunk sums
// its rows' log-probabilities; a sum over the world gathers them. Collective:
// every rank returns the same scores. B and T must be the runtime's.
ChoiceScores score_questions(parallel::Runtime& rt, const std::vector<ChoiceQuestion>& questions,
                             int64_t B, int64_t T, int32_t pad);

// eval.tasks: "name:file" entries separated by commas.
struct TaskSpec {
  std::string name, path;
};
std::vector<TaskSpec> parse_task_list(const std::string& value, const std::string& key);

// The trainer's eval.tasks: read and tokenized once (with data.tokenizer),
// scored at every evaluation.
class TaskEvaluator {
 public:
  struct Result {
    std::string name;
    Scoring scoring;
    ChoiceScores scores;
  };
  explicit TaskEvaluator(const Config& cfg);
  bool empty() const { return tasks_.empty(); }
  // Collective over the runtime's world.
  std::vector<Result> evaluate(parallel::Runtime& rt) const;
  // Its metrics.jsonl record and progress line.
  static nlohmann::json record(int64_t step, const Result& r);
  static std::string progress(int64_t step, const Result& r);

 private:
  struct Task {
    std::string name;
    std::vector<ChoiceQuestion> questions;
  };
  std::vector<Task> tasks_;
  int64_t B_, T_;
  int32_t pad_ = 0;  // the tokenizer's EOT
  Scoring scoring_ = Scoring::LmEval;
};

}  // namespace attnres::train
