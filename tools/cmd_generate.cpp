// attnres generate --checkpoint DIR --prompt TEXT [--tokens N] [--temperature T]
//                  [--top-k K] [--seed S] [--tokenizer FILE] [--json]
// Samples a continuation with the KV-cache decoder (the sampler: model/sample.h).
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "data/tokenizer_file.h"
#include "model/sample.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/checkpoint.h"

namespace attnres::tools {

int cmd_generate(const Args& args) {
  Flags f(args, "generate",
          {"checkpoint", "prompt", "tokens", "temperature", "top-k", "seed", "tokenizer", "special"},
          {"help", "json"});
  if (f.has("help")) {
    std::puts("usage: attnres generate --checkpoint DIR --prompt TEXT [--tokens 100]\n"
              "         [--temperature 0.8] [--top-k 40] [--seed 1] [--tokenizer FILE] [--json]\n"
              "         [--special text|allow|refuse]\n"
              "  The tokenizer defaults to DIR/tokenizer.json (written there by the trainer from\n"
              "  data.tokenizer). FILE may be any form `tokenize encode --tokenizer` takes.\n"
              "  --temperature 0 is greedy. --json prints {\"prompt_tokens\": [EOT, ...],\n"
              "  \"tokens\": [the generated ids], \"text\": prompt + continuation}.\n"
              "  --special: <|endoftext|> in the prompt is text (default), the token, or an error.");
    return 0;
  }
  const std::string dir = f.required("checkpoint", "generate");
  const std::string prompt = f.required("prompt", "generate");
  const int64_t n = f.get_int("tokens", 100, "generate");
  const double temperature = f.get_double("temperature", 0.8, "generate");
  const int64_t top_k = f.get_int("top-k", 40, "generate");
  const uint64_t seed = static_cast<uint64_t>(f.get_int("seed", 1, "generate"));
  const data::Specials specials = data::parse_specials(f.get("special", "text"), "generate: --special");
  std::string tok_path = f.get("tokenizer", (std::filesystem::path(dir) / "tokenizer.json").string());
  auto tokenizer = data::open_tokenizer(
      tok_path, "generate (pass --tokenizer, or set data.tokenizer when training so checkpoints "
                "carry a copy)");

  train::Config cfg = train::config_from_checkpoint(dir);
  if (tokenizer.vocab_size() > cfg.model.vocab_size)
    fail("generate: tokenizer '", tok_path, "' has ", tokenizer.vocab_size(),
         " tokens but the model's vocab_size is ", cfg.model.vocab_size);
  model::Model model(cfg.model, DType::F32);
  train::load_weights(dir, model);

  std::vector<int32_t> ids{tokenizer.eot()};  // documents start with EOT, as in training
  auto enc = tokenizer.encode(prompt, specials);
  ids.insert(ids.end(), enc.begin(), enc.end());
  auto cache = model.new_decode_cache(static_cast<int64_t>(ids.size()) + n);
  std::vector<float> logits;
  for (int32_t id : ids) logits = model.decode_step(id, cache);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    logits.resize(tokenizer.vocab_size());  // never sample ids the tokenizer can't decode
    int32_t next = attnres::model::sample_token(logits, temperature, top_k, seed, static_cast<uint64_t>(i));
    if (next == tokenizer.eot()) break;
    out.push_back(next);
    logits = model.decode_step(next, cache);
  }
  const std::string text = prompt + tokenizer.decode(out);
  if (f.has("json")) {
    const nlohmann::json j = {{"prompt_tokens", ids}, {"tokens", out}, {"text", text}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s\n", text.c_str());
  }
  return 0;
}

}  // namespace attnres::tools
