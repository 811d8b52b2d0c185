#!/usr/bin/env bash
# The pipeline and data-parallel runtime with training.device = "cuda".
#
# ATTNRES_TEST_TRANSPORT unset ("auto"; CTest "gpu: pipeline on cuda"): up to
# 4 ranks on however many GPUs there are (local rank modulo the visible GPUs;
# ranks sharing a GPU each have their own CUDA context, and the trainer then
# picks the MPI transport, which stages device tensors through host memory).
# ATTNRES_TEST_TRANSPORT=nccl (CTest label gpu-multi): the NCCL transport, a GPU
# per rank. ATTNRES_TEST_RANKS=N (CTest runs N = 2 and N = 4 as two tests)
# keeps the layouts of N ranks only; the test is skipped ("skipped: ...", with
# the GPUs it saw) when a layout it would run needs more GPUs than are visible,
# never passed with layouts left out.
#
# The single-process CUDA run in fp32 against the CPU's (1e-4 relative), then
# every layout against the single-process CUDA run of the same precision:
#   fp32: losses, val losses and grad norms within 1e-5 relative (the cached
#         protocol and data parallelism reassociate sums; AdamW's eps is raised
#         as in tests/mpi/train_exact.sh so that rounding in nearly cancelling
#         gradients is not magnified), final checkpoints within 1e-5;
#   bf16: within 2e-2 relative, the bound the GPU model tests put on bf16
#         training against fp32 (here both sides round alike and only the sums'
#         order differs; the measured difference is printed);
#   pp_bytes: the fp32 run's equals the same layout's on the CPU; bf16 messages
#         are half of it (every boundary tensor is in the model's dtype);
#   over NCCL, each layout again with training.cuda_graphs = true: the same
#         metrics bit for bit (every rank's step captured with its NCCL calls);
#         with ranks sharing a GPU (MPI), cuda_graphs = true is refused.
# Usage: pipeline_cuda.sh BIN SRC TEST_MPI MPIEXEC NPFLAG [launcher flags...]
export ATTNRES_TEST_DEVICE=cuda
source "$2/tests/mpi/lib.sh"
require_device

layouts=("--parallel.pipeline=2 --parallel.virtual_stages=2"
         "--parallel.pipeline=4 --parallel.virtual_stages=2"
         "--parallel.pipeline=4 --parallel.virtual_stages=2 --parallel.cache_blocks=false"
         "--parallel.data=2 --training.grad_accum=2"
         "--parallel.pipeline=2 --parallel.data=2 --training.grad_accum=2"
         "--parallel.data=2 --training.grad_accum=2 --parallel.zero=1")
