#!/usr/bin/env bash
# The GPU checks, in stages that each fit one 10-minute command of the device
# tool (H100/H200; no network needed there). The first lent GPU runs --first,
# --second and --bench (with the machine's start at most 14 of its 15
# minutes); later loans run --race, --1b3 and --profile, each on a fresh
# machine. Every stage starts with the binaries step (gpu_binaries,
# scripts/gpu_lib.sh): the binaries of this tree prebuilt on the CPU machine
# (scripts/gpu_prebuild.sh, .gpu-prebuilt.tar.xz carried), used when ldd finds
# every library they load, else built on the device (1.6 min).
#   --first    what has never run, the code that proves the most per minute
#              first, each test family in its own process: MoE and Muon
#              (grouped expert GEMMs, then per expert), matmul, our attention
#              on the joint q|k|v rows, the model with recomputation, CUDA
#              graphs, the 1-rank NCCL test (the expert all-to-all as a
#              self-send), the Mix kernels, cuDNN's fused attention last (the
#              slowest, the most likely to fail outside our code)
#   --second   the shell tests: the 2-rank NCCL all-to-all, MoE / EP on cuda
#              (tests/gpu/moe_ep_cuda.sh), CUDA graphs through attnres train,
#              exact resume, the pipeline layouts, ZeRO-1 in bf16; the GPU
#              tests that passed on 2026-11-26 (cross-entropy, SwiGLU, Store,
#              the rest)
#   --bench    124M and 350M training steps (and 124M with recomputation,
#              cuDNN, CUDA graphs), the per-kernel tables, the engine's
#              tokens/s against the benchmark's, PyTorch's attention at the
#              same shapes, the targets (scripts/gpu_targets.py), bf16 against
#              fp32 logits (scripts/gpu_logits_compare.sh, when .shards/brown_gpt2
#              is there)
#   --race     the race: attnres train against the PyTorch peer (torch.compile,
#              bf16) at 124M and 350M, each residual mode (scripts/race_torch.py),
#              then the targets again
#   --1b3      the 1b3 training steps (the planner's micro-batch, once more at
#              3/4 of it if that fails) and its kernel table
#   --profile  Nsight Compute per kernel (scripts/gpu_profile.sh, 124M)
#   --only SPEC  the binaries step, then one run of the GPU tests a Catch2
#              spec selects, e.g. "[mix],[adamw]" (log gpu_tests.log)
#   --report DIR where logs and tables go (default build-gpu/report)
#   --plan     print the next GPU sessions' commands with their expected
#              minutes and the minute each ends at (no GPU, builds nothing)
# Without a stage flag: every stage above in that order (for a GPU machine
# without the device tool's limits).
#
# The stages' steps are the rows of PLAN below, with their expected minutes
# (from the 2026-11-26 sessions, the H200's and then the H100's: docs/cuda.md,
# docs/measurements/; a test family's share of its former run; the never-run
# scripts guessed) and
# time limits; --plan prints the same rows. Each step's output goes to its log
# in the report folder, a summary line to steps.txt there (result, seconds,
# expected minutes), and when $OUT is set (the device tool's folder, which
# returns at most 8 files) the report folder is packed into
# $OUT/gpu_check_<N>_<stages>.tgz (N: the first stage's place in the plan)
# after every step, so a command killed at its time limit still returns what
# had finished. With $OUT set, no step starts later than ATTNRES_TIME_LIMIT_S
# (default 570) seconds after the command began, and a step is cut at that
# point (its log says so): the archive is always written inside the tool's
# 10 minutes. Exit status: 0 when every step that ran passed (or skipped
# saying so), 1 when one failed or could not run, 2 for a usage error or a
# missing build.
#
# Dependencies: nvcc, CMake and the CUDA libraries must be there. The Debian
# packages the CPU side needs (json, spdlog, Catch2, OpenBLAS) are used from the
# system when present; otherwise this script unpacks .deb files from .deps/
# (made on a Debian machine with `scripts/gpu_deps.sh`) into /tmp/attnres-deps
# and checks that their libraries load (use_deps, scripts/gpu_lib.sh).
set -uo pipefail
cd "$(dirname "$0")/.."

