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
