#!/usr/bin/env bash
# scripts/gpu_check.sh without a GPU. --plan: the first loan's stages first
# (first, second, bench), their total with the machine's start printed, equal
# to their sum and at most 14 minutes, then a "Later loans" heading with race,
# 1b3 and profile; each stage's and step's expected minutes a number under 9,
# each stage with the minute it ends at and beginning with the binaries step;
# the first command's steps in the order of the issue (MoE and Muon, per
# expert, matmul, our attention, the model, graphs, the 1-rank NCCL test, Mix,
# cuDNN last); the CPU-side steps (the shards command the same as at the head
# of scripts/gpu_logits_compare.sh, the prebuild) and the carry list; docs/
# cuda.md's table the same; it builds nothing and runs no GPU tool. An
# unknown flag exits 2. Then the mechanics with fake binaries: the binaries
# step takes build-gpu/ as it is when its stamp is this tree's, unpacks a
# prebuilt archive of this tree's stamp, refuses one of another tree and then
# builds (a failing build stops the command: exit 1); --first runs each test
# family in its own process and log, in order, a failing one fails the
# stage, steps.txt and the $OUT archive are written; --only SPEC runs one spec.
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

# The first loan, then the later ones, each stage with its command, its
# minutes and the minute it ends at.
first_at=$(grep -n '^The first loan' plan.txt | cut -d: -f1)
later_at=$(grep -n '^Later loans' plan.txt | cut -d: -f1)
[[ -n $first_at && -n $later_at ]] && ((first_at < later_at)) || fail "no first-loan section before the later loans"
stages=$(awk '$1 == "stage" { print $2 }' plan.txt | tr '\n' ' ')
[[ "$stages" == "first second bench race 1b3 profile " ]] || fail "stages: '$stages'"
first_stages=$(awk -v a="$first_at" -v b="$later_at" 'NR > a && NR < b && $1 == "stage" { print $2 }' plan.txt | tr '\n' ' ')
[[ "$first_stages" == "first second bench " ]] || fail "the first loan's stages: '$first_stages'"
while read -r name min; do
  [[ $min =~ ^[0-9]+(\.[0-9]+)?$ ]] || fail "stage $name: estimate '$min' is not a number"
  awk -v m="$min" 'BEGIN { exit !(m > 0 && m < 9) }' || fail "stage $name: $min min is not under 9"
done < <(awk '$1 == "stage" { print $2, $3 }' plan.txt)
for s in first second bench race 1b3 profile; do
  grep -qE "^stage $s +[0-9.]+ min \(at +[0-9.]+\)  scripts/gpu_check.sh --$s$" plan.txt \
    || fail "stage $s without its minute and command scripts/gpu_check.sh --$s"
  # Its first step is the binaries step.
  awk -v s="$s" '$1 == "stage" { cur = $2; first = 1; next }
                 cur == s && $1 == "step" && first { first = 0; getline cmd; if (cmd !~ /^ +gpu_binaries$/) bad = 1 }
                 END { exit bad }' plan.txt || fail "stage $s does not start with the binaries step"
done
n=0
while read -r min; do
  [[ $min =~ ^[0-9]+(\.[0-9]+)?$ ]] || fail "a step's estimate '$min' is not a number"
  awk -v m="$min" 'BEGIN { exit !(m >= 0 && m < 9) }' || fail "a step's $min min is not under 9"
  n=$((n + 1))
done < <(awk '/^2\. On the GPU machine/ { g = 1 } /^3\. After/ { g = 0 } g && $1 == "step" { print $2 }' plan.txt)
((n >= 30)) || fail "only $n steps listed"
pass "the first loan (${first_stages% }) before the later loans; each stage under 9 minutes, from the binaries step; $n steps"

# The first loan's total: printed, its stages' sum plus the machine's start,
# at most 14 minutes; each "(at N)" the running sum.
total_line=$(grep -E '^first loan: [0-9.]+ min in 3 stages \+ [0-9.]+ min machine start = [0-9.]+ min against 14 \(of the 15-minute budget\)' plan.txt) \
  || fail "no first-loan total line"
