#!/usr/bin/env bash
# The GPU checks, in stages that each fit one 10-minute command of the device
# tool (H100/H200; no network needed there), run one after another on a warm
# machine (it keeps build-gpu/ only while warm):
#   --build    configure (Release, sm_90) and build attnres, test_gpu and, when
#              mpirun is there and CMake finds MPI, test_mpi into build-gpu/
#   --tests    the GPU tests in three runs with their own logs: cross-entropy,
#              SwiGLU and Store; the model tests; everything else
#   --engine   exact resume + eval on the GPU in bf16 (tests/cli/resume.sh), the
#              engine's training tokens/s against the benchmark's
#              (scripts/bench_vs_train.sh, 30 steps of 124M, one round), recomputation
#              none vs mix / layer bit for bit (test_gpu "[recompute]")
#   --multi    the NCCL transport test (1 rank), then the multi-rank scripts
#              tests/gpu/pipeline_cuda.sh, tests/gpu/moe_ep_cuda.sh and
#              tests/gpu/zero_bf16.sh
#   --bench    124M and 350M training steps (and 124M with recomputation), the
#              per-kernel tables, PyTorch's attention at the same shapes, the
#              targets (scripts/gpu_targets.py), bf16 against fp32 logits
#              (scripts/gpu_logits_compare.sh, when .shards/brown_gpt2 is there)
#   --race     the race: attnres train against the PyTorch peer (torch.compile,
#              bf16) at 124M and 350M, each residual mode (scripts/race_torch.py),
#              then the targets again
#   --1b3      the 1b3 training steps (the planner's micro-batch, once more at
#              3/4 of it if that fails) and its kernel table
#   --only SPEC  --tests with one run of the GPU tests a Catch2 spec selects,
#              e.g. "[mix],[adamw]" (log gpu_tests.log)
#   --report DIR where logs and tables go (default build-gpu/report)
#   --plan     print the next GPU session's commands with their expected minutes
#              (no GPU, builds nothing) and exit
# Without a stage flag: every stage above in that order (~35 min: for a GPU
# machine without the device tool's 10-minute limit). Later stages never
# build: a binary they need that is missing stops them at once (run --build).
# Profiles are scripts/gpu_profile.sh's, the last step of the plan.
#
# The stages' steps are the rows of PLAN below, with their expected minutes
# (from the 2026-11-26 sessions, the H200's and then the H100's: docs/cuda.md,
# docs/measurements/) and
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
#   stage    cpu (on the CPU machine, before), build tests engine multi bench 1b3
#            (this script's stages), profile (scripts/gpu_profile.sh), after (CPU)
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
build|1.6|560|build|build.log||configure (Release, sm_90) and build attnres, test_gpu and test_mpi|cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 $DEPS_CMAKE_ARGS && cmake --build build-gpu -j"$(nproc)" --target $(build_targets build-gpu)
tests|0.2|180|catch2|gpu_tests_cudnn.log|if_cudnn_engines|GPU tests: cuDNN's fused attention first (a GQA and a multi-head shape among its cases), with cuDNN's own log (CUDNN_LOGLEVEL_DBG=2) in this log|CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr build-gpu/tests/test_gpu "[cudnn]" -w NoTests --durations yes
tests|0.1|120|catch2|gpu_tests_matmul.log||GPU tests: matmul, each cuBLASLt plan's algorithm logged (ATTNRES_GEMM_LOG)|ATTNRES_GEMM_LOG=1 build-gpu/tests/test_gpu "[matmul]" -w NoTests --durations yes
tests|1.4|240|catch2|gpu_tests_ce_swiglu_store.log||GPU tests: cross-entropy, SwiGLU, Store|build-gpu/tests/test_gpu "[cross_entropy],[swiglu],[store]" -w NoTests --durations yes
tests|0.1|240|catch2|gpu_tests_model.log||GPU tests: the model (training steps against the CPU, bf16, decoding)|build-gpu/tests/test_gpu "[model]~[recompute]" -w NoTests --durations yes
tests|2.4|360|catch2|gpu_tests_rest.log||GPU tests: everything else (matmul, our attention, mix, norms, AdamW, MoE, Muon, ...)|build-gpu/tests/test_gpu "~[cross_entropy]~[swiglu]~[store]~[model]~[cudnn]" -w NoTests --durations yes
engine|0.1|300|script|resume.log||exact resume and eval through the engine on the GPU in bf16|ATTNRES_TEST_DEVICE=cuda bash tests/cli/resume.sh "$PWD/build-gpu/attnres" "$PWD"
engine|0.2|300|text|bench_vs_train.txt||the engine's training tokens/s (30-step 124M train) against the benchmark's|bash scripts/bench_vs_train.sh --device cuda --preset 124m --steps 30 --rounds 1 --bin build-gpu/attnres --data .shards/brown_gpt2
engine|0.1|300|script|cuda_graphs.log||training.cuda_graphs through attnres train (eval, checkpoints, depth statistics, a resume) against the run without graphs, bit for bit, bf16|bash tests/gpu/cuda_graphs_train.sh "$PWD/build-gpu/attnres" "$PWD"
engine|0.1|180|catch2|gpu_tests_recompute.log||recomputation (none vs mix, layer) bit for bit on the GPU|build-gpu/tests/test_gpu "[recompute]" -w NoTests --durations yes
multi|0.1|120|catch2|nccl.log|if_mpirun|the NCCL transport, 1 rank (self-exchange, P = 1 with two chunks)|NCCL_DEBUG=WARN ATTNRES_COMM_TIMEOUT_S=60 mpirun -np 1 $MPIRUN_FLAGS build-gpu/tests/test_mpi "[nccl]" -s --use-colour no
multi|1.2|240|script|pipeline_cuda.log|if_mpirun|pipeline and data-parallel layouts, 2 and 4 ranks on the visible GPUs, against one GPU|NCCL_DEBUG=WARN ATTNRES_COMM_TIMEOUT_S=60 OMP_NUM_THREADS=1 bash tests/gpu/pipeline_cuda.sh "$PWD/build-gpu/attnres" "$PWD" "$PWD/build-gpu/tests/test_mpi" mpirun -np $MPIRUN_FLAGS
multi|0.4|240|script|moe_ep_cuda.log|if_mpirun|MoE on cuda against the cpu, then D2, D2 EP2 and P2 x D2 EP2 ZeRO-1 (the all-to-all) against one GPU|NCCL_DEBUG=WARN ATTNRES_COMM_TIMEOUT_S=60 OMP_NUM_THREADS=1 bash tests/gpu/moe_ep_cuda.sh "$PWD/build-gpu/attnres" "$PWD" "$PWD/build-gpu/tests/test_mpi" mpirun -np $MPIRUN_FLAGS
multi|0.2|180|script|zero_bf16.log|if_mpirun|ZeRO-1 in bf16, 2 ranks|NCCL_DEBUG=WARN ATTNRES_COMM_TIMEOUT_S=60 OMP_NUM_THREADS=1 bash tests/gpu/zero_bf16.sh "$PWD/build-gpu/attnres" "$PWD" "$PWD/build-gpu/tests/test_mpi" mpirun -np $MPIRUN_FLAGS
bench|0.2|240|bench|bench_124m.txt||training steps, 124M, every residual mode (bf16, bf16 logits)|build-gpu/attnres bench --device cuda --preset 124m --steps 10 --warmup 3
bench|0.3|240|bench|bench_350m.txt||training steps, 350M|build-gpu/attnres bench --device cuda --preset 350m --steps 5 --warmup 2
bench|0.2|240|bench|bench_124m_recompute.txt||training steps, 124M, each mode with recompute none, mix and layer|build-gpu/attnres bench --device cuda --preset 124m --recompute all --steps 5 --warmup 2
bench|0.2|240|bench|bench_124m_cudnn.txt||training steps, 124M, with cuDNN's fused attention where it runs (--attention auto)|build-gpu/attnres bench --device cuda --preset 124m --steps 10 --warmup 3 --attention auto
bench|0.2|240|bench|bench_124m_graphs.txt||training steps, 124M, each step one CUDA graph (--cuda-graphs: eager, captured, then replayed; the modes one after another)|build-gpu/attnres bench --device cuda --preset 124m --steps 10 --warmup 3 --cuda-graphs
bench|0.2|240|bench|kernels_124m.txt||per-kernel benchmark against the floors, 124M shapes|build-gpu/attnres bench --device cuda --preset 124m --kernels
bench|0.3|240|bench|kernels_350m.txt||per-kernel benchmark against the floors, 350M shapes|build-gpu/attnres bench --device cuda --preset 350m --kernels
bench|0.5|180|text|attention_torch.txt|if_torch|reference attention (PyTorch SDPA, each backend) at the 124M and 350M shapes|python3 scripts/bench_attention_torch.py "$REPORT/bench_124m.txt" "$REPORT/bench_350m.txt"
bench|0.1|60|text|targets.txt||the GPU performance targets (docs/cuda.md)|python3 scripts/gpu_targets.py "$REPORT"
bench|0.6|300|text|logits_compare.log|if_shards|bf16 against fp32 logits, 124M, 3 runs of 400 steps on Brown (own archive gpu_logits_compare.tgz)|scripts/gpu_logits_compare.sh --data .shards/brown_gpt2
race|4.0|420|text|race_124m.txt|if_torch|the race: attnres train against the PyTorch peer (torch.compile, bf16), 124M, baseline / Block N=8 / Full, 20 steps of 16 x 1024 tokens each on Brown (estimate: never run)|python3 scripts/race_torch.py configs/gpu_124m.json --device cuda --compile --steps 20 --skip 5 --attnres build-gpu/attnres --training.grad_accum=1 --data.train='.shards/brown_gpt2/brown_train_*.bin' --data.val='.shards/brown_gpt2/brown_val_*.bin'
race|4.5|480|text|race_350m.txt|if_torch|the race at 350M (8 x 2048 tokens a step)|python3 scripts/race_torch.py configs/gpu_350m.json --device cuda --compile --steps 20 --skip 5 --attnres build-gpu/attnres --training.grad_accum=1 --data.train='.shards/brown_gpt2/brown_train_*.bin' --data.val='.shards/brown_gpt2/brown_val_*.bin'
race|0.1|60|text|targets.txt||the GPU performance targets, with the race|python3 scripts/gpu_targets.py "$REPORT"
1b3|0.5|330|bench_retry|bench_1b3.txt||training steps, 1b3 at the planner's micro-batch (again at 3/4 of it if that fails)|build-gpu/attnres bench --device cuda --preset 1b3 --steps 5 --warmup 2
1b3|0.6|240|bench|kernels_1b3.txt||per-kernel benchmark, 1b3 shapes|build-gpu/attnres bench --device cuda --preset 1b3 --kernels
1b3|0.5|180|text|attention_torch.txt|if_torch|reference attention at the 124M, 350M and 1b3 shapes (replaces --bench's)|python3 scripts/bench_attention_torch.py "$REPORT/bench_124m.txt" "$REPORT/bench_350m.txt" "$REPORT/bench_1b3.txt"
1b3|0.1|60|text|targets.txt||the GPU performance targets, with the 1.3B rows|python3 scripts/gpu_targets.py "$REPORT"
profile|1.0|600|-|-||Nsight Compute per kernel, 124M, baseline, block, full (at most 150 s each: --limit)|scripts/gpu_profile.sh --preset 124m
after|0.5|0|-|-||unpack the returned archives (their names sort in stage order) into one folder, then write its README|mkdir -p docs/measurements/DATE-h100-3 && for f in FILES/*.tgz; do tar xzf "$f" -C docs/measurements/DATE-h100-3; done && python3 scripts/gpu_report.py docs/measurements/DATE-h100-3 --commit SHA --date DATE > docs/measurements/DATE-h100-3/README.md
EOF
GPU_STAGES=(build tests engine multi bench race 1b3)
START_MIN=1.0       # a fresh machine's start, counted as device time (~35 s seen)
BUDGET_MIN=15       # device time of a session
CARRY='[".deps", ".shards"]'

# The checks of the table's "if" column: print why not, and return 1 (the step
# is skipped: not a failure) or 2 (the step is not run and that is a failure).
if_mpirun() { command -v mpirun >/dev/null && return 0; echo "no mpirun on PATH"; return 2; }
if_torch() { python3 -c "import torch" 2>/dev/null && return 0; echo "python3 cannot import torch"; return 1; }
# cuDNN's fused attention graphs run on its runtime-compiled engines, which
# load NVRTC and cuDNN's engines_runtime_compiled library when they run: both
# must be known to the loader (ldconfig -p), else the cases fail for a reason
# that is not ours.
if_cudnn_engines() {
  local lib missing=()
  for lib in libnvrtc libcudnn_engines_runtime_compiled; do
    ldconfig -p 2>/dev/null | grep -q "$lib\.so" || missing+=("$lib")
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

print_plan() {
  local r stage min limit kind log cond what cmd s t cum total=0 start
  start=$(tenths $START_MIN)
  echo "The next GPU session (scripts/gpu_check.sh --plan): expected minutes from the 2026-11-26 H100"
  echo "session (docs/cuda.md, docs/measurements/2026-11-26-h100-4), each stage under 9 minutes."
  echo
  echo "1. On the CPU machine, before (not device time):"
  print_cpu_steps cpu cmd
  echo
  echo "2. On the GPU machine: one device-tool command per stage, back to back, each with"
  echo "   carry $CARRY and timeout_s 600. The machine keeps build-gpu/ only while warm (call"
  echo "   again within ~30 s); on a fresh machine run --build again first. Commands of the steps"
  echo "   run from the repository root; MPIRUN_FLAGS is '--oversubscribe' (and '--allow-run-as-root'"
  echo "   as root) when mpirun is Open MPI, else empty (mpi_launcher_flags, scripts/gpu_lib.sh)."
  cum=$start
  printf 'start         %4s min (at %4s)  a fresh machine (device time)\n' "$(minutes "$start")" "$(minutes "$cum")"
  for s in "${GPU_STAGES[@]}" profile; do
    t=$(stage_tenths "$s")
    cum=$((cum + t)) total=$((total + t))
    cmd=$(stage_command "$s")
    printf 'stage %-7s %4s min (at %4s)  %s%s\n' "$s" "$(minutes "$t")" "$(minutes "$cum")" "$cmd" \
      "$( ((cum > BUDGET_MIN * 10)) && echo "   [past the $BUDGET_MIN-minute budget]")"
    for r in "${ROWS[@]}"; do
      IFS='|' read -r stage min limit kind log cond what cmd <<<"$r"
      [[ $stage == "$s" ]] || continue
      printf '  step %4s min  %s%s\n' "$(minutes "$(tenths "$min")")" "$what" \
        "$([[ -n $cond ]] && echo " [$(cond_text "$cond")]")"
      printf '                 %s\n' "$cmd"
    done
  done
  echo
  printf 'total: %s min in %d stages + %s min machine start = %s min against the %d-minute budget' \
    "$(minutes "$total")" $((${#GPU_STAGES[@]} + 1)) "$(minutes "$start")" "$(minutes "$cum")" "$BUDGET_MIN"
  if ((cum > BUDGET_MIN * 10)); then
    echo ": over by $(minutes $((cum - BUDGET_MIN * 10))) min;"
    echo "  the stages marked past the budget run on what is left (gpu_profile.sh --limit, or --modes, to fit)"
  else
    echo ": $(minutes $((BUDGET_MIN * 10 - cum))) min to spare"
  fi
  # Fewer calls, fewer chances to lose the warm machine between them: stages
  # in order, joined while their sum stays under 9 minutes.
  local group=() gt=0
  echo "Or fewer calls (stages joined while under 9 min; the same steps, one archive per call):"
  for s in "${GPU_STAGES[@]}" ""; do
    t=0; [[ -n $s ]] && t=$(stage_tenths "$s")
    if [[ ${#group[@]} -gt 0 ]] && { [[ -z $s ]] || ((gt + t >= 90)); }; then
      printf '  %-46s %4s min\n' "scripts/gpu_check.sh$(printf ' --%s' "${group[@]}")" "$(minutes $gt)"
      group=() gt=0
    fi
    [[ -n $s ]] && group+=("$s") && gt=$((gt + t))
  done
  echo
  echo "3. After, on the CPU machine (FILES: where the tool put each call's archives; copy them"
  echo "   out after every call):"
  print_cpu_steps after what
}

out=build-gpu/report
stages=()
only=""
usage() {
  echo "usage: scripts/gpu_check.sh [--build] [--tests] [--engine] [--multi] [--bench] [--race] [--1b3]" >&2
  echo "                            [--only SPEC] [--report DIR] | --plan" >&2
  echo "(--tests SPEC is now --only SPEC; --quick is --build, then --tests, then --engine)" >&2
  exit 2
}
plan=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build|--tests|--engine|--multi|--bench|--race|--1b3) stages+=("${1#--}") ;;
    --only) [[ $# -ge 2 ]] || usage; only=$2; shift ;;
    --report) [[ $# -ge 2 ]] || usage; out=$2; shift ;;
    --plan) plan=1 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
    *) usage ;;
  esac
  shift
done
if [[ $plan -eq 1 ]]; then print_plan; exit 0; fi
[[ -n $only && " ${stages[*]} " != *" tests "* ]] && stages+=(tests)
if [[ ${#stages[@]} -eq 0 ]]; then stages=("${GPU_STAGES[@]}"); fi
# In the plan's order, whatever the order of the flags.
ordered=()
for s in "${GPU_STAGES[@]}"; do [[ " ${stages[*]} " == *" $s "* ]] && ordered+=("$s"); done
stages=("${ordered[@]}")

mkdir -p "$out"
# gpu_check_<N>_<stages>.tgz, N the first stage's place in the plan: the
# archives of a session sort in stage order (each holds the whole report
# folder so far, so unpacking them in that order leaves the latest files).
for i in "${!GPU_STAGES[@]}"; do [[ ${GPU_STAGES[$i]} == "${stages[0]}" ]] && break; done
archive=gpu_check_$((i + 1))_$(IFS=_; echo "${stages[*]}")
source scripts/gpu_lib.sh
# Packs the report so far into $OUT (see above); called after every step.
save() { pack_to_out "$archive" "$out"; }

# stage_rows STAGE: its rows (for --tests with --only, the one run of SPEC).
stage_rows() {
  local r
  if [[ $1 == tests && -n $only ]]; then
    echo "tests|4.0|540|catch2|gpu_tests.log||GPU tests selected by --only|build-gpu/tests/test_gpu \"$only\" -w NoTests --durations yes"
    return
  fi
  for r in "${ROWS[@]}"; do [[ ${r%%|*} == "$1" ]] && echo "$r"; done
}
# need_binaries STAGE: later stages never build: the build-gpu/ binaries its
# steps run (those whose "if" holds) must be there; else exit 2 at once.
need_binaries() {
  local r f cond missing=()
  [[ $1 == build ]] && return 0
  while IFS= read -r r; do
    cond=$(field "$r" 5)
    [[ -n $cond ]] && ! "$cond" >/dev/null && continue
    for f in $(grep -oE 'build-gpu/[A-Za-z0-9_/.-]+' <<<"${r##*|}" | sort -u); do
      [[ -x $f || " ${missing[*]} " == *" $f "* ]] || missing+=("$f")
    done
  done < <(stage_rows "$1")
  [[ ${#missing[@]} -eq 0 ]] && return 0
  echo "error: ${missing[*]} missing: run scripts/gpu_check.sh --build first" \
       "(the machine keeps build-gpu/ only while warm)" | tee -a "$out/steps.txt" >&2
  save
  exit 2
}
# Without --build in this command, every stage's binaries are checked first.
if [[ " ${stages[*]} " != *" build "* ]]; then
  for s in "${stages[@]}"; do need_binaries "$s"; done
fi
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
  if [[ -n $cond ]]; then
    why=$("$cond"); rc=$?
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
  [[ $rc -eq 124 || $rc -eq 137 ]] && echo "    (cut at $lim s)" | tee -a "$out/$log"
  echo "    -> $result (exit $rc) in $secs s; expected $min min"
  printf '%-7s %-30s %-9s %5d s  (expected %s min)\n' "$stage" "$log" "$result" "$secs" "$min" >> "$out/steps.txt"
  save
}

for s in "${stages[@]}"; do
  echo "=== stage $s: $(stage_command "$s") (expected $(minutes "$(stage_tenths "$s")") min)"
  need_binaries "$s"
  mapfile -t rows < <(stage_rows "$s")
  for r in "${rows[@]}"; do run_step "$r"; done
  if [[ $s == build && $status -ne 0 ]]; then
    # No stale binaries for the later stages to run: they stop, asking for --build.
    rm -f build-gpu/attnres build-gpu/tests/test_gpu build-gpu/tests/test_mpi
    echo "error: the build failed ($out/build.log); its binaries were removed, later stages not run" \
      | tee -a "$out/steps.txt" >&2
    save
    exit 1
  fi
done
save
exit $status
