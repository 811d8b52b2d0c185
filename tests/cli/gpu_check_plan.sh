#!/usr/bin/env bash
# scripts/gpu_check.sh without a GPU. --plan: every stage of the next GPU
# session in the order the plan asks for (build; the cross-entropy / SwiGLU /
# Store GPU tests, the model tests, the rest; resume on cuda, the engine's
# 124M tokens/s, recompute; the 1-rank NCCL test, the multi-rank scripts; the
# 124M / 350M benchmarks and the logits comparison; 1b3; profiles), each
# stage's and step's expected minutes a number under 9, the total printed
# and equal to the stages' sum, the CPU-side steps (the shards command the
# same as at the head of scripts/gpu_logits_compare.sh) and the carry list;
# it builds nothing and runs no GPU tool. An unknown flag exits 2. Then the
# stages' mechanics with a fake build-gpu/: a stage whose binary is missing
# stops at once (exit 2, "--build first"); --tests runs test_gpu three times
# with its own log each, in order, a failing run fails the stage, steps.txt
# and the $OUT archive are written; --only SPEC runs one spec.
# Usage: gpu_check_plan.sh BIN SRC (BIN unused)
source "$(dirname "$0")/lib.sh"

# A copy of the scripts, and tools that must not be called by --plan.
mkdir -p repo fakebin
cp -r "$SRC/scripts" repo/
for t in nvidia-smi cmake nvcc mpirun ncu; do
  printf '#!/bin/sh\necho "%s $*" >> "%s/called.txt"\nexit 1\n' "$t" "$WORK" > fakebin/$t
  chmod +x fakebin/$t
done
rc=0
PATH="$WORK/fakebin:$PATH" repo/scripts/gpu_check.sh --plan > plan.txt 2> plan_err.txt || rc=$?
cat plan.txt
[[ $rc -eq 0 ]] || { cat plan_err.txt; fail "--plan exited $rc"; }
[[ ! -e called.txt ]] || { cat called.txt; fail "--plan ran GPU or build tools"; }
[[ ! -e repo/build-gpu ]] || fail "--plan made build-gpu/"
pass "--plan prints $(wc -l < plan.txt) lines without a GPU, building nothing"

# The stages, in order, each under 9 minutes, with their commands.
stages=$(awk '$1 == "stage" { print $2 }' plan.txt | tr '\n' ' ')
[[ "$stages" == "build tests engine multi bench race 1b3 profile " ]] || fail "stages: '$stages'"
while read -r name min; do
  [[ $min =~ ^[0-9]+(\.[0-9]+)?$ ]] || fail "stage $name: estimate '$min' is not a number"
  awk -v m="$min" 'BEGIN { exit !(m > 0 && m < 9) }' || fail "stage $name: $min min is not under 9"
done < <(awk '$1 == "stage" { print $2, $3 }' plan.txt)
for s in build tests engine multi bench race 1b3; do
  grep -qE "^stage $s +[0-9.]+ min \(at +[0-9.]+\)  scripts/gpu_check.sh --$s( |$)" plan.txt \
    || fail "stage $s without its command scripts/gpu_check.sh --$s"
done
grep -qE "^stage profile .*scripts/gpu_profile.sh --preset 124m" plan.txt || fail "profile stage command"
n=0
while read -r min; do
  [[ $min =~ ^[0-9]+(\.[0-9]+)?$ ]] || fail "a step's estimate '$min' is not a number"
  awk -v m="$min" 'BEGIN { exit !(m >= 0 && m < 9) }' || fail "a step's $min min is not under 9"
  n=$((n + 1))
done < <(awk '$1 == "step" { print $2 }' plan.txt)
((n >= 20)) || fail "only $n steps listed"
pass "stages in order (${stages% }), each under 9 minutes; $n steps, each under 9 minutes"

# The steps in the order of the issue.
order=('scripts/gpu_deps.sh'
       'tokenize encode --tokenizer data/gpt2/encoder.json'
       'cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90'
       'CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr build-gpu/tests/test_gpu "[cudnn]"'
       'test_gpu "[cross_entropy],[swiglu],[store]"'
       'test_gpu "[model]~[recompute]"'
       'test_gpu "~[cross_entropy]~[swiglu]~[store]~[model]~[cudnn]"'
       'ATTNRES_TEST_DEVICE=cuda bash tests/cli/resume.sh'
       'scripts/bench_vs_train.sh --device cuda --preset 124m --steps 30 --rounds 1 --bin build-gpu/attnres --data .shards/brown_gpt2'
       'test_gpu "[recompute]"'
       'mpirun -np 1 $MPIRUN_FLAGS build-gpu/tests/test_mpi "[nccl]" -s --use-colour no'
       'tests/gpu/pipeline_cuda.sh'
       'tests/gpu/zero_bf16.sh'
       'bench --device cuda --preset 124m --steps'
       'bench --device cuda --preset 350m --steps'
       '--recompute all'
       'scripts/gpu_logits_compare.sh'
       'scripts/race_torch.py configs/gpu_124m.json --device cuda --compile'
       'scripts/race_torch.py configs/gpu_350m.json --device cuda --compile'
       'bench --device cuda --preset 1b3 --steps'
       'scripts/gpu_profile.sh --preset 124m'
       'scripts/gpu_report.py')
