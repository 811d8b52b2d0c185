// attnres eval --checkpoint DIR --data GLOB [--batches N] [--device cpu|cuda]
// Prints {"loss": ..., "tokens": ...} on stdout: the same number the trainer
// logs as val loss for the same data and batch count (on the device and in the
// precision the checkpoint was trained with, which is the default).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/log.h"
#include "data/loader.h"
#include "data/shard.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace attnres::tools {

int cmd_eval(const Args& args) {
  Flags f(args, "eval", {"checkpoint", "data", "batches", "device"}, {"help"});
  if (f.has("help")) {
    std::puts("usage: attnres eval --checkpoint DIR --data GLOB [--batches N] [--device cpu|cuda]\n"
              "  Mean token loss of the checkpoint's model over the first N units\n"
              "  (micro_batch_size x seq_len tokens each, default eval.batches) of the data,\n"
              "  on the checkpoint's training device and precision unless --device says otherwise\n"
              "  (the cpu computes in fp32).");
    return 0;
  }
  const std::string dir = f.required("checkpoint", "eval");
  train::Config cfg = train::config_from_checkpoint(dir);
  const int64_t B = cfg.training.micro_batch_size, T = cfg.training.seq_len;
  const int64_t batches = f.get_int("batches", cfg.eval.batches, "eval");
  if (batches <= 0) fail("eval: --batches must be positive");
  data::TokenLoader loader(data::resolve_data_spec(f.required("data", "eval"), "--data"), B, T,
                           false, cfg.training.seed);
  Device device = f.has("device") ? train::parse_device(f.get("device", ""), "eval: --device")
                                  : cfg.training.device;
  if (device == Device::CUDA && cuda::device_count() == 0) {
    if (f.has("device")) fail("eval: --device cuda, but no CUDA device is visible");
    spdlog::warn("the checkpoint was trained on cuda but no CUDA device is visible: evaluating on "
                 "the cpu in fp32 (the loss can differ from a bf16 run's in the 3rd digit)");
    device = Device::CPU;
  }
  const DType dtype = device == Device::CUDA ? cfg.training.precision : DType::F32;
  spdlog::info("evaluating on {} in {}", device_name(device), dtype_name(dtype));
  model::Model model(cfg.model, dtype, {}, device);
  train::load_weights(dir, model.params());
  auto [loss, tokens] = train::evaluate(model, loader, batches, B, T);
  std::printf("%s\n", nlohmann::json({{"loss", loss}, {"tokens", tokens}}).dump().c_str());
  return 0;
}

}  // namespace attnres::tools
