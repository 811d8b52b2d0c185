// attnres train CONFIG.json [--section.key=value ...]
#include <cstdio>

#include "core/error.h"
#include "tools/commands.h"
#include "train/config.h"
#include "train/trainer.h"

namespace attnres::tools {

int cmd_train(const Args& args) {
  if (args.empty() || args[0] == "--help") {
    std::puts("usage: attnres train CONFIG.json [--section.key=value ...]\n"
              "  Overrides use the config's key names, e.g. --optimizer.lr=3e-4\n"
              "  --training.steps=100 --data.train='data/*_train_*.bin'. See docs/config.md.");
    return args.empty() ? 2 : 0;
  }
  std::vector<std::string> overrides;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i].rfind("--", 0) != 0 || args[i].find('=') == std::string::npos)
      fail("train: unexpected argument '", args[i], "' (overrides look like --section.key=value)");
    overrides.push_back(args[i]);
  }
  train::Config cfg = train::load_config(args[0], overrides);
  return train::train(cfg);
}

}  // namespace attnres::tools
