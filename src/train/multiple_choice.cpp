#include "train/multiple_choice.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>

#include "core/error.h"
#include "data/hellaswag_text.h"
#include "data/tokenizer_file.h"

namespace attnres::train {

Scoring parse_scoring(const std::string& name, const std::string& where) {
  if (name == "lm-eval") return Scoring::LmEval;
  if (name == "llm.c") return Scoring::LlmC;
  fail(where, ": unknown scoring '", name, "' (known: lm-eval, llm.c)");
}

const char* scoring_name(Scoring s) { return s == Scoring::LmEval ? "lm-eval" : "llm.c"; }

namespace {

// Code points of valid UTF-8 (Python's len() of the string).
int64_t characters(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

std::vector<ChoiceQuestion> tokenize_questions(const std::vector<data::ChoiceItem>& items,
                                               Scoring scoring, const Encoder& encode, int64_t T,
                                               const std::string& source,
                                               const std::string& what_T) {
  std::vector<ChoiceQuestion> out;
  out.reserve(items.size());
  for (const data::ChoiceItem& it : items) {
    ChoiceQuestion q;
    if (scoring == Scoring::LmEval) {
      if (!it.has_parts)
        fail(source, ":", it.line, ": lm-eval's scoring needs \"activity_label\", \"ctx_a\" and "
             "\"ctx_b\" (as in HellaSwag's own files); this line lacks one (--scoring llm.c reads \"ctx\")");
      q.context_text = data::lm_eval_preprocess(it.activity_label + ": " + it.ctx_a + " " +
                                                data::python_capitalize(it.ctx_b));
    } else {
      q.context_text = it.context;
    }
    // lm-eval's _encode_pair moves the context's trailing spaces (a "[...]"
    // removed at its end leaves one) to the front of the continuation.
    std::string moved;
    if (scoring == Scoring::LmEval) {
      const std::string kept = data::python_rstrip(q.context_text);
      moved = q.context_text.substr(kept.size());
      q.context_text = kept;
    }
    q.context = encode(q.context_text);
    if (q.context.empty()) fail(source, ":", it.line, ": the context is empty once rendered");
    for (size_t j = 0; j < it.endings.size(); ++j) {
      if (scoring == Scoring::LmEval) {
        const std::string choice = data::lm_eval_preprocess(it.endings[j]);
        q.ending_texts.push_back(moved + " " + choice);
        // lm-eval's _encode_pair: the whole text's tokens past the context's.
        const auto whole = encode(q.context_text + q.ending_texts.back());
        q.endings.emplace_back(whole.begin() + static_cast<std::ptrdiff_t>(std::min(q.context.size(), whole.size())),
                               whole.end());
        q.norm.push_back(static_cast<double>(characters(choice)));
      } else {
        q.ending_texts.push_back(" " + it.endings[j]);
        q.endings.push_back(encode(q.ending_texts.back()));
        q.norm.push_back(static_cast<double>(q.endings.back().size()));
      }
      const int64_t n = static_cast<int64_t>(q.endings.back().size());
      if (n == 0 || q.norm.back() <= 0)
        fail(source, ":", it.line, ": ending ", j, " is empty once rendered (", scoring_name(scoring), ")");
      if (n > T)
        fail(source, ":", it.line, ": ending ", j, " is ", n, " tokens, more than the ", T,
             " positions of a sequence (", what_T, ")");
    }
    q.label = it.label;
    out.push_back(std::move(q));
  }
  return out;
}

ChoiceScores choice_scores(const std::vector<ChoiceQuestion>& questions,
                           std::vector<std::vector<double>> logprobs) {
  ATTNRES_CHECK(logprobs.size() == questions.size(), logprobs.size(), " scores for ",
                questions.size(), " questions");
  ChoiceScores s;
  s.examples = static_cast<int64_t>(questions.size());
  int64_t right = 0, right_norm = 0;
  for (size_t i = 0; i < questions.size(); ++i) {
    const auto& lp = logprobs[i];
    const auto& norm = questions[i].norm;
    size_t best = 0, best_norm = 0;
    for (size_t j = 1; j < lp.size(); ++j) {
      if (lp[j] > lp[best]) best = j;
      if (lp[j] / norm[j] > lp[best_norm] / norm[best_norm]) best_norm = j;
    }
    right += static_cast<int64_t>(best) == questions[i].label;
    right_norm += static_cast<int64_t>(best_norm) == questions[i].label;
  }
  if (s.examples > 0) {
    s.acc = static_cast<double>(right) / static_cast<double>(s.examples);
    s.acc_norm = static_cast<double>(right_norm) / static_cast<double>(s.examples);
  }
  s.logprobs = std::move(logprobs);
  return s;
}

namespace {

// One row: question q's context followed by its ending j.
struct Row {
  size_t q, j;
};

// A row's tokens cut to the last T + 1 (context lost from the left): the
// inputs are all but the last, the targets all but the first, and the
// ending's tokens are the last `count` targets, from position `first`.
struct RowTokens {
  std::vector<int32_t> seq;
  int64_t first = 0, count = 0;
};
RowTokens row_tokens(const ChoiceQuestion& q, size_t j, int64_t T) {
  RowTokens r;
  const auto& ending = q.endings[j];
  r.seq = q.context;
  r.seq.insert(r.seq.end(), ending.begin(), ending.end());
  const int64_t keep = std::min<int64_t>(static_cast<int64_t>(r.seq.size()), T + 1);
  r.seq.erase(r.seq.begin(), r.seq.end() - keep);
  r.count = static_cast<int64_t>(ending.size());
  r.first = keep - 1 - r.count;
  ATTNRES_CHECK(r.first >= 0, "ending of ", r.count, " tokens in a row of ", keep);
  return r;
}

}  // namespace

ChoiceScores score_questions(parallel::Runtime& rt, const std::vector<ChoiceQuestion>& questions,
                             int64_t B, int64_t T, int32_t pad) {
  std::vector<Row> rows;
  for (size_t q = 0; q < questions.size(); ++q)
    for (size_t j = 0; j < questions[q].endings.size(); ++j) rows.push_back({q, j});
  const int64_t R = static_cast<int64_t>(rows.size());
  const int64_t G = (R + B - 1) / B;  // microbatches, the last one padded with empty rows
  const int64_t D = rt.grid().D(), replica = rt.grid().replica();
  const int M = static_cast<int>(G > replica ? (G - replica + D - 1) / D : 0);
  auto global = [&](int mb) { return replica + static_cast<int64_t>(mb) * D; };

  auto batch_of = [&](int mb) {
    data::TokenLoader::Batch batch{Tensor::empty({B * T}, DType::I32),
                                   Tensor::empty({B * T}, DType::I32)};
    int32_t* in = batch.inputs.data<int32_t>();
    int32_t* tg = batch.targets.data<int32_t>();
    std::fill(in, in + B * T, pad);
    std::fill(tg, tg + B * T, pad);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t r = global(mb) * B + b;
      if (r >= R) break;
      const RowTokens t = row_tokens(questions[rows[r].q], rows[r].j, T);
      const int64_t n = static_cast<int64_t>(t.seq.size()) - 1;
      std::copy(t.seq.begin(), t.seq.begin() + n, in + b * T);
      std::copy(t.seq.begin() + 1, t.seq.end(), tg + b * T);
    }
    return batch;
  };

  std::vector<double> sums(static_cast<size_t>(R), 0.0);
  parallel::HeadFn head = [&](int mb, model::Model& m, const model::DepthState& st,
                              model::Activations& acts) {
    std::vector<int64_t> positions;
    std::vector<int32_t> targets;
    std::vector<int64_t> owner;  // the row of each position
    for (int64_t b = 0; b < B; ++b) {
      const int64_t r = global(mb) * B + b;
      if (r >= R) break;
      const RowTokens t = row_tokens(questions[rows[r].q], rows[r].j, T);
      for (int64_t i = 0; i < t.count; ++i) {
        positions.push_back(b * T + t.first + i);
        targets.push_back(t.seq[static_cast<size_t>(t.first + i + 1)]);
        owner.push_back(r);
      }
    }
    const std::vector<double> lp = m.head_logprobs(st, positions, targets, acts);
    for (size_t i = 0; i < lp.size(); ++i) sums[static_cast<size_t>(owner[i])] += lp[i];
  };
  // (With expert parallelism the group's largest count: the extra
  // microbatches are padding, which the head skips.)
  if (const int run = rt.forward_microbatches(M); run > 0) rt.executor().forward_only(run, batch_of, head);
  // Each row was summed by exactly one rank (the last stage of its replica),
  // the others hold 0 there: the world sum is that value exactly.
  if (R > 0) rt.grid().world().allreduce_sum(sums.data(), static_cast<int>(R));

  std::vector<std::vector<double>> logprobs(questions.size());
  for (int64_t r = 0; r < R; ++r) logprobs[rows[r].q].push_back(sums[static_cast<size_t>(r)]);
  return choice_scores(questions, std::move(logprobs));
}

std::vector<TaskSpec> parse_task_list(const std::string& value, const std::string& key) {
  std::vector<TaskSpec> out;
  size_t at = 0;
  while (at <= value.size()) {
    const size_t comma = std::min(value.find(',', at), value.size());
    const std::string entry = value.substr(at, comma - at);
    const size_t colon = entry.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == entry.size())
      fail("config key ", key, ": entry '", entry, "' must be TASK:FILE (tasks: ",
           data::known_tasks(), "), entries separated by commas");
    TaskSpec t{entry.substr(0, colon), entry.substr(colon + 1)};
    if (!data::is_known_task(t.name))
      fail("config key ", key, ": unknown task '", t.name, "' (known: ", data::known_tasks(), ")");
    out.push_back(std::move(t));
    at = comma + 1;
  }
  return out;
}

TaskEvaluator::TaskEvaluator(const Config& cfg)
    : B_(cfg.training.micro_batch_size), T_(cfg.training.seq_len),
      scoring_(parse_scoring(cfg.eval.scoring, "config key eval.scoring")) {
  if (cfg.eval.tasks.empty()) return;
  auto tokenizer = data::open_tokenizer(cfg.data.tokenizer, "config key data.tokenizer (eval.tasks)");
  pad_ = tokenizer.eot();
  const Encoder encode = [&](const std::string& s) { return tokenizer.encode(s); };
  for (const TaskSpec& spec : parse_task_list(cfg.eval.tasks, "eval.tasks")) {
    try {
      const auto items = data::read_task(spec.name, spec.path, cfg.eval.task_examples);
      tasks_.push_back({spec.name, tokenize_questions(items, scoring_, encode, T_, spec.path,
                                                      "training.seq_len")});
    } catch (const InternalError&) {
      throw;
    } catch (const Error& e) {
      fail("config key eval.tasks: ", e.what());
    }
  }
}

std::vector<TaskEvaluator::Result> TaskEvaluator::evaluate(parallel::Runtime& rt) const {
  std::vector<Result> out;
  for (const Task& t : tasks_)
    out.push_back({t.name, scoring_, score_questions(rt, t.questions, B_, T_, pad_)});
  return out;
}

nlohmann::json TaskEvaluator::record(int64_t step, const Result& r) {
  return {{"step", step}, {"task", r.name}, {"scoring", scoring_name(r.scoring)}, {"acc", r.scores.acc},
          {"acc_norm", r.scores.acc_norm}, {"examples", r.scores.examples}};
}

std::string TaskEvaluator::progress(int64_t step, const Result& r) {
  return fmt::format("step {:>6} | {} acc {:.4f} | acc_norm {:.4f} ({} examples)", step, r.name,
                     r.scores.acc, r.scores.acc_norm, r.scores.examples);
}

}  // namespace attnres::train