ranks() {  # P x D of a layout's flags
  local P=1 D=1
  [[ "$1" =~ pipeline=([0-9]+) ]] && P=${BASH_REMATCH[1]}
  [[ "$1" =~ data=([0-9]+) ]] && D=${BASH_REMATCH[1]}
  echo $((P * D))
}
# ATTNRES_TEST_RANKS: only the layouts of that many ranks.
if [[ -n "${ATTNRES_TEST_RANKS:-}" ]]; then
  kept=()
  for args in "${layouts[@]}"; do
    [[ $(ranks "$args") == "$ATTNRES_TEST_RANKS" ]] && kept+=("$args")
  done
  ((${#kept[@]} > 0)) || fail "no layout of ATTNRES_TEST_RANKS=$ATTNRES_TEST_RANKS ranks"
  layouts=("${kept[@]}")
fi
# The GPUs this job may use (tests/cli/lib.sh; require_device has skipped
# the test when there are none).
gpus=$(visible_gpus)
transport="${ATTNRES_TEST_TRANSPORT:-auto}"
if [[ $transport == nccl ]]; then
  need=2  # NCCL between ranks: at least 2, and a GPU for each rank of every layout
  for args in "${layouts[@]}"; do (($(ranks "$args") > need)) && need=$(ranks "$args"); done
  if ((gpus < need)); then
    echo "skipped: the NCCL transport needs a GPU per rank: these layouts need $need GPUs, $gpus visible"
    exit 0
  fi
fi
common=(--optimizer.eps=1e-4 --parallel.transport=$transport)
make_corpus
write_mpi_config

declare -A cpu_bytes
for i in "${!layouts[@]}"; do
  args=${layouts[$i]}
  [[ "$args" == *pipeline=* ]] || continue  # no pipeline traffic without stages
  run_np "$(ranks "$args")" "$BIN" train base.json --optimizer.eps=1e-4 --training.device=cpu \
    --checkpoint.dir=ck_cpu$i --run.dir=run_cpu$i $args 2>log_cpu.txt \
    || { cat log_cpu.txt; fail "cpu: mpirun $args"; }
  cpu_bytes[$i]=$(pp_bytes run_cpu$i/metrics.jsonl)
done

# The single-process CPU run: the reference of the single-process GPU run in
# fp32, so that a fault in the executor's GPU path, which every run below
# shares, cannot cancel out (1e-4: other kernels, other rounding, 8 steps).
"$BIN" train base.json --optimizer.eps=1e-4 --training.device=cpu --checkpoint.dir=ck_cpu \
  --run.dir=run_cpu 2>log_cpu.txt || { cat log_cpu.txt; fail "cpu: single process"; }

for prec in fp32 bf16; do
  tol=1e-5; [[ $prec == bf16 ]] && tol=2e-2
  dev=(--training.device=cuda --training.precision=$prec)
  "$BIN" train base.json "${common[@]}" "${dev[@]}" --checkpoint.dir=ck_1$prec \
    --run.dir=run_1$prec 2>log_1.txt || { cat log_1.txt; fail "$prec: single process"; }
  if [[ $prec == fp32 ]]; then
    result=$(compare_losses run_cpu/metrics.jsonl run_1fp32/metrics.jsonl 1e-4) \
      || { echo "$result"; fail "fp32: the single-process cuda run differs from the cpu run"; }
    pass "fp32, 1 process: cuda = cpu within 1e-4 (final loss $(last_loss run_1fp32/metrics.jsonl) vs $(last_loss run_cpu/metrics.jsonl))"
  fi
  for i in "${!layouts[@]}"; do
    args=${layouts[$i]}
    np=$(ranks "$args")
    rm -rf ck_p run_p
    run_np "$np" "$BIN" train base.json "${common[@]}" "${dev[@]}" --checkpoint.dir=ck_p \
      --run.dir=run_p $args 2>log_p.txt || { cat log_p.txt; fail "$prec: mpirun -np $np $args"; }
    if ((np > gpus)); then
      grep -q "share $gpus GPU" log_p.txt || { cat log_p.txt; fail "$prec $args: no warning that ranks share a GPU"; }
      grep -q "mpi transport" log_p.txt || { cat log_p.txt; fail "$prec $args: shared GPUs must use the MPI transport"; }
    fi
    result=$(compare_losses run_1$prec/metrics.jsonl run_p/metrics.jsonl $tol) \
      || { echo "$result"; fail "$prec $args: losses differ from the single process"; }
    if [[ $prec == fp32 ]]; then
      "$BIN" inspect compare ck_1$prec/step_00000008 ck_p/step_00000008 --rtol 1e-5 >/dev/null \
        || fail "$prec $args: final checkpoint differs"
    fi
    bytes=""
    if [[ -n "${cpu_bytes[$i]:-}" ]]; then
      got=$(pp_bytes run_p/metrics.jsonl)
      want=${cpu_bytes[$i]}; [[ $prec == bf16 ]] && want=$((want / 2))
      [[ "$got" == "$want" ]] || fail "$prec $args: pp_bytes $got, expected $want (cpu fp32 ${cpu_bytes[$i]})"
      bytes=", pp_bytes $got"
    fi
    grep -q "$transport transport" log_p.txt || [[ $transport == auto ]] \
      || fail "$prec $args: the log does not name the $transport transport"
    pass "$prec, $np ranks on $gpus GPU(s), $transport transport, $args: final loss" \
      "$(last_loss run_p/metrics.jsonl) (one process $(last_loss run_1$prec/metrics.jsonl)), $result$bytes"
    if [[ $transport == nccl ]]; then
      # training.cuda_graphs: every rank's step, its NCCL sends, receives and
      # sums included, captured and replayed: the same run bit for bit (with
      # D <= 2 a sum over replicas has one order whatever NCCL's algorithm).
      rm -rf ck_g run_g
      run_np "$np" "$BIN" train base.json "${common[@]}" "${dev[@]}" --checkpoint.dir=ck_g \
        --run.dir=run_g $args --training.cuda_graphs=true 2>log_g.txt \
        || { cat log_g.txt; fail "$prec $args: with CUDA graphs"; }
      grep -q "replayed (on every rank, with its NCCL operations)" log_g.txt \
        || { cat log_g.txt; fail "$prec $args: the log does not say the ranks' steps are graphs"; }
      diff <(strip_metrics run_p/metrics.jsonl) <(strip_metrics run_g/metrics.jsonl) \
        || fail "$prec $args: the run with CUDA graphs differs from the run without"
      [[ "$(pp_bytes run_g/metrics.jsonl)" == "$(pp_bytes run_p/metrics.jsonl)" ]] \
        || fail "$prec $args: pp_bytes with CUDA graphs differ"
      grep -q '"bubble"' run_g/metrics.jsonl && fail "$prec $args: a bubble reported for graphed steps"
      pass "$prec $args: every rank's step as a CUDA graph == eager, bit for bit"
    fi
  done
done
# With ranks sharing the GPU(s): a job of $1 ranks run with the flags after $3
# fails with a config error containing $2 ($3 names what is refused).
refused() {
  local np=$1 want=$2 what=$3
  shift 3
  run_np "$np" "$BIN" train base.json --training.device=cuda "$@" 2>log_n.txt \
    && fail "$what with $np ranks on $gpus GPU(s) was accepted"
  grep -qF "$want" log_n.txt || { cat log_n.txt; fail "$what: not the expected error"; }
  pass "$what with ranks sharing a GPU is refused with a config error"
}
if [[ $transport == auto ]] && ((gpus < 2)); then
  # They talk through MPI, whose transfers a CUDA graph cannot hold.
  refused 2 "training.cuda_graphs: true with 2 ranks captures their communication too, which needs the NCCL transport" \
    "training.cuda_graphs = true" --parallel.pipeline=2 --training.cuda_graphs=true
fi
if [[ $transport == auto ]] && ((gpus < 4)); then
  refused 4 'parallel.transport is "nccl", but ranks of this job share a GPU' \
    "parallel.transport = nccl" --parallel.pipeline=4 --parallel.transport=nccl
fi
echo "all pipeline_cuda checks passed"
