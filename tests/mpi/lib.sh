# Shared setup for the mpirun shell tests: arguments, a launcher helper, the
# small corpus of tests/cli/lib.sh, and a model deep enough for P*V = 8 chunks.
# Usage: source lib.sh BIN SRC TEST_MPI MPIEXEC NPFLAG [launcher flags...]
BIN_="$1"; SRC_="$2"; TEST_MPI="$3"; MPIEXEC="$4"; NPFLAG="$5"; shift 5
MPI_FLAGS=("$@")
source "$SRC_/tests/cli/lib.sh" "$BIN_" "$SRC_"

# run_np K cmd...: cmd as K MPI processes.
run_np() {
  local k="$1"; shift
  "$MPIEXEC" "$NPFLAG" "$k" "${MPI_FLAGS[@]}" "$@"
}

# base.json for P*V = 8 chunks (tests/cli/lib.sh's write_base_json): 8 layers,
# 8 steps of 4 microbatches, on the cpu unless a test says otherwise.
write_mpi_config() { write_base_json 8 8 4 4 3; }

# reference_run: the corpus, base.json and its uninterrupted single-process
# run (ck_s, run_s, log_s.txt), which runs under other layouts must match.
reference_run() {
  make_corpus
  write_mpi_config
  "$BIN" train base.json --checkpoint.dir=ck_s --run.dir=run_s 2>log_s.txt \
    || { cat log_s.txt; fail "the single-process reference run"; }
}

# ranks_of "ARGS": the processes a layout's overrides ask for (pipeline x data).
ranks_of() {
  local P=1 D=1
  [[ "$1" == *pipeline=* ]] && P=$(sed -E 's/.*pipeline=([0-9]+).*/\1/' <<<"$1")
  [[ "$1" == *data=* ]] && D=$(sed -E 's/.*data=([0-9]+).*/\1/' <<<"$1")
  echo $((P * D))
}

# same_as_reference REF TOL "LAYOUT"... -- EXTRA...: base.json with EXTRA
# under each layout (its overrides, one string), against the run REF
# (ck_REF / run_REF, step 8): metrics and every checkpoint tensor bit for bit
# when TOL is 0, else losses and checkpoint tensors within relative TOL.
same_as_reference() {
  local ref="$1" tol="$2"; shift 2
  local layouts=() args
  while [[ $# -gt 0 && "$1" != "--" ]]; do layouts+=("$1"); shift; done
  shift
  for args in "${layouts[@]}"; do
    rm -rf ck_p run_p
    # shellcheck disable=SC2086
    run_np "$(ranks_of "$args")" "$BIN" train base.json --checkpoint.dir=ck_p --run.dir=run_p "$@" \
      $args 2>log_p.txt || { cat log_p.txt; fail "mpirun $args"; }
    if [[ $tol == 0 ]]; then
      diff <(strip_metrics "run_$ref/metrics.jsonl") <(strip_metrics run_p/metrics.jsonl) \
        || fail "$args: metrics differ from the single process"
    else
      compare_losses "run_$ref/metrics.jsonl" run_p/metrics.jsonl "$tol" || fail "$args: losses differ"
    fi
    "$BIN" inspect compare "ck_$ref/step_00000008" ck_p/step_00000008 --rtol "$tol" >/dev/null \
      || fail "$args: checkpoint tensors differ"
    if [[ $tol == 0 ]]; then
      pass "$args: metrics and every checkpoint tensor bit-identical to the single process"
    else
      pass "$args: equal to the single process within $tol"
    fi
  done
}

# resume_on REF TOL "FIRST" "SECOND" -- EXTRA...: base.json with EXTRA stopped
# at step 4 on the layout FIRST (its overrides, one string; "" = one
# process), then resumed on SECOND (ck_r / run_r): the run REF's losses and
# final checkpoint within relative TOL.
resume_on() {
  local ref="$1" tol="$2" first="$3" second="$4"; shift 5
  rm -rf ck_r run_r
  # shellcheck disable=SC2086
  run_np "$(ranks_of "$first")" "$BIN" train base.json --checkpoint.dir=ck_r --run.dir=run_r "$@" \
    $first --run.stop_after=4 2>log_r1.txt || { cat log_r1.txt; fail "the first half on '$first'"; }
  # shellcheck disable=SC2086
  run_np "$(ranks_of "$second")" "$BIN" train base.json --checkpoint.dir=ck_r --run.dir=run_r "$@" \
    $second --checkpoint.resume=auto 2>log_r2.txt || { cat log_r2.txt; fail "the second half on '$second'"; }
  grep -q "resumed from ck_r/step_00000004" log_r2.txt || { cat log_r2.txt; fail "did not resume from step 4"; }
  compare_losses "run_$ref/metrics.jsonl" run_r/metrics.jsonl "$tol" || fail "resumed on '$second': losses differ"
  "$BIN" inspect compare "ck_$ref/step_00000008" ck_r/step_00000008 --rtol "$tol" >/dev/null \
    || fail "resumed on '$second': checkpoint tensors differ"
  pass "stopped at step 4 on '${first:-one process}', resumed on '$second': the uninterrupted run within $tol"
}

# A metrics.jsonl's first step's pipeline bytes, and its last train loss.
pp_bytes() { grep -o '"pp_bytes":[0-9]*' "$1" | awk -F: 'NR == 1 { print $2 }'; }
last_loss() { grep -o '"loss":[^,}]*' "$1" | tail -1 | cut -d: -f2; }


# compare_losses A B TOL: the same records; "loss", "val_loss", "grad_norm"
# and a MoE model's "aux_loss" within relative TOL, every other field (step,
# lr, tokens, the experts' loads and biases) identical.
compare_losses() {
  [[ $(step_records "$1" | wc -l) -eq $(step_records "$2" | wc -l) ]] || { echo "$1 and $2 differ in length"; return 1; }
  paste -d '\n' <(strip_metrics "$1") <(strip_metrics "$2") | awk -v tol="$3" '
    function val(line, key) {
      if (match(line, "\"" key "\":[^,}]*")) return substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 3)
      return ""
    }
    function others(line) { gsub(/"(loss|val_loss|grad_norm|aux_loss)":[^,}]*/, "", line); return line }
    function abs(x) { return x < 0 ? -x : x }
    NR % 2 == 1 { a = $0; next }
    {
      b = $0; n++
      if (others(a) != others(b)) { print "record " n ": " a " vs " b; bad = 1; exit 1 }
      split("loss val_loss grad_norm aux_loss", keys, " ")
      for (i = 1; i <= 4; i++) {
        x = val(a, keys[i]); y = val(b, keys[i])
        if (x == "" && y == "") continue
        m = abs(x) > abs(y) ? abs(x) : abs(y)
        r = m > 0 ? abs(x - y) / m : 0
        if (r > worst) worst = r
        if (r > tol) { print "record " n ": " keys[i] " " x " vs " y ", relative " r " > " tol; bad = 1; exit 1 }
      }
    }
    END { if (!bad) printf "%d records agree, largest relative difference %.3g\n", n, worst; exit bad }'
}
