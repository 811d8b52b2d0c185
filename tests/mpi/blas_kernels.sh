#!/usr/bin/env bash
# Every mpirun rank chooses its BLAS kernels for itself, before MPI_Init
# (src/kernels/cpu/blas_cores.h): with OpenBLAS's own choice made to fall short
# (ATTNRES_BLAS_ASSUME_CORE=Prescott), each of 2 ranks re-runs itself with
# kernels of the CPU's class (a new program in the same process, before it
# joins the job), and a pipeline job of 2 ranks trains.
source "$(dirname "$0")/lib.sh"
isa=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$BIN_" inspect cpu | sed -n 's/^cpu instruction set: //p')
case $isa in
  unknown|SSE|"") echo "skipped: this CPU's instruction set ($isa) leaves nothing to choose"; exit 77 ;;
esac
make_corpus
write_mpi_config
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u ATTNRES_BLAS_CHOICE ATTNRES_BLAS_ASSUME_CORE=Prescott \
  "$MPIEXEC" "$NPFLAG" 2 "${MPI_FLAGS[@]}" -x ATTNRES_BLAS_ASSUME_CORE \
  "$BIN_" train base.json --parallel.pipeline=2 --training.steps=2 --checkpoint.every=0 \
  --eval.every=0 2> train.txt || { cat train.txt; fail "mpirun train"; }
n=$(grep -c "BLAS: .* kernels (chosen by attnres from the CPU's flags: OpenBLAS's own choice was Prescott" train.txt || true)
[[ $n -ge 1 ]] || { cat train.txt; fail "no rank logged the kernels attnres chose"; }
grep -q "kernels (OpenBLAS's own choice)" train.txt && { cat train.txt; fail "a rank kept Prescott"; }
[[ $(grep -c '"loss"' run/metrics.jsonl) -eq 2 ]] || fail "the job did not train 2 steps"
# Each rank for itself: two processes under mpirun, each says what it runs.
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u ATTNRES_BLAS_CHOICE ATTNRES_BLAS_ASSUME_CORE=Prescott \
  "$MPIEXEC" "$NPFLAG" 2 "${MPI_FLAGS[@]}" -x ATTNRES_BLAS_ASSUME_CORE "$BIN_" inspect cpu > ranks.txt \
  || fail "mpirun inspect cpu"
[[ $(grep -c "^blas: .*kernels (chosen by attnres" ranks.txt) -eq 2 ]] || { cat ranks.txt; fail "not both ranks chose"; }
pass "mpirun ranks re-ran with the chosen kernels ($n start-up lines) and trained"
