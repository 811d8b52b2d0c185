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

write_mpi_config() {
  cat > base.json <<JSON
{"model": {"vocab_size": 300, "d_model": 32, "n_layers": 8, "n_heads": 4, "n_kv_heads": 2,
           "d_ff": 64, "residual": {"mode": "block", "block_size": 3}},
 "optimizer": {"lr": 3e-3},
 "schedule": {"type": "cosine", "warmup_steps": 2},
 "training": {"steps": 8, "micro_batch_size": 2, "seq_len": 16, "grad_accum": 4, "seed": 7},
 "data": {"train": "shards/tiny_train_*.bin", "val": "shards/tiny_val_*.bin", "shuffle": true,
          "tokenizer": "tok.json"},
 "checkpoint": {"dir": "ckpt", "every": 4, "keep_last": 0},
 "eval": {"every": 4, "batches": 3},
 "run": {"dir": "run", "log_every": 1}}
JSON
}

# A metrics.jsonl's first step's pipeline bytes, and its last train loss.
pp_bytes() { grep -o '"pp_bytes":[0-9]*' "$1" | awk -F: 'NR == 1 { print $2 }'; }
last_loss() { grep -o '"loss":[^,}]*' "$1" | tail -1 | cut -d: -f2; }


# compare_losses A B TOL: the same records; "loss", "val_loss" and "grad_norm"
# within relative TOL, every other field (step, lr, tokens) identical.
compare_losses() {
  [[ $(step_records "$1" | wc -l) -eq $(step_records "$2" | wc -l) ]] || { echo "$1 and $2 differ in length"; return 1; }
  paste -d '\n' <(strip_metrics "$1") <(strip_metrics "$2") | awk -v tol="$3" '
    function val(line, key) {
      if (match(line, "\"" key "\":[^,}]*")) return substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 3)
      return ""
    }
    function others(line) { gsub(/"(loss|val_loss|grad_norm)":[^,}]*/, "", line); return line }
    function abs(x) { return x < 0 ? -x : x }
    NR % 2 == 1 { a = $0; next }
    {
      b = $0; n++
      if (others(a) != others(b)) { print "record " n ": " a " vs " b; bad = 1; exit 1 }
      split("loss val_loss grad_norm", keys, " ")
      for (i = 1; i <= 3; i++) {
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
