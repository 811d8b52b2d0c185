// Subcommands of the `attnres` binary. Each takes its arguments (without the
// program and subcommand names) and returns the process exit code; errors are
// thrown as attnres::Error and reported by main().
#pragma once
#include <string>
#include <vector>

namespace attnres::tools {

using Args = std::vector<std::string>;

int cmd_train(const Args& args);
int cmd_eval(const Args& args);
int cmd_generate(const Args& args);
int cmd_score(const Args& args);
int cmd_export(const Args& args);
int cmd_tokenize(const Args& args);
int cmd_inspect(const Args& args);
int inspect_plan(const Args& args);    // tools/inspect_plan.cpp
int inspect_memory(const Args& args);  // tools/inspect_memory.cpp
int cmd_bench(const Args& args);
int cmd_sweep(const Args& args);
int cmd_supervise(const Args& args);  // tools/cmd_supervise.cpp

}  // namespace attnres::tools
