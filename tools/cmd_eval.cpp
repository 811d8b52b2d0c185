// attnres eval --checkpoint DIR --data GLOB [--batches N]
// Prints {"loss": ..., "tokens": ...} on stdout: the same number the trainer
// logs as val loss for the same data and batch count.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "data/shard.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace attnres::tools {

int cmd_eval(const Args& args) {
  Flags f(args, "eval", {"checkpoint", "data", "batches"}, {"help"});
  if (f.has("help")) {
    std::puts("usage: attnres eval --checkpoint DIR --data GLOB [--batches N]\n"
              "  Mean token loss of the checkpoint's model over the first N units\n"
              "  (micro_batch_size x seq_len tokens each, default eval.batches) of the data.");
    return 0;
  }
  const std::string dir = f.required("checkpoint", "eval");
  train::Config cfg = train::config_from_checkpoint(dir);
  const int64_t B = cfg.training.micro_batch_size, T = cfg.training.seq_len;
  const int64_t batches = f.get_int("batches", cfg.eval.batches, "eval");
  if (batches <= 0) fail("eval: --batches must be positive");
  data::TokenLoader loader(data::resolve_data_spec(f.required("data", "eval"), "--data"), B, T,
                           false, cfg.training.seed);
  model::Model model(cfg.model, DType::F32);
  train::load_weights(dir, model.params());
  auto [loss, tokens] = train::evaluate(model, loader, batches, B, T);
  std::printf("%s\n", nlohmann::json({{"loss", loss}, {"tokens", tokens}}).dump().c_str());
  return 0;
}

}  // namespace attnres::tools