# ---- the plan: one row per step, read by --plan and by the stages ----
# stage|minutes|limit s|kind|log|if|what|command
#   stage    cpu (on the CPU machine, before), first second bench race 1b3
#            profile (this script's stages), after (CPU)
#   minutes  expected, one decimal; limit: the step is cut (timeout) after it
#   kind     how its log is summarised: build, catch2, script, bench, bench_retry
#            (bench, once more at 3/4 of the micro-batch without a baseline row),
#            text (its last 60 lines shown); "-": rows this script does not run
#   if       a check (function below) that must pass for the step to run;
#            otherwise the step is "not run" with the reason
#   command  run with bash from the repository root, scripts/gpu_lib.sh
#            sourced, REPORT (the report folder), MPIRUN_FLAGS (Open MPI's
#            launcher flags, mpi_launcher_flags) and DEPS_CMAKE_ARGS (use_deps)
#            set, stdout and stderr into the log; no '|' before it
# The cpu row making .shards/brown_gpt2 is the command at the head of
# scripts/gpu_logits_compare.sh (tests/cli/gpu_check_plan.sh checks that).
read -r -d '' PLAN <<'EOF'
cpu|0.5|0|-|-||the Debian packages of the CPU side as .deb files in .deps/ (carried)|scripts/gpu_deps.sh
cpu|0.5|0|-|-||GPT-2's vocabulary and the Brown corpus, if data/gpt2, data/brown/raw are missing|scripts/fetch_gpt2.sh && scripts/fetch_brown.sh
cpu|0.1|0|-|-||the Brown corpus in GPT-2 tokens for the engine's train run and the logits comparison (carried)|build/attnres tokenize encode --tokenizer data/gpt2/encoder.json --input data/brown/raw --format brown --output-dir .shards/brown_gpt2 --val-fraction 0.05 --name brown
cpu|8.0|0|-|-||the GPU binaries built here (sm_90, no -march=native), packed with this tree's stamp into .gpu-prebuilt.tar.xz (carried): the device builds nothing|scripts/gpu_prebuild.sh
first|0.2|560|build|binaries_first.log||the binaries: this tree's prebuilt ones (.gpu-prebuilt.tar.xz, every library found by ldd), else built here (1.6 min)|gpu_binaries
first|0.4|150|catch2|gpu_tests_moe_muon.log||GPU tests: MoE (routing, permutation, combine, the grouped expert GEMMs and their type mixes) and Muon (bf16 Newton-Schulz)|build-gpu/tests/test_gpu "[moe],[muon]" -w NoTests --durations yes
first|0.2|120|catch2|gpu_tests_moe_per_expert.log||GPU tests: MoE again with the grouped GEMM off (a GEMM per expert)|ATTNRES_MOE_GROUPED_GEMM=0 build-gpu/tests/test_gpu "[moe]" -w NoTests --durations yes
first|0.2|120|catch2|gpu_tests_matmul.log||GPU tests: matmul, each cuBLASLt plan's algorithm logged (ATTNRES_GEMM_LOG)|ATTNRES_GEMM_LOG=1 build-gpu/tests/test_gpu "[matmul]" -w NoTests --durations yes
first|0.4|150|catch2|gpu_tests_attention.log||GPU tests: our attention on the joint q, k, v rows (forward, backward, decoding)|build-gpu/tests/test_gpu "[attention]~[cudnn]" -w NoTests --durations yes
first|0.2|150|catch2|gpu_tests_kda.log||GPU tests: Kimi Linear on cuda against the CPU: KDA (the chunkwise core forward and backward, the recurrence, the layer's parts) and MLA (the expansion, attention with values of their own width)|build-gpu/tests/test_gpu "[kda],[mla]" -w NoTests --durations yes
first|0.4|180|catch2|gpu_tests_model.log||GPU tests: the model (training steps against the CPU, bf16, decoding) and recomputation bit for bit|build-gpu/tests/test_gpu "[model]" -w NoTests --durations yes
first|0.3|150|catch2|gpu_tests_graphs.log||GPU tests: the step as a CUDA graph|build-gpu/tests/test_gpu "[graphs]" -w NoTests --durations yes
first|0.3|120|catch2|nccl.log|if_mpirun|the NCCL transport, 1 rank (self-exchange, the expert all-to-all as a self-send, P = 1 with two chunks, graphs)|NCCL_DEBUG=WARN ATTNRES_COMM_TIMEOUT_S=60 mpirun -np 1 $MPIRUN_FLAGS build-gpu/tests/test_mpi "[nccl]" -s --use-colour no
first|1.2|240|catch2|gpu_tests_mix.log||GPU tests: Mix, both kernel families (the rows kernels' first run), a query's results and dw alone and beside others|build-gpu/tests/test_gpu "[mix]" -w NoTests --durations yes
first|0.4|180|catch2|gpu_tests_cudnn.log|if_cudnn_engines|GPU tests: cuDNN's fused attention last (a GQA and a multi-head shape among its cases), with cuDNN's own log (CUDNN_LOGLEVEL_DBG=2) in this log|CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr ATTNRES_CUDNN_LOG=1 build-gpu/tests/test_gpu "[cudnn]" -w NoTests --durations yes
second|0.1|560|build|binaries_second.log||the binaries (as in --first)|gpu_binaries
second|0.2|120|catch2|nccl_all_to_all.log|if_mpirun|the NCCL expert all-to-all between 2 ranks (skipped where NCCL refuses two ranks on one GPU)|NCCL_DEBUG=WARN ATTNRES_COMM_TIMEOUT_S=60 mpirun -np 2 $MPIRUN_FLAGS build-gpu/tests/test_mpi "[nccl2]" -s --use-colour no
second|0.6|240|script|moe_ep_cuda.log|if_mpirun|MoE on cuda against the cpu, then D2, D2 EP2 and P2 x D2 EP2 ZeRO-1 (the all-to-all; bf16 with the routers in fp32) against one GPU|NCCL_DEBUG=WARN ATTNRES_COMM_TIMEOUT_S=60 OMP_NUM_THREADS=1 bash tests/gpu/moe_ep_cuda.sh "$PWD/build-gpu/attnres" "$PWD" "$PWD/build-gpu/tests/test_mpi" mpirun -np $MPIRUN_FLAGS
second|0.2|300|script|cuda_graphs.log||training.cuda_graphs through attnres train (eval, checkpoints, depth statistics, a resume) against the run without graphs, bit for bit, bf16|bash tests/gpu/cuda_graphs_train.sh "$PWD/build-gpu/attnres" "$PWD"
second|0.2|300|script|resume.log||exact resume and eval through the engine on the GPU in bf16|ATTNRES_TEST_DEVICE=cuda bash tests/cli/resume.sh "$PWD/build-gpu/attnres" "$PWD"
second|1.2|240|script|pipeline_cuda.log|if_mpirun|pipeline and data-parallel layouts, 2 and 4 ranks on the visible GPUs, against one GPU|NCCL_DEBUG=WARN ATTNRES_COMM_TIMEOUT_S=60 OMP_NUM_THREADS=1 bash tests/gpu/pipeline_cuda.sh "$PWD/build-gpu/attnres" "$PWD" "$PWD/build-gpu/tests/test_mpi" mpirun -np $MPIRUN_FLAGS
second|0.3|180|script|zero_bf16.log|if_mpirun|ZeRO-1 in bf16, 2 ranks|NCCL_DEBUG=WARN ATTNRES_COMM_TIMEOUT_S=60 OMP_NUM_THREADS=1 bash tests/gpu/zero_bf16.sh "$PWD/build-gpu/attnres" "$PWD" "$PWD/build-gpu/tests/test_mpi" mpirun -np $MPIRUN_FLAGS
second|1.4|240|catch2|gpu_tests_ce_swiglu_store.log||GPU tests: cross-entropy, SwiGLU, Store (passed on 2026-11-26, unchanged since)|build-gpu/tests/test_gpu "[cross_entropy],[swiglu],[store]" -w NoTests --durations yes
second|0.5|180|catch2|gpu_tests_rest.log||GPU tests: everything not run before (AdamW, norms, RoPE, embedding, reduce)|build-gpu/tests/test_gpu "~[moe]~[muon]~[matmul]~[attention]~[kda]~[mla]~[model]~[graphs]~[mix]~[cudnn]~[cross_entropy]~[swiglu]~[store]" -w NoTests --durations yes
bench|0.1|560|build|binaries_bench.log||the binaries (as in --first)|gpu_binaries
bench|0.2|240|bench|bench_124m.txt||training steps, 124M, every residual mode (bf16, bf16 logits)|build-gpu/attnres bench --device cuda --preset 124m --steps 10 --warmup 3
bench|0.3|240|bench|bench_350m.txt||training steps, 350M|build-gpu/attnres bench --device cuda --preset 350m --steps 5 --warmup 2
bench|0.2|240|bench|bench_124m_recompute.txt||training steps, 124M, each mode with recompute none, mix and layer|build-gpu/attnres bench --device cuda --preset 124m --recompute all --steps 5 --warmup 2
bench|0.2|240|bench|bench_124m_cudnn.txt||training steps, 124M, with cuDNN's fused attention where it runs (--attention auto)|build-gpu/attnres bench --device cuda --preset 124m --steps 10 --warmup 3 --attention auto
bench|0.2|240|bench|bench_124m_graphs.txt||training steps, 124M, each step one CUDA graph (--cuda-graphs: eager, captured, then replayed; the modes one after another)|build-gpu/attnres bench --device cuda --preset 124m --steps 10 --warmup 3 --cuda-graphs
bench|0.2|240|bench|kernels_124m.txt||per-kernel benchmark against the floors, 124M shapes|build-gpu/attnres bench --device cuda --preset 124m --kernels
bench|0.3|240|bench|kernels_350m.txt||per-kernel benchmark against the floors, 350M shapes|build-gpu/attnres bench --device cuda --preset 350m --kernels
bench|0.2|300|text|bench_vs_train.txt||the engine's training tokens/s (30-step 124M train) against the benchmark's|bash scripts/bench_vs_train.sh --device cuda --preset 124m --steps 30 --rounds 1 --bin build-gpu/attnres --data .shards/brown_gpt2
bench|0.5|180|text|attention_torch.txt|if_torch|reference attention (PyTorch SDPA, each backend) at the 124M and 350M shapes|python3 scripts/bench_attention_torch.py "$REPORT/bench_124m.txt" "$REPORT/bench_350m.txt"
bench|0.1|60|text|targets.txt||the GPU performance targets (docs/cuda.md)|python3 scripts/gpu_targets.py "$REPORT"
bench|0.6|300|text|logits_compare.log|if_shards|bf16 against fp32 logits, 124M, 3 runs of 400 steps on Brown (own archive gpu_logits_compare.tgz)|scripts/gpu_logits_compare.sh --data .shards/brown_gpt2
race|0.2|560|build|binaries_race.log||the binaries (as in --first)|gpu_binaries
race|4.0|420|text|race_124m.txt|if_torch|the race: attnres train against the PyTorch peer (torch.compile, bf16), 124M, baseline / Block N=8 / Full, 20 steps of 16 x 1024 tokens each on Brown (estimate: never run)|python3 scripts/race_torch.py configs/gpu_124m.json --device cuda --compile --steps 20 --skip 5 --attnres build-gpu/attnres --training.grad_accum=1 --data.train='.shards/brown_gpt2/brown_train_*.bin' --data.val='.shards/brown_gpt2/brown_val_*.bin'
race|4.5|480|text|race_350m.txt|if_torch|the race at 350M (8 x 2048 tokens a step)|python3 scripts/race_torch.py configs/gpu_350m.json --device cuda --compile --steps 20 --skip 5 --attnres build-gpu/attnres --training.grad_accum=1 --data.train='.shards/brown_gpt2/brown_train_*.bin' --data.val='.shards/brown_gpt2/brown_val_*.bin'
race|0.1|60|text|targets.txt||the GPU performance targets, with the race|python3 scripts/gpu_targets.py "$REPORT"
1b3|0.2|560|build|binaries_1b3.log||the binaries (as in --first)|gpu_binaries
1b3|0.5|330|bench_retry|bench_1b3.txt||training steps, 1b3 at the planner's micro-batch (again at 3/4 of it if that fails)|build-gpu/attnres bench --device cuda --preset 1b3 --steps 5 --warmup 2
1b3|0.6|240|bench|kernels_1b3.txt||per-kernel benchmark, 1b3 shapes|build-gpu/attnres bench --device cuda --preset 1b3 --kernels
1b3|0.5|180|text|attention_torch.txt|if_torch|reference attention at the 124M, 350M and 1b3 shapes (replaces --bench's)|python3 scripts/bench_attention_torch.py "$REPORT/bench_124m.txt" "$REPORT/bench_350m.txt" "$REPORT/bench_1b3.txt"
1b3|0.1|60|text|targets.txt||the GPU performance targets, with the 1.3B rows|python3 scripts/gpu_targets.py "$REPORT"
profile|0.2|560|build|binaries_profile.log||the binaries (as in --first)|gpu_binaries
profile|1.0|540|text|profile.log||Nsight Compute per kernel, 124M, baseline, block, full (at most 150 s each: --limit)|scripts/gpu_profile.sh --preset 124m
after|0.5|0|-|-||unpack the returned archives (their names sort in stage order) into one folder, then write its README|mkdir -p docs/measurements/DATE-GPU-7 && for f in FILES/*.tgz; do tar xzf "$f" -C docs/measurements/DATE-GPU-7; done && python3 scripts/gpu_report.py docs/measurements/DATE-GPU-7 --commit SHA --date DATE > docs/measurements/DATE-GPU-7/README.md
EOF
GPU_STAGES=(first second bench race 1b3 profile)
FIRST_LOAN=(first second bench)  # the first lent GPU: start + these <= FIRST_LOAN_MIN
LATER_LOANS=(race 1b3 profile)   # each on a later loan (a fresh machine)
START_MIN=1.0       # a fresh machine's start, counted as device time (~35 s seen)
BUDGET_MIN=15       # device time of a session
FIRST_LOAN_MIN=14   # what the first loan's stages may take with the start (a minute to spare)
CARRY='[".deps", ".shards", ".gpu-prebuilt.tar.xz"]'

# The checks of the table's "if" column: print why not, and return 1 (the step
# is skipped: not a failure) or 2 (the step is not run and that is a failure).
if_mpirun() { command -v mpirun >/dev/null && return 0; echo "no mpirun on PATH"; return 2; }
if_torch() { python3 -c "import torch" 2>/dev/null && return 0; echo "python3 cannot import torch"; return 1; }
# cuDNN's fused attention graphs run on its runtime-compiled engines, which
# load NVRTC and cuDNN's engines_runtime_compiled library when they run: both
# must be known to the loader (ldconfig -p), else the cases fail for a reason
# that is not ours.
if_cudnn_engines() {
  local lib missing=() cache
  # The loader's list read whole first: `ldconfig -p | grep -q` under pipefail
  # fails when grep stops at its match and ldconfig, still writing, gets SIGPIPE.
  cache=$(ldconfig -p 2>/dev/null || true)
  for lib in libnvrtc libcudnn_engines_runtime_compiled; do
    grep -q "$lib\.so" <<<"$cache" || missing+=("$lib")
  done
  ((${#missing[@]} == 0)) && return 0
  echo "ldconfig -p does not list ${missing[*]} (cuDNN's runtime-compiled engines need them)"
  return 2
}
if_shards() {
  ls .shards/brown_gpt2/brown_train_*.bin >/dev/null 2>&1 && return 0
  echo "no .shards/brown_gpt2 (make it on the CPU machine: the command at the head of" \
       "scripts/gpu_logits_compare.sh; carry .shards)"
  return 1
}

# Minutes with one decimal <-> tenths.
tenths() { local m=$1; [[ $m == *.* ]] || m+=.0; echo $((10#${m%.*} * 10 + 10#${m#*.})); }
minutes() { printf '%d.%d' $(($1 / 10)) $(($1 % 10)); }
mapfile -t ROWS < <(grep -v '^#' <<<"$PLAN" | grep .)
field() { local IFS='|' f; read -r -a f <<<"$1"; echo "${f[$2]}"; }  # (fields before the command only)
stage_tenths() {  # the sum of a stage's rows
  local r t=0
  for r in "${ROWS[@]}"; do [[ ${r%%|*} == "$1" ]] && t=$((t + $(tenths "$(field "$r" 1)"))); done
  echo $t
}
stage_command() {  # this script's stages: the flag; the others: their rows' commands
  case " ${GPU_STAGES[*]} " in *" $1 "*) echo "scripts/gpu_check.sh --$1"; return ;; esac
  local r cmds=()
  for r in "${ROWS[@]}"; do [[ ${r%%|*} == "$1" ]] && cmds+=("${r##*|}"); done
  (IFS=';'; echo "${cmds[*]}")
}
cond_text() {
  case $1 in
    if_mpirun) echo "only with mpirun on PATH (else not run: a failure)" ;;
    if_torch) echo "only if python3 imports torch (else skipped)" ;;
    if_shards) echo "only with .shards/brown_gpt2 (else skipped)" ;;
    if_cudnn_engines) echo "only if ldconfig -p lists libnvrtc and libcudnn_engines_runtime_compiled (else not run: a failure)" ;;
    *) echo "only if $1" ;;
  esac
}

# The CPU-side steps of one stage (cpu or after), each as its minutes, then
# its command and description, or (FIRST = what) description and command.
print_cpu_steps() {
  local want=$1 first=$2 r stage min limit kind log cond what cmd
  for r in "${ROWS[@]}"; do
    IFS='|' read -r stage min limit kind log cond what cmd <<<"$r"
    [[ $stage == "$want" ]] || continue
    if [[ $first == cmd ]]; then set -- "$cmd" "$what"; else set -- "$what" "$cmd"; fi
    printf '  step %4s min  %s\n                 %s\n' "$(minutes "$(tenths "$min")")" "$1" "$2"
  done
}

# print_stage S: stage S's line, "(at N)" the minute it ends at (cum, in
# tenths, adds its minutes), then its steps.
print_stage() {
  local s=$1 t r stage min limit kind log cond what cmd
  t=$(stage_tenths "$s")
  cum=$((cum + t))
  printf 'stage %-7s %4s min (at %4s)  %s\n' "$s" "$(minutes "$t")" "$(minutes "$cum")" "$(stage_command "$s")"
  for r in "${ROWS[@]}"; do
    IFS='|' read -r stage min limit kind log cond what cmd <<<"$r"
    [[ $stage == "$s" ]] || continue
    printf '  step %4s min  %s%s\n' "$(minutes "$(tenths "$min")")" "$what" \
      "$([[ -n $cond ]] && echo " [$(cond_text "$cond")]")"
    printf '                 %s\n' "$cmd"
  done
}

print_plan() {
  local s cum start total=0
  start=$(tenths $START_MIN)
  echo "The next GPU session (scripts/gpu_check.sh --plan): expected minutes from the 2026-11-26 H100"
  echo "session (docs/cuda.md, docs/measurements/2026-11-26-h100-4), each stage under 9 minutes."
  echo
  echo "1. On the CPU machine, before (not device time):"
  print_cpu_steps cpu cmd
  echo
  echo "2. On the GPU machine: one device-tool command per stage, back to back, each with"
  echo "   carry $CARRY and timeout_s 600. Every stage starts with the binaries step: the"
  echo "   prebuilt ones when their stamp is this tree's and ldd finds every library they load, else"
  echo "   built there (1.6 min). Each step runs in its own process with its own log and time limit,"
  echo "   the report packed into \$OUT after every step. Commands of the steps run from the"
  echo "   repository root; MPIRUN_FLAGS is '--oversubscribe' (and '--allow-run-as-root' as root)"
  echo "   when mpirun is Open MPI, else empty (mpi_launcher_flags, scripts/gpu_lib.sh)."
  echo
  echo "The first loan (at most $FIRST_LOAN_MIN of its $BUDGET_MIN minutes, the machine's start included):"
  cum=$start
  printf 'start         %4s min (at %4s)  a fresh machine (device time)\n' "$(minutes "$start")" "$(minutes "$cum")"
  for s in "${FIRST_LOAN[@]}"; do print_stage "$s"; done
  total=$((cum - start))
  printf 'first loan: %s min in %d stages + %s min machine start = %s min against %d (of the %d-minute budget)' \
    "$(minutes "$total")" ${#FIRST_LOAN[@]} "$(minutes "$start")" "$(minutes "$cum")" "$FIRST_LOAN_MIN" "$BUDGET_MIN"
  if ((cum > FIRST_LOAN_MIN * 10)); then
    echo ": OVER by $(minutes $((cum - FIRST_LOAN_MIN * 10))) min"
  else
    echo ": $(minutes $((FIRST_LOAN_MIN * 10 - cum))) min to spare"
  fi
  echo
  echo "Later loans (each stage on a fresh machine, its start counted again):"
  for s in "${LATER_LOANS[@]}"; do
    cum=$start
    printf 'start         %4s min (at %4s)  a fresh machine (device time)\n' "$(minutes "$start")" "$(minutes "$cum")"
    print_stage "$s"
  done
  echo
  echo "3. After, on the CPU machine (FILES: where the tool put each call's archives; GPU: h100 or"
  echo "   h200; copy them out after every call):"
  print_cpu_steps after what
}

out=build-gpu/report
stages=()
only=""
usage() {
  echo "usage: scripts/gpu_check.sh [--first] [--second] [--bench] [--race] [--1b3] [--profile]" >&2
  echo "                            [--only SPEC] [--report DIR] | --plan" >&2
  echo "(--build, --tests, --engine and --multi are now the steps of --first and --second)" >&2
  exit 2
}
plan=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --first|--second|--bench|--race|--1b3|--profile) stages+=("${1#--}") ;;
    --only) [[ $# -ge 2 ]] || usage; only=$2; shift ;;
    --report) [[ $# -ge 2 ]] || usage; out=$2; shift ;;
    --plan) plan=1 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
    *) usage ;;
  esac
  shift
done
if [[ $plan -eq 1 ]]; then print_plan; exit 0; fi
[[ -n $only ]] && stages=(only)
if [[ ${#stages[@]} -eq 0 ]]; then stages=("${GPU_STAGES[@]}"); fi
# In the plan's order, whatever the order of the flags.
if [[ ${stages[0]} != only ]]; then
  ordered=()
  for s in "${GPU_STAGES[@]}"; do [[ " ${stages[*]} " == *" $s "* ]] && ordered+=("$s"); done
  stages=("${ordered[@]}")
fi

mkdir -p "$out"
# gpu_check_<N>_<stages>.tgz, N the first stage's place in the plan (0 for
# --only): the archives of a session sort in stage order (each holds the
# whole report folder so far, so unpacking them in that order leaves the
# latest files).
i=-1
for j in "${!GPU_STAGES[@]}"; do [[ ${GPU_STAGES[$j]} == "${stages[0]}" ]] && i=$j; done
archive=gpu_check_$((i + 1))_$(IFS=_; echo "${stages[*]}")
source scripts/gpu_lib.sh
# Packs the report so far into $OUT (see above); called after every step.
save() { pack_to_out "$archive" "$out"; }

# stage_rows STAGE: its rows (--only: the binaries step, then one run of SPEC).
stage_rows() {
  local r
  if [[ $1 == only ]]; then
    for r in "${ROWS[@]}"; do [[ ${r%%|*} == first && ${r##*|} == gpu_binaries ]] && echo "${r/#first|/only|}"; done
    echo "only|4.0|540|catch2|gpu_tests.log||GPU tests selected by --only|build-gpu/tests/test_gpu \"$only\" -w NoTests --durations yes"
    return
  fi
  for r in "${ROWS[@]}"; do [[ ${r%%|*} == "$1" ]] && echo "$r"; done
}
t_begin=0  # $SECONDS counts from the script's start
limit_s=${ATTNRES_TIME_LIMIT_S:-570}
[[ -n "${OUT:-}" ]] || limit_s=${ATTNRES_TIME_LIMIT_S:-0}  # no limit outside the device tool

# The commands' environment (see the table's header).
use_deps || exit 2
export REPORT=$out DEPS_CMAKE_ARGS="${deps_cmake_args[*]}" MPIRUN_FLAGS=""
command -v mpirun >/dev/null && MPIRUN_FLAGS=$(mpi_launcher_flags mpirun)

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1 \
  || echo "warning: nvidia-smi failed (see $out/gpu.txt)"
tail -1 "$out/gpu.txt"

status=0
# run_step ROW: one step (see the table), its log summarised on the console,
# a line in steps.txt, the report packed.
run_step() {
  local stage min limit kind log cond what cmd why rc=0 t0 secs lim result
  IFS='|' read -r stage min limit kind log cond what cmd <<<"$1"
  echo "==> $what"
  echo "    \$ $cmd"
  last_rc=0
  if [[ -n $cond ]]; then
    why=$("$cond"); rc=$?
    last_rc=$rc
    if [[ $rc -ne 0 ]]; then
      echo "    not run: $why"
      printf '%-7s %-30s %-9s %5s    (expected %s min) %s\n' "$stage" "$log" "not run" "-" "$min" "$why" >> "$out/steps.txt"
      [[ $rc -eq 2 ]] && status=1
      save
      return
    fi
  fi
  lim=$limit
  if ((limit_s > 0)); then
    local left=$((limit_s - (SECONDS - t_begin)))
    if ((left < 20)); then
      last_rc=1
      echo "    not run: this command's $limit_s s are spent (ATTNRES_TIME_LIMIT_S)"
      printf '%-7s %-30s %-9s %5s    (expected %s min) time spent\n' "$stage" "$log" "not run" "-" "$min" >> "$out/steps.txt"
      status=1
      save
      return
    fi
    ((left < lim)) && lim=$left
  fi
  t0=$SECONDS
  timeout -k 10 "$lim" bash -c "source scripts/gpu_lib.sh; $cmd" > "$out/$log" 2>&1 < /dev/null || rc=$?
  secs=$((SECONDS - t0))
  # bench_retry: no baseline row is a failure (a mode that ran out of memory).
  no_baseline() { [[ $kind == bench_retry ]] && ! grep -q "^baseline" "$out/$log"; }
  if [[ $rc -eq 0 ]] && no_baseline; then rc=1; fi
  if [[ $rc -ne 0 && $kind == bench_retry ]]; then
    # The planner's micro-batch did not run (out of memory?): once more at 3/4 of it.
    local b left2
    b=$(grep -o ' B=[0-9]*' "$out/$log" | head -1 | cut -d= -f2)
    left2=$((lim - secs))
    if [[ -n "$b" && $b -ge 2 && $left2 -ge 30 ]]; then
      mv "$out/$log" "$out/${log%.txt}_failed.txt"
      echo "    B=$b failed (rc $rc); again at B=$((b * 3 / 4))"
      rc=0
      timeout -k 10 "$left2" bash -c "source scripts/gpu_lib.sh; $cmd --batch $((b * 3 / 4))" \
        > "$out/$log" 2>&1 < /dev/null || rc=$?
      secs=$((SECONDS - t0))
      if [[ $rc -eq 0 ]] && no_baseline; then rc=1; fi
    fi
  fi
  case $kind in
    build)
      if [[ $rc -ne 0 ]]; then
        grep -E "error|Error" -A3 "$out/$log" | head -60
        tail -15 "$out/$log"
      fi
      grep -E "^note:" "$out/$log" ;;
    catch2)
      grep -E "^(GPU tests on|All tests passed|test cases:|No test cases matched)|skipped|SKIPPED" "$out/$log" | head -20
      [[ $rc -ne 0 ]] && grep -B3 -A12 "FAILED" "$out/$log" | head -150 ;;
    script)
      grep -E "^(ok|skipped|not run)" "$out/$log"
      [[ $rc -ne 0 ]] && tail -30 "$out/$log" ;;
    bench|bench_retry)
      grep -E "^(model|micro-batch|modes|baseline|block|full|measured ceilings|attention|lm_head)" "$out/$log"
      [[ $rc -ne 0 ]] && tail -30 "$out/$log" ;;
    *) tail -60 "$out/$log" ;;
  esac
  if [[ $rc -eq 0 ]]; then
    result=ok
    # A test that found no device (or no NCCL) passes saying so: not "ok".
    [[ $kind == catch2 || $kind == script ]] && grep -qE "^ *(skipped|SKIPPED):" "$out/$log" && result=skipped
  else
    status=1
    result="FAILED"
    [[ $rc -eq 124 || $rc -eq 137 ]] && result="TIMEOUT"
  fi
  last_rc=$rc
  [[ $rc -eq 124 || $rc -eq 137 ]] && echo "    (cut at $lim s)" | tee -a "$out/$log"
  echo "    -> $result (exit $rc) in $secs s; expected $min min"
  printf '%-7s %-30s %-9s %5d s  (expected %s min)\n' "$stage" "$log" "$result" "$secs" "$min" >> "$out/steps.txt"
  save
}

for s in "${stages[@]}"; do
  echo "=== stage $s: $(stage_command "$s") (expected $(minutes "$(stage_tenths "$s")") min)"
  mapfile -t rows < <(stage_rows "$s")
  for r in "${rows[@]}"; do
    run_step "$r"
    if [[ ${r##*|} == gpu_binaries && $last_rc -ne 0 ]]; then
      # No binaries of this tree: the later steps would test other code or none.
      echo "error: no binaries built from this tree ($out/$(field "$r" 4)): later steps not run" \
        | tee -a "$out/steps.txt" >&2
      save
      exit 1
    fi
  done
done
save
exit $status
