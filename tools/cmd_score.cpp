// attnres score --checkpoint DIR --text TEXT [--tokenizer FILE] [--device cpu|cuda]
// Per-token log-probabilities of a text under the checkpoint's model, as
// JSON on stdout: what the Hugging Face export (`attnres export hf`) is
// checked against. The text is scored as generate reads a prompt: after the
// EOT that starts every training document.
#include <cstdio>
#include <filesystem>
#include <numeric>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "data/tokenizer_file.h"
#include "data/utf8.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/checkpoint.h"

namespace attnres::tools {

int cmd_score(const Args& args) {
  Flags f(args, "score", {"checkpoint", "text", "tokenizer", "device", "special"}, {"help"});
  if (f.has("help")) {
    std::puts("usage: attnres score --checkpoint DIR --text TEXT [--tokenizer FILE] [--device cpu|cuda]\n"
              "         [--special text|allow|refuse]\n"
              "  Prints {\"tokens\": [EOT, t1, ..., tn], \"logprobs\": [log p(t1 | EOT), ...,\n"
              "  log p(tn | EOT t1 ... tn-1)], \"pieces\": [the text of t1 ... tn], \"partial\":\n"
              "  [indices of pieces that hold part of a UTF-8 character, its bytes written <0xHH>],\n"
              "  \"sum\": ...}\n"
              "  computed in fp32 (cpu by default). The tokenizer defaults to DIR/tokenizer.json.\n"
              "  --special: <|endoftext|> in the text is text (default), the token, or an error.");
    return 0;
  }
  const std::string dir = f.required("checkpoint", "score");
  const std::string text = f.required("text", "score");
  const data::Specials specials = data::parse_specials(f.get("special", "text"), "score: --special");
  if (text.empty()) fail("score: --text is empty");
  const Device device =
      train::parse_device(f.get("device", "cpu"), "score: --device");
  if (device == Device::CUDA && cuda::device_count() == 0)
    fail("score: --device cuda, but no CUDA device is visible");
  const auto tokenizer = data::open_tokenizer(
      f.get("tokenizer", (std::filesystem::path(dir) / "tokenizer.json").string()),
      "score: --tokenizer (default: the checkpoint's tokenizer.json)");

  const train::Config cfg = train::config_from_checkpoint(dir);
  model::Model model(cfg.model, DType::F32, {}, device);
  train::load_weights(dir, model);

  std::vector<int32_t> tokens{tokenizer.eot()};
  const auto enc = tokenizer.encode(text, specials);
  tokens.insert(tokens.end(), enc.begin(), enc.end());
  // One sequence of n inputs; position i predicts token i + 1.
  const int64_t n = static_cast<int64_t>(tokens.size()) - 1;
  std::vector<int32_t> inputs(tokens.begin(), tokens.end() - 1), targets(tokens.begin() + 1, tokens.end());
  std::vector<int64_t> rows(static_cast<size_t>(n));
  std::iota(rows.begin(), rows.end(), 0);
  const auto lp = model.forward_logprobs(Tensor::from_vector(inputs, {n}), 1, n, rows, targets);

  // A token can end inside a UTF-8 character: its bytes that are not part of
  // a whole character are written "<0xHH>", and the piece is listed in
  // "partial" (JSON strings hold characters, not bytes).
  nlohmann::json pieces = nlohmann::json::array(), partial = nlohmann::json::array();
  for (size_t i = 0; i < targets.size(); ++i) {
    bool marked = false;
    pieces.push_back(data::mark_partial_utf8(tokenizer.decode(Span<const int32_t>(&targets[i], 1)), &marked));
    if (marked) partial.push_back(i);
  }
  const nlohmann::json out = {{"tokens", tokens},
                              {"logprobs", lp},
                              {"pieces", pieces},
                              {"partial", partial},
                              {"sum", std::accumulate(lp.begin(), lp.end(), 0.0)}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace attnres::tools
