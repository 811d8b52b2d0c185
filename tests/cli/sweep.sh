#!/usr/bin/env bash
# attnres sweep end to end on the small test corpus: a 2x2 grid (two sizes x
# baseline / Block), results.csv and fits.json; a second invocation skips every
# run; SIGTERM mid-run, then the same command resumes it; the shipped sweep
# configs validate with --dry-run.
# Two parts need what a machine may lack, and are their own CTest tests,
# reported skipped (exit code 77, with the reason) where they cannot run:
#   ATTNRES_TEST_PART=figures: the figures (needs matplotlib in /usr/bin/python3;
#     without it, the sweep must say so);
#   ATTNRES_TEST_PART=mpirun: the same grid under mpirun (pipeline of 2) gives
#     bit-identical metrics and depth statistics (needs mpirun and MPI in the build).
# ATTNRES_TEST_PART=cuda runs only the checks whose outcome depends on the build
# (a sweep on cuda: refused, or each run given its GPU; the shipped GPU sweeps'
# validation): CI runs the whole script on the CPU-only build and this part on
# the build with CUDA (label backend).
source "$(dirname "$0")/lib.sh"
part="${ATTNRES_TEST_PART:-}"
case "$part" in
  ""|figures|mpirun|cuda) ;;
  *) fail "unknown ATTNRES_TEST_PART '$part' (figures, mpirun, cuda, or unset)" ;;
esac
if [[ $part == mpirun ]] && ! command -v mpirun > /dev/null; then
  echo "skipped: sweep under mpirun: mpirun not found (apt-get install openmpi-bin)"
  exit 77
fi
make_corpus

cat > sweep.json <<JSON
{"out_dir": "out",
 "base": {"model": {"vocab_size": 300, "n_heads": 4, "n_kv_heads": 2},
          "optimizer": {"lr": 3e-3},
          "schedule": {"type": "cosine"},
          "training": {"micro_batch_size": 2, "seq_len": 16, "seed": 7},
          "data": {"train": "shards/tiny_train_*.bin", "val": "shards/tiny_val_*.bin",
                   "shuffle": true, "tokenizer": "tok.json"},
          "checkpoint": {"every": 4, "keep_last": 1},
          "eval": {"batches": 2},
          "run": {"log_every": 100, "depth_stats_every": 4}},
 "sizes": [{"name": "a", "model": {"d_model": 32, "n_layers": 2, "d_ff": 64}, "tokens": [384]},
           {"name": "b", "model": {"d_model": 48, "n_layers": 3, "d_ff": 96}, "tokens": [768]}],
 "modes": [{"mode": "baseline"}, {"mode": "block", "block_size": 2}],
 "warmup_fraction": 0.1,
 "plots": {"script": "$SRC/scripts/plot_sweep.py"}}
JSON
runs="a_baseline_384 a_block_s2_384 b_baseline_768 b_block_s2_768"

if [[ -z $part ]]; then
  # A sweep file handed to train or inspect says what it is and how to get
  # one run's config; --print-config prints a config those take (the run's
  # own keys: b's width, Block's S), and names the runs when asked for another.
  for cmd in "train" "inspect memory" "inspect plan"; do
    # shellcheck disable=SC2086
    expect_error "$cmd of a sweep file" "this is a sweep file" "$BIN" $cmd sweep.json
    grep -qF -- "--print-config RUN > run.json" err.txt || fail "$cmd of a sweep file: no --print-config hint"
  done
  "$BIN" sweep sweep.json --print-config b_block_s2_768 > run.json 2>err.txt || { cat err.txt; fail "--print-config"; }
  /usr/bin/python3 -c 'import json,sys; c=json.load(open("run.json"))["model"]; r=c["residual"]; sys.exit(not (c["d_model"] == 48 and r["mode"] == "block" and r.get("block_size") == 2))' \
    || { cat run.json; fail "--print-config: not run b_block_s2_768's config"; }
  "$BIN" inspect memory run.json > mem.txt 2>err.txt || { cat err.txt; fail "inspect memory of a printed run config"; }
  grep -q "d=48 L=3" mem.txt || { cat mem.txt; fail "inspect memory: not the run's model"; }
  expect_error "--print-config of no such run" "its runs: a_baseline_384, a_block_s2_384" \
    "$BIN" sweep sweep.json --print-config nope
  [[ ! -e out ]] || fail "--print-config wrote into the sweep's out_dir"
  pass "a sweep file given to train / inspect is named as one; --print-config gives a run's config"