awk -v a="$first_at" -v b="$later_at" -v line="$total_line" '
  NR > a && NR < b && $1 == "start" { st = $2; at = $2 }
  NR > a && NR < b && $1 == "stage" { s += $3; at += $3; got = $6; sub(/\)/, "", got)
                                      if ((at - got) ^ 2 > 0.001) { print "stage " $2 " at " got ", sum " at; bad = 1 } }
  END { split(line, w, " "); if ((s - w[3]) ^ 2 > 0.001 || (s + st - w[14]) ^ 2 > 0.001 || s + st > 14) bad = 1
        if (bad) print "sum " s " + start " st " vs: " line; exit bad }' plan.txt \
  || fail "the first loan's total is not its stages' sum with the start, or over 14 minutes"
pass "$total_line"

# The first command's steps in the issue's order, then the later stages'.
order=('scripts/gpu_deps.sh'
       'tokenize encode --tokenizer data/gpt2/encoder.json'
       'scripts/gpu_prebuild.sh'
       'test_gpu "[moe],[muon]"'
       'ATTNRES_MOE_GROUPED_GEMM=0 build-gpu/tests/test_gpu "[moe]"'
       'ATTNRES_GEMM_LOG=1 build-gpu/tests/test_gpu "[matmul]"'
       'test_gpu "[attention]~[cudnn]"'
       'test_gpu "[model]"'
       'test_gpu "[graphs]"'
       'mpirun -np 1 $MPIRUN_FLAGS build-gpu/tests/test_mpi "[nccl]" -s --use-colour no'
       'test_gpu "[mix]"'
       'CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr ATTNRES_CUDNN_LOG=1 build-gpu/tests/test_gpu "[cudnn]"'
       'mpirun -np 2 $MPIRUN_FLAGS build-gpu/tests/test_mpi "[nccl2]"'
       'tests/gpu/moe_ep_cuda.sh'
       'tests/gpu/cuda_graphs_train.sh'
       'ATTNRES_TEST_DEVICE=cuda bash tests/cli/resume.sh'
       'tests/gpu/pipeline_cuda.sh'
       'tests/gpu/zero_bf16.sh'
       'test_gpu "[cross_entropy],[swiglu],[store]"'
       'bench --device cuda --preset 124m --steps'
       'bench --device cuda --preset 350m --steps'
       '--recompute all'
       'scripts/bench_vs_train.sh --device cuda --preset 124m'
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
# Every GPU test family of the first stage runs in a run of its own, and the
# stages' runs together select every test once: the rest's spec excludes
# exactly the tags the other runs select.
rest=$(grep -oE 'test_gpu "~[^"]*"' plan.txt | head -1)
for tag in moe muon matmul attention model graphs mix cudnn cross_entropy swiglu store; do
  [[ $rest == *"~[$tag]"* ]] || fail "the rest's run does not leave out [$tag]: $rest"
done
pass "the ${#order[@]} key steps in the issue's order; the rest's run leaves out the other runs' tags"

# The shards command is the one at the head of gpu_logits_compare.sh.
want=$(sed -n '/^#   build\/attnres tokenize encode/,/--name brown/p' "$SRC/scripts/gpu_logits_compare.sh" \
       | sed 's/^#//; s/\\$//' | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
[[ -n $want ]] || fail "no tokenize command at the head of scripts/gpu_logits_compare.sh"
grep -qF -- "$want" plan.txt || fail "the plan's shards command differs from gpu_logits_compare.sh's: $want"
grep -qF 'carry [".deps", ".shards", ".gpu-prebuilt.tar.xz"]' plan.txt || fail "no carry list"
pass "CPU steps (shards command as in gpu_logits_compare.sh, the prebuild) and carry list"

# docs/cuda.md's table of the next session says what --plan says: each
# stage's command, expected minutes and the minute it ends at, in order.
plan_rows=$(sed -nE 's/^start +([0-9.]+) min \(at +([0-9.]+)\).*/start|\1|\2/p
                     s/^stage +[^ ]+ +([0-9.]+) min \(at +([0-9.]+)\)  (.*)$/\3|\1|\2/p' plan.txt)
doc_rows=$(awk -F'|' '/^### The next GPU session/ { p = 1; next } p && /^## / { p = 0 }
                      p && /^\| *[0-9]* *\| / && $5 ~ /[0-9]/ {
                        for (i = 2; i <= 6; i++) gsub(/^ +| +$|`/, "", $i)
                        print ($2 == "" ? "start" : $3) "|" $5 "|" $6 }' "$SRC/docs/cuda.md")
[[ "$plan_rows" == "$doc_rows" ]] || { diff <(echo "$plan_rows") <(echo "$doc_rows") || true; fail "docs/cuda.md's next-session table differs from --plan"; }
pass "docs/cuda.md's next-session table matches --plan ($(wc -l <<<"$doc_rows") rows)"

# Usage errors: exit 2 (the old stage flags included).
for args in "--bogus" "--tests" "--build" "--multi" "--only" "--report"; do
  rc=0
  PATH="$WORK/fakebin:$PATH" repo/scripts/gpu_check.sh $args > out.txt 2> err.txt || rc=$?
  [[ $rc -eq 2 ]] || { cat out.txt err.txt; fail "gpu_check.sh $args: exit $rc, expected 2"; }
  grep -q "usage:" err.txt || fail "gpu_check.sh $args: no usage message"
done
[[ ! -e called.txt ]] || { cat called.txt; fail "a usage error ran GPU or build tools"; }
pass "unknown flags and missing arguments exit 2 with the usage"

# ---- the mechanics, with fake binaries ----
if ! (cd repo && source scripts/gpu_lib.sh && use_deps) > /dev/null 2>&1; then
  echo "skipped: the stage mechanics (the CPU-side packages are not installed here)"
  exit 0
fi
# A tree to stamp, fake binaries (shell scripts: a fake ldd finds their
# libraries), and an mpirun that runs its program once.
mkdir -p repo/src repo/tools repo/tests
echo 'int main() {}' > repo/src/main.cpp
cp "$SRC/CMakeLists.txt" repo/
printf '#!/bin/sh\nexit 0\n' > fakebin/ldd
printf '#!/bin/sh\n[ "$1" = --version ] && { echo "mpirun (Open MPI) 4.1.4"; exit 0; }\nwhile [ $# -gt 0 ]; do case "$1" in -np) shift 2 ;; --*) shift ;; *) break ;; esac; done\nexec "$@"\n' \
  > fakebin/mpirun
printf '#!/bin/sh\necho "\tlibnvrtc.so.13 => /x/libnvrtc.so.13"\necho "\tlibcudnn_engines_runtime_compiled.so.9 => /x/libcudnn_engines_runtime_compiled.so.9"\n' \
  > fakebin/ldconfig
chmod +x fakebin/ldd fakebin/mpirun fakebin/ldconfig
bins=$WORK/bins
mkdir -p "$bins/tests"
cat > "$bins/tests/test_gpu" <<'SH'
#!/bin/sh
echo "GPU tests on a fake device"
echo "args: $*"
echo "ATTNRES_GEMM_LOG=${ATTNRES_GEMM_LOG:-}"
echo "ATTNRES_MOE_GROUPED_GEMM=${ATTNRES_MOE_GROUPED_GEMM:-}"
echo "CUDNN_LOGLEVEL_DBG=${CUDNN_LOGLEVEL_DBG:-}"
case "$1" in
  "[graphs]") echo "FAILED: (a fake failure)"; echo "test cases: 2 | 1 passed | 1 failed"; exit 1 ;;
  *) echo "All tests passed (3 assertions in 1 test case)" ;;
esac
SH
printf '#!/bin/sh\necho "test_mpi $*"\necho "All tests passed (2 assertions in 1 test case)"\n' > "$bins/tests/test_mpi"
printf '#!/bin/sh\necho "attnres $*"\n' > "$bins/attnres"
chmod +x "$bins/attnres" "$bins/tests/test_gpu" "$bins/tests/test_mpi"
stamp=$(cd repo && source scripts/gpu_lib.sh && tree_stamp)
[[ $stamp =~ ^[0-9a-f]{64}$ ]] || fail "tree_stamp: '$stamp'"
r=repo/build-gpu/report
run() { rc=0; OUT="$WORK/out" PATH="$WORK/fakebin:$PATH" repo/scripts/gpu_check.sh "$@" > out.txt 2>&1 || rc=$?; }
mkdir -p out

# A prebuilt archive of this tree: unpacked, then --only runs its spec.
echo "$stamp" > "$bins/stamp.txt"
tar cJf repo/.gpu-prebuilt.tar.xz -C "$bins" stamp.txt attnres tests/test_gpu tests/test_mpi
rm -f called.txt
run --only "[mix],[adamw]"
[[ $rc -eq 0 ]] || { cat out.txt; fail "--only with a prebuilt archive: exit $rc"; }
grep -q "binaries: prebuilt from this tree ($stamp), every library found" $r/binaries_first.log \
  || { cat $r/binaries_first.log; fail "the prebuilt archive was not taken"; }
grep -qxF 'args: [mix],[adamw] -w NoTests --durations yes' $r/gpu_tests.log || fail "--only: $(cat $r/gpu_tests.log)"
! grep -q "^cmake" called.txt 2>/dev/null || fail "the prebuilt binaries were rebuilt"
pass "the binaries step unpacks this tree's prebuilt archive; --only SPEC runs one spec (gpu_tests.log)"

# An archive of another tree: refused, then a build (which fails here:
# cmake is a fake) stops the command before any test.
rm -rf repo/build-gpu
echo "0000" > "$bins/stamp.txt"
tar cJf repo/.gpu-prebuilt.tar.xz -C "$bins" stamp.txt attnres tests/test_gpu tests/test_mpi
run --first
[[ $rc -eq 1 ]] || { cat out.txt; fail "--first with a stale archive and a failing build: exit $rc, expected 1"; }
grep -q "built from another tree (stamp 0000" $r/binaries_first.log || { cat $r/binaries_first.log; fail "stale archive not refused"; }
grep -q "^cmake -S . -B build-gpu" called.txt || fail "no build after the stale archive"
grep -q "no binaries built from this tree" out.txt || fail "no stop after the failed build"
[[ ! -e $r/gpu_tests_moe_muon.log ]] || fail "a test ran without this tree's binaries"
pass "an archive of another tree is refused and built over; a failed build stops the command (exit 1)"

# build-gpu/ of this tree's stamp: taken as it is; --first's runs in order.
rm -rf repo/build-gpu repo/.gpu-prebuilt.tar.xz called.txt
mkdir -p repo/build-gpu
cp -r "$bins/." repo/build-gpu/
echo "$stamp" > repo/build-gpu/stamp.txt
run --first
cat out.txt
[[ $rc -eq 1 ]] || fail "--first with a failing run: exit $rc, expected 1"
grep -q "binaries: built from this tree ($stamp), already here" $r/binaries_first.log || fail "build-gpu/ not taken"
grep -qxF 'args: [moe],[muon] -w NoTests --durations yes' $r/gpu_tests_moe_muon.log \
  && grep -qxF 'ATTNRES_MOE_GROUPED_GEMM=' $r/gpu_tests_moe_muon.log || fail "moe/muon run: $(cat $r/gpu_tests_moe_muon.log)"
grep -qxF 'args: [moe] -w NoTests --durations yes' $r/gpu_tests_moe_per_expert.log \
  && grep -qxF 'ATTNRES_MOE_GROUPED_GEMM=0' $r/gpu_tests_moe_per_expert.log || fail "per-expert run"
grep -qxF 'ATTNRES_GEMM_LOG=1' $r/gpu_tests_matmul.log || fail "matmul run without ATTNRES_GEMM_LOG"
grep -qxF 'ATTNRES_GEMM_LOG=' $r/gpu_tests_mix.log || fail "ATTNRES_GEMM_LOG leaked into the other runs"
grep -qxF 'test_mpi [nccl] -s --use-colour no' $r/nccl.log || fail "the NCCL run: $(cat $r/nccl.log)"
grep -qxF 'args: [cudnn] -w NoTests --durations yes' $r/gpu_tests_cudnn.log \
  && grep -qxF 'CUDNN_LOGLEVEL_DBG=2' $r/gpu_tests_cudnn.log || fail "the [cudnn] run: $(cat $r/gpu_tests_cudnn.log)"
grep -qxF 'CUDNN_LOGLEVEL_DBG=' $r/gpu_tests_mix.log || fail "cuDNN's logging leaked into the other runs"
got=$(awk '$1 == "first" { print $2, $3 }' $r/steps.txt | tr '\n' ';')
want="binaries_first.log ok;gpu_tests_moe_muon.log ok;gpu_tests_moe_per_expert.log ok;gpu_tests_matmul.log ok;"
want+="gpu_tests_attention.log ok;gpu_tests_kda.log ok;gpu_tests_model.log ok;gpu_tests_graphs.log FAILED;nccl.log ok;"
want+="gpu_tests_mix.log ok;gpu_tests_cudnn.log ok;"
[[ $got == "$want" ]] || { cat $r/steps.txt; fail "steps.txt: $got"; }
grep -q "steps.txt" <(tar tzf out/gpu_check_1_first.tgz) || fail "no steps.txt in \$OUT/gpu_check_1_first.tgz"
pass "--first: build-gpu/ of this tree taken; eleven runs in order, each its own log, a failure fails the stage (the rest still run), steps.txt, \$OUT archive"
