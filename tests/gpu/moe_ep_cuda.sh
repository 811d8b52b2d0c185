#!/usr/bin/env bash
# Mixture-of-experts layers and expert parallelism with training.device =
# "cuda" (written without a GPU: see docs/cuda.md's never-run list).
#
# The single-process CUDA run of a MoE model in fp32 against the CPU's (1e-4
# relative, as tests/gpu/pipeline_cuda.sh), then, against the single-process
# CUDA run of the same precision (fp32 1e-5, bf16 2e-2), data parallelism and
# expert parallelism: D2, D2 EP2, P2 x D2 EP2 with ZeRO-1 (2 and 4 ranks; a
# GPU per rank with ATTNRES_TEST_TRANSPORT=nccl, the rows' all-to-all then
# grouped ncclSend/ncclRecv; ranks sharing GPUs talk MPI, staging the rows
# through host memory).
# Usage: moe_ep_cuda.sh BIN SRC TEST_MPI MPIEXEC NPFLAG [launcher flags...]
export ATTNRES_TEST_DEVICE=cuda
source "$2/tests/mpi/lib.sh"
require_device

layouts=("--parallel.data=2 --training.grad_accum=2"
         "--parallel.data=2 --parallel.expert=2 --training.grad_accum=2"
         "--parallel.pipeline=2 --parallel.data=2 --parallel.expert=2 --training.grad_accum=2 --parallel.zero=1")
gpus=$(visible_gpus)
transport="${ATTNRES_TEST_TRANSPORT:-auto}"
if [[ $transport == nccl ]] && ((gpus < 4)); then
  echo "skipped: the NCCL transport needs a GPU per rank: these layouts need 4 GPUs, $gpus visible"
  exit 0
fi
moe=(--model.moe='{"experts": 4, "top_k": 2, "shared_experts": 1, "expert_d_ff": 24}' --optimizer.eps=1e-4)
make_corpus
write_mpi_config

"$BIN" train base.json "${moe[@]}" --training.device=cpu --checkpoint.dir=ck_cpu --run.dir=run_cpu \
  2>log_cpu.txt || { cat log_cpu.txt; fail "cpu: single process"; }
for prec in fp32 bf16; do
  tol=1e-5; [[ $prec == bf16 ]] && tol=2e-2
  dev=(--training.device=cuda --training.precision=$prec --parallel.transport=$transport)
  "$BIN" train base.json "${moe[@]}" "${dev[@]}" --checkpoint.dir=ck_1$prec --run.dir=run_1$prec \
    2>log_1.txt || { cat log_1.txt; fail "$prec: single process"; }
  if [[ $prec == fp32 ]]; then
    result=$(compare_losses run_cpu/metrics.jsonl run_1fp32/metrics.jsonl 1e-4) \
      || { echo "$result"; fail "fp32: the single-process cuda MoE run differs from the cpu run"; }
    pass "fp32 MoE, 1 process: cuda = cpu within 1e-4, $result"
  fi
  for args in "${layouts[@]}"; do
    rm -rf ck_p run_p
    # shellcheck disable=SC2086
    run_np "$(ranks_of "$args")" "$BIN" train base.json "${moe[@]}" "${dev[@]}" --checkpoint.dir=ck_p \
      --run.dir=run_p $args 2>log_p.txt || { cat log_p.txt; fail "$prec: mpirun $args"; }
    result=$(compare_losses run_1$prec/metrics.jsonl run_p/metrics.jsonl $tol) \
      || { echo "$result"; fail "$prec $args: losses differ from the single process"; }
    if [[ $prec == fp32 ]]; then
      "$BIN" inspect compare ck_1$prec/step_00000008 ck_p/step_00000008 --rtol 1e-5 >/dev/null \
        || fail "$prec $args: final checkpoint differs"
    fi
    pass "$prec MoE, $transport transport on $gpus GPU(s), $args: $result"
  done
done
echo "all moe_ep_cuda checks passed"
