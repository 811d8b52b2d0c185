// attnres eval --checkpoint DIR --data GLOB [--batches N] [--device cpu|cuda]
// Prints {"loss": ..., "tokens": ...} on stdout: the same number the trainer
// logs as val loss for the same data and batch count (on the device and in the
// precision the checkpoint was trained with, which is the default).
//
// attnres eval --checkpoint DIR --task hellaswag --data FILE.jsonl [...]
// Prints {"task", "acc", "acc_norm", "examples"}: multiple-choice scoring
// (train/multiple_choice.h) through the same runtime as the trainer's
// eval.tasks, so with the defaults (the checkpoint's micro_batch_size,
// seq_len, device and precision) it reproduces the trainer's numbers.
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/log.h"
#include "data/loader.h"
#include "data/multiple_choice.h"
#include "data/shard.h"
#include "data/tokenizer_file.h"
#include "parallel/runtime.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/multiple_choice.h"

namespace attnres::tools {

namespace {

const char* kHelp =
    "usage: attnres eval --checkpoint DIR --data GLOB [--batches N] [--device cpu|cuda]\n"
    "  Mean token loss of the checkpoint's model over the first N units\n"
    "  (micro_batch_size x seq_len tokens each, default eval.batches) of the data,\n"
    "  on the checkpoint's training device and precision unless --device says otherwise\n"
    "  (the cpu computes in fp32).\n"
    "\n"
    "usage: attnres eval --checkpoint DIR --task hellaswag --data FILE.jsonl [--limit N]\n"
    "         [--scoring lm-eval|llm.c] [--seq-len T] [--batch-size B] [--tokenizer FILE]\n"
    "         [--device cpu|cuda] [--per-example]\n"
    "  Multiple-choice accuracy: each ending scored by the sum of its tokens' log-probabilities\n"
    "  given the context; prints {\"task\", \"scoring\", \"acc\", \"acc_norm\", \"examples\"}.\n"
    "  --scoring (default lm-eval): lm-evaluation-harness's rendering of HellaSwag and acc_norm\n"
    "  per character of the ending, or llm.c's (\"ctx\" as it is, acc_norm per token).\n"
    "  --limit: the first N questions. T and B default to the checkpoint's training.seq_len and\n"
    "  micro_batch_size (longer contexts lose their start); the tokenizer to DIR/tokenizer.json.\n"
    "  --per-example adds each question's texts, tokens, normalisers and sums.";

// The device and precision to evaluate with: the checkpoint's unless --device
// says otherwise; a cuda checkpoint on a machine without a GPU falls back to
// the cpu (fp32) with a warning.
std::pair<Device, DType> choose_device(const Flags& f, const train::Config& cfg) {
  Device device = f.has("device") ? train::parse_device(f.get("device", ""), "eval: --device")
                                  : cfg.training.device;
  if (device == Device::CUDA && cuda::device_count() == 0) {
    if (f.has("device")) fail("eval: --device cuda, but no CUDA device is visible");
    spdlog::warn("the checkpoint was trained on cuda but no CUDA device is visible: evaluating on "
                 "the cpu in fp32 (results can differ from a bf16 run's in the 3rd digit)");
    device = Device::CPU;
  }
  const DType dtype = device == Device::CUDA ? cfg.training.precision : DType::F32;
  spdlog::info("evaluating on {} in {}", device_name(device), dtype_name(dtype));
  return {device, dtype};
}

int eval_loss(const Flags& f, const std::string& dir, const train::Config& cfg) {
  const int64_t B = cfg.training.micro_batch_size, T = cfg.training.seq_len;
  const int64_t batches = f.get_int("batches", cfg.eval.batches, "eval");
  if (batches <= 0) fail("eval: --batches must be positive");
  data::TokenLoader loader(data::resolve_data_spec(f.required("data", "eval"), "--data"), B, T,
                           false, cfg.training.seed);
  const auto [device, dtype] = choose_device(f, cfg);
  model::Model model(cfg.model, dtype, {}, device);
  model.set_logits(train::logit_dtype(cfg.training.logits, dtype));  // the trainer's val loss
  train::load_weights(dir, model);
  auto [loss, tokens] = train::evaluate(model, loader, batches, B, T);
  std::printf("%s\n", nlohmann::json({{"loss", loss}, {"tokens", tokens}}).dump().c_str());
  return 0;
}

int eval_task(const Flags& f, const std::string& dir, const train::Config& cfg) {
  const std::string task = f.get("task", "");
  const std::string path = f.required("data", "eval");
  const int64_t limit = f.get_int("limit", 0, "eval");
  const int64_t T = f.get_int("seq-len", cfg.training.seq_len, "eval");
  const int64_t B = f.get_int("batch-size", cfg.training.micro_batch_size, "eval");
  if (limit < 0) fail("eval: --limit must be >= 0 (0 = every question)");
  if (T <= 0 || B <= 0) fail("eval: --seq-len and --batch-size must be positive");
  if (!data::is_known_task(task))
    fail("eval: unknown --task '", task, "' (known: ", data::known_tasks(), ")");
  const auto tokenizer = data::open_tokenizer(
      f.get("tokenizer", (std::filesystem::path(dir) / "tokenizer.json").string()),
      "eval: --tokenizer (default: the checkpoint's tokenizer.json)");
  const train::Scoring scoring = train::parse_scoring(f.get("scoring", "lm-eval"), "eval: --scoring");
  const auto items = data::read_task(task, path, limit);
  const auto questions = train::tokenize_questions(
      items, scoring, [&](const std::string& s) { return tokenizer.encode(s); }, T, path,
      "--seq-len, default the checkpoint's training.seq_len");

  // The trainer's path on a job of one process: the same runtime and rows.
  const auto [device, dtype] = choose_device(f, cfg);
  const parallel::Comm solo = parallel::Comm::solo();
  const parallel::ProcessGrid grid(solo, 1, 1);
  parallel::Runtime rt(grid, cfg.model, dtype, device, parallel::RuntimeOptions{}, B, T);
  for (int v = 0; v < rt.model().size(); ++v) train::load_weights(dir, rt.model().chunk(v));
  const train::ChoiceScores s = train::score_questions(rt, questions, B, T, tokenizer.eot());

  nlohmann::json out = {{"task", task}, {"scoring", train::scoring_name(scoring)}, {"acc", s.acc},
                        {"acc_norm", s.acc_norm}, {"examples", s.examples}};
  if (f.has("per-example")) {
    nlohmann::json per = nlohmann::json::array();
    for (size_t i = 0; i < questions.size(); ++i)
      per.push_back({{"context", questions[i].context_text},
                     {"endings", questions[i].ending_texts},
                     {"context_tokens", questions[i].context},
                     {"ending_tokens", questions[i].endings},
                     {"norm", questions[i].norm},
                     {"label", questions[i].label},
                     {"logprobs", s.logprobs[i]}});
    out["per_example"] = per;
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int cmd_eval(const Args& args) {
  Flags f(args, "eval",
          {"checkpoint", "data", "batches", "device", "task", "limit", "seq-len", "batch-size",
           "tokenizer", "scoring"},
          {"help", "per-example"});
  if (f.has("help")) {
    std::puts(kHelp);
    return 0;
  }
  const std::string dir = f.required("checkpoint", "eval");
  const train::Config cfg = train::config_from_checkpoint(dir);
  if (f.has("task")) {
    for (const char* other : {"batches"})
      if (f.has(other)) fail("eval: --", other, " is for the loss, not with --task");
    return eval_task(f, dir, cfg);
  }
  for (const char* other : {"limit", "seq-len", "batch-size", "tokenizer", "per-example"})
    if (f.has(other)) fail("eval: --", other, " needs --task");
  return eval_loss(f, dir, cfg);
}

}  // namespace attnres::tools
