#!/usr/bin/env bash
# Planted faults: does the test suite catch small, realistic bugs?
#
#   scripts/mutants.sh [--rev REV] [--only NAMES] [--full] [--keep DIR] [--list]
#                      [--jobs N] [--timeout SEC] [--suite-passed]
#
# Copies the repository at REV (default HEAD) out with `git archive` into a folder under /tmp
# (the working tree is only read), configures a CPU build there (Release, -DATTNRES_CUDA=OFF:
# no nvcc, the faults are in CPU code), builds it once and runs the faults' CTest tests on the
# unchanged build (a test that fails there is left out, and named). Then, for each fault of
# scripts/mutants.txt: plants it (one exact text replacement in one file), rebuilds
# incrementally, runs its tests and restores the file. A fault is caught when one of its tests
# fails, crashes or times out, and survives when they all pass. For a survivor the same tests
# also run outside CTest (the record's `catch:` Catch2 spec), which tells a case that CTest
# does not run from a missing test. At the end: a table (also in .mutants/report.md) and the
# score.
#
#   --rev REV     the commit to check (default HEAD; uncommitted changes are not included)
#   --only NAMES  only these faults (comma-separated names; --list shows them)
#   --full        run the whole CTest suite for every fault instead of its own tests
#   --keep DIR    build in DIR and keep it: a later run with the same DIR brings it to REV and
#                 rebuilds incrementally (default: a new folder under /tmp, removed at the end)
#   --list        print the faults and exit (no copy, no build)
#   --jobs N      build and CTest parallelism (default 2)
#   --timeout S   CTest's time limit per test, in seconds (default 900; the longest
#                 tests take 1 to 3 min on 2 busy cores)
#   --suite-passed  the whole suite has just passed on a CPU-only build of REV (CI runs
#                 this right after it): the faults' tests are not run again on the
#                 unchanged build, and none is left out
#
# Exit status: 0 every fault caught, 1 some survived, 2 an error (bad arguments, an anchor not
# found exactly once, a fault that does not build or has no test left to run).
# CI runs it after the test suite (.ci/run, with --suite-passed; its figures are in
# docs/testing.md). A fault whose anchor a change removed is an error: update
# scripts/mutants.txt with the code.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TABLE="$REPO/scripts/mutants.txt"
REV=HEAD ONLY="" FULL=0 KEEP="" LIST=0 JOBS=2 TIMEOUT=900 SUITE_PASSED=0

die() { echo "mutants.sh: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --rev) REV=${2:?--rev needs a commit}; shift 2 ;;
    --only) ONLY=${2:?--only needs fault names}; shift 2 ;;
    --full) FULL=1; shift ;;
    --keep) KEEP=${2:?--keep needs a directory}; shift 2 ;;
    --list) LIST=1; shift ;;
    --jobs) JOBS=${2:?--jobs needs a number}; shift 2 ;;
    --timeout) TIMEOUT=${2:?--timeout needs seconds}; shift 2 ;;
    --suite-passed) SUITE_PASSED=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || die "--jobs takes a positive integer, got '$JOBS'"
[[ "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || die "--timeout takes seconds, got '$TIMEOUT'"

# ---------------------------------------------------------------------------
# The table: [name] then key: value lines (see the head of scripts/mutants.txt).
# ---------------------------------------------------------------------------
NAMES=()
declare -A FILE WHAT TESTS CATCH ANCHOR REPLACE
name=""
lineno=0
while IFS= read -r line || [[ -n "$line" ]]; do
  lineno=$((lineno + 1))
  [[ "$line" =~ ^# || -z "${line//[[:space:]]/}" ]] && continue
  if [[ "$line" =~ ^\[([a-z0-9-]+)\]$ ]]; then
    name=${BASH_REMATCH[1]}
    [[ -z "${FILE[$name]+x}" ]] || die "$TABLE:$lineno: fault '$name' defined twice"
    NAMES+=("$name")
    FILE[$name]="" WHAT[$name]="" TESTS[$name]="" CATCH[$name]="" ANCHOR[$name]="" REPLACE[$name]=""
    continue
  fi
  [[ "$line" =~ ^(file|what|tests|catch|anchor|replace):\ (.*)$ && -n "$name" ]] \
    || die "$TABLE:$lineno: expected '[name]' or 'key: value', got: $line"
  case "${BASH_REMATCH[1]}" in
    file) FILE[$name]=${BASH_REMATCH[2]} ;;
    what) WHAT[$name]=${BASH_REMATCH[2]} ;;
    tests) TESTS[$name]=${BASH_REMATCH[2]} ;;
    catch) CATCH[$name]=${BASH_REMATCH[2]} ;;
    # A repeated anchor/replace pair is an alternative (the code changed between revisions).
    anchor) ANCHOR[$name]+=${ANCHOR[$name]:+$'\x1f'}${BASH_REMATCH[2]} ;;
    replace) REPLACE[$name]+=${REPLACE[$name]:+$'\x1f'}${BASH_REMATCH[2]} ;;
  esac