last=0
for o in "${order[@]}"; do
  line=$(grep -nF -- "$o" plan.txt | head -1 | cut -d: -f1 || true)
  [[ -n $line ]] || fail "the plan lacks: $o"
  ((line > last)) || fail "out of order: $o (line $line, after line $last)"
  last=$line
done
grep -q 'NCCL_DEBUG=WARN ATTNRES_COMM_TIMEOUT_S=60' plan.txt || fail "multi-rank steps without NCCL_DEBUG / comm timeout"
pass "the ${#order[@]} key steps in the issue's order"

# The shards command is the one at the head of gpu_logits_compare.sh.
want=$(sed -n '/^#   build\/attnres tokenize encode/,/--name brown/p' "$SRC/scripts/gpu_logits_compare.sh" \
       | sed 's/^#//; s/\\$//' | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
[[ -n $want ]] || fail "no tokenize command at the head of scripts/gpu_logits_compare.sh"
grep -qF -- "$want" plan.txt || fail "the plan's shards command differs from gpu_logits_compare.sh's: $want"
grep -qF 'carry [".deps", ".shards"]' plan.txt || fail "no carry list"
pass "CPU steps (shards command as in gpu_logits_compare.sh) and carry list"

# The total: printed, the stages' sum plus the machine's start, against 15 minutes.
total_line=$(grep -E '^total: [0-9.]+ min in 8 stages \+ [0-9.]+ min machine start = [0-9.]+ min against the 15-minute budget' plan.txt) \
  || fail "no total line"
awk -v line="$total_line" '$1 == "stage" { s += $3 } $1 == "start" { st = $2 }
  END { split(line, w, " "); d = s - w[2]; e = s + st - w[13]
        if (d * d > 0.001 || e * e > 0.001) { print "sum " s " + " st " vs " line; exit 1 } }' plan.txt \
  || fail "the total is not the stages' sum"
pass "$total_line"

# docs/cuda.md's table of the next session says what --plan says: each
# stage's command, expected minutes and the minute it ends at, in order.
plan_rows=$(sed -nE 's/ +\[past the [0-9]+-minute budget\]$//
                     s/^start +([0-9.]+) min \(at +([0-9.]+)\).*/start|\1|\2/p
                     s/^stage +[^ ]+ +([0-9.]+) min \(at +([0-9.]+)\)  (.*)$/\3|\1|\2/p' plan.txt)
doc_rows=$(awk -F'|' '/^### The next GPU session/ { p = 1; next } p && /^## / { p = 0 }
                      p && /^\| *[0-9]* *\| / && $5 ~ /[0-9]/ {
                        for (i = 2; i <= 6; i++) gsub(/^ +| +$|`/, "", $i)
                        print ($2 == "" ? "start" : $3) "|" $5 "|" $6 }' "$SRC/docs/cuda.md")
[[ "$plan_rows" == "$doc_rows" ]] || { diff <(echo "$plan_rows") <(echo "$doc_rows") || true; fail "docs/cuda.md's next-session table differs from --plan"; }
pass "docs/cuda.md's next-session table matches --plan ($(wc -l <<<"$doc_rows") rows)"

# Usage errors: exit 2.
for args in "--bogus" "--quick" "--tests [mix]" "--only" "--report"; do
  rc=0
  PATH="$WORK/fakebin:$PATH" repo/scripts/gpu_check.sh $args > out.txt 2> err.txt || rc=$?
  [[ $rc -eq 2 ]] || { cat out.txt err.txt; fail "gpu_check.sh $args: exit $rc, expected 2"; }
  grep -q "usage:" err.txt || fail "gpu_check.sh $args: no usage message"
done
[[ ! -e called.txt ]] || { cat called.txt; fail "a usage error ran GPU or build tools"; }
pass "unknown flags and missing arguments exit 2 with the usage"

# ---- the stages' mechanics, with a fake build-gpu/ ----
if ! (cd repo && source scripts/gpu_lib.sh && use_deps) > /dev/null 2>&1; then
  echo "skipped: the stage mechanics (the CPU-side packages are not installed here)"
  exit 0
fi
rc=0
PATH="$WORK/fakebin:$PATH" repo/scripts/gpu_check.sh --tests > out.txt 2>&1 || rc=$?
[[ $rc -eq 2 ]] || { cat out.txt; fail "--tests without build-gpu: exit $rc, expected 2"; }
grep -q "build-gpu/tests/test_gpu missing: run scripts/gpu_check.sh --build first" out.txt \
  || { cat out.txt; fail "--tests without build-gpu: no '--build first' message"; }
[[ ! -e called.txt ]] || { cat called.txt; fail "--tests without build-gpu ran cmake"; }
pass "a stage without its binary stops at once: $(grep -m1 error: out.txt)"

mkdir -p repo/build-gpu/tests out
cat > repo/build-gpu/tests/test_gpu <<'SH'
#!/bin/sh
echo "GPU tests on a fake device"
echo "args: $*"
echo "ATTNRES_GEMM_LOG=${ATTNRES_GEMM_LOG:-}"
echo "CUDNN_LOGLEVEL_DBG=${CUDNN_LOGLEVEL_DBG:-}"
case "$1" in
  "[model]~[recompute]") echo "FAILED: (a fake failure)"; echo "test cases: 2 | 1 passed | 1 failed"; exit 1 ;;
  *) echo "All tests passed (3 assertions in 1 test case)" ;;
esac
SH
chmod +x repo/build-gpu/tests/test_gpu
# The loader knows cuDNN's runtime-compiled engines and NVRTC (the check
# before the [cudnn] cases reads ldconfig -p).
printf '#!/bin/sh\necho "\tlibnvrtc.so.13 => /x/libnvrtc.so.13"\necho "\tlibcudnn_engines_runtime_compiled.so.9 => /x/libcudnn_engines_runtime_compiled.so.9"\n' \
  > fakebin/ldconfig
chmod +x fakebin/ldconfig
rc=0
OUT="$WORK/out" PATH="$WORK/fakebin:$PATH" repo/scripts/gpu_check.sh --tests > out.txt 2>&1 || rc=$?
cat out.txt
[[ $rc -eq 1 ]] || fail "--tests with a failing run: exit $rc, expected 1"
r=repo/build-gpu/report
grep -qxF 'args: [matmul] -w NoTests --durations yes' $r/gpu_tests_matmul.log \
  && grep -qxF 'ATTNRES_GEMM_LOG=1' $r/gpu_tests_matmul.log || fail "first run: $(cat $r/gpu_tests_matmul.log)"
grep -qxF 'ATTNRES_GEMM_LOG=' $r/gpu_tests_rest.log || fail "ATTNRES_GEMM_LOG leaked into the other runs"
grep -qxF 'args: [cross_entropy],[swiglu],[store] -w NoTests --durations yes' $r/gpu_tests_ce_swiglu_store.log \
  || fail "second run: $(cat $r/gpu_tests_ce_swiglu_store.log)"
grep -qxF 'args: [model]~[recompute] -w NoTests --durations yes' $r/gpu_tests_model.log || fail "third run"
grep -qxF 'args: ~[cross_entropy]~[swiglu]~[store]~[model]~[cudnn] -w NoTests --durations yes' $r/gpu_tests_rest.log \
  || fail "fifth run"
grep -qxF 'args: [cudnn] -w NoTests --durations yes' $r/gpu_tests_cudnn.log \
  && grep -qxF 'CUDNN_LOGLEVEL_DBG=2' $r/gpu_tests_cudnn.log || fail "the [cudnn] run: $(cat $r/gpu_tests_cudnn.log)"
grep -qxF 'CUDNN_LOGLEVEL_DBG=' $r/gpu_tests_rest.log || fail "cuDNN's logging leaked into the other runs"
[[ $(awk '$1 == "tests" { print $2, $3 }' $r/steps.txt | tr '\n' ';') == \
   "gpu_tests_cudnn.log ok;gpu_tests_matmul.log ok;gpu_tests_ce_swiglu_store.log ok;gpu_tests_model.log FAILED;gpu_tests_rest.log ok;" ]] \
  || { cat $r/steps.txt; fail "steps.txt"; }
grep -q "steps.txt" <(tar tzf out/gpu_check_2_tests.tgz) || fail "no steps.txt in \$OUT/gpu_check_2_tests.tgz"
pass "--tests: five runs in order ([cudnn] first, with cuDNN's log), each its own log, a failure fails the stage, steps.txt, \$OUT archive"

rc=0
PATH="$WORK/fakebin:$PATH" repo/scripts/gpu_check.sh --only "[mix],[adamw]" > out.txt 2>&1 || rc=$?
[[ $rc -eq 0 ]] || { cat out.txt; fail "--only: exit $rc"; }
grep -qxF 'args: [mix],[adamw] -w NoTests --durations yes' $r/gpu_tests.log || fail "--only: $(cat $r/gpu_tests.log)"
pass "--only SPEC: one run of test_gpu with SPEC (gpu_tests.log)"
