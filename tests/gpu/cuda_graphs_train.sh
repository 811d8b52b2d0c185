#!/usr/bin/env bash
# training.cuda_graphs through `attnres train` on the GPU in bf16: the run with
# graphs writes the metrics of the run without, bit for bit (losses, gradient
# norms, val losses), with evaluation, checkpoints, depth-statistics steps
# (eager between replays) and a resume in between; and the log says graphs ran.
# Our attention on both sides (cuDNN's backward need not repeat its bits). A bad
# id in a replay: tests/gpu/test_step_graph.cpp.
# Usage: cuda_graphs_train.sh ATTNRES_BIN SOURCE_DIR (as tests/cli/*.sh).
export ATTNRES_TEST_DEVICE=cuda
source "$(dirname "$0")/../cli/lib.sh"
require_device
make_corpus
write_config
sed -i 's/"log_every": 1}/"log_every": 1, "depth_stats_every": 5}/' base.json
common=(--training.attention_kernel=own)

"$BIN" train base.json "${common[@]}" --training.cuda_graphs=false --checkpoint.dir=ck_e --run.dir=run_e \
  2>log_e.txt || { cat log_e.txt; fail "the run without graphs"; }
"$BIN" train base.json "${common[@]}" --training.cuda_graphs=true --checkpoint.dir=ck_g --run.dir=run_g \
  2>log_g.txt || { cat log_g.txt; fail "the run with graphs"; }
grep -q "CUDA graphs: the step runs eagerly once" log_g.txt || { cat log_g.txt; fail "the log does not say graphs run"; }
grep -q "CUDA graphs" log_e.txt && fail "graphs ran with training.cuda_graphs = false"
diff <(strip_metrics run_e/metrics.jsonl) <(strip_metrics run_g/metrics.jsonl) \
  || fail "the run with CUDA graphs differs from the run without"
cmp run_e/depth_stats.jsonl run_g/depth_stats.jsonl || fail "depth statistics differ"
pass "12 steps with graphs == without, bit for bit ($(grep -c '"loss"' run_g/metrics.jsonl) step records, eval, depth statistics)"

# Stopped at step 6 and resumed with graphs: the same again (a fresh capture).
"$BIN" train base.json "${common[@]}" --training.cuda_graphs=true --checkpoint.dir=ck_r --run.dir=run_r \
  --run.stop_after=6 2>log_r.txt || { cat log_r.txt; fail "first half with graphs"; }
"$BIN" train base.json "${common[@]}" --training.cuda_graphs=true --checkpoint.dir=ck_r --run.dir=run_r \
  --checkpoint.resume=auto 2>>log_r.txt || { cat log_r.txt; fail "resumed half with graphs"; }
diff <(strip_metrics run_e/metrics.jsonl) <(strip_metrics run_r/metrics.jsonl) \
  || fail "6 + resumed 6 steps with graphs differ from 12 without"
pass "6 + resumed 6 steps with graphs == 12 without"

echo "all cuda graphs checks passed"