fi

# run_sweep [flags...]: sweep.json into out/, every run trained, results, fits.
run_sweep() {
  "$BIN" sweep sweep.json --jobs 1 "$@" > table.txt 2>log.txt || { tail -30 log.txt; fail "sweep $*"; }
  [[ $(wc -l < out/results.csv) -eq 5 ]] || { cat out/results.csv; fail "results.csv: header + 4 rows"; }
  [[ $(grep -c ",done$" out/results.csv) -eq 4 ]] || { cat out/results.csv; fail "results.csv: 4 done"; }
  for r in $runs; do
    [[ -f out/runs/$r/result.json && -f out/runs/$r/metrics.jsonl && -f out/runs/$r/depth_stats.jsonl ]] \
      || fail "$r: result.json / metrics.jsonl / depth_stats.jsonl missing"
  done
  grep -q '"alpha"' out/fits.json || fail "fits.json has no fit"
  grep -q "power-law fits" table.txt && grep -q "compute multiplier over baseline" table.txt \
    || { cat table.txt; fail "fit table not printed"; }
}

# The checks whose outcome depends on the build (also the "cuda" part).
check_cuda_jobs() {
  # --jobs on cuda: each run gets GPUs of its own (CUDA_VISIBLE_DEVICES, a GPU
  # per rank, from those the sweep sees). Devices 7 and 9 exist on no test
  # machine, so every run stops at once naming the GPU it was given. A build
  # without the CUDA backend (ATTNRES_TEST_HAVE_CUDA=OFF, from CMake) refuses
  # such a sweep before it starts, naming the key.
  sed 's/"out_dir": "out"/"out_dir": "out_gpu"/' sweep.json > gpu.json
  if [[ ${ATTNRES_TEST_HAVE_CUDA:-} == OFF ]]; then
    expect_error "--jobs 2 on cuda in a build without CUDA" \
      'config key training.device: "cuda", but this build has no CUDA backend' \
      env CUDA_VISIBLE_DEVICES=7,9 "$BIN" sweep gpu.json --no-plots --jobs 2 --training.device=cuda
    [[ ! -d out_gpu/runs ]] || fail "--jobs 2 on cuda in a build without CUDA started runs"
  else
    [[ ${ATTNRES_TEST_HAVE_CUDA:-} == ON ]] || fail "ATTNRES_TEST_HAVE_CUDA is '${ATTNRES_TEST_HAVE_CUDA:-}' (ON or OFF, set by tests/CMakeLists.txt)"
    CUDA_VISIBLE_DEVICES=7,9 "$BIN" sweep gpu.json --no-plots --jobs 2 --training.device=cuda > /dev/null 2> log_gpu.txt || true
    grep -q "2 at a time, .*, 1 GPU(s) each" log_gpu.txt || { cat log_gpu.txt; fail "--jobs 2 on cuda: no GPU share in the plan line"; }
    # The first two runs start together, in the two slots; later runs take a
    # freed slot. Every run names one GPU of the two, and both were given.
    given=$(for r in $runs; do grep -ho "CUDA_VISIBLE_DEVICES=[0-9,]*" out_gpu/runs/$r/train.log | tail -1; done | sort | uniq -c | awk '{print $2 " x" $1}' | tr '\n' ' ')
    [[ $given =~ ^CUDA_VISIBLE_DEVICES=7\ x[0-9]\ CUDA_VISIBLE_DEVICES=9\ x[0-9]\ $ && \
       $(grep -lo "CUDA_VISIBLE_DEVICES=[79])" out_gpu/runs/*/train.log | wc -l) -eq 4 ]] \
      || { grep -h error out_gpu/runs/*/train.log; fail "--jobs 2 on cuda: each run should get GPU 7 or 9, both in use (got: $given)"; }
    expect_error "--jobs on cuda with no GPU visible" "sees 0 GPU(s)" \
      env CUDA_VISIBLE_DEVICES= "$BIN" sweep gpu.json --no-plots --jobs 2 --training.device=cuda
    pass "--jobs 2 on cuda: each run its own GPU ($given)"
  fi
}
check_shipped_sweeps() {
  # The shipped sweeps validate. Without CUDA in this build the GPU sweep is
  # checked with the device and precision overridden (everything else as is).
  "$BIN" sweep "$SRC/configs/sweeps/cpu_small.json" --dry-run > cpu_plan.txt 2>&1 \
    || { cat cpu_plan.txt; fail "configs/sweeps/cpu_small.json does not validate"; }
  grep -q "27 runs" cpu_plan.txt || { cat cpu_plan.txt; fail "cpu_small: expected 27 runs"; }
  local name count plan
  for name_count in "gpu_paper 15" "gpu_paper_dense 15" "gpu_paper_kimi 15" "gpu_h100 18" "cpu_kimi 18" \
                    "cpu_ablation 33" "gpu_ablation 11"; do
    read -r name count <<<"$name_count"
    plan=(sweep "$SRC/configs/sweeps/$name.json" --dry-run)
    if ! "$BIN" "${plan[@]}" > "${name}_plan.txt" 2>&1; then
      grep -q "no CUDA backend" "${name}_plan.txt" || { cat "${name}_plan.txt"; fail "$name.json does not validate"; }
      "$BIN" "${plan[@]}" --training.device=cpu --training.precision=fp32 > "${name}_plan.txt" 2>&1 \
        || { cat "${name}_plan.txt"; fail "$name.json does not validate (device overridden to cpu)"; }
    fi
    grep -q "$count runs" "${name}_plan.txt" || { cat "${name}_plan.txt"; fail "$name: expected $count runs"; }
  done
  # Both paper sweeps: each run's activated non-embedding parameters (the plan's
  # params column) within 3% of its size in the paper's Table 2 (the run's name).
  local f
  for f in gpu_paper_plan.txt gpu_paper_dense_plan.txt; do
    awk '$1 ~ /^[0-9]+M_/ { n++; want = substr($1, 1, index($1, "M_") - 1) * 1e6;
           if ($7 < 0.97 * want || $7 > 1.03 * want) { print "FAIL: " FILENAME ": " $1 " has " $7 " activated parameters"; bad = 1 } }
         END { exit bad || n != 15 }' "$f" || fail "$f: activated parameters off Table 2's"
  done
  # The ablation sweep at the paper's scale also plans its Slurm jobs.
  plan=(sweep "$SRC/configs/sweeps/gpu_ablation.json" --slurm --dry-run --partition p --time 24:00:00)
  "$BIN" "${plan[@]}" > ablation_slurm.txt 2>&1 || "$BIN" "${plan[@]}" --training.device=cpu \
    --training.precision=fp32 > ablation_slurm.txt 2>&1 || { cat ablation_slurm.txt; fail "gpu_ablation --slurm --dry-run"; }
  pass "configs/sweeps/cpu_small.json (27 runs), gpu_paper.json (15, MoE), gpu_paper_dense.json (15), gpu_paper_kimi.json (15, Kimi Linear hybrids), gpu_h100.json (18), cpu_kimi.json (18), cpu_ablation.json (33) and gpu_ablation.json (11; and --slurm --dry-run) validate"
}
if [[ $part == cuda ]]; then
  check_cuda_jobs
  check_shipped_sweeps
  echo "all build-dependent sweep checks passed"
  exit 0
fi

if [[ $part == figures ]]; then
  run_sweep
  if ! /usr/bin/python3 -c "import matplotlib, numpy" 2>/dev/null; then
    grep -q "plots:" log.txt || fail "the sweep did not report the missing matplotlib"
    echo "skipped: figures: /usr/bin/python3 has no matplotlib (apt-get install python3-matplotlib);" \
      "the sweep said so"
    exit 77
  fi
  for f in loss_vs_compute loss_curves depth_stats depth_attention; do
    png=out/plots/$f.png
    [[ -s $png ]] || { tail -20 log.txt; fail "$png missing"; }
    [[ $(head -c 8 "$png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "$png is not a PNG"
  done
  pass "figures: $(ls out/plots | tr '\n' ' ')"
  echo "all sweep figure checks passed"
  exit 0
fi

# Under mpirun every run is one parallel job (MPI initialised once for the
# whole sweep); a 2-stage pipeline keeps the single-process sums, so metrics
# and depth statistics are bit-identical.
if [[ $part == mpirun ]]; then
  run_sweep --no-plots
  flags=(--oversubscribe)
  [[ $(id -u) -eq 0 ]] && flags+=(--allow-run-as-root)
  sed 's/"out_dir": "out"/"out_dir": "out_mpi"/' sweep.json > mpi.json
  mpi_rc=0
  OMP_NUM_THREADS=1 mpirun -np 2 "${flags[@]}" "$BIN" sweep mpi.json --no-plots \
    --parallel.pipeline=2 > /dev/null 2>log_mpi.txt || mpi_rc=$?
  if ((mpi_rc != 0)) && grep -q "this build has no MPI" log_mpi.txt; then
    echo "skipped: sweep under mpirun: this build has no MPI"
    exit 77
  fi
  ((mpi_rc == 0)) || { tail -20 log_mpi.txt; fail "sweep under mpirun (exit code $mpi_rc)"; }
  for r in $runs; do
    diff <(strip_metrics out/runs/$r/metrics.jsonl) <(strip_metrics out_mpi/runs/$r/metrics.jsonl) > /dev/null \
      || fail "$r: metrics under mpirun differ from the single process"
    cmp -s out/runs/$r/depth_stats.jsonl out_mpi/runs/$r/depth_stats.jsonl \
      || fail "$r: depth_stats.jsonl under mpirun differs from the single process"
  done
  [[ $(grep -c ",done$" out_mpi/results.csv) -eq 4 ]] || fail "mpirun sweep: 4 runs done"
  pass "mpirun -np 2 (pipeline 2): 4 runs, metrics and depth stats identical to the single process"
  echo "all sweep checks under mpirun passed"
  exit 0
fi

# --dry-run: the plan, nothing written.
"$BIN" sweep sweep.json --dry-run > plan.txt 2>err.txt || { cat err.txt; fail "dry run"; }
grep -q "4 runs into out" plan.txt || { cat plan.txt; fail "dry run: plan header"; }
[[ $(grep -c " new$" plan.txt) -eq 4 ]] || { cat plan.txt; fail "dry run: 4 new runs"; }
[[ ! -e out ]] || fail "dry run wrote out/"
pass "--dry-run prints the plan ($(grep -c ' new$' plan.txt) runs) and writes nothing"

# The sweep (the figures are the "figures" part's).
run_sweep --no-plots
pass "sweep: 4 runs done, results.csv, fits.json, fit table"

# A second invocation skips every completed run and rewrites the same results.
cp out/results.csv results_1.csv
"$BIN" sweep sweep.json --jobs 1 --no-plots > /dev/null 2>log2.txt || { cat log2.txt; fail "second sweep"; }
[[ $(grep -c "complete, skipped" log2.txt) -eq 4 ]] || { cat log2.txt; fail "expected 4 skipped runs"; }
grep -q "model:" log2.txt && fail "the second invocation trained something"
diff results_1.csv out/results.csv || fail "results.csv changed"
pass "second invocation: 4 runs skipped, results.csv unchanged"

# --status of a local sweep: every run done, with its losses; a damaged record
# of Slurm submissions is an error naming the file.
"$BIN" sweep sweep.json --status > status.txt 2>&1 || { cat status.txt; fail "--status"; }
grep -q "(not submitted to Slurm)" status.txt && tail -1 status.txt | grep -qx "4 done" \
  && [[ $(grep -cE "^ +[^ ]+ +done +step [0-9]+, train loss [0-9.]+, val loss [0-9.]+$" status.txt) -eq 4 ]] \
  || { cat status.txt; fail "--status of the complete local sweep"; }
mkdir -p out/slurm && echo '[{"arrays": 3}]' > out/slurm/submissions.json
expect_error "--status with a damaged submissions.json" "out/slurm/submissions.json: damaged record" \
  "$BIN" sweep sweep.json --status
rm -r out/slurm
pass "--status: 4 runs done (not submitted to Slurm)"

# --jobs 2: two runs at a time, each `attnres train` in a process of its own
# with 1 of the 2 CPUs; the same numbers as the sequential sweep, bit for bit
# (a run's numbers depend neither on its neighbours nor on its thread count).
sed 's/"out_dir": "out"/"out_dir": "out_jobs"/' sweep.json > jobs.json
"$BIN" sweep jobs.json --no-plots --jobs 2 > /dev/null 2>log_jobs.txt || { tail -30 log_jobs.txt; fail "sweep --jobs 2"; }
grep -q "4 runs to train, 2 at a time, 1 thread(s) each" log_jobs.txt || { cat log_jobs.txt; fail "--jobs 2: no plan line"; }
for r in $runs; do
  diff <(strip_metrics out/runs/$r/metrics.jsonl) <(strip_metrics out_jobs/runs/$r/metrics.jsonl) > /dev/null \
    || fail "$r: --jobs 2 metrics differ from the sequential sweep"
  cmp -s out/runs/$r/depth_stats.jsonl out_jobs/runs/$r/depth_stats.jsonl || fail "$r: depth stats differ"
  grep -q "model:" out_jobs/runs/$r/train.log || fail "$r: no train.log of its process"
done
wallless() { cut -d, -f1-$(($(head -1 "$1" | tr ',' '\n' | grep -n '^wall_sec$' | cut -d: -f1) - 1)) "$1"; }
head -1 out/results.csv | grep -q wall_sec || fail "results.csv has no wall_sec column"
diff <(wallless out/results.csv | sed 1d) <(wallless out_jobs/results.csv | sed 1d) || fail "--jobs 2: results.csv differs"
pass "--jobs 2: two processes at a time, 1 CPU each: metrics, depth stats and results identical to the sequential sweep"

# Without --jobs, a sweep of small CPU models trains a run per CPU.
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # the CPUs it may use (nproc heeds OMP_NUM_THREADS)
sed 's/"out_dir": "out"/"out_dir": "out_auto"/' sweep.json > auto.json
"$BIN" sweep auto.json --no-plots > /dev/null 2>log_auto.txt || { tail -30 log_auto.txt; fail "sweep without --jobs"; }
if ((cpus > 1)); then
  grep -q "small CPU models: $cpus runs at once" log_auto.txt || { cat log_auto.txt; fail "no --jobs: not a run per CPU"; }
fi
diff <(wallless out/results.csv | sed 1d) <(wallless out_auto/results.csv | sed 1d) || fail "no --jobs: results.csv differs"
pass "no --jobs, $cpus CPU(s): $(grep -o "small CPU models: [0-9]* runs at once" log_auto.txt || echo "one run at a time"), the same results"

# --dry-run on the started sweep with a changed config: every changed run is
# named and the dry run fails as the real run would; unchanged, it passes.
rc=0
"$BIN" sweep sweep.json --dry-run --optimizer.lr=0.002 > plan2.txt 2> err2.txt || rc=$?
[[ $rc -eq 2 ]] || { cat plan2.txt err2.txt; fail "dry run of a changed sweep: exit $rc, expected 2"; }
[[ $(grep -c "its config changed since it was started (config key 'optimizer.lr': 0.003 -> 0.002" err2.txt) -eq 4 ]] \
  || { cat err2.txt; fail "dry run of a changed sweep: expected the 4 runs named"; }
"$BIN" sweep sweep.json --dry-run > plan3.txt 2>&1 || { cat plan3.txt; fail "dry run of the unchanged sweep"; }
grep -q "the started runs match their stored configs" plan3.txt || { cat plan3.txt; fail "dry run: no match line"; }
pass "--dry-run names the 4 runs a changed learning rate would refuse (exit 2)"

# The real run refuses a changed sweep before it trains anything, even when
# the first run is new (here: its directory deleted) and would train first.
cp -r out out_changed
rm -r out_changed/runs/a_baseline_384
sed 's/"out_dir": "out"/"out_dir": "out_changed"/' sweep.json > changed.json
rc=0
"$BIN" sweep changed.json --no-plots --optimizer.lr=0.002 > /dev/null 2> err4.txt || rc=$?
[[ $rc -eq 2 ]] || { cat err4.txt; fail "changed sweep: exit $rc, expected 2"; }
[[ $(grep -c "its config changed since it was started" err4.txt) -eq 3 ]] \
  || { cat err4.txt; fail "changed sweep: expected the 3 started runs named"; }
grep -q "model:" err4.txt && fail "the changed sweep trained a run before refusing"
[[ ! -e out_changed/runs/a_baseline_384 ]] || fail "the changed sweep started the new run"
pass "a changed sweep is refused before any run trains (3 changed runs named, exit 2)"

# SIGTERM during a run: the trainer checkpoints and the sweep exits 143; the
# same command resumes that run from its checkpoint.
sed -e 's/"out_dir": "out"/"out_dir": "long"/' -e 's/"tokens": \[768\]/"tokens": [96000]/' \
  -e 's/{"mode": "baseline"}, //' sweep.json > long.json
"$BIN" sweep long.json --jobs 1 --no-plots --checkpoint.every=0 > /dev/null 2>log_sig.txt &
pid=$!
# Wait for the long run's training loop (its first progress line).
wait_for 60 "the long run's first progress line in log_sig.txt" grep -qs "/3000 |" log_sig.txt
kill -TERM $pid
rc=0; wait $pid || rc=$?
[[ $rc -eq 143 ]] || { tail -5 log_sig.txt; fail "SIGTERM: exit code $rc, expected 143"; }
ls long/runs/b_block_s2_96k/ckpt/step_* > /dev/null 2>&1 || fail "no checkpoint after SIGTERM"
[[ ! -e long/runs/b_block_s2_96k/result.json ]] || fail "an interrupted run was marked complete"
stopped=$(ls long/runs/b_block_s2_96k/ckpt | tail -1)
"$BIN" sweep long.json --jobs 1 --no-plots > /dev/null 2>log_res.txt || { tail -5 log_res.txt; fail "resume"; }
grep -q "a_block_s2_384: complete, skipped" log_res.txt || fail "completed run not skipped"
grep -q "resumed from long/runs/b_block_s2_96k/ckpt/$stopped" log_res.txt \
  || { grep resumed log_res.txt; fail "the interrupted run did not resume from $stopped"; }
grep -q ",done$" <(grep b_block long/results.csv) || fail "resumed run not done"
steps=$(grep '"loss"' long/runs/b_block_s2_96k/metrics.jsonl | grep -o '"step":[0-9]*' | sort -u | wc -l)
[[ $steps -eq 3000 ]] || fail "resumed run logged $steps distinct steps, expected 3000"
pass "SIGTERM at $stopped: exit 143, then the same command resumed it to step 3000"

check_cuda_jobs
check_shipped_sweeps
echo "all sweep checks passed"
