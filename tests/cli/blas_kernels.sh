#!/usr/bin/env bash
# OpenBLAS's kernels fit the CPU (src/kernels/cpu/blas_cores.h), end to end:
# - without OPENBLAS_CORETYPE, the kernels that run are of the CPU's own
#   instruction set (whoever chose them: OpenBLAS, or attnres when OpenBLAS's
#   own choice fell short);
# - when OpenBLAS's own choice falls short (made to, here, by
#   ATTNRES_BLAS_ASSUME_CORE=Prescott), attnres starts itself again with
#   kernels of the CPU's class and says why, in `inspect cpu` and in the
#   training log; the run trains;
# - a user's OPENBLAS_CORETYPE wins, and a class below the CPU's is warned of.
# The machine's own OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (some hosts set
# them) are unset together for the commands that test the choice.
source "$(dirname "$0")/lib.sh"
clean() { env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u ATTNRES_BLAS_CHOICE "$@"; }
field() { sed -n "s/^$1: //p" "$2"; }

clean "$BIN" inspect cpu > plain.txt || fail "inspect cpu"
cat plain.txt
cpu_isa=$(field "cpu instruction set" plain.txt)
[[ -n $cpu_isa ]] || fail "inspect cpu printed no instruction set"
if [[ $cpu_isa == unknown ]]; then
  echo "skipped: this CPU has no CPUID (not x86-64): nothing to choose"
  exit 77
fi
[[ $(field "blas kernels' instruction set" plain.txt) == "$cpu_isa" ]] \
  || fail "without OPENBLAS_CORETYPE the kernels are not of the CPU's class ($cpu_isa)"
grep -q '^warning:.*kernels' plain.txt && fail "a kernels warning without OPENBLAS_CORETYPE"
pass "without OPENBLAS_CORETYPE: $(field blas plain.txt | cut -d, -f2) on a $cpu_isa CPU"

if [[ $cpu_isa == SSE ]]; then
  echo "skipped: an SSE-only CPU: no faster kernels to choose"
  exit 77
fi
vendor=$(field cpu plain.txt | cut -d' ' -f1)
case $cpu_isa in
  AVX-512) want=SkylakeX ;;
  AVX2) [[ $vendor == AuthenticAMD || $vendor == HygonGenuine ]] && want=Zen || want=Haswell ;;
  AVX) want=Sandybridge ;;
esac

# OpenBLAS's own choice "falls short": attnres re-runs itself with $want.
clean ATTNRES_BLAS_ASSUME_CORE=Prescott "$BIN" inspect cpu > chosen.txt || fail "inspect cpu (re-run)"
blas=$(field blas chosen.txt)
grep -q "$want kernels (chosen by attnres from the CPU's flags: OpenBLAS's own choice was Prescott (SSE)" <<< "$blas" \
  || fail "the re-run does not run $want kernels, said why: $blas"
[[ $(field "blas kernels' instruction set" chosen.txt) == "$cpu_isa" ]] || fail "re-run kernels' class"
pass "a short choice (Prescott) is replaced: $want"

# The training log's start-up line says the same; the run trains and its loss
# is finite.
make_corpus
cat > tiny.json <<JSON
{"model": {"vocab_size": 300, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
           "d_ff": 64, "residual": {"mode": "block", "block_size": 2}},
 "training": {"steps": 2, "micro_batch_size": 2, "seq_len": 16, "grad_accum": 1, "seed": 3},
 "data": {"train": "shards/tiny_train_*.bin", "tokenizer": "tok.json"},
 "checkpoint": {"dir": "ckpt", "every": 0}, "eval": {"every": 0},
 "run": {"dir": "run", "log_every": 1}}
JSON
clean ATTNRES_BLAS_ASSUME_CORE=Prescott "$BIN" train tiny.json 2> train.txt \
  || { cat train.txt; fail "training after the re-run"; }
grep -q "BLAS: OpenBLAS.* $want kernels (chosen by attnres" train.txt \
  || { cat train.txt; fail "the training log does not say attnres chose $want"; }
[[ $(grep -c '"loss"' run/metrics.jsonl) -eq 2 ]] || fail "the re-run training did not log 2 steps"
pass "train logs the choice and trains"

# The user's variable wins (no re-run), and a class below the CPU's is warned of.
env -u OPENBLAS_L2_SIZE -u ATTNRES_BLAS_CHOICE OPENBLAS_CORETYPE=Prescott \
  ATTNRES_BLAS_ASSUME_CORE=Prescott "$BIN" inspect cpu > user.txt || fail "inspect cpu (user's)"
grep -q '^blas: .*Prescott kernels (OPENBLAS_CORETYPE=Prescott)' user.txt \
  || { cat user.txt; fail "the user's OPENBLAS_CORETYPE=Prescott did not win"; }
grep -q "^warning: OpenBLAS runs Prescott (SSE) kernels on .*GEMMs run slower" user.txt \
  || { cat user.txt; fail "no warning for kernels below the CPU's class"; }
pass "the user's OPENBLAS_CORETYPE wins, with a warning"

# The benchmark warns too, in its header.
env -u OPENBLAS_L2_SIZE -u ATTNRES_BLAS_CHOICE OPENBLAS_CORETYPE=Prescott "$BIN" bench --steps 1 \
  --warmup 0 --d-model 32 --layers 2 --heads 4 --kv-heads 2 --d-ff 64 --vocab 97 --seq-len 16 \
  --batch 2 --mode baseline > bench.txt 2>&1 || { cat bench.txt; fail "bench"; }
grep -q "^warning: OpenBLAS runs Prescott (SSE) kernels" bench.txt \
  || { cat bench.txt; fail "bench does not warn of Prescott kernels"; }
pass "bench warns of kernels below the CPU's class"
