# Shared setup for the CLI tests: a temp dir, a small real-text corpus turned
# into shards by `attnres tokenize`, and a tiny base config.
# Usage: source lib.sh BIN SRC
set -euo pipefail
BIN="$1"; SRC="$2"
WORK=$(mktemp -d /tmp/attnres_cli.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

# Debian's python3 (python3-torch, matplotlib), not a python3 earlier on PATH.
PY=/usr/bin/python3
[[ -x $PY ]] || PY=$(command -v python3)

fail() { echo "FAIL: $*" >&2; exit 1; }
# metrics.jsonl's step and evaluation records: event records (checkpoints:
# their timings and memory differ from run to run; restarts) left out.
step_records() { grep -v '"event":"' "$1"; }
# Those records without timing (mfu: GPU runs) and parallel-only fields: what
# equal runs write the same.
strip_metrics() { step_records "$1" | sed -E 's/,?"(tokens_per_sec|elapsed_sec|mfu|bubble|pp_bytes)":[^,}]*//g; s/\{,/{/'; }
pass() { echo "ok: $*"; }

# wait_for SECONDS WHAT CMD...: polls CMD every 0.1 s until it succeeds. A test
# that waits on another process waits for a state (a log line, a file, a
# process gone), never for a time (docs/testing.md, "Tests that start
# processes"); SECONDS only bounds a hang, far past what the state needs.
# Past it: on_wait_timeout (when the test defines one, to show its logs), the
# test's background jobs killed, and a failure naming WHAT.
wait_for() {
  local limit=$1 what=$2 end
  shift 2
  end=$((SECONDS + limit))
  until "$@"; do
    if ((SECONDS >= end)); then
      if declare -F on_wait_timeout >/dev/null; then on_wait_timeout || true; fi
      local j
      for j in $(jobs -p); do kill -KILL "$j" 2>/dev/null || true; done
      fail "waited ${limit} s for $what"
    fi
    sleep 0.1
  done
}
# gone PID: true once PID has exited (or is a zombie waiting for its reaper).
gone() { [[ ! -e /proc/$1 ]] || grep -q '^[^)]*) Z' "/proc/$1/stat" 2>/dev/null; }

# expect_error "description" "substring" cmd... : cmd must exit 2 and print substring on stderr.
expect_error() {
  local what="$1" needle="$2"; shift 2
  local rc=0
  "$@" >out.txt 2>err.txt || rc=$?
  [[ $rc -eq 2 ]] || { cat err.txt >&2; fail "$what: exit code $rc, expected 2"; }
  grep -qF -- "$needle" err.txt || { cat err.txt >&2; fail "$what: message lacks '$needle'"; }
  pass "$what -> $(grep -m1 error: err.txt)"
}

make_corpus() {
  mkdir -p corpus
  # Several documents of real-looking English so BPE and the loader have work.
  for i in 1 2 3 4 5 6; do
    for j in $(seq 1 40); do
      echo "Document $i line $j: the quick brown fox jumps over the lazy dog while the jury said that the election was fair."
    done > corpus/doc$i.txt
  done
  "$BIN" tokenize train --input corpus --format text --vocab-size 300 --output tok.json >/dev/null
  "$BIN" tokenize encode --tokenizer tok.json --input corpus --format text --output-dir shards \
    --val-fraction 0.34 --name tiny >/dev/null
}

# The device and precision the tests train on: the CPU in fp32, or, with
# ATTNRES_TEST_DEVICE=cuda (the GPU variant of a test), the GPU in bf16.
DEVICE="${ATTNRES_TEST_DEVICE:-cpu}"
PRECISION=$([[ "$DEVICE" == cuda ]] && echo bf16 || echo fp32)

# visible_gpus: how many GPUs this job may use: nvidia-smi's, cut to the
# entries of CUDA_VISIBLE_DEVICES when it is set (CUDA takes them up to the
# first that names no device, so "", "-1" or "NoDevFiles" leave none).
visible_gpus() {
  local n k=0 e list=()
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    IFS=',' read -r -a list <<<"$CUDA_VISIBLE_DEVICES"
    for e in "${list[@]}"; do
      e=${e// /}
      [[ $e =~ ^([0-9]+|GPU-.+|MIG-.+)$ ]] || break
      k=$((k + 1))
    done
    ((k < n)) && n=$k
  fi
  echo "${n:-0}"
}

# On a machine without a GPU, or in a job that may use none, a CUDA variant
# says so and stops (CTest reports it skipped).
require_device() {
  [[ "$DEVICE" == cuda ]] || return 0
  if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "skipped: no CUDA device visible"
    exit 0
  fi
  if [[ $(visible_gpus) -eq 0 ]]; then
    echo "skipped: no CUDA device visible to this job (CUDA_VISIBLE_DEVICES='${CUDA_VISIBLE_DEVICES-}')"
    exit 0
  fi
}

# write_base_json LAYERS STEPS GRAD_ACCUM EVAL_EVERY EVAL_BATCHES [DEVICE PRECISION]:
# base.json, a block AttnRes model of LAYERS layers trained on make_corpus's
# shards, a checkpoint every 4 steps; training.device and .precision only
# when given. Tests edit its text with sed: keep '"steps": N',
# '"every": 4, "keep_last": 0', '"eval": {"every": N' and '"log_every": 1}'.
write_base_json() {
  local layers=$1 steps=$2 accum=$3 eval_every=$4 eval_batches=$5 device_keys=""
  if [[ $# -ge 7 ]]; then device_keys=", \"device\": \"$6\", \"precision\": \"$7\""; fi
  cat > base.json <<JSON
{"model": {"vocab_size": 300, "d_model": 32, "n_layers": $layers, "n_heads": 4, "n_kv_heads": 2,
           "d_ff": 64, "residual": {"mode": "block", "block_size": 3}},
 "optimizer": {"lr": 3e-3},
 "schedule": {"type": "cosine", "warmup_steps": 2},
 "training": {"steps": $steps, "micro_batch_size": 2, "seq_len": 16, "grad_accum": $accum,
              "seed": 7$device_keys},
 "data": {"train": "shards/tiny_train_*.bin", "val": "shards/tiny_val_*.bin", "shuffle": true,
          "tokenizer": "tok.json"},
 "checkpoint": {"dir": "ckpt", "every": 4, "keep_last": 0},
 "eval": {"every": $eval_every, "batches": $eval_batches},
 "run": {"dir": "run", "log_every": 1}}
JSON
}

# The CLI tests' base.json: 2 layers, 12 steps, on $DEVICE in $PRECISION.
write_config() { write_base_json 2 12 2 6 2 "$DEVICE" "$PRECISION"; }
