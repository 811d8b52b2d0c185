// attnres: one binary, subcommands train | eval | generate | score | export | tokenize | inspect
// | bench | sweep | supervise.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu/blas_cores.h"
#include "parallel/mpi.h"
#include "tools/commands.h"

namespace {

const char* kUsage = R"(attnres: pretraining with Attention Residuals

usage:
  attnres train CONFIG.json [--section.key=value ...]
  attnres eval --checkpoint DIR --data GLOB [--batches N]
  attnres eval --checkpoint DIR --task hellaswag --data FILE.jsonl [--limit N]   (attnres eval --help)
  attnres generate --checkpoint DIR --prompt TEXT [--tokens N] [--temperature T] [--top-k K] [--seed S]
  attnres score --checkpoint DIR --text TEXT      per-token log-probabilities, as JSON
  attnres export hf --checkpoint DIR --out DIR [--dtype fp32|bf16]   Hugging Face model directory
  attnres tokenize train|encode ...      (attnres tokenize --help)
  attnres inspect checkpoint DIR | config CONFIG.json | keys | cpu | attention --checkpoint DIR --data GLOB
                  | compare DIR_A DIR_B | schedule --pipeline P --virtual V --microbatches M
                                                     (attnres inspect --help)
  attnres bench [--device cpu|cuda] [--preset 124m|350m|1b3] [...]   training throughput (attnres bench --help)
  attnres sweep SWEEP.json [--jobs N | --slurm | --status] [--dry-run | --report]  scaling-law sweep
  attnres supervise [--max-restarts N] [--backoff SEC] -- COMMAND...  restart a failed run from
                                                     its newest checkpoint (attnres supervise --help)

Logs go to stderr, machine-readable results to stdout. Exit codes: 0 ok, 1 runtime
or internal error, 2 bad input (config, data, checkpoint, arguments), 3 non-finite loss/gradient,
128+N stopped by signal N (after writing a checkpoint).
)";

}  // namespace

int main(int argc, char** argv) {
  // Before anything else (MPI, threads): may start this program again with
  // BLAS kernels that fit the CPU (kernels/cpu/blas_cores.h).
  attnres::kernels::cpu::select_blas_kernels(argv);
  attnres::init_logging(0);
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  attnres::tools::Args args(argv + 2, argv + argc);
  using namespace attnres::tools;
  try {
    if (cmd == "train") return cmd_train(args);
    if (cmd == "eval") return cmd_eval(args);
    if (cmd == "generate") return cmd_generate(args);
    if (cmd == "score") return cmd_score(args);
    if (cmd == "export") return cmd_export(args);
    if (cmd == "tokenize") return cmd_tokenize(args);
    if (cmd == "inspect") return cmd_inspect(args);
    if (cmd == "bench") return cmd_bench(args);
    if (cmd == "sweep") return cmd_sweep(args);
    if (cmd == "supervise") return cmd_supervise(args);
    std::fprintf(stderr, "attnres: unknown command '%s'\n\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const attnres::InternalError& e) {
    // Our fault (a broken invariant, a failed CUDA / NCCL / MPI call): say so.
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 1;
  } catch (const attnres::Error& e) {
    // Bad input of any kind: the message names the key / file and the reason.
    // Under mpirun every rank usually meets it alike: printed once.
    attnres::parallel::let_rank0_report_first(attnres::parallel::launcher_world_rank());
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