done < "$TABLE"
for n in "${NAMES[@]}"; do
  for field in FILE WHAT TESTS ANCHOR REPLACE; do
    declare -n col=$field
    [[ -n "${col[$n]}" ]] || die "$TABLE: fault '$n' has no ${field,,}:"
    unset -n col
  done
  a=${ANCHOR[$n]//[^$'\x1f']/} r=${REPLACE[$n]//[^$'\x1f']/}
  [[ ${#a} -eq ${#r} ]] || die "$TABLE: fault '$n' has $((${#a} + 1)) anchor: but $((${#r} + 1)) replace: lines"
done

SELECTED=("${NAMES[@]}")
if [[ -n "$ONLY" ]]; then
  SELECTED=()
  IFS=',' read -ra wanted <<< "$ONLY"
  for n in "${wanted[@]}"; do
    [[ -n "${FILE[$n]+x}" ]] || die "--only: no fault named '$n' (--list shows them)"
    SELECTED+=("$n")
  done
fi

if [[ $LIST -eq 1 ]]; then
  for n in "${SELECTED[@]}"; do
    printf '%-30s %-32s %s\n' "$n" "${FILE[$n]}" "${WHAT[$n]}"
    printf '%-30s %-32s tests: %s\n' "" "" "${TESTS[$n]}"
  done
  echo "${#SELECTED[@]} faults ($TABLE)"
  exit 0
fi

# ---------------------------------------------------------------------------
# The copy: REV's files, never the working tree of $REPO.
# ---------------------------------------------------------------------------
command -v python3 > /dev/null || die "python3 is needed (it plants the faults)"
COMMIT=$(git -C "$REPO" rev-parse --verify --quiet "$REV^{commit}") || die "no commit '$REV' in $REPO"

if [[ -n "$KEEP" ]]; then
  mkdir -p "$KEEP"
  WORK=$(cd "$KEEP" && pwd)
  case "$WORK/" in "$REPO/"*) die "--keep $KEEP is inside the repository; use a folder outside it" ;; esac
  if [[ ! -f "$WORK/.mutants/files" && -n "$(ls -A "$WORK")" ]]; then
    die "--keep $KEEP is neither empty nor a folder of an earlier run (no .mutants/files)"
  fi
else
  WORK=$(mktemp -d /tmp/attnres-mutants.XXXXXX)
fi
BUILD="$WORK/build"
STATE="$WORK/.mutants"
LOGS="$STATE/logs"
mkdir -p "$STATE" "$LOGS"
# Relative paths in ccache's hashes: a fresh folder reuses an earlier one's objects.
export CCACHE_BASEDIR="$WORK"

PLANTED=""  # the file holding a fault right now (restored on any exit)
restore() {
  if [[ -n "$PLANTED" ]]; then
    cp "$STATE/original" "$WORK/$PLANTED"
    PLANTED=""
  fi
}
cleanup() {
  restore
  [[ -n "$KEEP" ]] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Brings $WORK to COMMIT: files that differ are replaced (their mtimes then
# drive the incremental build), files REV does not have are removed.
sync_tree() {
  local stage="$STATE/stage" f
  rm -rf "$stage"
  mkdir -p "$stage"
  git -C "$REPO" archive "$COMMIT" | tar -x -C "$stage"
  git -C "$REPO" ls-tree -r --name-only "$COMMIT" | sort > "$STATE/files.new"
  while IFS= read -r f; do
    if [[ -f "$stage/$f" ]] && ! cmp -s "$stage/$f" "$WORK/$f"; then
      mkdir -p "$(dirname "$WORK/$f")"
      cp "$stage/$f" "$WORK/$f"  # a new mtime: make rebuilds what depends on it
    fi
  done < "$STATE/files.new"
  if [[ -f "$STATE/files" ]]; then
    comm -23 "$STATE/files" "$STATE/files.new" | while IFS= read -r f; do rm -f "$WORK/$f"; done
  fi
  mv "$STATE/files.new" "$STATE/files"
  rm -rf "$stage"
}

secs() { echo $(($(date +%s) - $1)); }
T_ALL=$(date +%s)
echo "== copy of $REV ($COMMIT) in $WORK"
sync_tree
echo "$COMMIT" > "$STATE/rev"
# The fetched inputs (data/: GPT-2's vocabulary, Brown, tiktoken; git-ignored,
# so not in the archive) are the repository's own: tests that need them would
# otherwise skip, and a skipped test catches nothing.
[[ -d "$REPO/data" && ! -e "$WORK/data" ]] && ln -s "$REPO/data" "$WORK/data"

echo "== configure and build (Release, CUDA off; log: $STATE/build.log)"
t0=$(date +%s)
{
  cmake -S "$WORK" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DATTNRES_CUDA=OFF &&
    cmake --build "$BUILD" -j "$JOBS"
} > "$STATE/build.log" 2>&1 || { tail -n 30 "$STATE/build.log" >&2; die "the unchanged tree does not build"; }
echo "   built in $(secs "$t0") s"

# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------
# The CTest regex of a fault ("" = every test).
regex_of() { [[ $FULL -eq 1 ]] && echo "" || echo "${TESTS[$1]}"; }

# Every test, "number<TAB>name", listed once: a fault changes no test's name,
# and `ctest -N` three times per fault cost a minute of CI.
ctest --test-dir "$BUILD" -N | sed -nE 's/^ *Test +#([0-9]+): (.*)$/\1\t\2/p' > "$STATE/tests.txt"
# The tests whose names match a regex ("" = every test), as listed above.
# (ENVIRON, not awk -v: -v would take the regex's backslashes as escapes.)
tests_matching() { RE="$1" awk -F'\t' 'ENVIRON["RE"] == "" || $2 ~ ENVIRON["RE"]' "$STATE/tests.txt"; }

# The build targets that the tests matching a regex run: test_<layer> for a
# layer's Catch2 cases, the attnres binary for the CLI scripts, test_mpi and
# attnres under mpirun; everything for anything else.
targets_of() {
  local regex=$1 names prefix out=()
  [[ -n "$regex" ]] || { echo all; return; }
  names=$(tests_matching "$regex" | cut -f2)
  while IFS= read -r prefix; do
    case "$prefix" in
      core|kernels|model|data|parallel|train) out+=("test_$prefix") ;;
      cli) out+=(attnres) ;;
      mpi) out+=(test_mpi attnres) ;;
      *) echo all; return ;;
    esac
  done < <(echo "$names" | sed -nE 's/^([a-z-]+)[:/].*/\1/p' | sort -u)
  printf '%s\n' "${out[@]}" | sort -u | tr '\n' ' '
}

# Tests are selected by number (-I 0,0,0,n1,n2,...): a union of the faults'
# regexes would need more groups than CMake's regular expressions allow, and
# tests that fail on the unchanged build are left out by number.
BROKEN=""  # numbers of the tests that fail without any fault, one a line
numbers_of() {  # regex ("" = every test) -> the numbers of the tests it matches, one a line
  tests_matching "$1" | cut -f1 | { grep -vxF -f <(echo "${BROKEN:-none}") || true; }
}
SEL=()  # CTest's arguments selecting the numbers on stdin (sorted, once each)
select_numbers() { SEL=(-I "0,0,0,$(sort -nu | paste -sd, -)"); }

# Runs CTest with the further arguments; sets FAILED to the failing tests, one
# a line, with CTest's reason (Failed, Timeout, SEGFAULT, ...), and
# FAILED_NUMBERS to their numbers. Returns 0 when all passed.
FAILED="" FAILED_NUMBERS=""
run_ctest() {
  local log=$1 args=(--test-dir "$BUILD" --timeout "$TIMEOUT" -j "$JOBS" --output-on-failure
                     --no-tests=error "${@:2}") list
  FAILED="" FAILED_NUMBERS=""
  ctest "${args[@]}" > "$log" 2>&1 && return 0
  list=$(sed -n '/The following tests FAILED:/,$p' "$log" | sed -nE 's/^[[:space:]]+([0-9]+ - .*)/\1/p')
  FAILED=$(sed -E 's/^[0-9]+ - //' <<< "$list")
  FAILED_NUMBERS=$(sed -nE 's/^([0-9]+) - .*/\1/p' <<< "$list")
  [[ -n "$FAILED" ]] || FAILED="(ctest: $(grep -m1 -iE 'no tests were found|error' "$log" || echo "exit status non-zero"))"
  return 1
}

# For a survivor: the record's Catch2 spec run directly (not through CTest's
# discovery). Prints the failing cases, or "none".
run_catch() {
  local n=$1 log=$2 bin spec
  [[ -n "${CATCH[$n]}" ]] || { echo "no Catch2 spec"; return; }
  bin=${CATCH[$n]%% *}
  spec=${CATCH[$n]#* }
  [[ "$spec" != "${CATCH[$n]}" ]] || spec=""
  cmake --build "$BUILD" -j "$JOBS" --target "$bin" >> "$log" 2>&1 || { echo "build of $bin failed"; return; }
  (cd "$BUILD/tests" && OMP_NUM_THREADS=2 timeout "$TIMEOUT" "./$bin" ${spec:+"$spec"} -r junit > "$log.junit.xml" 2>> "$log") || true
  python3 - "$log.junit.xml" "$bin" <<'PYEOF'
import sys, xml.etree.ElementTree as ET
path, binary = sys.argv[1:3]
try:
    root = ET.parse(path).getroot()
except Exception as e:
    print(f"{binary} crashed or wrote no report ({type(e).__name__})")
    sys.exit()
cases = [c for c in root.iter("testcase")
         if c.find("failure") is not None or c.find("error") is not None]
names = []
for c in cases:
    name = c.get("name")
    if name not in names:
        names.append(name)
print("; ".join(f"{binary}: {n}" for n in names) if names else "none")
PYEOF
}

# ---- the faults' tests on the unchanged build ----
numbers=""
for n in "${SELECTED[@]}"; do
  found=$(numbers_of "$(regex_of "$n")")
  # None at all: REV has no such test yet (reported as a survivor below).
  [[ -z "$found" ]] || numbers+="$found"$'\n'
done
[[ -n "${numbers//[[:space:]]/}" ]] || die "no CTest test matches the tests: of any fault (at $REV)"
select_numbers <<< "$numbers"
NOTE=""
if [[ $SUITE_PASSED -eq 1 ]]; then
  echo "== the tests of ${#SELECTED[@]} faults on the unchanged build: not run again (--suite-passed)"
else
  echo "== the tests of ${#SELECTED[@]} faults on the unchanged build"
  t0=$(date +%s)
  if ! run_ctest "$LOGS/clean.log" "${SEL[@]}"; then
    # A test failing without any fault cannot tell a fault: leave it out.
    BROKEN=$FAILED_NUMBERS
    NOTE="left out, failing without any fault: $(paste -sd';' - <<< "$FAILED")"
    echo "   $NOTE (log: $LOGS/clean.log)" >&2
    [[ -n "$BROKEN" ]] || die "CTest did not run (log: $LOGS/clean.log)"
  fi
  echo "   $(grep -cE '^ *[0-9]+/[0-9]+ Test' "$LOGS/clean.log") tests ran in $(secs "$t0") s"
fi

# ---------------------------------------------------------------------------
# The faults, one at a time
# ---------------------------------------------------------------------------
# file anchors replacements (alternatives separated by \x1f): plants the first
# alternative found exactly once; exit 3 (printing the counts) when none is.
plant() {
  python3 - "$@" <<'PYEOF'
import sys
path, anchors, repls = sys.argv[1:4]
unescape = lambda s: s.replace("\\\\", "\0").replace("\\n", "\n").replace("\0", "\\")
text = open(path).read()
counts = []
for anchor, repl in zip(anchors.split("\x1f"), repls.split("\x1f")):
    anchor, repl = unescape(anchor), unescape(repl)
    counts.append(str(text.count(anchor)))
    if text.count(anchor) == 1:
        open(path, "w").write(text.replace(anchor, repl))
        sys.exit(0)
print(", ".join(counts))
sys.exit(3)
PYEOF
}

REPORT="$STATE/report.md"
caught=0 survived=0 errors=0
{
  echo "Planted faults at $COMMIT ($([[ $FULL -eq 1 ]] && echo "whole suite" || echo "each fault's own tests"))"
  [[ -z "$NOTE" ]] || { echo; echo "Tests $NOTE."; }
  echo
  echo "| fault | file | what it breaks | result | caught by | s |"
  echo "|---|---|---|---|---|---|"
} > "$REPORT"
for n in "${SELECTED[@]}"; do
  t0=$(date +%s)
  f=""
  for cand in ${FILE[$n]}; do  # the first of the alternatives that REV has
    if [[ -f "$WORK/$cand" ]]; then f=$cand; break; fi
  done
  log="$LOGS/$n.log"
  rm -f "$log".*  # an earlier run's
  : > "$log"
  result="" by=""
  echo "== $n ($f)"
  if [[ -z "$f" ]]; then
    f=${FILE[$n]}
    result="error" by="no file $f at $REV"
  else
    cp "$WORK/$f" "$STATE/original"
    PLANTED=$f
    if ! count=$(plant "$WORK/$f" "${ANCHOR[$n]}" "${REPLACE[$n]}"); then
      result="error" by="anchor missing (found $count times)"
    else
      regex=$(regex_of "$n")
      targets=$(targets_of "$regex")
      numbers=$(numbers_of "$regex")
      select_numbers <<< "$numbers"
      if [[ "$targets" == all ]]; then build_args=(); else read -ra build_args <<< "--target $targets"; fi
      if [[ -z "$(BROKEN="" numbers_of "$regex")" ]]; then
        result="survived" by="no test at this revision matches '${TESTS[$n]}'"
      elif [[ -z "$numbers" ]]; then
        result="error" by="no test left to run (they fail without any fault)"
      elif ! cmake --build "$BUILD" -j "$JOBS" "${build_args[@]}" >> "$log" 2>&1; then
        result="error" by="does not build (log: $log)"
      elif run_ctest "$log.ctest" --stop-on-failure "${SEL[@]}"; then
        result="survived"
        by="outside CTest: $(run_catch "$n" "$log")"
      else
        result="caught"
        by=$(echo "$FAILED" | head -n 1)
        more=$(($(echo "$FAILED" | wc -l) - 1))
        [[ $more -eq 0 ]] || by+=" (+$more more)"
      fi
    fi
    restore
  fi
  case "$result" in
    caught) caught=$((caught + 1)) ;;
    survived) survived=$((survived + 1)) ;;
    *) errors=$((errors + 1)) ;;
  esac
  s=$(secs "$t0")
  echo "   $result: $by ($s s)"
  echo "| $n | $f | ${WHAT[$n]//|/\\|} | $result | ${by//|/\\|} | $s |" >> "$REPORT"
done

# Leave the kept build as REV built it.
if [[ -n "$KEEP" ]]; then cmake --build "$BUILD" -j "$JOBS" >> "$STATE/build.log" 2>&1 || true; fi

total=$((caught + survived))
{
  echo
  echo "score: $caught of $total caught, $survived survived$([[ $errors -eq 0 ]] || echo ", $errors errors")" \
       "($(secs "$T_ALL") s)"
} >> "$REPORT"
echo
cat "$REPORT"
[[ -z "$KEEP" ]] || echo "(report: $REPORT)"
[[ $errors -eq 0 ]] || exit 2
[[ $survived -eq 0 ]] || exit 1
exit 0
